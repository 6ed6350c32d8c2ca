//! `dbStats`, `collStats` and the `$collStats` stage through the router: every shard measures
//! its part (`shard::commands::stats`), the router adds the parts up, as mongos does, and keeps
//! each shard's figures under `raw` (`dbStats`) or `shards` (`collStats`). `validate` likewise:
//! every shard checks its part, and the collection is valid when every part is.
//!
//! Invariants: counts and sizes are sums over the shards that answered (a shard that fails
//! fails the command); `collections` and `views` are the most any shard has (a sharded
//! collection exists on every shard and is counted once); `$collStats` gives one document per
//! shard that has the collection, and `NamespaceNotFound` (26) when none has it.

use bson::{Bson, DateTime, Document, doc};
use wire::raw::Body;
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::validate_collection_name;
use crate::kernel::catalog::Placement;
use crate::kernel::transport::Shards;

fn number(v: Option<&Bson>) -> f64 {
    match v {
        Some(Bson::Double(d)) => *d,
        Some(Bson::Int32(i)) => f64::from(*i),
        Some(Bson::Int64(i)) => *i as f64,
        _ => 0.0,
    }
}

/// The command as shards get it: the router's own fields left out.
fn for_shards(ctx: &Ctx<'_>) -> Document {
    super::crud::forwardable(ctx.cmd)
}

/// Each shard's reply, by name, without `ok` and the gossip.
async fn ask_every_shard(ctx: &Ctx<'_>, cmd: &Document) -> Result<Vec<(String, Document)>> {
    let seams = ctx.seams;
    let names = seams.transport.names();
    let replies = seams
        .shards()
        .broadcast_read(&seams.transport.all(), ctx.db, cmd)
        .await;
    let mut out = Vec::with_capacity(names.len());
    for (name, reply) in names.into_iter().zip(replies) {
        let mut reply = reply?;
        for k in ["ok", "$clusterTime", "operationTime"] {
            reply.remove(k);
        }
        out.push((name, reply));
    }
    Ok(out)
}

/// `dbStats`.
pub(super) async fn db_stats(ctx: &Ctx<'_>) -> Result<Document> {
    crate::kernel::catalog::validate_db_name(ctx.db)?;
    let parts = ask_every_shard(ctx, &for_shards(ctx)).await?;
    let sum = |k: &str| parts.iter().map(|(_, p)| number(p.get(k))).sum::<f64>();
    let most = |k: &str| {
        parts
            .iter()
            .map(|(_, p)| number(p.get(k)) as i64)
            .max()
            .unwrap_or(0)
    };
    let objects = sum("objects") as i64;
    let data = sum("dataSize");
    let scale = parts
        .first()
        .map_or(1.0, |(_, p)| number(p.get("scaleFactor")).max(1.0));
    let mut raw = Document::new();
    for (name, part) in &parts {
        raw.insert(name.clone(), part.clone());
    }
    Ok(doc! {
        "raw": raw,
        "db": ctx.db,
        "collections": most("collections"),
        "views": most("views"),
        "objects": objects,
        "avgObjSize": if objects > 0 { data * scale / objects as f64 } else { 0.0 },
        "dataSize": data,
        "storageSize": sum("storageSize"),
        "indexes": most("indexes"),
        "indexSize": sum("indexSize"),
        "totalSize": sum("totalSize"),
        "scaleFactor": scale as i64,
        "ok": 1.0,
    })
}

/// `collStats`.
pub(super) async fn coll_stats(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?.to_string();
    validate_collection_name(ctx.db, &coll)?;
    let parts = ask_every_shard(ctx, &for_shards(ctx)).await?;
    let sharded = matches!(
        ctx.seams.catalog.placement(ctx.db, &coll, false).await?,
        Placement::Sharded(_)
    );
    let sum = |k: &str| {
        parts
            .iter()
            .map(|(_, p)| number(p.get(k)) as i64)
            .sum::<i64>()
    };
    let (count, size) = (sum("count"), sum("size"));
    let mut index_sizes = Document::new();
    let mut shards = Document::new();
    for (name, part) in &parts {
        if number(part.get("nindexes")) == 0.0 {
            continue; // no such collection on this shard
        }
        if let Ok(sizes) = part.get_document("indexSizes") {
            for (index, s) in sizes {
                let total = number(index_sizes.get(index)) as i64 + number(Some(s)) as i64;
                index_sizes.insert(index.clone(), total);
            }
        }
        shards.insert(name.clone(), part.clone());
    }
    let scale = parts
        .first()
        .map_or(1, |(_, p)| (number(p.get("scaleFactor")) as i64).max(1));
    Ok(doc! {
        "sharded": sharded,
        "shards": shards,
        "ns": format!("{}.{coll}", ctx.db),
        "count": count,
        "size": size,
        "avgObjSize": if count > 0 { size * scale / count } else { 0 },
        "storageSize": sum("storageSize"),
        "nindexes": index_sizes.len() as i32,
        "totalIndexSize": sum("totalIndexSize"),
        "totalSize": sum("totalSize"),
        "indexSizes": index_sizes,
        "scaleFactor": scale,
        "ok": 1.0,
    })
}

/// An `aggregate` whose first stage is `$collStats`: one document per shard holding the
/// collection (`storageStats` and `count` as asked), then the rest of the pipeline.
pub(super) async fn coll_stats_stage(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
) -> Result<Body> {
    let Some(Ok(spec)) = stages.first().map(|s| s.get_document("$collStats")) else {
        return Err(MongoError::failed_to_parse(
            "the $collStats stage specification must be an object",
        ));
    };
    for key in spec.keys() {
        if !matches!(
            key.as_str(),
            "storageStats" | "count" | "latencyStats" | "queryExecStats"
        ) {
            return Err(MongoError::failed_to_parse(format!(
                "unrecognized option to $collStats: {key}"
            )));
        }
    }
    let rest = pipeline::agg::Pipeline::parse(&stages[1..])?;
    let parts = ask_every_shard(ctx, &doc! {"collStats": coll}).await?;
    let ns = format!("{}.{coll}", ctx.db);
    let mut docs = Vec::new();
    for (name, part) in parts {
        if number(part.get("nindexes")) == 0.0 {
            continue;
        }
        let mut d = doc! {
            "ns": &ns,
            "shard": &name,
            "host": &ctx.seams.options.advertised_host,
            "localTime": DateTime::now(),
        };
        if spec.contains_key("storageStats") {
            d.insert("storageStats", part.clone());
        }
        if spec.contains_key("count") {
            d.insert("count", number(part.get("count")) as i64);
        }
        if spec.contains_key("latencyStats") {
            let zero = doc! {"latency": 0_i64, "ops": 0_i64};
            d.insert(
                "latencyStats",
                doc! {"reads": zero.clone(), "writes": zero.clone(), "commands": zero.clone(), "transactions": zero},
            );
        }
        docs.push(d);
    }
    if docs.is_empty() {
        return Err(MongoError::new(
            ErrorCode::NAMESPACE_NOT_FOUND,
            format!(
                "Unable to retrieve storageStats in $collStats stage :: caused by :: Collection [{ns}] not found."
            ),
        ));
    }
    let out = rest.run(docs)?;
    super::reads::buffered_reply(ctx, ns, out).await
}

/// `validate`: every shard that holds the collection checks its part; the collection is
/// valid when every part is. Each shard's report is under `raw`, as mongos shows them.
pub(super) async fn validate(ctx: &Ctx<'_>) -> Result<Document> {
    let coll = ctx.args().collection()?.to_string();
    validate_collection_name(ctx.db, &coll)?;
    let seams = ctx.seams;
    let replies = seams
        .shards()
        .broadcast_read(&seams.transport.all(), ctx.db, &for_shards(ctx))
        .await;
    let (mut raw, mut errors, mut warnings) = (Document::new(), Vec::new(), Vec::new());
    let (mut valid, mut records, mut invalid) = (true, 0i64, 0i64);
    let mut keys_per_index = Document::new();
    for (name, reply) in seams.transport.names().into_iter().zip(replies) {
        let mut reply = match reply {
            // This shard has no part of the collection.
            Err(e) if e.code == ErrorCode::NAMESPACE_NOT_FOUND.code => continue,
            other => other?,
        };
        for k in ["ok", "$clusterTime", "operationTime"] {
            reply.remove(k);
        }
        valid &= reply.get_bool("valid").unwrap_or(false);
        records += number(reply.get("nrecords")) as i64;
        invalid += number(reply.get("nInvalidDocuments")) as i64;
        let tagged = |list: Option<&Vec<Bson>>| -> Vec<Bson> {
            list.into_iter()
                .flatten()
                .filter_map(Bson::as_str)
                .map(|e| Bson::String(format!("{name}: {e}")))
                .collect()
        };
        errors.extend(tagged(reply.get_array("errors").ok()));
        warnings.extend(tagged(reply.get_array("warnings").ok()));
        if let Ok(keys) = reply.get_document("keysPerIndex") {
            for (index, n) in keys {
                let total = number(keys_per_index.get(index)) as i64 + number(Some(n)) as i64;
                keys_per_index.insert(index.clone(), total);
            }
        }
        raw.insert(name, reply);
    }
    if raw.is_empty() {
        return Err(MongoError::new(
            ErrorCode::NAMESPACE_NOT_FOUND,
            format!("Collection '{}.{coll}' does not exist to validate.", ctx.db),
        ));
    }
    Ok(doc! {
        "ns": format!("{}.{coll}", ctx.db),
        "nInvalidDocuments": invalid,
        "nrecords": records,
        "keysPerIndex": keys_per_index,
        "valid": valid,
        "warnings": warnings,
        "errors": errors,
        "raw": raw,
        "ok": 1.0,
    })
}
