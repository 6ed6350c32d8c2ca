//! `aggregate`: a change stream (`$changeStream` first) is opened on `crate::streams`; any other
//! pipeline is forwarded whole to the one shard that can answer it, or run by the router, in
//! whole or in part: pipelines over a collection
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
//! collection (split between that collection's shards and the router), or over nothing when
//! it starts with `$documents`; `$graphLookup` reads what its search reaches, level by level;
//! a `$facet` that reads elsewhere gathers its input once and runs each sub-pipeline over it
//! as a pipeline of its own; other correlated lookups read their collections whole.
//!
//! Memory: the router holds a pipeline's documents as they wait for the next join in a
//! `Spool` (in memory up to the sort limit, then on disk under `allowDiskUse`, 292 without;
//! a `$facet`'s input too, read again by each sub-pipeline), and the streaming stages between
//! joins run as they are read. A `$lookup` or `$graphLookup`
//! joins its input a chunk at a time (`lookup::CHUNK_DOCS`, `lookup::CHUNK_BYTES`), reading the foreign documents of that chunk only; what it reads of a
//! foreign collection is held in memory up to the sort limit. Past it a `$lookup` runs each
//! document's join as a query of its own on the shards (as MongoDB runs every one) when the
//! command allows disk use, and is 292 when it does not; a `$graphLookup` is 40099, as
//! MongoDB 7.0's, which does not spill either.
//!
//! Invariants:
//! * Every shard read carries the command's session, transaction, read concern, and the `let`
//!   variables in force (the command's, and a `$lookup`'s when it queries per document), so a
//!   pipeline reads its own transaction's writes and one snapshot.
//! * A collection that does not exist reads as empty; a view reads as its pipeline over its
//!   source (the shard answers 169 with the view resolved, as for any read of a view).
//! * A pipeline that reads other collections never runs on a shard alone: a shard cannot see
//!   other shards' collections.

use std::collections::VecDeque;
use std::sync::Arc;

use bson::{Bson, Document, doc};
use pipeline::agg::lookup::{self, Foreign, GraphPrefetch, UnionSource};
use pipeline::agg::spill::{Spool, sort_limit};
use pipeline::agg::{Docs, FacetOutput, Pipeline, Stage, split};
use pipeline::changestream::split::document_size;
use pipeline::expr::Env;
use pipeline::sort::SortSpec;
use resume::token::ResumeToken;
use shard::sharding::ShardId;
use wire::raw::{Body, CursorBody};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::validate_collection_name;
use super::reads::{Targets, batch_size, cursor_reply, first_reply, needs_router, read_targets};
use crate::cursors::{CursorState, Merge, RouterCursor, Run, Source};
use crate::kernel::transport::Shards;
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

/// What the 292 of the router's spools names.
const GATHERED: &str = "The documents the router gathers for this pipeline";

/// The largest array of documents one `$lookup` may join to a document (MongoDB's 4568).
const MAX_JOINED_BYTES: usize = 16 * 1024 * 1024 + 16 * 1024;

/// Runs `parsed` over `input` on the router, reading the other collections its stages name
/// as each stage comes (see the module's notes on memory); the output is read lazily.
pub(super) async fn run_stages(
    ctx: &Ctx<'_>,
    parsed: &Pipeline,
    input: Docs,
    env: &Env,
) -> Result<Docs> {
    let mut whole = Whole::default();
    let mut docs = input;
    let mut streaming = Vec::new();
    for stage in parsed.stages() {
        if !lookup::reads_other_collections(stage) {
            streaming.push(stage.clone());
            continue;
        }
        docs = Pipeline::from_stages(std::mem::take(&mut streaming)).stream(docs, env)?;
        docs = match stage {
            Stage::Lookup(_) | Stage::GraphLookup(_) => {
                let mut out = Spool::new(GATHERED, env.allow_disk_use);
                loop {
                    let chunk = next_chunk(&mut docs)?;
                    if chunk.is_empty() {
                        break;
                    }
                    Box::pin(join_chunk(ctx, stage, chunk, env, &mut whole, &mut out)).await?;
                }
                Box::new(out.finish()?)
            }
            Stage::UnionWith(_) => {
                // What the input passes on as it is, then what the stage adds.
                let mut out = Spool::new(GATHERED, env.allow_disk_use);
                out.extend(docs)?;
                let theirs = match lookup::union_source(stage) {
                    Some(UnionSource::Collection(coll, stages)) => {
                        Box::pin(aggregate_of(ctx, coll, stages, env)).await?
                    }
                    Some(UnionSource::Documents(made)) => {
                        Box::pin(run_stages(ctx, made, Box::new(std::iter::empty()), env)).await?
                    }
                    None => return Err(MongoError::internal("a $unionWith reads nothing")),
                };
                out.extend(theirs)?;
                Box::new(out.finish()?)
            }
            Stage::Facet(facets) => Box::pin(facet(ctx, facets, docs, env)).await?,
            other => {
                return Err(MongoError::internal(format!(
                    "{} reads other collections but the router cannot run it",
                    other.name()
                )));
            }
        };
    }
    Pipeline::from_stages(streaming).stream(docs, env)
}

/// A `$facet` whose sub-pipelines read other collections: its input is gathered once (on
/// disk past the limit under `allowDiskUse`), and each sub-pipeline runs over all of it in
/// turn as a pipeline of its own, its joins reading what they join (not whole collections).
async fn facet(
    ctx: &Ctx<'_>,
    facets: &[(String, Pipeline)],
    docs: Docs,
    env: &Env,
) -> Result<Docs> {
    let mut input = Spool::new(GATHERED, env.allow_disk_use);
    input.extend(docs)?;
    let input = input.replay()?;
    let mut output = FacetOutput::new(facets.iter().map(|(name, _)| name.clone()));
    for (i, (_, sub)) in facets.iter().enumerate() {
        for doc in run_stages(ctx, sub, Box::new(input.pass()), env).await? {
            output.keep(i, [doc?])?;
        }
    }
    Ok(Box::new(std::iter::once(Ok(output.finish()))))
}

/// The next chunk of a join's input (see `lookup::CHUNK_DOCS`); empty at the end.
fn next_chunk(docs: &mut Docs) -> Result<Vec<Document>> {
    let mut chunk = Vec::new();
    let mut bytes = 0;
    while chunk.len() < lookup::CHUNK_DOCS && bytes < lookup::CHUNK_BYTES {
        let Some(doc) = docs.next().transpose()? else {
            break;
        };
        bytes += document_size(&doc);
        chunk.push(doc);
    }
    Ok(chunk)
}

/// Joins one chunk of a `$lookup` or `$graphLookup`'s input into `out`, reading what the
/// chunk can join (or the foreign collection whole, once per run, for joins that cannot say).
async fn join_chunk(
    ctx: &Ctx<'_>,
    stage: &Stage,
    chunk: Vec<Document>,
    env: &Env,
    whole: &mut Whole,
    out: &mut Spool,
) -> Result<()> {
    let limit = sort_limit();
    let foreign = if let Some((from, filters)) =
        lookup::join_prefetch(stage, &chunk, JOIN_VALUES_PER_READ, env)?
    {
        let Some(docs) = read_foreign(ctx, &from, &filters, env, limit).await? else {
            return per_document(ctx, stage, chunk, env, out).await;
        };
        joined(ctx, from, docs)
    } else if let Some(mut search) = GraphPrefetch::start(stage, &chunk, env)? {
        while let Some(filters) = search.next_filters(JOIN_VALUES_PER_READ) {
            let Some(level) = read_foreign(ctx, search.from(), &filters, env, limit).await? else {
                return Err(graph_too_large());
            };
            search.found(level)?;
        }
        let from = search.from().to_string();
        joined(ctx, from, search.into_docs())
    } else {
        match whole.read(ctx, stage, env).await? {
            Some(foreign) => foreign,
            None => return per_document(ctx, stage, chunk, env, out).await,
        }
    };
    let env = Env {
        foreign: Some(foreign),
        ..env.clone()
    };
    if let Some(joined) = lookup::join_each(stage, chunk, &env)? {
        out.extend(joined)?;
    }
    Ok(())
}

/// The foreign documents a chunk joins, read from collection `from`, as its stage takes them
/// (and counted in the metrics as read for what joins).
fn joined(ctx: &Ctx<'_>, from: String, docs: Vec<Document>) -> Arc<Foreign> {
    ctx.seams
        .metrics
        .foreign_documents_read(true, docs.len() as u64);
    let mut foreign = Foreign::default();
    foreign.insert(from, docs);
    Arc::new(foreign)
}

/// A `$lookup` whose foreign documents do not fit the memory limit: with disk use, each
/// document's join is a query of its own on the shards (an aggregate of the foreign
/// collection), as MongoDB runs every `$lookup`; without, 292.
async fn per_document(
    ctx: &Ctx<'_>,
    stage: &Stage,
    chunk: Vec<Document>,
    env: &Env,
    out: &mut Spool,
) -> Result<()> {
    if !env.allow_disk_use {
        return Err(whole_too_large(stage));
    }
    for doc in chunk {
        let Some(query) = lookup::lookup_per_document(stage, &doc, env)? else {
            return Err(whole_too_large(stage));
        };
        let mut joined = Vec::new();
        let mut bytes = 0;
        for d in Box::pin(aggregate_of(ctx, &query.from, &query.stages, &query.env)).await? {
            let d = d?;
            bytes += document_size(&d);
            if bytes > MAX_JOINED_BYTES {
                return Err(MongoError::new(
                    ErrorCode::BSON_OBJECT_TOO_LARGE,
                    format!(
                        "Total size of documents in {} matching pipeline's $lookup stage \
                         exceeds {MAX_JOINED_BYTES} bytes",
                        query.from
                    ),
                ));
            }
            joined.push(d);
        }
        out.push(query.attach(doc, joined))?;
    }
    Ok(())
}

/// The collections read whole by the stages that need them, once per run, held up to the
/// sort limit together.
#[derive(Default)]
struct Whole {
    foreign: Arc<Foreign>,
    bytes: usize,
}

impl Whole {
    /// Every collection `stage` reads, each read whole when first needed; `None` when they do
    /// not fit the sort limit (what was read stays, for the next stage that needs it).
    async fn read(
        &mut self,
        ctx: &Ctx<'_>,
        stage: &Stage,
        env: &Env,
    ) -> Result<Option<Arc<Foreign>>> {
        // One after another: inside a transaction, the first read of a shard starts it there.
        for name in lookup::stage_foreign_collections(stage) {
            if self.foreign.get(&name).is_some() {
                continue;
            }
            let room = sort_limit().saturating_sub(self.bytes);
            let Some(docs) = read_foreign(ctx, &name, &[Document::new()], env, room).await? else {
                return Ok(None);
            };
            ctx.seams
                .metrics
                .foreign_documents_read(false, docs.len() as u64);
            self.bytes += docs.iter().map(document_size).sum::<usize>();
            Arc::make_mut(&mut self.foreign).insert(name, docs);
        }
        Ok(Some(self.foreign.clone()))
    }
}

/// 292 for a stage whose foreign collections do not fit the memory limit.
fn whole_too_large(stage: &Stage) -> MongoError {
    MongoError::new(
        ErrorCode::QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED,
        format!(
            "The documents {} reads from other collections exceeded the memory limit of {} \
             bytes; pass allowDiskUse:true to have a $lookup query them per document",
            stage.name(),
            sort_limit()
        ),
    )
}

/// 40099, as MongoDB 7.0's `$graphLookup` (which ignores `allowDiskUse`).
fn graph_too_large() -> MongoError {
    MongoError::with_code(40099, "$graphLookup reached maximum memory consumption")
}

/// `stages` over collection `coll` as an aggregate of its own (what a `$unionWith` adds, and a
/// `$lookup`'s query for one document): split between the shards that hold it and the router.
/// A view runs them over its documents.
async fn aggregate_of(ctx: &Ctx<'_>, coll: &str, stages: &[Document], env: &Env) -> Result<Docs> {
    validate_collection_name(ctx.db, coll)?;
    let parsed = Pipeline::parse_with_vars(stages, &env.names())?;
    let filter = super::reads::leading_match_of(stages);
    let routed = read_targets(ctx, coll, &filter).await?;
    if routed.shards.is_empty() {
        return run_stages(ctx, &parsed, Box::new(std::iter::empty()), env).await;
    }
    match run_split(ctx, coll, stages, &parsed, env, &routed, &filter).await {
        Err(e) => match shard::views::resolved(&e) {
            Some((source_ns, pipeline)) => {
                let docs = read_view(ctx, &source_ns, &pipeline, env).await?;
                run_stages(ctx, &parsed, docs, env).await
            }
            None => Err(e),
        },
        done => done,
    }
}

/// The documents of collection `name` that pass any of `filters` (each read with its own
/// routing, under the command's collation), each once; `None` when they pass `limit` bytes.
/// A view reads whole: its pipeline over its source, which is what every filter would have
/// been applied to.
async fn read_foreign(
    ctx: &Ctx<'_>,
    name: &str,
    filters: &[Document],
    env: &Env,
    limit: usize,
) -> Result<Option<Vec<Document>>> {
    validate_collection_name(ctx.db, name)?;
    let mut held = Held::new(limit);
    for filter in filters {
        let routed = read_targets(ctx, name, filter).await?;
        if routed.shards.is_empty() {
            continue;
        }
        let mut find = doc! {"find": name, "filter": filter.clone()};
        if let Some(c) = ctx.cmd.get("collation") {
            find.insert("collation", c.clone());
        }
        let merge = match open_merge(ctx, name, &routed, find, None, true).await {
            Ok(merge) => merge,
            Err(e) => match shard::views::resolved(&e) {
                Some((source_ns, pipeline)) => {
                    let mut held = Held::new(limit);
                    for doc in read_view(ctx, &source_ns, &pipeline, env).await? {
                        if !held.take(doc?) {
                            return Ok(None);
                        }
                    }
                    return Ok(Some(held.docs));
                }
                None => return Err(e),
            },
        };
        if !drain(ctx, merge, |doc| Ok(held.take(doc))).await? {
            return Ok(None);
        }
    }
    let mut out = held.docs;
    if filters.len() > 1 {
        // A document whose foreign field is an array can pass two chunks' filters.
        out.sort_by(|a, b| pipeline::value::compare(id(a), id(b)));
        out.dedup_by(|a, b| pipeline::value::compare(id(a), id(b)).is_eq());
    }
    Ok(Some(out))
}

/// Documents held in memory up to a number of bytes.
struct Held {
    docs: Vec<Document>,
    bytes: usize,
    limit: usize,
}

impl Held {
    fn new(limit: usize) -> Held {
        Held {
            docs: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    /// Keeps `doc`; whether everything kept is still within the limit.
    fn take(&mut self, doc: Document) -> bool {
        self.bytes += document_size(&doc);
        self.docs.push(doc);
        self.bytes <= self.limit
    }
}

fn id(d: &Document) -> &Bson {
    d.get("_id").unwrap_or(&Bson::Null)
}

/// The documents of a view named by `$lookup` / `$unionWith` / `$graphLookup`: its resolved
/// pipeline run over every document of its source (spooled as the command allows).
async fn read_view(
    ctx: &Ctx<'_>,
    source_ns: &str,
    pipeline: &[Document],
    env: &Env,
) -> Result<Docs> {
    let source = source_ns
        .strip_prefix(&format!("{}.", ctx.db))
        .unwrap_or(source_ns)
        .to_string();
    let routed = read_targets(ctx, &source, &Document::new()).await?;
    let mut spool = Spool::new(GATHERED, env.allow_disk_use);
    if !routed.shards.is_empty() {
        let find = doc! {"find": &source, "filter": {}};
        let merge = open_merge(ctx, &source, &routed, find, None, true).await?;
        drain(ctx, merge, |doc| spool.push(doc).map(|()| true)).await?;
    }
    let docs: Docs = Box::new(spool.finish()?);
    Pipeline::parse_with_vars(pipeline, &env.names())?.stream(docs, env)
}

/// Runs `stages` over `coll`: the shards run their part, the router spools what they send and
/// runs the rest. `filter` is the pipeline's leading `$match` (what a `find` asks the shards
/// for).
pub(super) async fn run_split(
    ctx: &Ctx<'_>,
    coll: &str,
    stages: &[Document],
    parsed: &Pipeline,
    env: &Env,
    routed: &Targets,
    filter: &Document,
) -> Result<Docs> {
    let (merge, merger) = open_split(ctx, coll, stages, parsed, env, routed, filter, true).await?;
    let mut spool = Spool::new(GATHERED, env.allow_disk_use);
    drain(ctx, merge, |doc| spool.push(doc).map(|()| true)).await?;
    run_stages(ctx, &merger, Box::new(spool.finish()?), env).await
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

/// The `let` a shard read carries: every variable in force, each as the literal value it has
/// here (the command's `let` evaluated once, and a `$lookup`'s for the document it joins).
fn let_of(env: &Env) -> Option<Document> {
    (!env.vars.is_empty()).then(|| {
        env.vars
            .iter()
            .map(|(name, v)| (name.clone(), Bson::Document(doc! {"$literal": v.clone()})))
            .collect()
    })
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
    // The shards' part runs under the command's collation, disk use and variables.
    let with_context = |mut cmd: Document| {
        for field in ["collation", "allowDiskUse"] {
            if let Some(v) = ctx.cmd.get(field) {
                cmd.insert(field, v.clone());
            }
        }
        if let Some(vars) = let_of(env) {
            cmd.insert("let", vars);
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
/// The inherited fields `cmd` already has (its `let`) stay as they are.
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
    routed.route(&mut cmd);
    for field in INHERITED {
        if let Some(v) = ctx.cmd.get(*field)
            && !cmd.contains_key(*field)
        {
            cmd.insert(*field, v.clone());
        }
    }
    let targets = &routed.shards;
    let replies = ctx
        .seams
        .shards()
        .broadcast_read(targets, ctx.db, &cmd)
        .await;
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

/// Feeds every document of `merge` to `take` while it answers `true`; whether every document
/// was taken. The shards' cursors are killed when it stops early or a read fails.
async fn drain(
    ctx: &Ctx<'_>,
    merge: Merge,
    mut take: impl FnMut(Document) -> Result<bool>,
) -> Result<bool> {
    let mut all = RouterCursor {
        ns: format!("{}.{}", merge.db, merge.collection),
        state: CursorState::merge(merge),
        info: None,
    };
    loop {
        let read = all.next_batch(ctx.seams.shards(), usize::MAX, None).await;
        let (batch, exhausted) = match read {
            Ok(read) => read,
            Err(e) => {
                all.kill(ctx.seams.shards()).await;
                return Err(e);
            }
        };
        for doc in batch {
            match take(doc) {
                Ok(true) => {}
                stopped => {
                    all.kill(ctx.seams.shards()).await;
                    return stopped;
                }
            }
        }
        if exhausted {
            return Ok(true);
        }
    }
}

/// `aggregate: 1` on a database: the first stage makes the documents.
pub(super) async fn collectionless(ctx: &Ctx<'_>, stages: &[Document]) -> Result<Body> {
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
    let out = run_stages(ctx, &parsed, Box::new(input.into_iter().map(Ok)), &env).await?;
    let ns = format!("{}.$cmd.aggregate", ctx.db);
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: CursorState::spooled(out),
        info: None,
    };
    if let Some(sink) = &sink {
        super::out::write(ctx, sink, cursor).await?;
        return Ok(doc! {"cursor": {"firstBatch": [], "id": 0_i64, "ns": ns}, "ok": 1.0}.into());
    }
    let batch = super::reads::batch_size(ctx, ctx.args().opt_doc("cursor")?)?;
    super::reads::first_reply(ctx, ns, cursor, batch, false).await
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
        (false, None) => Which::Users(vec![super::session_user(ctx.seams, ctx.conn)]),
    };
    Ok(ctx.seams.local_sessions.list(&which, bson::DateTime::now()))
}

pub(super) async fn aggregate(ctx: &Ctx<'_>) -> Result<Body> {
    let args = ctx.args();
    if pipeline::changestream::spec::is_change_stream(args.array("pipeline")?) {
        return open_change_stream(ctx).await.map(Body::Cursor);
    }
    aggregate_documents(ctx).await
}

/// `aggregate` with `$changeStream` first: opens the stream, registers its cursor (unless its
/// first batch ended it) and replies with the first batch.
async fn open_change_stream(ctx: &Ctx<'_>) -> Result<CursorBody> {
    let (seams, db, cmd) = (ctx.seams, ctx.db, ctx.cmd);
    let opened = seams.streams.open(db, cmd).await?;
    let batch = opened.batch;
    seams.metrics.events_delivered(batch.events.len() as u64);
    let stamp = seams.streams.stamp();
    let Some(cursor) = opened.cursor else {
        return Ok(crate::streams::cursor_reply(
            &opened.ns, 0, batch, true, stamp,
        ));
    };
    let mut info = crate::cursors::StreamInfo::new(&opened.ns, cmd);
    info.replied(
        batch.events.len(),
        batch
            .post_batch_resume_token
            .as_ref()
            .map(ResumeToken::to_document),
    );
    let id = seams.cursors.insert(RouterCursor {
        ns: opened.ns.clone(),
        state: CursorState::ChangeStream(Box::new(cursor)),
        info: Some(Arc::new(std::sync::Mutex::new(info))),
    });
    Ok(crate::streams::cursor_reply(
        &opened.ns, id, batch, true, stamp,
    ))
}

/// `aggregate` over a collection's documents.
async fn aggregate_documents(ctx: &Ctx<'_>) -> Result<Body> {
    let args = ctx.args();
    let stages = args.documents("pipeline")?;
    let cursor_opts = args.opt_doc("cursor")?;
    if args.opt_bool("explain")?.unwrap_or(false) {
        return super::explain::aggregate(ctx).await.map(Body::from);
    }
    if cursor_opts.is_none() {
        return Err(MongoError::failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument",
        ));
    }
    let first = batch_size(ctx, cursor_opts)?;
    let stage_docs: Vec<Document> = stages.iter().map(|d| (*d).clone()).collect();
    let coll = match ctx.cmd.get("aggregate") {
        Some(Bson::String(c)) => c.as_str(),
        _ => return collectionless(ctx, &stage_docs).await,
    };
    validate_collection_name(ctx.db, coll)?;
    let ns = format!("{}.{coll}", ctx.db);
    if stage_docs
        .first()
        .is_some_and(|s| s.contains_key("$collStats"))
    {
        return super::stats::coll_stats_stage(ctx, coll, &stage_docs).await;
    }
    if let Some(name) = stage_docs
        .first()
        .and_then(|s| s.keys().next())
        .filter(|n| {
            matches!(
                n.as_str(),
                "$documents" | "$listLocalSessions" | "$currentOp"
            )
        })
    {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!(
                "{name} must be run against the database with {{aggregate: 1}}, not a collection"
            ),
        ));
    }
    // A final $out or $merge writes the results instead of returning them.
    let (stage_docs, sink) = super::out::split(&stage_docs, ctx.db)?;
    if sink.is_some() {
        super::out::check_allowed(ctx)?;
    }
    let env = pipeline::expr::Env::from_command(ctx.cmd)?;
    let parsed = pipeline::agg::Pipeline::parse_with_vars(&stage_docs, &env.names())?;
    // The leading $match stages select what the shards send.
    let filter = super::reads::leading_match(ctx.cmd);
    let routed = read_targets(ctx, coll, &filter).await?;
    let targets = &routed.shards;
    let single_shard = targets.len() == 1 && !routed.sharded;
    if sink.is_none() && single_shard && !needs_router(&parsed) {
        let reply = ctx
            .seams
            .shards()
            .read(targets[0], ctx.db, routed.command(ctx.cmd))
            .await?;
        return pass_through(ctx, ns, targets[0], coll, reply, first)
            .await
            .map(Body::from);
    }
    // The results stream from the shards as the client (or the sink) reads when no stage
    // reads another collection; otherwise the router spools them between its joins (and
    // before a `$merge` into the collection it reads).
    let merges_into_source = sink.as_ref().is_some_and(|s| s.merges_into(ctx.db, coll));
    let state = if !targets.is_empty() && !needs_router(&parsed) && !merges_into_source {
        let run = open_run(ctx, coll, &stage_docs, &parsed, &env, &routed, &filter).await?;
        CursorState::Run(Box::new(run))
    } else if targets.is_empty() {
        let none = Box::new(std::iter::empty());
        CursorState::spooled(run_stages(ctx, &parsed, none, &env).await?)
    } else {
        let run = run_split(ctx, coll, &stage_docs, &parsed, &env, &routed, &filter);
        CursorState::spooled(run.await?)
    };
    let cursor = RouterCursor {
        ns: ns.clone(),
        state,
        info: None,
    };
    if let Some(sink) = &sink {
        super::out::write(ctx, sink, cursor).await?;
        return Ok(cursor_reply(&ctx.seams.cursors, ns, Vec::new(), None).into());
    }
    first_reply(ctx, ns, cursor, first, false).await
}

/// Wraps a shard's cursor reply in a router cursor (when it stays open).
async fn pass_through(
    ctx: &Ctx<'_>,
    ns: String,
    shard: ShardId,
    coll: &str,
    reply: Document,
    _first: usize,
) -> Result<Document> {
    let source = Source::from_reply(shard, &reply)?;
    let batch: Vec<Document> = source.buffer.iter().cloned().collect();
    if source.cursor_id == 0 {
        return Ok(cursor_reply(&ctx.seams.cursors, ns, batch, None));
    }
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: CursorState::merge(Merge::concat(
            ctx.db,
            coll,
            vec![Source {
                shard,
                cursor_id: source.cursor_id,
                buffer: VecDeque::new(),
            }],
        )),
        info: None,
    };
    Ok(cursor_reply(&ctx.seams.cursors, ns, batch, Some(cursor)))
}
