//! `explain` (and `aggregate` with `explain: true`) on the router: which shards a command
//! reaches and what each does, in mongos's layout: `queryPlanner.winningPlan` is
//! `SINGLE_SHARD`, `SHARD_MERGE`, `SHARD_MERGE_SORT` or `SHARD_WRITE` over the shards' own
//! plans (`shard::commands::explain`), and an aggregate shows how it is split between the
//! shards and the router.
//!
//! Invariants: the shards are chosen by the same routing as the command itself, and asked to
//! explain exactly what the command would send them; nothing is written.

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::validate_collection_name;
use super::reads::{leading_match, read_targets};
use crate::kernel::transport::Shards;

/// The documents an explained command's filter selects: `(collection, filter)`.
fn target_of(name: &str, inner: &Document) -> Result<(String, Document)> {
    let coll = match inner.get(name) {
        Some(Bson::String(c)) => c.clone(),
        _ => {
            return Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!("explain of {name} needs a collection name"),
            ));
        }
    };
    let sub = |d: &Document, f: &str| d.get_document(f).cloned().unwrap_or_default();
    let first = |field: &str| {
        inner
            .get_array(field)
            .ok()
            .and_then(|a| a.first())
            .and_then(Bson::as_document)
            .map(|s| sub(s, "q"))
            .unwrap_or_default()
    };
    let filter = match name {
        "find" => sub(inner, "filter"),
        "count" | "distinct" | "findAndModify" | "findandmodify" => sub(inner, "query"),
        "update" => first("updates"),
        "delete" => first("deletes"),
        "aggregate" => leading_match(inner),
        other => {
            return Err(MongoError::new(
                ErrorCode::COMMAND_NOT_FOUND,
                format!("Explain failed due to unknown command: {other}"),
            ));
        }
    };
    Ok((coll, filter))
}

/// `explain: {<command>}, verbosity`.
pub(super) async fn explain(ctx: &Ctx<'_>) -> Result<Document> {
    let inner = match ctx.cmd.get("explain") {
        Some(Bson::Document(d)) => d.clone(),
        _ => {
            return Err(MongoError::type_mismatch(
                "explain takes a command document",
            ));
        }
    };
    let verbosity = shard::commands::explain::verbosity(ctx.cmd)?;
    run(ctx, inner, &verbosity).await
}

/// `aggregate` with `explain: true`: the plan at `queryPlanner` verbosity.
pub(super) async fn aggregate(ctx: &Ctx<'_>) -> Result<Document> {
    let mut inner = ctx.cmd.clone();
    inner.remove("explain");
    run(ctx, inner, "queryPlanner").await
}

async fn run(ctx: &Ctx<'_>, inner: Document, verbosity: &str) -> Result<Document> {
    let name = inner.keys().next().cloned().unwrap_or_default();
    if name == "aggregate"
        && pipeline::value::as_f64(inner.get("aggregate").unwrap_or(&Bson::Null)) == Some(1.0)
    {
        return collectionless(ctx, inner);
    }
    let (coll, filter) = target_of(&name, &inner)?;
    validate_collection_name(ctx.db, &coll)?;
    let routed = read_targets(ctx, &coll, &filter).await?;
    let targets = &routed.shards;
    let is_aggregate = name == "aggregate";
    // A sharded aggregate (or one reading other collections) is split: the shards run a
    // prefix, the router the rest (`super::aggregate::run_split`).
    let plan = if is_aggregate {
        let stages: Vec<Document> = inner
            .get_array("pipeline")
            .map(|p| p.iter().filter_map(Bson::as_document).cloned().collect())
            .unwrap_or_default();
        let (stages, _) = super::out::split(&stages, ctx.db)?;
        let env = pipeline::expr::Env::from_command(&inner)?;
        let parsed = pipeline::agg::Pipeline::parse_with_vars(&stages, &env.names())?;
        let splits = routed.sharded || targets.len() > 1 || super::reads::needs_router(&parsed);
        splits.then(|| pipeline::agg::split::split(&stages, &parsed))
    } else {
        None
    };
    let shard_inner = match &plan {
        Some(p) if p.shards.iter().all(|s| s.contains_key("$match")) => {
            doc! {"find": &coll, "filter": &filter}
        }
        Some(p) => {
            let shards_part: Vec<Bson> = p.shards.iter().cloned().map(Bson::Document).collect();
            doc! {"aggregate": &coll, "pipeline": shards_part, "cursor": {}}
        }
        None => inner.clone(),
    };
    let shard_cmd = doc! {"explain": routed.command(&shard_inner), "verbosity": verbosity};
    let replies = ctx
        .seams
        .shards()
        .broadcast_read(targets, ctx.db, &shard_cmd)
        .await;
    let mut shards = Vec::with_capacity(targets.len());
    for (i, reply) in targets.iter().zip(replies) {
        let reply = reply?;
        if let Some(e) = MongoError::from_reply(&reply) {
            return Err(e);
        }
        shards.push((
            ctx.seams.transport.name(*i).unwrap_or_default().to_string(),
            reply,
        ));
    }
    let server_info = doc! {
        "host": ctx.seams.options.advertised_host.clone(),
        "version": "7.0.0",
        "gitVersion": "tributary",
    };
    let mut out = doc! {"explainVersion": "1"};
    if is_aggregate {
        out.insert("mergeType", "mongos");
        if let Some(p) = &plan {
            out.insert("splitPipeline", pipeline::agg::split::explain(p));
        } else {
            out.insert("splitPipeline", Bson::Null);
        }
        let mut by_shard = Document::new();
        for (name, reply) in shards {
            by_shard.insert(name, strip(reply));
        }
        out.insert("shards", by_shard);
    } else {
        let stage = match (targets.len(), name.as_str()) {
            (0, _) => "EOF",
            (_, "update" | "delete" | "findAndModify" | "findandmodify") => "SHARD_WRITE",
            (1, _) => "SINGLE_SHARD",
            (_, "find") if inner.get_document("sort").is_ok_and(|s| !s.is_empty()) => {
                "SHARD_MERGE_SORT"
            }
            _ => "SHARD_MERGE",
        };
        out.insert("queryPlanner", query_planner(stage, &shards));
        if verbosity != "queryPlanner" {
            out.insert("executionStats", execution_stats(stage, &shards));
        }
    }
    out.insert("serverInfo", server_info);
    out.insert("command", inner);
    out.insert("ok", 1.0);
    Ok(out)
}

/// `explain` of `aggregate: 1`: no shard is read first; the router runs the whole pipeline,
/// whose stages (checked as the command would check them) are the plan.
fn collectionless(ctx: &Ctx<'_>, inner: Document) -> Result<Document> {
    let stages: Vec<Document> = inner
        .get_array("pipeline")
        .map(|p| p.iter().filter_map(Bson::as_document).cloned().collect())
        .unwrap_or_default();
    let Some(first) = stages.first().and_then(|s| s.keys().next()) else {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            "{aggregate: 1} is not valid for an empty pipeline.",
        ));
    };
    if !matches!(
        first.as_str(),
        "$documents" | "$currentOp" | "$listLocalSessions" | "$changeStream"
    ) {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("{{aggregate: 1}} is not valid for '{first}'; a collection is required."),
        ));
    }
    let (rest, _) = super::out::split(&stages, ctx.db)?;
    if first == "$documents" {
        let env = pipeline::expr::Env::from_command(&inner)?;
        pipeline::agg::Pipeline::parse_with_vars(&rest, &env.names())?;
    }
    let server_info = doc! {
        "host": ctx.seams.options.advertised_host.clone(),
        "version": "7.0.0",
        "gitVersion": "tributary",
    };
    let plan: Vec<Bson> = stages.into_iter().map(Bson::Document).collect();
    Ok(doc! {
        "explainVersion": "1",
        "mergeType": "mongos",
        "stages": plan,
        "serverInfo": server_info,
        "command": inner,
        "ok": 1.0,
    })
}

/// A shard's reply without what the router's own reply carries.
fn strip(mut reply: Document) -> Document {
    for field in [
        "ok",
        "$clusterTime",
        "operationTime",
        "command",
        "explainVersion",
    ] {
        reply.remove(field);
    }
    reply
}

fn query_planner(stage: &str, shards: &[(String, Document)]) -> Document {
    let plans: Vec<Bson> = shards
        .iter()
        .map(|(name, reply)| {
            let mut plan = doc! {"shardName": name};
            if let Ok(qp) = reply.get_document("queryPlanner") {
                plan.extend(qp.clone());
            }
            if let Ok(info) = reply.get_document("serverInfo") {
                plan.insert("serverInfo", info.clone());
            }
            Bson::Document(plan)
        })
        .collect();
    doc! {
        "mongosPlannerVersion": 1,
        "winningPlan": {"stage": stage, "shards": plans},
    }
}

fn execution_stats(stage: &str, shards: &[(String, Document)]) -> Document {
    let mut total = [0i64; 4];
    let per_shard: Vec<Bson> = shards
        .iter()
        .map(|(name, reply)| {
            let stats = reply
                .get_document("executionStats")
                .cloned()
                .unwrap_or_default();
            let field = |f: &str| match stats.get(f) {
                Some(Bson::Int64(n)) => *n,
                Some(Bson::Int32(n)) => i64::from(*n),
                _ => 0,
            };
            let counts = [
                field("nReturned"),
                field("executionTimeMillis"),
                field("totalKeysExamined"),
                field("totalDocsExamined"),
            ];
            for (t, c) in total.iter_mut().zip(counts) {
                *t += c;
            }
            Bson::Document(doc! {
                "shardName": name,
                "executionSuccess": stats.get_bool("executionSuccess").unwrap_or(false),
                "nReturned": counts[0],
                "executionTimeMillis": counts[1],
                "totalKeysExamined": counts[2],
                "totalDocsExamined": counts[3],
                "executionStages": stats.get_document("executionStages").cloned().unwrap_or_default(),
            })
        })
        .collect();
    let [returned, millis, keys, docs] = total;
    doc! {
        "nReturned": returned,
        "executionTimeMillis": millis,
        "totalKeysExamined": keys,
        "totalDocsExamined": docs,
        "executionStages": {
            "stage": stage,
            "nReturned": returned,
            "executionTimeMillis": millis,
            "totalKeysExamined": keys,
            "totalDocsExamined": docs,
            "totalChildMillis": millis,
            "shards": per_shard,
        },
    }
}
