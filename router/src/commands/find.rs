//! Reads through the router: `find`, `getMore`, `killCursors`, `count`, `distinct`
//! (`aggregate` is in `super::aggregate`, what they share in `super::reads`).
//!
//! A read that one shard can answer is forwarded whole and its cursor passed through. A read
//! that spans shards is scattered and the router merges: k-way by the sort (the shards sort
//! their parts), with skip and limit applied after the merge (each shard returns at most
//! skip + limit) and the projection applied by the router when it would hide the sort key.
//! A sharded aggregation is split (`super::aggregate`): the shards run a prefix, the router the rest.

use bson::{Bson, Document, doc};
use pipeline::projection::Projection;
use pipeline::sort::SortSpec;
use wire::raw::Body;
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use super::crud::validate_collection_name;
use super::reads::{batch_size, cursor_reply, encoded_reply, first_reply, read_targets};
use crate::cursors::{CursorState, Merge, RouterCursor, SHARD_GET_MORE_DOCS, Source};
use crate::kernel::transport::Shards;

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
        return Ok(cursor_reply(&ctx.seams.cursors, ns, vec![], None).into());
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
        .seams
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
    let seams = ctx.seams;
    let cursor = seams.cursors.get(id)?;
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
    if seams.options.enable_test_commands
        && let Some(e) = seams.failpoints.check_get_more()
    {
        let stream = matches!(guard.state, CursorState::ChangeStream(_));
        guard.kill(seams.shards()).await;
        seams.cursors.remove(id);
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
            let seams = seams.clone();
            let key = crate::kernel::transport::current_operation_key()
                .unwrap_or_else(crate::ops::new_key);
            shard::background::run(
                crate::kernel::transport::OPERATION_KEY.scope(key, async move {
                    let batch = match &mut guard.state {
                        CursorState::ChangeStream(stream) => {
                            stream.next_batch(&seams.streams, n, max_time).await
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
                guard.kill(seams.shards()).await;
                seams.cursors.remove(id);
                return Err(crate::streams::label_resumable(e));
            }
        };
        seams.metrics.events_delivered(batch.events.len() as u64);
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
        let stamp = seams.streams.stamp();
        let reply = crate::streams::cursor_reply(&guard.ns, id, batch, false, stamp);
        if !keep {
            guard.kill(seams.shards()).await;
            seams.cursors.remove(id);
        }
        return Ok(Body::Cursor(reply));
    }
    let max_await_ms = args.opt_i64("maxTimeMS")?.filter(|ms| *ms > 0);
    let result = guard
        .next_encoded_batch(seams.shards(), n, max_await_ms)
        .await;
    let (batch, exhausted) = match result {
        Ok(r) => r,
        Err(e) => {
            guard.kill(seams.shards()).await;
            seams.cursors.remove(id);
            return Err(e);
        }
    };
    let ns = guard.ns.clone();
    let id = if exhausted {
        guard.kill(seams.shards()).await;
        seams.cursors.remove(id);
        0
    } else {
        id
    };
    Ok(Body::Raw(encoded_reply(&ns, id, false, &batch)))
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
        match ctx.seams.cursors.remove(id) {
            Some(c) => {
                c.lock().await.kill(ctx.seams.shards()).await;
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
            .seams
            .shards()
            .read(targets[0], ctx.db, routed.command(ctx.cmd))
            .await;
    }
    let mut cmd = routed.command(ctx.cmd);
    cmd.remove("skip");
    cmd.remove("limit");
    let mut total: u64 = 0;
    for reply in ctx
        .seams
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
        .seams
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
