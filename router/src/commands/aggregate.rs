//! The aggregations the router runs itself, in whole or in part: pipelines over a collection
//! split between the shards and the router, pipelines that read other collections (`$lookup`,
//! `$unionWith`, `$graphLookup`), and `aggregate: 1` on a database (`$documents`,
//! `$listLocalSessions`, `$currentOp`).
//!
//! A collection's documents reach the router through `pipeline::agg::split`: the shards run the
//! prefix (an `aggregate` command; a plain `find` when the prefix is only `$match`), the router
//! merges their cursors (in the prefix's `$sort` order when it ends with one) and runs the rest
//! (`run_stages`). Other collections are read when the stage that names them comes, with their
//! own routing, and handed to it as `pipeline::agg::lookup::Foreign`: a `$lookup` on
//! `localField`/`foreignField`, or with a sub-pipeline whose first `$match` equates a foreign
//! field with a `let` variable, reads only the foreign documents its input can join (by `$in`
//! on the join values, which the shards answer through their indexes, routed by the foreign
//! shard key); a `$unionWith` runs its sub-pipeline as an aggregate of its own over its
//! collection (split between that collection's shards and the router); `$graphLookup` reads
//! what its search reaches, level by level; other correlated lookups (and `$facet`s that read
//! elsewhere) read their collections whole.
//!
//! Invariants:
//! * Every shard read carries the command's session, transaction, read concern and `let`, so a
//!   pipeline reads its own transaction's writes and one snapshot.
//! * A collection that does not exist reads as empty; a view reads as its pipeline over its
//!   source (the shard answers 169 with the view resolved, as for any read of a view).
//! * A pipeline that reads other collections never runs on a shard alone: a shard cannot see
//!   other shards' collections.

use std::collections::VecDeque;
use std::sync::Arc;

use bson::{Bson, Document, doc};
use pipeline::agg::lookup::{self, Foreign};
use pipeline::agg::{Pipeline, split};
use pipeline::changestream::split::document_size;
use pipeline::expr::Env;
use pipeline::sort::SortSpec;
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::validate_collection_name;
use super::find::{Targets, read_targets};
use crate::cursors::{CursorState, Merge, RouterCursor, Run, Source};
use crate::local_sessions::Which;

/// The command fields a shard read inherits: session, transaction, snapshot, variables.
pub(super) const INHERITED: &[&str] = &[
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "readConcern",
    "let",
];

/// How many join values one read of a `$lookup`'s foreign collection asks for.
const JOIN_VALUES_PER_READ: usize = 1_000;

/// Runs `parsed` over `input` on the router, reading the other collections its stages name
/// as each stage comes: a `$lookup` on `localField`/`foreignField` (or a correlated `$eq` on a
/// `let` variable) reads only the foreign documents that can join the documents reaching it
/// (their join values, `$in` chunks, routed by the foreign shard key where it is one, through
/// the shards' indexes); a `$unionWith` runs
/// its sub-pipeline over its collection as an aggregate of its own; a `$graphLookup` reads the
/// documents its search reaches, level by level (`$in` on each level's values); every other
/// stage that reads a collection reads it whole, once per run.
pub(super) async fn run_stages(
    ctx: &Ctx<'_>,
    parsed: &Pipeline,
    input: Vec<Document>,
    env: &Env,
) -> Result<Vec<Document>> {
    let mut whole = Arc::new(Foreign::default());
    let mut docs = input;
    for stage in parsed.stages() {
        if !lookup::reads_other_collections(stage) {
            docs = stage.run_in(docs, env)?;
            continue;
        }
        if let Some((coll, stages)) = lookup::union_with_aggregate(stage) {
            docs.extend(Box::pin(aggregate_of(ctx, coll, stages, env)).await?);
            continue;
        }
        let joined = match lookup::join_prefetch(stage, &docs, JOIN_VALUES_PER_READ, env)? {
            Some((from, filters)) => {
                let docs = read_foreign(ctx, &from, &filters, env).await?;
                Some((from, docs))
            }
            None => match lookup::GraphPrefetch::start(stage, &docs, env)? {
                Some(mut search) => {
                    while let Some(filters) = search.next_filters(JOIN_VALUES_PER_READ) {
                        let level = read_foreign(ctx, search.from(), &filters, env).await?;
                        search.found(level)?;
                    }
                    let from = search.from().to_string();
                    Some((from, search.into_docs()))
                }
                None => None,
            },
        };
        let foreign = match joined {
            Some((from, docs)) => {
                ctx.router
                    .metrics
                    .foreign_documents_read(true, docs.len() as u64);
                let mut joined = Foreign::default();
                joined.insert(from, docs);
                Arc::new(joined)
            }
            None => {
                // One after another: inside a transaction, the first read of a shard starts
                // it there.
                for name in lookup::stage_foreign_collections(stage) {
                    if whole.get(&name).is_none() {
                        let docs = read_foreign(ctx, &name, &[Document::new()], env).await?;
                        ctx.router
                            .metrics
                            .foreign_documents_read(false, docs.len() as u64);
                        Arc::make_mut(&mut whole).insert(name, docs);
                    }
                }
                whole.clone()
            }
        };
        let env = Env {
            foreign: Some(foreign),
            ..env.clone()
        };
        docs = stage.run_in(docs, &env)?;
    }
    Ok(docs)
}

/// `stages` over collection `coll` as an aggregate of its own (what a `$unionWith` adds): split
/// between the shards that hold it and the router. A view runs them over its documents.
async fn aggregate_of(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
    env: &Env,
) -> Result<Vec<Document>> {
    validate_collection_name(ctx.db, coll)?;
    let parsed = Pipeline::parse_with_vars(stages, &env.names())?;
    let filter = super::explain::leading_match_of(stages);
    let routed = read_targets(ctx, coll, &filter).await?;
    if routed.shards.is_empty() {
        return parsed.run_in(Vec::new(), env);
    }
    match run_split(ctx, coll, stages, &parsed, env, &routed, &filter).await {
        Err(e) => match shard::views::resolved(&e) {
            Some((source_ns, pipeline)) => {
                let docs = read_view(ctx, &source_ns, &pipeline, env).await?;
                parsed.run_in(docs, env)
            }
            None => Err(e),
        },
        done => done,
    }
}

/// The documents of collection `name` that pass any of `filters` (each read with its own
/// routing, under the command's collation), each once. A view reads whole: its pipeline over
/// its source, which is what every filter would have been applied to.
async fn read_foreign(
    ctx: &Ctx<'_>,
    name: &str,
    filters: &[Document],
    env: &Env,
) -> Result<Vec<Document>> {
    validate_collection_name(ctx.db, name)?;
    let mut out = Vec::new();
    for filter in filters {
        let routed = read_targets(ctx, name, filter).await?;
        if routed.shards.is_empty() {
            continue;
        }
        let mut find = doc! {"find": name, "filter": filter.clone()};
        if let Some(c) = ctx.cmd.get("collation") {
            find.insert("collation", c.clone());
        }
        match read_merged(ctx, name, &routed, find, None).await {
            Ok(docs) => out.extend(docs),
            Err(e) => match shard::views::resolved(&e) {
                Some((source_ns, pipeline)) => {
                    return read_view(ctx, &source_ns, &pipeline, env).await;
                }
                None => return Err(e),
            },
        }
    }
    if filters.len() > 1 {
        // A document whose foreign field is an array can pass two chunks' filters.
        out.sort_by(|a, b| pipeline::value::compare(id(a), id(b)));
        out.dedup_by(|a, b| pipeline::value::compare(id(a), id(b)).is_eq());
    }
    Ok(out)
}

fn id(d: &Document) -> &Bson {
    d.get("_id").unwrap_or(&Bson::Null)
}

/// The documents of a view named by `$lookup` / `$unionWith` / `$graphLookup`: its resolved
/// pipeline run over every document of its source.
async fn read_view(
    ctx: &Ctx<'_>,
    source_ns: &str,
    pipeline: &[Document],
    env: &Env,
) -> Result<Vec<Document>> {
    let source = source_ns
        .strip_prefix(&format!("{}.", ctx.db))
        .unwrap_or(source_ns)
        .to_string();
    let routed = read_targets(ctx, &source, &Document::new()).await?;
    let docs = if routed.shards.is_empty() {
        Vec::new()
    } else {
        let find = doc! {"find": &source, "filter": {}};
        read_merged(ctx, &source, &routed, find, None).await?
    };
    Pipeline::parse_with_vars(pipeline, &env.names())?.run_in(docs, env)
}

/// Whether the pipeline must run on the router even over one shard's collection.
pub(super) fn needs_router(parsed: &Pipeline) -> bool {
    parsed.stages().iter().any(lookup::reads_other_collections)
}

/// Runs `stages` over `coll`: the shards run their part, the router merges and runs the rest.
/// `filter` is the pipeline's leading `$match` (what a `find` asks the shards for).
pub(super) async fn run_split(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
    parsed: &Pipeline,
    env: &Env,
    routed: &Targets,
    filter: &Document,
) -> Result<Vec<Document>> {
    let (merge, merger) = open_split(ctx, coll, stages, parsed, env, routed, filter, true).await?;
    let merged = drain(ctx, merge).await?;
    run_stages(ctx, &merger, merged, env).await
}

/// The cursor of `stages` over `coll` when no stage reads another collection: the shards run
/// their part, and the router runs the rest over the merge of their cursors as the client
/// reads (see [`Run`]), holding neither its input nor its output whole.
pub(super) async fn open_run(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
    parsed: &Pipeline,
    env: &Env,
    routed: &Targets,
    filter: &Document,
) -> Result<Run> {
    let (merge, merger) = open_split(ctx, coll, stages, parsed, env, routed, filter, false).await?;
    Ok(Run::new(merge, merger.push_run(env)))
}

/// Sends the shards' part of `stages` (a `find` when it is only `$match`) and opens the merge
/// of their cursors, in the order of the part's final `$sort`; returns it with the router's
/// part. `whole` asks the shards for everything in their first replies.
#[allow(clippy::too_many_arguments)]
async fn open_split(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
    parsed: &Pipeline,
    env: &Env,
    routed: &Targets,
    filter: &Document,
    whole: bool,
) -> Result<(Merge, Pipeline)> {
    let split = split::split(stages, parsed);
    // The shards' part runs under the command's collation, variables and disk use.
    let with_context = |mut cmd: Document| {
        for field in ["collation", "let", "allowDiskUse"] {
            if let Some(v) = ctx.cmd.get(field) {
                cmd.insert(field, v.clone());
            }
        }
        cmd
    };
    let merge = if split.shards.iter().all(|s| s.contains_key("$match")) {
        let find = with_context(doc! {"find": coll, "filter": filter.clone()});
        open_merge(ctx, coll, routed, find, None, whole).await?
    } else {
        let shards_part: Vec<Bson> = split.shards.iter().cloned().map(Bson::Document).collect();
        let cmd = with_context(doc! {"aggregate": coll, "pipeline": shards_part, "cursor": {}});
        let sort = split
            .merge_sort
            .as_ref()
            .map(SortSpec::parse)
            .transpose()?
            .map(|s| s.with_collation(env.collation.clone()));
        open_merge(ctx, coll, routed, cmd, sort, whole).await?
    };
    let merger = Pipeline::parse_with_vars(&split.merger, &env.names())?;
    Ok((merge, merger))
}

/// Sends `cmd` (a `find` or `aggregate` of `coll`) to the shards `routed` names and opens the
/// merge of their cursors, in `sort` order (or one shard after another). `whole` asks for
/// everything in the first replies; otherwise the shards' first batches are their default.
async fn open_merge(
    ctx: &Ctx<'_>,
    coll: &str,
    routed: &Targets,
    mut cmd: Document,
    sort: Option<SortSpec>,
    whole: bool,
) -> Result<Merge> {
    if whole {
        if cmd.contains_key("find") {
            cmd.insert("batchSize", i32::MAX);
        } else {
            cmd.insert("cursor", doc! {"batchSize": i32::MAX});
        }
    }
    cmd.insert("shardVersion", routed.version.clone());
    for field in INHERITED {
        if let Some(v) = ctx.cmd.get(*field) {
            cmd.insert(*field, v.clone());
        }
    }
    let targets = &routed.shards;
    let replies = ctx.router.broadcast_read(targets, ctx.db, &cmd).await;
    let mut sources = Vec::with_capacity(targets.len());
    for (shard, reply) in targets.iter().zip(replies) {
        sources.push(Source::from_reply(*shard, &reply?)?);
    }
    Ok(Merge {
        db: ctx.db.to_string(),
        collection: coll.to_string(),
        sources,
        sort,
        skip: 0,
        limit: None,
        projection: None,
        await_data: false,
        max_await_ms: None,
    })
}

/// Sends `cmd` (a `find` or `aggregate` of `coll`) to the shards `routed` names and reads every
/// document of their cursors, merged in `sort` order (or one shard after another).
pub(super) async fn read_merged(
    ctx: &Ctx<'_>,
    coll: &str,
    routed: &Targets,
    cmd: Document,
    sort: Option<SortSpec>,
) -> Result<Vec<Document>> {
    let merge = open_merge(ctx, coll, routed, cmd, sort, true).await?;
    drain(ctx, merge).await
}

/// Every document of `merge`. What the router holds of them at once is a blocking stage's
/// memory: past the sort limit it is 292 unless the command allows disk use.
async fn drain(ctx: &Ctx<'_>, merge: Merge) -> Result<Vec<Document>> {
    let mut all = RouterCursor {
        ns: format!("{}.{}", merge.db, merge.collection),
        state: CursorState::merge(merge),
        info: None,
    };
    let limit = (!matches!(ctx.cmd.get("allowDiskUse"), Some(Bson::Boolean(true))))
        .then(pipeline::agg::spill::sort_limit);
    let mut docs = Vec::new();
    let mut bytes = 0_usize;
    loop {
        let read = all.next_batch(ctx.router, usize::MAX, None).await;
        let (batch, exhausted) = match read {
            Ok(read) => read,
            Err(e) => {
                all.kill(ctx.router).await;
                return Err(e);
            }
        };
        bytes += batch.iter().map(document_size).sum::<usize>();
        docs.extend(batch);
        if let Some(limit) = limit.filter(|l| bytes > *l) {
            all.kill(ctx.router).await;
            return Err(MongoError::new(
                ErrorCode::QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED,
                format!(
                    "The documents the router gathers for this pipeline exceeded the memory \
                     limit of {limit} bytes, but it did not opt in to using more. Pass \
                     allowDiskUse:true to opt in."
                ),
            ));
        }
        if exhausted {
            return Ok(docs);
        }
    }
}

/// `aggregate: 1` on a database: the first stage makes the documents.
pub(super) async fn collectionless(ctx: &Ctx<'_>, stages: &[Document]) -> Result<Document> {
    let Some(first) = stages.first() else {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            "{aggregate: 1} is not valid for an empty pipeline.",
        ));
    };
    let name = first.keys().next().map(String::as_str).unwrap_or("");
    let (stages, sink) = super::out::split(stages, ctx.db)?;
    if sink.is_some() {
        super::out::check_allowed(ctx)?;
    }
    let env = Env::from_command(ctx.cmd)?;
    let (input, rest) = match name {
        "$currentOp" if sink.is_none() => {
            return super::current_op::aggregate(ctx, &stages).await;
        }
        "$documents" => (Vec::new(), &stages[..]),
        "$listLocalSessions" => (list_local_sessions(ctx, first)?, &stages[1..]),
        other => {
            return Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!("{{aggregate: 1}} is not valid for '{other}'; a collection is required."),
            ));
        }
    };
    let parsed = Pipeline::parse_with_vars(rest, &env.names())?;
    let out = run_stages(ctx, &parsed, input, &env).await?;
    let ns = format!("{}.$cmd.aggregate", ctx.db);
    if let Some(sink) = &sink {
        super::out::write(ctx, sink, out).await?;
        return Ok(doc! {"cursor": {"firstBatch": [], "id": 0_i64, "ns": ns}, "ok": 1.0});
    }
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: CursorState::Buffered(VecDeque::from(out)),
        info: None,
    };
    let batch = super::find::batch_size(ctx, ctx.args().opt_doc("cursor")?)?;
    super::find::first_reply(ctx, ns, cursor, batch).await
}

/// `$listLocalSessions: {}` (the caller's sessions), `{allUsers: true}` or
/// `{users: [{user, db}, ...]}`.
fn list_local_sessions(ctx: &Ctx<'_>, stage: &Document) -> Result<Vec<Document>> {
    let spec = match stage.get("$listLocalSessions") {
        Some(Bson::Document(d)) => d,
        Some(other) => {
            return Err(MongoError::type_mismatch(format!(
                "$listLocalSessions options must be specified in an object, but found: {}",
                super::args::type_name(other)
            )));
        }
        None => return Err(MongoError::internal("no $listLocalSessions stage")),
    };
    let mut all_users = false;
    let mut users = None;
    for (k, v) in spec {
        match (k.as_str(), v) {
            ("allUsers", Bson::Boolean(b)) => all_users = *b,
            ("users", Bson::Array(list)) => {
                let mut names = Vec::with_capacity(list.len());
                for u in list {
                    let (Some(user), Some(db)) = (
                        u.as_document().and_then(|d| d.get_str("user").ok()),
                        u.as_document().and_then(|d| d.get_str("db").ok()),
                    ) else {
                        return Err(MongoError::with_code(
                            40414,
                            "BSON field 'ListSessionsUser.user' is missing but a required field",
                        ));
                    };
                    names.push(format!("{user}@{db}"));
                }
                users = Some(names);
            }
            ("allUsers" | "users", other) => {
                return Err(MongoError::type_mismatch(format!(
                    "BSON field '$listLocalSessions.{k}' is the wrong type '{}'",
                    super::args::type_name(other)
                )));
            }
            _ => {
                return Err(MongoError::with_code(
                    40415,
                    format!("BSON field '$listLocalSessions.{k}' is an unknown field."),
                ));
            }
        }
    }
    let which = match (all_users, users) {
        (true, Some(_)) => {
            return Err(MongoError::bad_value(
                "$listLocalSessions may not specify both allUsers and users",
            ));
        }
        (true, None) => Which::All,
        (false, Some(users)) => Which::Users(users),
        (false, None) => Which::Users(vec![super::session_user(ctx.router, ctx.conn)]),
    };
    Ok(ctx
        .router
        .local_sessions
        .list(&which, bson::DateTime::now()))
}
