//! Reads of views through the router. The shard holding a view's definition answers a read
//! of it with `CommandOnShardedViewNotSupportedOnMongod` (169) and the view resolved to its
//! source and pipeline (`shard::views`); the router then runs the read again as an
//! aggregation over the source, as mongos does: `find` as `$match` / `$sort` / `$skip` /
//! `$limit` / `$project` after the view's stages, `count` with `$count`, `distinct` with
//! `$unwind` and `$group`.
//!
//! Invariants: the rewritten command keeps the original's session, transaction, read concern,
//! `let` and batch size; a `find` cursor over a view reports the view's namespace, and its
//! getMores are accepted under that namespace.

use bson::{Bson, Document, doc};
use wire::{MongoError, Result};

use super::{Body, Ctx};
use crate::command::Command;

/// Fields of the original command the aggregation keeps beyond what every shard read
/// inherits (`aggregate::INHERITED`).
const CARRIED: [&str; 2] = ["maxTimeMS", "comment"];

/// Runs `ctx`'s read (which met a view) over the view's `source` with `view_pipeline` first.
pub(super) async fn run(
    ctx: &Ctx<'_>,
    source_ns: &str,
    view_pipeline: Vec<Document>,
) -> Result<Body> {
    let source = source_ns
        .strip_prefix(&format!("{}.", ctx.db))
        .unwrap_or(source_ns)
        .to_string();
    let args = ctx.args();
    let mut stages: Vec<Bson> = view_pipeline.into_iter().map(Bson::Document).collect();
    let nonempty = |f: &str| -> Result<Option<Document>> {
        Ok(args.opt_doc(f)?.filter(|d| !d.is_empty()).cloned())
    };
    let positive = |f: &str| -> Result<Option<i64>> {
        Ok(args.opt_i64(f)?.map(i64::saturating_abs).filter(|n| *n > 0))
    };
    let mut cursor = doc! {};
    match ctx.name {
        "find" => {
            if ctx.cmd.contains_key("hint")
                || ctx.cmd.contains_key("min")
                || ctx.cmd.contains_key("max")
            {
                return Err(MongoError::new(
                    wire::ErrorCode::OPTION_NOT_SUPPORTED_ON_VIEW,
                    "hint, min and max are not allowed on a view",
                ));
            }
            if let Some(f) = nonempty("filter")? {
                stages.push(Bson::Document(doc! {"$match": f}));
            }
            if let Some(s) = nonempty("sort")? {
                stages.push(Bson::Document(doc! {"$sort": s}));
            }
            if let Some(n) = args.opt_i64("skip")?.filter(|n| *n > 0) {
                stages.push(Bson::Document(doc! {"$skip": n}));
            }
            if let Some(n) = positive("limit")? {
                stages.push(Bson::Document(doc! {"$limit": n}));
            }
            if let Some(p) = nonempty("projection")? {
                stages.push(Bson::Document(doc! {"$project": p}));
            }
            if let Some(b) = args.opt_i64("batchSize")? {
                cursor.insert("batchSize", b);
            }
        }
        "count" => {
            if let Some(q) = nonempty("query")? {
                stages.push(Bson::Document(doc! {"$match": q}));
            }
            if let Some(n) = args.opt_i64("skip")?.filter(|n| *n > 0) {
                stages.push(Bson::Document(doc! {"$skip": n}));
            }
            if let Some(n) = positive("limit")? {
                stages.push(Bson::Document(doc! {"$limit": n}));
            }
            stages.push(Bson::Document(doc! {"$count": "n"}));
        }
        "distinct" => {
            let key = args.opt_str("key")?.unwrap_or_default().to_string();
            if let Some(q) = nonempty("query")? {
                stages.push(Bson::Document(doc! {"$match": q}));
            }
            let path = format!("${key}");
            stages.push(Bson::Document(
                doc! {"$unwind": {"path": &path, "preserveNullAndEmptyArrays": false}},
            ));
            stages.push(Bson::Document(
                doc! {"$group": {"_id": null, "values": {"$addToSet": &path}}},
            ));
        }
        _ => {
            stages.extend(args.array("pipeline")?.iter().cloned());
            if let Some(c) = args.opt_doc("cursor")? {
                cursor = c.clone();
            }
        }
    }
    let mut agg = doc! {"aggregate": &source, "pipeline": stages, "cursor": cursor};
    for &f in super::aggregate::INHERITED.iter().chain(&CARRIED) {
        if let Some(v) = ctx.cmd.get(f) {
            agg.insert(f, v.clone());
        }
    }
    let inner = Ctx {
        cmd: &agg,
        name: "aggregate",
        command: Some(Command::Aggregate),
        ..*ctx
    };
    let reply = match super::aggregate::aggregate(&inner).await? {
        Body::Document(d) => d,
        // The first batch, encoded: decoded to answer `count` and `distinct` and to name the
        // view's namespace.
        raw @ Body::Raw(_) => raw.into_document()?,
        stream => return Ok(stream),
    };
    let view_ns = format!("{}.{}", ctx.db, args.collection().unwrap_or_default());
    match ctx.name {
        "count" => {
            let n = first_batch(&reply)
                .first()
                .and_then(|d| d.get("n"))
                .and_then(pipeline::value::as_i64_exact)
                .unwrap_or(0);
            Ok(Body::Document(doc! {"n": n as i32, "ok": 1.0}))
        }
        "distinct" => {
            let mut values: Vec<Bson> = first_batch(&reply)
                .first()
                .and_then(|d| d.get_array("values").ok())
                .cloned()
                .unwrap_or_default();
            values.sort_by(pipeline::value::compare);
            Ok(Body::Document(doc! {"values": values, "ok": 1.0}))
        }
        _ => Ok(Body::Document(renamed(ctx, reply, &view_ns).await)),
    }
}

fn first_batch(reply: &Document) -> Vec<Document> {
    reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(|b| b.iter().filter_map(|d| d.as_document().cloned()).collect())
        .unwrap_or_default()
}

/// The reply (and the router cursor behind it) under the view's namespace.
async fn renamed(ctx: &Ctx<'_>, mut reply: Document, view_ns: &str) -> Document {
    if let Ok(cursor) = reply.get_document_mut("cursor") {
        cursor.insert("ns", view_ns);
        if let Ok(id) = cursor.get_i64("id")
            && id != 0
            && let Ok(c) = ctx.seams.cursors.get(id)
        {
            c.lock().await.ns = view_ns.to_string();
        }
    }
    reply
}
