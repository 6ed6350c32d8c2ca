//! Catalog commands: `create`, `drop`, `dropDatabase`, `renameCollection`, `listCollections`,
//! `listDatabases`, `createIndexes`, `dropIndexes`, `listIndexes`, `collMod`, and the internal
//! `_shardsvrShardCollection`.
//!
//! Every catalog change runs as a writer job: the catalog entry, the data change (if any) and
//! the `c` oplog entry on `<db>.$cmd` commit together. Validation happens before any write, so a
//! rejected DDL leaves nothing behind.

use bson::{Bson, Document, Uuid, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply, as_bool, cursor_reply};
use crate::catalog::{CollectionEntry, check_coll_name, check_db_name};
use crate::oplog::EntrySpec;
use crate::query::Filter;
use crate::storage::StorageResult;
use crate::write::ops::{create_collection, dup_key_error, ensure_collection, insert_one, lookup};
use crate::writer::{OpError, OpResult, WriteCtx, WriteOutput};

/// Generic command fields that are not collection options.
const GENERIC_FIELDS: &[&str] = &[
    "$db",
    "shardVersion",
    "databaseVersion",
    "$configTime",
    "$topologyTime",
    "txnRetryCounter",
    "$queryOptions",
    "$clusterTime",
    "$readPreference",
    "lsid",
    "txnNumber",
    "stmtIds",
    "autocommit",
    "startTransaction",
    "writeConcern",
    "readConcern",
    "comment",
    "maxTimeMS",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "collectionUUID",
    "mayBypassWriteBlocking",
    "$audit",
    "$client",
    // The router's mark on the copies of a sharded collection's DDL (see `run_ddl`).
    "fromMigrate",
];

fn options_of(cmd: &Document) -> Document {
    cmd.iter()
        .skip(1)
        .filter(|(k, _)| !GENERIC_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Runs a DDL body as one writer job.
async fn run_ddl<F>(ctx: &Ctx<'_>, f: F) -> Result<Reply, MongoError>
where
    F: FnOnce(&mut WriteCtx<'_>) -> OpResult<(Document, Option<ClusterTime>)> + Send + 'static,
{
    // The router sends `fromMigrate: true` with the copies of a sharded collection's DDL that
    // go to its non-primary shards, so change streams see each DDL event once.
    let from_migrate = ctx.bool_or("fromMigrate", false)?;
    let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
        w.from_migrate = from_migrate;
        match f(w) {
            Ok((mut reply, op_time)) => {
                reply.insert("ok", 1.0);
                let op_time = op_time.or(w.last_logged());
                Ok(WriteOutput { reply, op_time })
            }
            Err(OpError::Storage(e)) => Err(e),
            Err(OpError::Mongo(e)) => Ok(WriteOutput {
                reply: e.to_document(),
                op_time: None,
            }),
        }
    };
    let out = ctx.submit(Box::new(job)).await?;
    Ok(Reply {
        body: out.reply.into(),
        op_time: out.op_time,
    })
}

fn uuid_arg(cmd: &Document, field: &str) -> Result<Option<Uuid>, MongoError> {
    match cmd.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Binary(b)) => b
            .to_uuid()
            .map(Some)
            .map_err(|_| MongoError::bad_value(format!("'{field}' must be a UUID"))),
        Some(_) => Err(MongoError::type_mismatch(format!(
            "BSON field '{field}' is the wrong type, expected type 'binData'"
        ))),
    }
}

/// `changeStreamPreAndPostImages` of a `create` or `collMod` on `db`: `{enabled: bool}`,
/// refused where MongoDB refuses it (the `admin`, `config` and `local` databases, views).
fn check_pre_and_post_images(db: &str, options: &Document) -> Result<(), MongoError> {
    let Some(v) = options.get("changeStreamPreAndPostImages") else {
        return Ok(());
    };
    let Bson::Document(d) = v else {
        return Err(MongoError::type_mismatch(format!(
            "BSON field 'changeStreamPreAndPostImages' is the wrong type '{}', expected type 'object'",
            pipeline::value::type_name(v)
        )));
    };
    if let Some(k) = d.keys().find(|k| k.as_str() != "enabled") {
        return Err(MongoError::with_code(
            40415,
            format!("BSON field 'changeStreamPreAndPostImages.{k}' is an unknown field."),
        ));
    }
    match d.get("enabled") {
        Some(Bson::Boolean(enabled)) => {
            if *enabled && matches!(db, "admin" | "config" | "local") {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    format!(
                        "changeStreamPreAndPostImages is not supported for collections in the '{db}' database"
                    ),
                ));
            }
            if *enabled && options.contains_key("viewOn") {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    "option not supported on a view: changeStreamPreAndPostImages",
                ));
            }
            Ok(())
        }
        Some(other) => Err(MongoError::type_mismatch(format!(
            "BSON field 'changeStreamPreAndPostImages.enabled' is the wrong type '{}', expected type 'bool'",
            pipeline::value::type_name(other)
        ))),
        None => Err(MongoError::with_code(
            40414,
            "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field",
        )),
    }
}

fn ns_not_found() -> MongoError {
    MongoError::new(ErrorCode::NAMESPACE_NOT_FOUND, "ns not found")
}

pub async fn create(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    check_coll_name(&ctx.db, &coll)?;
    let uuid = uuid_arg(&ctx.cmd, "collectionUUID")?;
    let mut options = options_of(&ctx.cmd);
    if let Some(v) = options.get("viewOn")
        && !matches!(v, Bson::String(_))
    {
        return Err(MongoError::type_mismatch(
            "BSON field 'create.viewOn' is the wrong type, expected type 'string'",
        ));
    }
    if options.contains_key("pipeline") && !options.contains_key("viewOn") {
        return Err(MongoError::new(
            ErrorCode::BAD_VALUE,
            "'pipeline' requires 'viewOn' to also be specified",
        ));
    }
    check_pre_and_post_images(&ctx.db, &options)?;
    crate::validation::check_options("create", &ctx.db, &coll, &options)?;
    // A collection keeps its default collation's full spec; the simple one is no option.
    if let Some(v) = options.remove("collation")
        && let Some(c) = pipeline::collation::Collation::parse(&v)?
    {
        options.insert("collation", c.spec().clone());
    }
    if options.get("capped").and_then(as_bool).unwrap_or(false) {
        match options.get("size").and_then(pipeline::value::as_f64) {
            Some(n) if n > 0.0 => {}
            _ => {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    "the 'size' field is required when 'capped' is true",
                ));
            }
        }
    }
    let db = ctx.db.clone();
    // As in MongoDB 7.0, creating a collection that exists with the same options succeeds,
    // except in a transaction, which may only create what is not there.
    let in_transaction = ctx.txn.is_some();
    run_ddl(ctx, move |w| {
        if let Some(existing) = lookup(w, &db, &coll) {
            if existing.options == options
                && uuid.is_none_or(|u| u == existing.uuid)
                && !in_transaction
            {
                return Ok((Document::new(), None));
            }
            return Err(MongoError::new(
                ErrorCode::NAMESPACE_EXISTS,
                format!("Collection {db}.{coll} already exists."),
            )
            .into());
        }
        if let Some(Bson::String(view_on)) = options.get("viewOn") {
            // Views live in `<db>.system.views`, as in MongoDB; the catalog keeps the name.
            let views = ensure_collection(w, &db, "system.views")?;
            let mut vdoc = doc! {"_id": format!("{db}.{coll}"), "viewOn": view_on.clone()};
            vdoc.insert(
                "pipeline",
                options
                    .get("pipeline")
                    .cloned()
                    .unwrap_or(Bson::Array(Vec::new())),
            );
            w.save_collection(CollectionEntry::new(
                &db,
                &coll,
                uuid.unwrap_or_else(Uuid::new),
                options.clone(),
            ))?;
            let ts = insert_one(w, &views, vdoc, None, 0)?;
            return Ok((Document::new(), Some(ts)));
        }
        create_collection(w, &db, &coll, uuid, options)?;
        Ok((Document::new(), None))
    })
    .await
}

fn is_view(c: &CollectionEntry) -> bool {
    c.options.contains_key("viewOn")
}

/// Drops one collection (or view) inside a job; returns the `ts` of its entry.
fn drop_one(w: &mut WriteCtx<'_>, c: &CollectionEntry) -> OpResult<ClusterTime> {
    if is_view(c) {
        w.remove_collection(&c.ns())?;
        if let Some(views) = lookup(w, &c.db, "system.views") {
            let id = Bson::String(c.ns());
            if let Some(d) = w.get_doc(&views, &id)? {
                return crate::write::ops::delete_one(w, &views, &d, None, 0);
            }
        }
        return Ok(w.last_logged().unwrap_or_else(|| w.state().cluster_time()));
    }
    let n = w.clear_collection(c)?;
    w.remove_collection(&c.ns())?;
    let ts = w.log(EntrySpec::command(
        &c.db,
        Some(c.uuid),
        doc! {"drop": &c.name},
        Some(doc! {"numRecords": n as i64}),
    ))?;
    Ok(ts)
}

pub async fn drop(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    check_db_name(&ctx.db)?;
    let db = ctx.db.clone();
    run_ddl(ctx, move |w| {
        // MongoDB 7.0 answers `ok: 1` (and writes nothing) for a collection that does not exist.
        let Some(c) = lookup(w, &db, &coll) else {
            return Ok((Document::new(), None));
        };
        let n_indexes = c.all_indexes().len() as i32;
        let ts = drop_one(w, &c)?;
        Ok((doc! {"nIndexesWas": n_indexes, "ns": c.ns()}, Some(ts)))
    })
    .await
}

pub async fn drop_database(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    check_db_name(&ctx.db)?;
    let db = ctx.db.clone();
    run_ddl(ctx, move |w| {
        let colls: Vec<_> = w.catalog().collections_in(&db).cloned().collect();
        if colls.is_empty() {
            return Ok((Document::new(), None));
        }
        for c in &colls {
            drop_one(w, c)?;
        }
        let ts = w.log(EntrySpec::command(
            &db,
            None,
            doc! {"dropDatabase": 1},
            None,
        ))?;
        Ok((doc! {"dropped": &db}, Some(ts)))
    })
    .await
}

fn split_ns(ns: &str) -> Result<(String, String), MongoError> {
    match ns.split_once('.') {
        Some((d, c)) if !d.is_empty() && !c.is_empty() => Ok((d.to_string(), c.to_string())),
        _ => Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid namespace specified '{ns}'"),
        )),
    }
}

pub async fn rename_collection(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    if ctx.db != "admin" {
        return Err(MongoError::new(
            ErrorCode::UNAUTHORIZED,
            "renameCollection may only be run against the admin database.",
        ));
    }
    let from = ctx.collection()?;
    let to = ctx.opt_str("to")?.ok_or_else(|| ctx.missing("to"))?;
    let (sdb, scoll) = split_ns(&from)?;
    let (tdb, tcoll) = split_ns(&to)?;
    check_coll_name(&tdb, &tcoll)?;
    let drop_target = match ctx.cmd.get("dropTarget") {
        None | Some(Bson::Null) => false,
        Some(Bson::Binary(_)) => true,
        Some(v) => as_bool(v).ok_or_else(|| {
            MongoError::type_mismatch(
                "BSON field 'dropTarget' is the wrong type, expected type 'bool'",
            )
        })?,
    };
    let stay_temp = ctx.bool_or("stayTemp", false)?;
    if from == to {
        return Err(MongoError::new(
            ErrorCode::ILLEGAL_OPERATION,
            "Can't rename a collection to itself",
        ));
    }
    run_ddl(ctx, move |w| {
        let Some(src) = lookup(w, &sdb, &scoll) else {
            return Err(MongoError::new(
                ErrorCode::NAMESPACE_NOT_FOUND,
                format!("Source collection {from} does not exist"),
            )
            .into());
        };
        let target = lookup(w, &tdb, &tcoll);
        if target.is_some() && !drop_target {
            return Err(
                MongoError::new(ErrorCode::NAMESPACE_EXISTS, "target namespace exists").into(),
            );
        }
        let mut o = doc! {"renameCollection": &from, "to": &to, "stayTemp": stay_temp};
        if let Some(t) = &target {
            w.clear_collection(t)?;
            w.remove_collection(&t.ns())?;
            o.insert("dropTarget", t.uuid);
        }
        w.remove_collection(&src.ns())?;
        let mut moved = (*src).clone();
        moved.db = tdb.clone();
        moved.name = tcoll.clone();
        w.save_collection(moved)?;
        let ts = w.log(EntrySpec::command(&sdb, Some(src.uuid), o, None))?;
        Ok((Document::new(), Some(ts)))
    })
    .await
}

fn collection_info(c: &CollectionEntry, name_only: bool) -> Document {
    if is_view(c) {
        if name_only {
            return doc! {"name": &c.name, "type": "view"};
        }
        return doc! {"name": &c.name, "type": "view", "options": c.options.clone(), "info": {"readOnly": true}};
    }
    if name_only {
        return doc! {"name": &c.name, "type": "collection"};
    }
    doc! {
        "name": &c.name,
        "type": "collection",
        "options": c.options.clone(),
        "info": {"readOnly": false, "uuid": c.uuid},
        "idIndex": CollectionEntry::id_index(),
    }
}

pub fn list_collections(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    check_db_name(&ctx.db)?;
    let filter = Filter::parse(&ctx.opt_doc("filter")?.unwrap_or_default())?;
    let name_only = ctx.bool_or("nameOnly", false)?;
    let catalog = ctx.shard.state().catalog();
    let docs: Vec<Document> = catalog
        .collections_in(&ctx.db)
        .map(|c| collection_info(c, false))
        .filter(|d| filter.matches(d))
        .map(|d| {
            if name_only {
                doc! {"name": d.get("name").cloned().unwrap_or(Bson::Null), "type": d.get("type").cloned().unwrap_or(Bson::Null)}
            } else {
                d
            }
        })
        .collect();
    let ns = format!("{}.$cmd.listCollections", ctx.db);
    Ok(Reply::read(cursor_reply(0, &ns, docs, true)))
}

pub fn list_databases(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let name_only = ctx.bool_or("nameOnly", false)?;
    let filter = Filter::parse(&ctx.opt_doc("filter")?.unwrap_or_default())?;
    let catalog = ctx.shard.state().catalog();
    let txn = ctx
        .shard
        .state()
        .storage
        .begin_read()
        .map_err(|e| MongoError::internal(e.to_string()))?;
    let mut dbs = Vec::new();
    let mut total: i64 = 0;
    for db in catalog.databases() {
        let mut size: i64 = 0;
        for c in catalog.collections_in(&db) {
            size += super::stats::usage(&*txn, c)?.size;
        }
        let size = size.max(4096);
        let d = if name_only {
            doc! {"name": &db}
        } else {
            doc! {"name": &db, "sizeOnDisk": size, "empty": false}
        };
        if filter.matches(&d) {
            total += size;
            dbs.push(Bson::Document(d));
        }
    }
    let mut reply = doc! {"databases": dbs};
    if !name_only {
        reply.insert("totalSize", total);
        reply.insert("totalSizeMb", total / (1024 * 1024));
    }
    reply.insert("ok", 1.0);
    Ok(Reply::read(reply))
}

/// MongoDB's default index name: `field_dir` pairs joined by `_`.
pub fn default_index_name(key: &Document) -> String {
    key.iter()
        .map(|(k, v)| {
            let dir = match v {
                Bson::String(s) => s.clone(),
                Bson::Int32(i) => i.to_string(),
                Bson::Int64(i) => i.to_string(),
                Bson::Double(d) => d.to_string(),
                other => other.to_string(),
            };
            format!("{k}_{dir}")
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// Normalizes one requested index spec to `{v: 2, key, name, ...options}`, its `collation`
/// to the full spec (the collection's default when it names none; none when simple).
/// The most fields an index key pattern may have (MongoDB's 32).
const MAX_INDEX_KEY_FIELDS: usize = 32;

/// The fields an index specification may have, as MongoDB 7.0's `createIndexes` takes them;
/// any other is refused (197) rather than stored.
const INDEX_SPEC_FIELDS: &[&str] = &[
    "key",
    "name",
    "v",
    "ns",
    "unique",
    "sparse",
    "expireAfterSeconds",
    "partialFilterExpression",
    "collation",
    "background",
    "hidden",
    "prepareUnique",
    "weights",
    "default_language",
    "language_override",
    "textIndexVersion",
    "2dsphereIndexVersion",
    "bits",
    "min",
    "max",
    "bucketSize",
    "storageEngine",
    "wildcardProjection",
    "clustered",
];

fn normalize_spec(
    spec: &Bson,
    default_collation: Option<&pipeline::collation::Collation>,
) -> Result<Document, MongoError> {
    let Bson::Document(s) = spec else {
        return Err(MongoError::type_mismatch(
            "The elements of the 'indexes' array must be objects",
        ));
    };
    let key = match s.get("key") {
        Some(Bson::Document(k)) => {
            check_index_key(k)?;
            k.clone()
        }
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "The field 'key' must be an object",
            ));
        }
        None => {
            return Err(MongoError::failed_to_parse(
                "The 'key' field is a required property of an index specification",
            ));
        }
    };
    if let Some(k) = s.keys().find(|k| !INDEX_SPEC_FIELDS.contains(&k.as_str())) {
        return Err(MongoError::new(
            ErrorCode::INVALID_INDEX_SPECIFICATION_OPTION,
            format!("The field '{k}' is not valid for an index specification."),
        ));
    }
    for flag in ["unique", "sparse", "hidden", "background", "prepareUnique"] {
        if let Some(v) = s.get(flag)
            && !matches!(v, Bson::Boolean(_))
            && !pipeline::value::is_number(v)
        {
            return Err(MongoError::type_mismatch(format!(
                "The field '{flag}' must be a boolean, not {}",
                pipeline::value::type_name(v)
            )));
        }
    }
    if let Some(v) = s.get("expireAfterSeconds")
        && !pipeline::value::is_number(v)
    {
        return Err(MongoError::new(
            ErrorCode::CANNOT_CREATE_INDEX,
            format!(
                "TTL index 'expireAfterSeconds' option must be numeric, but received a type of '{}'",
                pipeline::value::type_name(v)
            ),
        ));
    }
    let name = match s.get("name") {
        Some(Bson::String(n)) if !n.is_empty() => n.clone(),
        Some(Bson::String(_)) => {
            return Err(MongoError::new(
                ErrorCode::CANNOT_CREATE_INDEX,
                "The index name cannot be empty",
            ));
        }
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "The field 'name' must be a string",
            ));
        }
        None => {
            return Err(MongoError::failed_to_parse(
                "The 'name' field is a required property of an index specification",
            ));
        }
    };
    if let Some(pfe) = s.get("partialFilterExpression") {
        let Bson::Document(pfe) = pfe else {
            return Err(MongoError::type_mismatch(
                "partialFilterExpression for an index must be a document",
            ));
        };
        pipeline::Matcher::parse(pfe)?;
        check_partial_filter(pfe, 0)?;
    }
    let collation = match s.get("collation") {
        Some(v) => pipeline::collation::Collation::parse(v)?,
        None => default_collation.cloned(),
    };
    let mut out = doc! {"v": 2, "key": key, "name": name};
    for (k, v) in s {
        if !matches!(k.as_str(), "v" | "key" | "name" | "ns" | "collation") {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(c) = collation {
        out.insert("collation", c.spec().clone());
    }
    Ok(out)
}

/// A key pattern's fields and values as MongoDB 7.0 checks them (`validateKeyPattern`): a
/// value is a non-zero number or a string (an index type), a field is a path without empty
/// parts. (Before, any value was taken: a key `{a: {<a million fields>}}` was stored whole.)
/// The largest encoded index key pattern MongoDB takes, in bytes.
const MAX_KEY_PATTERN_BYTES: usize = 2048;

/// An index key pattern as MongoDB's `validateKeyPattern` takes it (67 otherwise): at most
/// 2,048 bytes encoded, not empty, at most [`MAX_INDEX_KEY_FIELDS`] fields, each a non-zero
/// number or a string on a path without empty parts. The router checks it too, before it
/// copies the command for each shard.
pub fn check_index_key(key: &Document) -> Result<(), MongoError> {
    let refuse = |why: String| Err(MongoError::new(ErrorCode::CANNOT_CREATE_INDEX, why));
    if pipeline::changestream::split::document_size(key) > MAX_KEY_PATTERN_BYTES {
        return refuse("Index key pattern too large.".into());
    }
    if key.is_empty() {
        return refuse("Index keys cannot be empty.".into());
    }
    if key.len() > MAX_INDEX_KEY_FIELDS {
        return refuse(format!(
            "Index key pattern has {} fields; at most {MAX_INDEX_KEY_FIELDS} are allowed",
            key.len()
        ));
    }
    check_key_pattern(key)
}

fn check_key_pattern(key: &Document) -> Result<(), MongoError> {
    let refuse = |why: String| Err(MongoError::new(ErrorCode::CANNOT_CREATE_INDEX, why));
    for (field, value) in key {
        match value {
            Bson::String(_) => {}
            v if pipeline::value::is_number(v) => {
                let n = pipeline::value::as_f64(v).unwrap_or(f64::NAN);
                if n.is_nan() {
                    return refuse("Values in the index key pattern cannot be NaN.".into());
                }
                if n == 0.0 {
                    return refuse("Values in the index key pattern cannot be 0.".into());
                }
            }
            v => {
                return refuse(format!(
                    "Values in v:2 index key pattern cannot be of type {}. Only numbers > 0, \
                     numbers < 0, and strings are allowed.",
                    pipeline::value::type_name(v)
                ));
            }
        }
        if field.is_empty() {
            return refuse("Index keys cannot be an empty field.".into());
        }
        if field.split('.').any(str::is_empty) {
            return refuse("Index keys cannot contain an empty field.".into());
        }
    }
    Ok(())
}

/// A partial index's filter may only use what an index can decide per document: equality,
/// `$exists: true`, ranges, `$type`, `$in`, and `$and` / `$or` of those (MongoDB 7.0's list).
fn check_partial_filter(pfe: &Document, depth: usize) -> Result<(), MongoError> {
    let refuse = |what: String| {
        Err(MongoError::new(
            ErrorCode::CANNOT_CREATE_INDEX,
            format!("Expression not supported in partial index: {what}"),
        ))
    };
    for (k, v) in pfe {
        match (k.as_str(), v) {
            ("$and" | "$or", Bson::Array(items)) if depth < 4 => {
                for item in items {
                    match item {
                        Bson::Document(d) => check_partial_filter(d, depth + 1)?,
                        other => return refuse(format!("{k}: {other}")),
                    }
                }
            }
            (op, _) if op.starts_with('$') => return refuse(format!("{op}: {v}")),
            (_, Bson::Document(d)) if d.keys().any(|o| o.starts_with('$')) => {
                for (op, arg) in d {
                    let ok = match op.as_str() {
                        "$eq" | "$gt" | "$gte" | "$lt" | "$lte" | "$type" | "$in" => true,
                        "$exists" => as_bool(arg) == Some(true),
                        _ => false,
                    };
                    if !ok {
                        return refuse(format!("{k} {op} {arg}"));
                    }
                }
            }
            (_, Bson::RegularExpression(_)) => return refuse(format!("{k} regex {v}")),
            _ => {}
        }
    }
    Ok(())
}

fn options_only(spec: &Document) -> Document {
    spec.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "v" | "key" | "name"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn keys_equal(a: &Document, b: &Document) -> bool {
    pipeline::value::compare_documents(a, b) == std::cmp::Ordering::Equal
}

/// Adds index specs to a collection inside a job; returns how many were new.
fn add_indexes(
    w: &mut WriteCtx<'_>,
    coll: &CollectionEntry,
    specs: Vec<Document>,
) -> OpResult<(usize, Option<ClusterTime>)> {
    let mut entry = coll.clone();
    let mut added = Vec::new();
    for spec in specs {
        let key = spec.get_document("key").cloned().unwrap_or_default();
        let name = spec.get_str("name").unwrap_or("").to_string();
        let existing = entry.all_indexes();
        if let Some(same_name) = existing
            .iter()
            .find(|e| e.get_str("name").ok() == Some(name.as_str()))
        {
            let same_key = same_name
                .get_document("key")
                .map(|k| keys_equal(k, &key))
                .unwrap_or(false);
            if !same_key {
                return Err(MongoError::new(
                    ErrorCode::INDEX_KEY_SPECS_CONFLICT,
                    format!(
                        "An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}",
                        crate::shown::render_doc(&spec),
                        crate::shown::render_doc(same_name)
                    ),
                )
                .into());
            }
            if name != "_id_" && options_only(same_name) != options_only(&spec) {
                return Err(MongoError::new(
                    ErrorCode::INDEX_OPTIONS_CONFLICT,
                    format!(
                        "An existing index has the same name as the requested index. Requested index: {}, existing index: {}",
                        crate::shown::render_doc(&spec),
                        crate::shown::render_doc(same_name)
                    ),
                )
                .into());
            }
            continue;
        }
        if let Some(same_key) = existing.iter().find(|e| {
            e.get_document("key")
                .map(|k| keys_equal(k, &key))
                .unwrap_or(false)
                && options_only(e) == options_only(&spec)
        }) {
            return Err(MongoError::new(
                ErrorCode::INDEX_OPTIONS_CONFLICT,
                format!(
                    "Index already exists with a different name: {}",
                    same_key.get_str("name").unwrap_or("")
                ),
            )
            .into());
        }
        entry.indexes.push(spec.clone());
        added.push(spec);
    }
    if added.is_empty() {
        return Ok((0, None));
    }
    let n = added.len();
    // Everything is validated: now build the indexes' entries.
    for spec in &added {
        match crate::indexes::build(w.txn_mut(), &entry, spec) {
            Ok(()) => {}
            Err(crate::indexes::BuildError::Duplicate(dup)) => {
                let key = spec.get_document("key").cloned().unwrap_or_default();
                let name = spec.get_str("name").unwrap_or("");
                return Err(dup_key_error(coll, name, &key, &dup).into());
            }
            Err(crate::indexes::BuildError::Op(e)) => return Err(e),
        }
    }
    w.save_collection(entry)?;
    let mut last = None;
    for spec in added {
        let mut o = doc! {"createIndexes": &coll.name};
        o.extend(spec);
        last = Some(w.log(EntrySpec::command(&coll.db, Some(coll.uuid), o, None))?);
    }
    Ok((n, last))
}

pub async fn create_indexes(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    check_coll_name(&ctx.db, &coll)?;
    let indexes = ctx
        .opt_array("indexes")?
        .ok_or_else(|| ctx.missing("indexes"))?;
    if indexes.is_empty() {
        return Err(MongoError::bad_value(
            "Must specify at least one index to create",
        ));
    }
    let default_collation = ctx.default_collation(&coll);
    let specs = indexes
        .iter()
        .map(|s| normalize_spec(s, default_collation.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let db = ctx.db.clone();
    // As in MongoDB 7.0, a transaction may index only a collection it created itself.
    if ctx.txn.is_some() && ctx.shard.state().catalog().lookup(&db, &coll).is_some() {
        return Err(MongoError::new(
            crate::txn::OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
            format!(
                "Cannot create new indexes on existing collection {db}.{coll} in a \
                 multi-document transaction."
            ),
        ));
    }
    run_ddl(ctx, move |w| {
        let existed = lookup(w, &db, &coll);
        let created = existed.is_none();
        let c = match existed {
            Some(c) => c,
            None => ensure_collection(w, &db, &coll)?,
        };
        let before = c.all_indexes().len() as i32;
        let (n, ts) = add_indexes(w, &c, specs)?;
        let mut reply = doc! {
            "numIndexesBefore": before,
            "numIndexesAfter": before + n as i32,
            "createdCollectionAutomatically": created,
        };
        if n == 0 {
            reply.insert("note", "all indexes already exist");
        }
        Ok((reply, ts))
    })
    .await
}

pub async fn drop_indexes(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let index = ctx
        .cmd
        .get("index")
        .cloned()
        .ok_or_else(|| ctx.missing("index"))?;
    let db = ctx.db.clone();
    run_ddl(ctx, move |w| {
        let Some(c) = lookup(w, &db, &coll) else {
            return Err(ns_not_found().into());
        };
        let was = c.all_indexes().len() as i32;
        let names: Vec<String> = match &index {
            Bson::String(s) if s == "*" => c
                .indexes
                .iter()
                .filter_map(|s| s.get_str("name").ok().map(str::to_string))
                .collect(),
            Bson::String(s) => vec![s.clone()],
            Bson::Array(a) => a
                .iter()
                .map(|v| match v {
                    Bson::String(s) => Ok(s.clone()),
                    _ => Err(MongoError::type_mismatch(
                        "dropIndexes index names must be strings",
                    )),
                })
                .collect::<Result<_, _>>()?,
            Bson::Document(key) => {
                let found = c.all_indexes().into_iter().find(|s| {
                    s.get_document("key")
                        .map(|k| keys_equal(k, key))
                        .unwrap_or(false)
                });
                match found {
                    Some(s) => vec![s.get_str("name").unwrap_or("").to_string()],
                    None => {
                        return Err(MongoError::new(
                            ErrorCode::INDEX_NOT_FOUND,
                            format!(
                                "can't find index with key: {}",
                                crate::shown::render_doc(key)
                            ),
                        )
                        .into());
                    }
                }
            }
            _ => {
                return Err(MongoError::type_mismatch(
                    "BSON field 'dropIndexes.index' is the wrong type",
                )
                .into());
            }
        };
        let mut entry = (*c).clone();
        let mut dropped = Vec::new();
        for name in &names {
            if name == "_id_" {
                return Err(
                    MongoError::new(ErrorCode::INVALID_OPTIONS, "cannot drop _id index").into(),
                );
            }
            let Some(pos) = entry
                .indexes
                .iter()
                .position(|s| s.get_str("name").ok() == Some(name.as_str()))
            else {
                return Err(MongoError::new(
                    ErrorCode::INDEX_NOT_FOUND,
                    format!("index not found with name [{name}]"),
                )
                .into());
            };
            dropped.push(entry.indexes.remove(pos));
        }
        let mut last = None;
        if !dropped.is_empty() {
            for spec in &dropped {
                crate::indexes::drop_index(w.txn_mut(), &c, spec.get_str("name").unwrap_or(""))?;
            }
            w.save_collection(entry)?;
            for spec in dropped {
                let name = spec.get_str("name").unwrap_or("").to_string();
                last = Some(w.log(EntrySpec::command(
                    &db,
                    Some(c.uuid),
                    doc! {"dropIndexes": &coll, "index": name},
                    Some(spec),
                ))?);
            }
        }
        Ok((doc! {"nIndexesWas": was}, last))
    })
    .await
}

pub fn list_indexes(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let catalog = ctx.shard.state().catalog();
    let Some(c) = catalog.lookup(&ctx.db, &coll) else {
        return Err(MongoError::new(
            ErrorCode::NAMESPACE_NOT_FOUND,
            format!("ns does not exist: {}.{}", ctx.db, coll),
        ));
    };
    let ns = format!("{}.$cmd.listIndexes.{}", ctx.db, coll);
    Ok(Reply::read(cursor_reply(0, &ns, c.all_indexes(), true)))
}

pub async fn coll_mod(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let changes = options_of(&ctx.cmd);
    for (k, _) in &changes {
        if !matches!(
            k.as_str(),
            "validator"
                | "validationLevel"
                | "validationAction"
                | "changeStreamPreAndPostImages"
                | "expireAfterSeconds"
                | "index"
                | "viewOn"
                | "pipeline"
                | "recordPreImages"
                | "dryRun"
                | "cappedSize"
                | "cappedMax"
                | "timeseries"
        ) {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                format!("unknown option to collMod: {k}"),
            ));
        }
    }
    check_pre_and_post_images(&ctx.db, &changes)?;
    crate::validation::check_options("collMod", &ctx.db, &coll, &changes)?;
    let index_change = match changes.get("index") {
        Some(Bson::Document(spec)) => Some(IndexChange::parse(spec)?),
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "collMod 'index' must be an object",
            ));
        }
        None => None,
    };
    if matches!(changes.get("dryRun"), Some(Bson::Boolean(true))) {
        // MongoDB's dry run checks a conversion to unique, which Tributary does not do.
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "dry run mode requires an index modification with unique: true.",
        ));
    }
    let db = ctx.db.clone();
    run_ddl(ctx, move |w| {
        let Some(c) = lookup(w, &db, &coll) else {
            return Err(MongoError::new(
                ErrorCode::NAMESPACE_NOT_FOUND,
                format!("ns does not exist: {db}.{coll}"),
            )
            .into());
        };
        if is_view(&c)
            && let Some(k) = changes.keys().find(|k| {
                matches!(
                    k.as_str(),
                    "validator" | "validationLevel" | "validationAction"
                )
            })
        {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                format!("option not supported on a view: {k}"),
            )
            .into());
        }
        let mut entry = (*c).clone();
        let mut old = entry.options.clone();
        old.insert("uuid", c.uuid);
        let mut o2 = doc! {"collectionOptions_old": old};
        let mut reply = Document::new();
        let capped = entry
            .options
            .get("capped")
            .and_then(as_bool)
            .unwrap_or(false);
        for (k, v) in &changes {
            if matches!(k.as_str(), "cappedSize" | "cappedMax") {
                // A capped collection's limits, which its inserts then keep (`capped`).
                if !capped {
                    return Err(MongoError::new(
                        ErrorCode::INVALID_OPTIONS,
                        format!("{db}.{coll} is not a capped collection"),
                    )
                    .into());
                }
                let n = pipeline::value::as_f64(v).unwrap_or(-1.0);
                let (field, ok) = match k.as_str() {
                    "cappedSize" => ("size", n > 0.0 && n <= 1e15),
                    _ => ("max", (0.0..2_147_483_648.0).contains(&n)),
                };
                if !ok || n.fract() != 0.0 {
                    return Err(MongoError::bad_value(format!(
                        "invalid {k}: {}",
                        wire::capped::for_message(v)
                    ))
                    .into());
                }
                entry.options.insert(field, v.clone());
                continue;
            }
            if k == "index" {
                let Some(change) = &index_change else {
                    continue;
                };
                let pos = entry.indexes.iter().position(|s| change.names(s));
                let Some(pos) = pos else {
                    return Err(MongoError::new(
                        ErrorCode::INDEX_NOT_FOUND,
                        format!("cannot find index {} for ns {db}.{coll}", change.target),
                    )
                    .into());
                };
                if change.hidden.is_some()
                    && entry.indexes.get(pos).and_then(|s| s.get_str("name").ok()) == Some("_id_")
                {
                    return Err(MongoError::bad_value("can't hide _id index").into());
                }
                let mut old_opts = Document::new();
                if let Some(target) = entry.indexes.get_mut(pos) {
                    for (ik, iv) in &change.set {
                        let prev = target.get(ik).cloned();
                        reply.insert(
                            format!("{ik}_old"),
                            prev.clone().unwrap_or(Bson::Boolean(false)),
                        );
                        reply.insert(format!("{ik}_new"), iv.clone());
                        if let Some(p) = prev {
                            old_opts.insert(ik.clone(), p);
                        }
                        target.insert(ik.clone(), iv.clone());
                    }
                }
                o2.insert("indexOptions_old", old_opts);
            } else if k != "dryRun" {
                entry.options.insert(k.clone(), v.clone());
            }
        }
        w.save_collection(entry)?;
        let mut o = doc! {"collMod": &coll};
        o.extend(changes.clone());
        let ts = w.log(EntrySpec::command(&db, Some(c.uuid), o, Some(o2)))?;
        Ok((reply, Some(ts)))
    })
    .await
}

/// The index part of a `collMod`, as MongoDB 7.0 takes it: one index named by `name` or
/// `keyPattern`, and what may change on it in place (`hidden`, which the planner honours, and
/// `expireAfterSeconds`, which the TTL pass reads). Changing `unique` or `prepareUnique`
/// needs a check of every key (and `dryRun` is that check): Tributary refuses them rather
/// than write a flag it would not enforce; any other field is unknown (40415).
struct IndexChange {
    /// How the index was named, for messages.
    target: String,
    name: Option<String>,
    key_pattern: Option<Document>,
    hidden: Option<bool>,
    set: Document,
}

impl IndexChange {
    fn parse(spec: &Document) -> Result<IndexChange, MongoError> {
        let mut change = IndexChange {
            target: String::new(),
            name: None,
            key_pattern: None,
            hidden: None,
            set: Document::new(),
        };
        for (k, v) in spec {
            match (k.as_str(), v) {
                ("name", Bson::String(n)) => change.name = Some(n.clone()),
                ("keyPattern", Bson::Document(p)) => change.key_pattern = Some(p.clone()),
                ("hidden", Bson::Boolean(h)) => {
                    change.hidden = Some(*h);
                    change.set.insert("hidden", *h);
                }
                ("expireAfterSeconds", v) if pipeline::value::is_number(v) => {
                    let n = pipeline::value::as_f64(v).unwrap_or(-1.0);
                    if !(0.0..=2_147_483_647.0).contains(&n) {
                        return Err(MongoError::new(
                            ErrorCode::INVALID_OPTIONS,
                            format!("expireAfterSeconds must be within [0, 2147483647]: {v}"),
                        ));
                    }
                    change.set.insert("expireAfterSeconds", v.clone());
                }
                ("unique" | "prepareUnique" | "forceNonUnique", _) => {
                    return Err(MongoError::new(
                        ErrorCode::COMMAND_NOT_SUPPORTED,
                        format!("collMod index option '{k}' is not supported by Tributary"),
                    ));
                }
                ("name" | "keyPattern" | "hidden" | "expireAfterSeconds", other) => {
                    return Err(MongoError::type_mismatch(format!(
                        "BSON field 'collMod.index.{k}' is the wrong type '{}'",
                        pipeline::value::type_name(other)
                    )));
                }
                _ => {
                    return Err(MongoError::with_code(
                        40415,
                        format!("BSON field 'collMod.index.{k}' is an unknown field."),
                    ));
                }
            }
        }
        match (&change.name, &change.key_pattern) {
            (Some(_), Some(_)) => {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    "Cannot specify both key pattern and name.",
                ));
            }
            (None, None) => {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    "Must specify either index name or key pattern.",
                ));
            }
            (Some(n), None) => change.target = n.clone(),
            (None, Some(p)) => change.target = p.to_string(),
        }
        if change.set.is_empty() {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "no expireAfterSeconds, hidden, unique, or prepareUnique field",
            ));
        }
        Ok(change)
    }

    /// Whether `spec` is the index this change names.
    fn names(&self, spec: &Document) -> bool {
        match (&self.name, &self.key_pattern) {
            (Some(n), _) => spec.get_str("name").ok() == Some(n.as_str()),
            (None, Some(p)) => spec.get_document("key").is_ok_and(|k| keys_equal(k, p)),
            (None, None) => false,
        }
    }
}

pub async fn shard_collection(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let ns = ctx.collection()?;
    let (db, coll) = split_ns(&ns)?;
    check_coll_name(&db, &coll)?;
    let key = ctx.opt_doc("key")?.ok_or_else(|| ctx.missing("key"))?;
    if key.is_empty() {
        return Err(MongoError::bad_value("Shard key cannot be empty"));
    }
    let unique = ctx.bool_or("unique", false)?;
    let uuid = uuid_arg(&ctx.cmd, "collectionUUID")?;
    let is_primary = ctx.bool_or("isPrimary", false)?;
    let num_initial_chunks = ctx.opt_i64("numInitialChunks")?.unwrap_or(0);
    let presplit = ctx.bool_or("presplitHashedZones", false)?;
    let options = ctx.opt_doc("collectionOptions")?.unwrap_or_default();
    run_ddl(ctx, move |w| {
        let c = match lookup(w, &db, &coll) {
            Some(c) => {
                if let Some(u) = uuid
                    && u != c.uuid
                {
                    return Err(MongoError::new(
                        ErrorCode::INVALID_OPTIONS,
                        format!("collection {ns} exists with a different UUID"),
                    )
                    .into());
                }
                c
            }
            None => create_collection(w, &db, &coll, uuid, options)?,
        };
        if let Some(existing) = &c.shard_key {
            if !keys_equal(existing, &key) {
                return Err(MongoError::new(
                    ErrorCode::ALREADY_INITIALIZED,
                    format!("collection {ns} is already sharded with a different key"),
                )
                .into());
            }
            return Ok((
                doc! {"collectionsharded": &ns, "collectionUUID": c.uuid},
                None,
            ));
        }
        // The shard key needs an index (unless `_id` alone, which always has one).
        let mut last = None;
        let id_only = key.len() == 1 && key.contains_key("_id");
        let has_index = c.all_indexes().iter().any(|s| {
            s.get_document("key")
                .map(|k| keys_equal(k, &key))
                .unwrap_or(false)
        });
        let mut entry = (*c).clone();
        if !id_only && !has_index {
            let mut spec = doc! {"v": 2, "key": key.clone(), "name": default_index_name(&key)};
            if unique {
                spec.insert("unique", true);
            }
            let (_, ts) = add_indexes(w, &c, vec![spec])?;
            last = ts;
            if let Some(updated) = lookup(w, &db, &coll) {
                entry = (*updated).clone();
            }
        }
        entry.shard_key = Some(key.clone());
        entry.unique_shard_key = unique;
        w.save_collection(entry)?;
        if is_primary {
            let o2 = doc! {
                "shardCollection": &ns,
                "shardKey": key.clone(),
                "unique": unique,
                "numInitialChunks": num_initial_chunks,
                "presplitHashedZones": presplit,
            };
            last = Some(w.log(EntrySpec::noop(
                ns.clone(),
                Some(c.uuid),
                doc! {"msg": {"shardCollection": &ns}},
                Some(o2),
            ))?);
        }
        Ok((
            doc! {"collectionsharded": &ns, "collectionUUID": c.uuid},
            last,
        ))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_pattern_takes_non_zero_numbers_and_strings_on_paths_without_empty_parts() {
        let spec = |key: Document| Bson::Document(doc! {"key": key, "name": "i"});
        for ok in [
            doc! {"a": 1, "b.c": -1},
            doc! {"a": 1.5},
            doc! {"a": "hashed"},
            doc! {"$**": 1},
        ] {
            assert!(normalize_spec(&spec(ok.clone()), None).is_ok(), "{ok}");
        }
        let refused = |key: Document| {
            let e = normalize_spec(&spec(key), None).expect_err("refused");
            assert_eq!(e.code, ErrorCode::CANNOT_CREATE_INDEX.code);
            e.errmsg
        };
        assert_eq!(
            refused(doc! {".a": {"x": Bson::Null}}),
            "Values in v:2 index key pattern cannot be of type object. Only numbers > 0, \
             numbers < 0, and strings are allowed."
        );
        assert_eq!(
            refused(doc! {"a": 0}),
            "Values in the index key pattern cannot be 0."
        );
        assert_eq!(
            refused(doc! {"a": f64::NAN}),
            "Values in the index key pattern cannot be NaN."
        );
        assert_eq!(
            refused(doc! {"a..b": 1}),
            "Index keys cannot contain an empty field."
        );
        assert_eq!(
            refused(doc! {"": 1}),
            "Index keys cannot be an empty field."
        );
    }
}
