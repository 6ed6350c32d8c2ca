//! The change-stream commands of a shard: `aggregate` with `$changeStream`, `getMore` and
//! `killCursors` on change-stream cursors, and the router's `_tributaryNudgeChangeStream`
//! (promise at least this time as soon as you can). The cursors live in
//! [`crate::changestream`].

use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::MongoError;

use super::{Ctx, Reply, as_i64};
use crate::changestream::DEFAULT_AWAIT;

/// Whether an `aggregate` is a change stream.
pub fn is_change_stream(cmd: &Document) -> bool {
    cmd.get_array("pipeline")
        .is_ok_and(|p| pipeline::changestream::spec::is_change_stream(p))
}

/// Whether a `getMore` is for a change-stream cursor of this shard.
pub fn owns_get_more(ctx: &Ctx<'_>) -> bool {
    ctx.cmd
        .get("getMore")
        .and_then(as_i64)
        .is_some_and(|id| ctx.shard.change_streams().contains(id))
}

pub fn aggregate(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let state = ctx.shard.state();
    let reply = ctx.shard.change_streams().open(state, &ctx.db, &ctx.cmd)?;
    Ok(Reply::read(reply))
}

pub async fn get_more(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let id = ctx.cmd.get("getMore").and_then(as_i64).unwrap_or(0);
    let batch_size = ctx
        .opt_i64("batchSize")?
        .filter(|n| *n > 0)
        .map(|n| n as usize);
    let max_time = match ctx.opt_i64("maxTimeMS")? {
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
        _ => DEFAULT_AWAIT,
    };
    // On the background lane: a reader far behind takes only the CPU that writers leave.
    let state = ctx.shard.state().clone();
    let streams = ctx.shard.change_streams().clone();
    let reply =
        crate::background::run(
            async move { streams.get_more(&state, id, batch_size, max_time).await },
        )
        .await??;
    Ok(Reply::read(reply))
}

/// `killCursors` for both kinds of cursor.
pub fn kill_cursors(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let ids = ctx
        .opt_array("cursors")?
        .ok_or_else(|| ctx.missing("cursors"))?;
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for v in ids {
        let Some(id) = as_i64(&v) else {
            return Err(MongoError::type_mismatch(
                "BSON field 'killCursors.cursors' element is the wrong type, expected type 'long'",
            ));
        };
        if ctx.shard.change_streams().kill(id) || ctx.shard.cursors().kill(id) {
            killed.push(Bson::Int64(id));
        } else {
            not_found.push(Bson::Int64(id));
        }
    }
    Ok(Reply::read(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    }))
}

/// `{_tributaryNudgeChangeStream: <cursor id>, floor: Timestamp}`.
pub fn nudge(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let id = ctx
        .cmd
        .get("_tributaryNudgeChangeStream")
        .and_then(as_i64)
        .ok_or_else(|| MongoError::type_mismatch("the nudged cursor id must be a long"))?;
    let floor = match ctx.cmd.get("floor") {
        Some(Bson::Timestamp(t)) => ClusterTime::from(*t),
        _ => return Err(MongoError::type_mismatch("'floor' must be a timestamp")),
    };
    ctx.shard
        .change_streams()
        .nudge(ctx.shard.state(), id, floor)?;
    Ok(Reply::read(doc! {"ok": 1.0}))
}
