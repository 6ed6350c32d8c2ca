//! Reads through the router: `find`, `getMore`, `killCursors`, `count`, `distinct`, `aggregate`.
//!
//! A read that one shard can answer is forwarded whole and its cursor passed through. A read
//! that spans shards is scattered and the router merges: k-way by the sort (the shards sort
//! their parts), with skip and limit applied after the merge (each shard returns at most
//! skip + limit) and the projection applied by the router when it would hide the sort key.
//! A sharded aggregation is split (`super::aggregate`): the shards run a prefix, the router the rest.

use std::collections::VecDeque;
use std::sync::Arc;

use bson::{Bson, Document, RawDocumentBuf, doc};
use pipeline::projection::Projection;
use pipeline::sort::SortSpec;
use resume::token::ResumeToken;
use shard::sharding::ShardId;
use wire::raw::{Body, CursorBody, CursorReply};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::{forwardable, validate_collection_name};
use crate::cursors::{CursorState, Merge, RouterCursor, SHARD_GET_MORE_DOCS, Source};
use crate::kernel::catalog::{Catalog, Placement};
use crate::kernel::transport::Shards;
use crate::router::Router;

/// MongoDB's default first batch.
const DEFAULT_BATCH: usize = 101;

/// The shards a read of `db.coll` with `filter` must reach; empty when the database does not
/// exist.
pub(super) async fn read_targets(ctx: &Ctx<'_>, coll: &str, filter: &Document) -> Result<Targets> {
    let placement = ctx.router.catalog.placement(ctx.db, coll, false).await?;
    let shards = Catalog::targets(&placement, filter, ctx.cmd.get("collation"))?;
    Ok(Targets {
        shards,
        version: placement.version(),
        sharded: matches!(placement, Placement::Sharded(_)),
    })
}

/// The shards a read goes to, and the routing it was based on.
pub(super) struct Targets {
    pub(super) shards: Vec<ShardId>,
    pub(super) version: Document,
    pub(super) sharded: bool,
}

impl Targets {
    /// The driver's command for the shards, with the routing it was based on.
    pub(super) fn command(&self, cmd: &Document) -> Document {
        let mut cmd = forwardable(cmd);
        cmd.insert("shardVersion", self.version.clone());
        cmd
    }
}

/// `{cursor: {id, ns, firstBatch}, ok: 1}`, registering the cursor when it is not exhausted.
fn cursor_reply(
    router: &Router,
    ns: String,
    batch: Vec<Document>,
    open: Option<RouterCursor>,
) -> Document {
    let id = match open {
        Some(cursor) => router.cursors.insert(cursor),
        None => 0,
    };
    let batch: Vec<Bson> = batch.into_iter().map(Bson::Document).collect();
    doc! {"cursor": {"firstBatch": batch, "id": id, "ns": ns}, "ok": 1.0}
}

/// Reads the first batch of a fresh router cursor and replies with it (each document encoded
/// as it is taken, see [`RouterCursor::next_encoded_batch`]); a `singleBatch` read closes the
/// cursor after it.
pub(super) async fn first_reply(
    ctx: &Ctx<'_>,
    ns: String,
    mut cursor: RouterCursor,
    batch_size: usize,
    single_batch: bool,
) -> Result<Body> {
    let (batch, exhausted) = match cursor
        .next_encoded_batch(ctx.router, batch_size, None)
        .await
    {
        Ok(read) => read,
        Err(e) => {
            cursor.kill(ctx.router).await;
            return Err(e);
        }
    };
    let id = if exhausted || single_batch {
        cursor.kill(ctx.router).await;
        0
    } else {
        ctx.router.cursors.insert(cursor)
    };
    Ok(Body::Raw(encoded_reply(&ns, id, true, &batch)))
}

pub(super) fn batch_size(ctx: &Ctx<'_>, from: Option<&Document>) -> Result<usize> {
    let v = match from {
        Some(d) => super::Args::new(d, ctx.name).opt_i64("batchSize")?,
        None => ctx.args().opt_i64("batchSize")?,
    };
    match v {
        None => Ok(DEFAULT_BATCH),
        Some(n) if n < 0 => Err(MongoError::bad_value(
            "BatchSize value must be non-negative",
        )),
        Some(n) => Ok(n as usize),
    }
}

pub(super) async fn find(ctx: &Ctx<'_>) -> Result<Body> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    let ns = format!("{}.{coll}", ctx.db);
    let filter = args.opt_doc("filter")?.cloned().unwrap_or_default();
    // Validate everything before touching a shard, so bad input fails the same everywhere.
    let env = pipeline::expr::Env::from_command(ctx.cmd)?;
    pipeline::Matcher::parse_with_vars(&filter, &env.names())?;
    let sort = args
        .opt_doc("sort")?
        .filter(|s| !s.is_empty())
        .map(SortSpec::parse)
        .transpose()?
        .map(|s| s.with_collation(env.collation.clone()));
    let projection_doc = args.opt_doc("projection")?.filter(|p| !p.is_empty());
    let projection = projection_doc
        .map(|p| Projection::parse_with_query(p, Some(&filter)))
        .transpose()?;
    let skip = args.opt_i64("skip")?.unwrap_or(0);
    if skip < 0 {
        return Err(MongoError::bad_value("skip value must be non-negative"));
    }
    let limit = args.opt_i64("limit")?.unwrap_or(0);
    let single_batch = args.opt_bool("singleBatch")?.unwrap_or(false) || limit < 0;
    let limit = (limit != 0).then_some(limit.unsigned_abs());
    let mut first = batch_size(ctx, None)?;
    if single_batch {
        first = limit.map(|l| l as usize).unwrap_or(first);
    }

    let await_data =
        args.opt_bool("tailable")?.unwrap_or(false) && args.opt_bool("awaitData")?.unwrap_or(false);
    let routed = read_targets(ctx, coll, &filter).await?;
    let targets = &routed.shards;
    if targets.is_empty() {
        return Ok(cursor_reply(ctx.router, ns, vec![], None).into());
    }
    let (shard_cmd, merge_sort, router_skip, router_limit, router_projection) =
        if targets.len() == 1 {
            (routed.command(ctx.cmd), None, 0, None, None)
        } else {
            let mut cmd = routed.command(ctx.cmd);
            cmd.remove("skip");
            cmd.remove("singleBatch");
            // The shards' first batches are held parsed, as their getMores' are: at most
            // SHARD_GET_MORE_DOCS each, whatever the client's batch (the merge reads on).
            let per_shard = i64::try_from(first).unwrap_or(i64::MAX);
            cmd.insert("batchSize", per_shard.min(SHARD_GET_MORE_DOCS));
            if let Some(l) = limit {
                cmd.insert("limit", (l + skip as u64) as i64);
            }
            let router_projection = if sort.is_some() && projection.is_some() {
                cmd.remove("projection");
                projection
            } else {
                None
            };
            (cmd, sort, skip as u64, limit, router_projection)
        };
    let replies = ctx
        .router
        .shards()
        .broadcast_read(targets, ctx.db, &shard_cmd)
        .await;
    let mut sources = Vec::with_capacity(targets.len());
    for (shard, reply) in targets.iter().zip(replies) {
        sources.push(Source::from_reply(*shard, &reply?)?);
    }
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: CursorState::merge(Merge {
            db: ctx.db.to_string(),
            collection: coll.to_string(),
            sources,
            sort: merge_sort,
            skip: router_skip,
            limit: router_limit,
            projection: router_projection,
            await_data,
            max_await_ms: None,
        }),
        info: None,
    };
    first_reply(ctx, ns, cursor, first, single_batch).await
}

pub(super) async fn get_more(ctx: &Ctx<'_>) -> Result<Body> {
    let id = match ctx.cmd.get("getMore") {
        Some(Bson::Int64(i)) => *i,
        Some(other) => {
            return Err(MongoError::type_mismatch(format!(
                "BSON field 'getMore.getMore' is the wrong type '{}', expected type 'long'",
                super::args::type_name(other)
            )));
        }
        None => return Err(MongoError::failed_to_parse("getMore without a cursor id")),
    };
    let args = ctx.args();
    let coll = args.opt_str("collection")?.ok_or_else(|| {
        MongoError::with_code(
            40414,
            "BSON field 'getMore.collection' is missing but a required field",
        )
    })?;
    let n = match args.opt_i64("batchSize")? {
        Some(n) if n > 0 => n as usize,
        _ => usize::MAX,
    };
    let router = ctx.router;
    let cursor = router.cursors.get(id)?;
    let Ok(mut guard) = cursor.try_lock_owned() else {
        return Err(MongoError::new(
            ErrorCode::CURSOR_IN_USE,
            format!("Cursor id {id} is already in use"),
        ));
    };
    let expected_ns = format!("{}.{coll}", ctx.db);
    if guard.ns != expected_ns {
        return Err(MongoError::new(
            ErrorCode::UNAUTHORIZED,
            format!(
                "Requested getMore on namespace '{expected_ns}', but cursor belongs to a different namespace {}",
                guard.ns
            ),
        ));
    }
    if router.options.enable_test_commands
        && let Some(e) = router.failpoints.check_get_more()
    {
        let stream = matches!(guard.state, CursorState::ChangeStream(_));
        guard.kill(router).await;
        router.cursors.remove(id);
        return Err(if stream {
            crate::streams::label_resumable(e)
        } else {
            e
        });
    }
    if matches!(guard.state, CursorState::ChangeStream(_)) {
        let max_time = match args.opt_i64("maxTimeMS")? {
            Some(ms) if ms > 0 => std::time::Duration::from_millis(ms as u64),
            _ => crate::streams::DEFAULT_AWAIT,
        };
        // Served on the background lane, as the stream's feeds are: a reader far behind takes
        // only the CPU that writers leave.
        let (guard_back, batch) = {
            let router = router.clone();
            let key = crate::kernel::transport::current_operation_key()
                .unwrap_or_else(crate::ops::new_key);
            shard::background::run(
                crate::kernel::transport::OPERATION_KEY.scope(key, async move {
                    let batch = match &mut guard.state {
                        CursorState::ChangeStream(stream) => {
                            stream.next_batch(&router.streams, n, max_time).await
                        }
                        _ => Err(MongoError::internal("a change-stream cursor changed kind")),
                    };
                    (guard, batch)
                }),
            )
            .await?
        };
        guard = guard_back;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                guard.kill(router).await;
                router.cursors.remove(id);
                return Err(crate::streams::label_resumable(e));
            }
        };
        router.metrics.events_delivered(batch.events.len() as u64);
        let keep = !batch.invalidated;
        if let Some(info) = &guard.info {
            info.lock().unwrap_or_else(|e| e.into_inner()).replied(
                batch.events.len(),
                batch
                    .post_batch_resume_token
                    .as_ref()
                    .map(resume::token::ResumeToken::to_document),
            );
        }
        let stamp = router.streams.stamp();
        let reply = crate::streams::cursor_reply(&guard.ns, id, batch, false, stamp);
        if !keep {
            guard.kill(router).await;
            router.cursors.remove(id);
        }
        return Ok(Body::Cursor(reply));
    }
    let max_await_ms = args.opt_i64("maxTimeMS")?.filter(|ms| *ms > 0);
    let result = guard.next_encoded_batch(router, n, max_await_ms).await;
    let (batch, exhausted) = match result {
        Ok(r) => r,
        Err(e) => {
            guard.kill(router).await;
            router.cursors.remove(id);
            return Err(e);
        }
    };
    let ns = guard.ns.clone();
    let id = if exhausted {
        guard.kill(router).await;
        router.cursors.remove(id);
        0
    } else {
        id
    };
    Ok(Body::Raw(encoded_reply(&ns, id, false, &batch)))
}

/// `{cursor: {firstBatch | nextBatch, id, ns}, ok: 1}` around a batch of encoded documents.
fn encoded_reply(ns: &str, id: i64, first: bool, batch: &[Vec<u8>]) -> RawDocumentBuf {
    CursorReply {
        ns,
        id,
        first,
        batch,
        post_batch_resume_token: None,
        invalidated: false,
    }
    .write()
}

pub(super) async fn kill_cursors(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    args.collection()?;
    let ids = args.array("cursors")?;
    let mut killed = Vec::new();
    let mut not_found = Vec::new();
    for id in ids {
        let id = match id {
            Bson::Int64(i) => *i,
            Bson::Int32(i) => i64::from(*i),
            other => {
                return Err(MongoError::type_mismatch(format!(
                    "BSON field 'killCursors.cursors' has an element of type '{}', expected type 'long'",
                    super::args::type_name(other)
                )));
            }
        };
        match ctx.router.cursors.remove(id) {
            Some(c) => {
                c.lock().await.kill(ctx.router).await;
                killed.push(Bson::Int64(id));
            }
            None => not_found.push(Bson::Int64(id)),
        }
    }
    Ok(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    })
}

pub(super) async fn count(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    let query = args.opt_doc("query")?.cloned().unwrap_or_default();
    let vars = pipeline::expr::Env::from_command(ctx.cmd)?.names();
    pipeline::Matcher::parse_with_vars(&query, &vars)?;
    let skip = args.opt_i64("skip")?.unwrap_or(0).max(0) as u64;
    let limit = args.opt_i64("limit")?.unwrap_or(0).unsigned_abs();
    let routed = read_targets(ctx, coll, &query).await?;
    let targets = &routed.shards;
    if targets.len() == 1 {
        return ctx
            .router
            .shards()
            .read(targets[0], ctx.db, routed.command(ctx.cmd))
            .await;
    }
    let mut cmd = routed.command(ctx.cmd);
    cmd.remove("skip");
    cmd.remove("limit");
    let mut total: u64 = 0;
    for reply in ctx
        .router
        .shards()
        .broadcast_read(targets, ctx.db, &cmd)
        .await
    {
        let reply = reply?;
        total += match reply.get("n") {
            Some(Bson::Int32(n)) => *n as u64,
            Some(Bson::Int64(n)) => *n as u64,
            Some(Bson::Double(n)) => *n as u64,
            _ => 0,
        };
    }
    let mut n = total.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n as i64, "ok": 1.0})
}

pub(super) async fn distinct(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    args.opt_str("key")?.ok_or_else(|| {
        MongoError::with_code(
            40414,
            "BSON field 'distinct.key' is missing but a required field",
        )
    })?;
    let query = args.opt_doc("query")?.cloned().unwrap_or_default();
    let env = pipeline::expr::Env::from_command(ctx.cmd)?;
    pipeline::Matcher::parse_with_vars(&query, &env.names())?;
    let routed = read_targets(ctx, coll, &query).await?;
    let mut values: Vec<Bson> = Vec::new();
    for reply in ctx
        .router
        .shards()
        .broadcast_read(&routed.shards, ctx.db, &routed.command(ctx.cmd))
        .await
    {
        let reply = reply?;
        values.extend(
            reply
                .get_array("values")
                .map(|a| a.to_vec())
                .unwrap_or_default(),
        );
    }
    // The shards' values are distinct under the collation; so are the merged ones.
    values.sort_by(|a, b| env.compare(a, b));
    values.dedup_by(|a, b| env.equal(a, b));
    let bytes: usize = values
        .iter()
        .map(pipeline::changestream::split::value_size)
        .sum();
    if bytes > wire::MAX_BSON_OBJECT_SIZE {
        // Each shard's part fits; together they may not (MongoDB's cap, 17217).
        return Err(MongoError::with_code(17217, "distinct too big, 16mb cap"));
    }
    Ok(doc! {"values": values, "ok": 1.0})
}

pub(super) async fn aggregate(ctx: &Ctx<'_>) -> Result<Body> {
    let args = ctx.args();
    if pipeline::changestream::spec::is_change_stream(args.array("pipeline")?) {
        return open_change_stream(ctx.router, ctx.db, ctx.cmd)
            .await
            .map(Body::Cursor);
    }
    aggregate_documents(ctx).await
}

/// `aggregate` with `$changeStream` first: opens the stream, registers its cursor (unless its
/// first batch ended it) and replies with the first batch.
async fn open_change_stream(router: &Arc<Router>, db: &str, cmd: &Document) -> Result<CursorBody> {
    let opened = router.streams.open(db, cmd).await?;
    let batch = opened.batch;
    router.metrics.events_delivered(batch.events.len() as u64);
    let stamp = router.streams.stamp();
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
    let id = router.cursors.insert(RouterCursor {
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
        _ => return super::aggregate::collectionless(ctx, &stage_docs).await,
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
    let filter = super::explain::leading_match(ctx.cmd);
    let routed = read_targets(ctx, coll, &filter).await?;
    let targets = &routed.shards;
    let single_shard = targets.len() == 1 && !routed.sharded;
    if sink.is_none() && single_shard && !super::aggregate::needs_router(&parsed) {
        let reply = ctx
            .router
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
    let state = if !targets.is_empty()
        && !super::aggregate::needs_router(&parsed)
        && !merges_into_source
    {
        let run =
            super::aggregate::open_run(ctx, coll, &stage_docs, &parsed, &env, &routed, &filter)
                .await?;
        CursorState::Run(Box::new(run))
    } else if targets.is_empty() {
        let none = Box::new(std::iter::empty());
        CursorState::spooled(super::aggregate::run_stages(ctx, &parsed, none, &env).await?)
    } else {
        let run =
            super::aggregate::run_split(ctx, coll, &stage_docs, &parsed, &env, &routed, &filter);
        CursorState::spooled(run.await?)
    };
    let cursor = RouterCursor {
        ns: ns.clone(),
        state,
        info: None,
    };
    if let Some(sink) = &sink {
        super::out::write(ctx, sink, cursor).await?;
        return Ok(cursor_reply(ctx.router, ns, Vec::new(), None).into());
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
        return Ok(cursor_reply(ctx.router, ns, batch, None));
    }
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: CursorState::merge(Merge {
            db: ctx.db.to_string(),
            collection: coll.to_string(),
            sources: vec![Source {
                shard,
                cursor_id: source.cursor_id,
                buffer: VecDeque::new(),
            }],
            sort: None,
            skip: 0,
            limit: None,
            projection: None,
            await_data: false,
            max_await_ms: None,
        }),
        info: None,
    };
    Ok(cursor_reply(ctx.router, ns, batch, Some(cursor)))
}
