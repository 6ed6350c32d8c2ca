//! Collection and database DDL through the router, and `shardCollection`.
//!
//! Unsharded collections live on their database's primary shard, so their DDL goes there. A
//! sharded collection exists on every shard with one UUID, so its DDL is broadcast, and its
//! metadata (`config.collections`, `config.chunks` on the config shard) is written by the router
//! that shards or drops it.
//!
//! Invariant: a sharded collection is created on every shard (with the same UUID) before its
//! metadata says it is sharded, so no router ever routes a write to a shard without it.

use std::sync::Arc;

use bson::{Binary, Bson, Document, doc, spec::BinarySubtype};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::{forwardable, validate_collection_name};
use crate::cursors::{CursorState, Merge, RouterCursor, Source};
use crate::kernel::catalog::{CONFIG_DB, Placement, ShardedCollection};
use crate::kernel::transport::Shards;
use crate::txn::Enlisting;
use shard::sharding::{ChunkTable, ShardId, ShardKey};

/// Chunks per shard when a hashed key is pre-split.
const HASHED_CHUNKS_PER_SHARD: usize = 2;

/// The shards holding `db.coll`, and which of them is its database's primary.
struct Holders {
    shards: Vec<ShardId>,
    primary: Option<ShardId>,
    sharded: bool,
}

/// `db.coll` lives on its primary, or on every shard when it is sharded.
async fn holders(ctx: &Ctx<'_>, coll: &str, create_db: bool) -> Result<Holders> {
    let seams = ctx.seams;
    Ok(
        match seams.catalog.placement(ctx.db, coll, create_db).await? {
            Placement::Unsharded { primary: None } => Holders {
                shards: vec![],
                primary: None,
                sharded: false,
            },
            Placement::Unsharded {
                primary: Some(primary),
            } => Holders {
                shards: vec![primary],
                primary: Some(primary),
                sharded: false,
            },
            Placement::Sharded(_) => {
                let primary = seams.catalog.database(ctx.db).await?;
                let primary = primary.map(|d| d.primary);
                Holders {
                    shards: seams.transport.all(),
                    primary,
                    sharded: true,
                }
            }
        },
    )
}

/// Sends a DDL command (less the fields only the router reads) to every holder. The copies for
/// shards other than the primary carry `fromMigrate: true`, so change streams report the DDL
/// once, from the primary.
async fn broadcast_ddl(
    transport: &Enlisting,
    db: &str,
    shards: &[ShardId],
    primary: Option<ShardId>,
    cmd: &Document,
) -> Vec<Result<Document>> {
    let sends = shards.iter().map(|&s| {
        // Each shard's copy is made straight from the client's command (a copy of a large
        // command is as large as its parse).
        let mut cmd = forwardable(cmd);
        if primary.is_some_and(|p| p != s) {
            cmd.insert("fromMigrate", true);
        }
        transport.command(s, db, cmd)
    });
    futures::future::join_all(sends).await
}

/// Runs the driver's command on the holders and returns the first reply (or first error).
async fn on_shards(ctx: &Ctx<'_>, holders: &Holders) -> Result<Document> {
    let replies = broadcast_ddl(
        ctx.seams.shards(),
        ctx.db,
        &holders.shards,
        holders.primary,
        ctx.cmd,
    )
    .await;
    let mut first = None;
    for r in replies {
        let r = r?;
        first.get_or_insert(r);
    }
    first.ok_or_else(|| MongoError::internal("DDL reached no shard"))
}

fn ns_not_found(ns: &str) -> MongoError {
    MongoError::new(
        ErrorCode::NAMESPACE_NOT_FOUND,
        format!("ns does not exist: {ns}"),
    )
}

pub(super) async fn create(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    validate_collection_name(ctx.db, coll)?;
    // Refused here, before the command is copied and parsed again on a shard.
    if let Some(collation) = ctx.cmd.get("collation") {
        pipeline::collation::Collation::parse(collation)?;
    }
    let holders = holders(ctx, coll, true).await?;
    on_shards(ctx, &holders).await
}

pub(super) async fn drop(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    validate_collection_name(ctx.db, coll)?;
    let ns = format!("{}.{coll}", ctx.db);
    let Holders {
        shards,
        primary,
        sharded,
    } = holders(ctx, coll, false).await?;
    let replies = broadcast_ddl(ctx.seams.shards(), ctx.db, &shards, primary, ctx.cmd).await;
    let mut n_indexes_was = None;
    for r in replies {
        match r {
            Ok(r) => {
                n_indexes_was.get_or_insert(r.get("nIndexesWas").cloned());
            }
            // As in MongoDB 7.0, dropping a collection that does not exist succeeds.
            Err(e) if e.code == ErrorCode::NAMESPACE_NOT_FOUND.code => {}
            Err(e) => return Err(e),
        }
    }
    if sharded {
        let seams = ctx.seams;
        seams
            .shards()
            .command(
                ShardId::CONFIG,
                CONFIG_DB,
                doc! {"delete": "chunks", "deletes": [{"q": {"ns": &ns}, "limit": 0}]},
            )
            .await?;
        seams
            .shards()
            .command(
                ShardId::CONFIG,
                CONFIG_DB,
                doc! {"delete": "collections", "deletes": [{"q": {"_id": &ns}, "limit": 0}]},
            )
            .await?;
        seams.catalog.remember_collection(&ns, None);
    }
    let mut reply = doc! {"ns": ns};
    if let Some(Some(n)) = n_indexes_was {
        reply.insert("nIndexesWas", n);
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

pub(super) async fn drop_database(ctx: &Ctx<'_>) -> Result<Document> {
    let db = ctx.db;
    if db == "admin" || db == CONFIG_DB || db == "local" {
        return Err(MongoError::new(
            ErrorCode::ILLEGAL_OPERATION,
            format!("Cannot drop '{db}' database through a router"),
        ));
    }
    let seams = ctx.seams;
    // A dropped database's subscriptions go with it (and stop pinning its history).
    seams.subscriptions.drop_database(db).await?;
    let Some(entry) = seams.catalog.database(db).await? else {
        return Ok(doc! {"ok": 1.0});
    };
    let primary = entry.primary;
    let drop = doc! {"dropDatabase": 1};
    for r in broadcast_ddl(
        seams.shards(),
        db,
        &seams.transport.all(),
        Some(primary),
        &drop,
    )
    .await
    {
        r?;
    }
    // Namespaces `db.*` are exactly the strings in ["db.", "db/"): '/' follows '.'.
    let in_db = doc! {"$gte": format!("{db}."), "$lt": format!("{db}/")};
    seams
        .shards()
        .command(
            ShardId::CONFIG,
            CONFIG_DB,
            doc! {"delete": "chunks", "deletes": [{"q": {"ns": in_db.clone()}, "limit": 0}]},
        )
        .await?;
    seams
        .shards()
        .command(
            ShardId::CONFIG,
            CONFIG_DB,
            doc! {"delete": "collections", "deletes": [{"q": {"_id": in_db}, "limit": 0}]},
        )
        .await?;
    seams
        .shards()
        .command(
            ShardId::CONFIG,
            CONFIG_DB,
            doc! {"delete": "databases", "deletes": [{"q": {"_id": db}, "limit": 0}]},
        )
        .await?;
    seams.catalog.forget_database(db);
    Ok(doc! {"dropped": db, "ok": 1.0})
}

fn split_ns(ns: &str) -> Result<(&str, &str)> {
    ns.split_once('.')
        .filter(|(db, coll)| !db.is_empty() && !coll.is_empty())
        .ok_or_else(|| {
            MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!("Invalid namespace specified '{ns}'"),
            )
        })
}

pub(super) async fn rename_collection(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    if ctx.db != "admin" {
        return Err(MongoError::new(
            ErrorCode::UNAUTHORIZED,
            "renameCollection may only be run against the admin database.",
        ));
    }
    let from = args.collection()?;
    let to = args.opt_str("to")?.ok_or_else(|| {
        MongoError::with_code(
            40414,
            "BSON field 'renameCollection.to' is missing but a required field",
        )
    })?;
    let (from_db, from_coll) = split_ns(from)?;
    let (to_db, to_coll) = split_ns(to)?;
    validate_collection_name(to_db, to_coll)?;
    let seams = ctx.seams;
    if seams.catalog.sharded_collection(from).await?.is_some()
        || seams.catalog.sharded_collection(to).await?.is_some()
    {
        return Err(MongoError::new(
            ErrorCode::ILLEGAL_OPERATION,
            format!("renaming a sharded collection is not supported: {from}"),
        ));
    }
    let Some(source) = seams.catalog.database(from_db).await? else {
        return Err(MongoError::new(
            ErrorCode::NAMESPACE_NOT_FOUND,
            "Source collection does not exist",
        ));
    };
    let _ = from_coll;
    // A new database is made on the source's primary, so the rename stays on one shard.
    let target = seams
        .catalog
        .ensure_database_on(to_db, source.primary)
        .await?;
    if target.primary != source.primary {
        return Err(MongoError::new(
            ErrorCode::COMMAND_NOT_SUPPORTED,
            format!("cannot rename across databases with different primary shards ({from} → {to})"),
        ));
    }
    let shard = source.primary;
    seams
        .shards()
        .command(shard, "admin", forwardable(ctx.cmd))
        .await
}

pub(super) async fn list_collections(ctx: &Ctx<'_>) -> Result<Document> {
    let seams = ctx.seams;
    let ns = format!("{}.$cmd.listCollections", ctx.db);
    let Some(db) = seams.catalog.database(ctx.db).await? else {
        return Ok(doc! {"cursor": {"id": 0_i64, "ns": ns, "firstBatch": []}, "ok": 1.0});
    };
    let shard = db.primary;
    let reply = seams
        .shards()
        .command(shard, ctx.db, forwardable(ctx.cmd))
        .await?;
    pass_cursor(ctx, shard, "$cmd.listCollections", reply)
}

pub(super) async fn list_indexes(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    let ns = format!("{}.{coll}", ctx.db);
    let holders = holders(ctx, coll, false).await?;
    let Some(shard) = holders.primary.or(holders.shards.first().copied()) else {
        return Err(ns_not_found(&ns));
    };
    let reply = ctx
        .seams
        .shards()
        .command(shard, ctx.db, forwardable(ctx.cmd))
        .await?;
    pass_cursor(ctx, shard, coll, reply)
}

/// Registers a shard's open cursor as a router cursor and rewrites the id in the reply.
fn pass_cursor(
    ctx: &Ctx<'_>,
    shard: ShardId,
    collection: &str,
    mut reply: Document,
) -> Result<Document> {
    let source = Source::from_reply(shard, &reply)?;
    if source.cursor_id != 0 {
        let ns = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_str("ns").ok())
            .unwrap_or_default()
            .to_string();
        let id = ctx.seams.cursors.insert(RouterCursor {
            ns,
            state: CursorState::merge(Merge::concat(
                ctx.db,
                collection,
                vec![Source {
                    buffer: Default::default(),
                    ..source
                }],
            )),
            info: None,
        });
        if let Ok(c) = reply.get_document_mut("cursor") {
            c.insert("id", id);
        }
    }
    Ok(reply)
}

pub(super) async fn create_indexes(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    validate_collection_name(ctx.db, coll)?;
    // Refused here, before the command is copied for each shard.
    if let Ok(specs) = ctx.cmd.get_array("indexes") {
        for key in specs
            .iter()
            .filter_map(Bson::as_document)
            .filter_map(|spec| spec.get_document("key").ok())
        {
            shard::commands::check_index_key(key)?;
        }
    }
    if let Placement::Sharded(meta) = ctx.seams.catalog.placement(ctx.db, coll, false).await?
        && let Ok(specs) = ctx.cmd.get_array("indexes")
    {
        for spec in specs.iter().filter_map(Bson::as_document) {
            check_unique_prefix(spec, &meta.key)?;
        }
    }
    let holders = holders(ctx, coll, true).await?;
    on_shards(ctx, &holders).await
}

/// A unique index of a sharded collection must begin with the shard key's fields, so each
/// shard can enforce it alone (MongoDB's rule; the `_id` index is exempt).
fn check_unique_prefix(spec: &Document, key: &ShardKey) -> Result<()> {
    let unique = matches!(spec.get("unique"), Some(Bson::Boolean(true)))
        || spec
            .get("unique")
            .and_then(pipeline::value::as_f64)
            .is_some_and(|n| n != 0.0);
    let Ok(pattern) = spec.get_document("key") else {
        return Ok(());
    };
    if !unique || spec.get_str("name").is_ok_and(|n| n == "_id_") {
        return Ok(());
    }
    let fields: Vec<&str> = pattern.keys().map(String::as_str).collect();
    let shard_fields: Vec<&str> = key.fields().collect();
    if fields.len() >= shard_fields.len() && fields[..shard_fields.len()] == shard_fields[..] {
        return Ok(());
    }
    Err(MongoError::new(
        ErrorCode::CANNOT_CREATE_INDEX,
        format!(
            "cannot create unique index over {} with shard key pattern {}",
            wire::capped::for_message(pattern),
            key.pattern()
        ),
    ))
}

pub(super) async fn drop_indexes(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    let holders = holders(ctx, coll, false).await?;
    if holders.shards.is_empty() {
        return Err(ns_not_found(&format!("{}.{coll}", ctx.db)));
    }
    on_shards(ctx, &holders).await
}

pub(super) async fn coll_mod(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?;
    let holders = holders(ctx, coll, false).await?;
    if holders.shards.is_empty() {
        return Err(ns_not_found(&format!("{}.{coll}", ctx.db)));
    }
    on_shards(ctx, &holders).await
}

pub(super) async fn enable_sharding(ctx: &Ctx<'_>) -> Result<Document> {
    let db = match ctx.cmd.get(ctx.name) {
        Some(Bson::String(db)) => db.as_str(),
        _ => {
            return Err(MongoError::type_mismatch(
                "enableSharding takes a database name",
            ));
        }
    };
    let catalog = &ctx.seams.catalog;
    let entry = match ctx.args().opt_str("primaryShard")? {
        None => catalog.ensure_database(db).await?,
        Some(name) => {
            let shard = catalog.shard_named(name).ok_or_else(|| {
                MongoError::new(
                    ErrorCode::SHARD_NOT_FOUND,
                    format!("Shard {name} not found"),
                )
            })?;
            let entry = catalog.ensure_database_on(db, shard).await?;
            if entry.primary != shard {
                return Err(MongoError::new(
                    ErrorCode::NAMESPACE_EXISTS,
                    format!("database already created on a primary which is different from {name}"),
                ));
            }
            entry
        }
    };
    Ok(doc! {"primary": entry.primary.to_string(), "ok": 1.0})
}

pub(super) async fn shard_collection(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    if ctx.db != "admin" {
        return Err(MongoError::new(
            ErrorCode::ILLEGAL_OPERATION,
            "shardCollection may only be run against the admin database.",
        ));
    }
    let ns = args.collection()?;
    let (db, coll) = split_ns(ns)?;
    validate_collection_name(db, coll)?;
    let key = ShardKey::parse(args.doc("key")?)?;
    let unique = args.opt_bool("unique")?.unwrap_or(false);
    if unique && key.is_hashed() {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "hashed shard keys cannot be declared unique.",
        ));
    }
    let seams = ctx.seams;
    if let Some(existing) = seams.catalog.sharded_collection(ns).await? {
        if existing.key == key {
            return Ok(
                doc! {"collectionsharded": ns, "collectionUUID": existing.uuid.clone(), "ok": 1.0},
            );
        }
        return Err(MongoError::new(
            ErrorCode::ALREADY_INITIALIZED,
            format!(
                "sharding already enabled for collection {ns} with options {}",
                existing.to_document()
            ),
        ));
    }
    let primary = seams.catalog.ensure_database(db).await?.primary;

    // Reuse the UUID of an existing unsharded collection; keep its data on the primary.
    let listed = seams
        .shards()
        .command(
            primary,
            db,
            doc! {"listCollections": 1, "filter": {"name": coll}},
        )
        .await?;
    let existing = crate::kernel::transport::first_batch(&listed)?
        .into_iter()
        .next();
    if existing
        .as_ref()
        .is_some_and(|c| c.get_str("type").unwrap_or("collection") == "view")
    {
        return Err(MongoError::new(
            ErrorCode::COMMAND_NOT_SUPPORTED_ON_VIEW,
            format!("{ns} is a view"),
        ));
    }
    // The router targets and merges a sharded collection's operations by the collation they
    // name, not by a default it does not know: a default collation cannot be sharded here.
    if let Some(default) = existing
        .as_ref()
        .and_then(|c| c.get_document("options").ok())
        .and_then(|o| o.get_document("collation").ok())
    {
        return Err(MongoError::bad_value(format!(
            "cannot shard {ns}: it has a non-simple default collation {default}, which this \
             server's seams does not apply; recreate it without one and name the collation \
             per operation"
        )));
    }
    let uuid = match existing
        .as_ref()
        .and_then(|c| c.get_document("info").ok())
        .and_then(|i| i.get("uuid"))
    {
        Some(Bson::Binary(b)) => b.clone(),
        _ => Binary {
            subtype: BinarySubtype::Uuid,
            bytes: uuid::Uuid::new_v4().as_bytes().to_vec(),
        },
    };
    let has_data = match existing {
        None => false,
        Some(_) => {
            let count = seams
                .shards()
                .command(primary, db, doc! {"count": coll})
                .await?;
            count
                .get("n")
                .is_some_and(|n| !matches!(n, Bson::Int32(0) | Bson::Int64(0)))
        }
    };
    let chunks = if key.is_hashed() && !has_data {
        ChunkTable::presplit_hashed(&key, &seams.transport.all(), HASHED_CHUNKS_PER_SHARD)
    } else {
        ChunkTable::single(&key, primary)
    };
    // Create it everywhere first (the primary last: it writes the shardCollection event).
    let mut order: Vec<ShardId> = seams
        .transport
        .all()
        .into_iter()
        .filter(|&s| s != primary)
        .collect();
    order.push(primary);
    // The other shards create it with the primary's options (changeStreamPreAndPostImages,
    // validators...), so every shard treats its part of the collection alike.
    let options = existing
        .as_ref()
        .and_then(|c| c.get_document("options").ok())
        .cloned()
        .unwrap_or_default();
    for shard in order {
        let cmd = doc! {
            "_shardsvrShardCollection": ns,
            "key": key.pattern(),
            "unique": unique,
            "collectionUUID": uuid.clone(),
            "collectionOptions": options.clone(),
            "isPrimary": shard == primary,
            "fromMigrate": shard != primary,
            "numInitialChunks": chunks.chunks().len() as i64,
        };
        seams.shards().command(shard, "admin", cmd).await?;
    }
    let sharded = ShardedCollection {
        ns: ns.to_string(),
        uuid: uuid.clone(),
        key: key.clone(),
        unique,
        chunks,
    };
    let chunk_docs: Vec<Bson> = sharded
        .chunks
        .to_documents(&key, ns)
        .into_iter()
        .map(Bson::Document)
        .collect();
    seams
        .shards()
        .command(
            ShardId::CONFIG,
            CONFIG_DB,
            doc! {"insert": "chunks", "documents": chunk_docs},
        )
        .await?;
    seams
        .shards()
        .command(
            ShardId::CONFIG,
            CONFIG_DB,
            doc! {"insert": "collections", "documents": [sharded.to_document()]},
        )
        .await?;
    seams
        .catalog
        .remember_collection(ns, Some(Arc::new(sharded)));
    Ok(doc! {"collectionsharded": ns, "collectionUUID": uuid, "ok": 1.0})
}
