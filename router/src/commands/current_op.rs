//! `currentOp` and the `$currentOp` stage: what this router is doing, and `killOp`. The
//! operations in flight are listed (`crate::ops`); with `idleCursors: true` the open
//! change-stream cursors are too, each with
//! its namespace, the command that opened it, the post-batch resume token of its last reply and
//! how far that is behind the cluster's time (`lagSecs`), so an operator sees which streams
//! fall behind.
//!
//! Invariant: listing never waits on a cursor in use (each cursor's facts are kept beside it).

use bson::{Bson, Document, doc};
use resume::token::ResumeTokenData;
use wire::raw::Body;
use wire::{MongoError, Result};

use super::Ctx;
use super::admin::admin_only;

/// The `inprog` entries: one `idleCursor` per open change stream when `idle_cursors`.
fn inprog(ctx: &Ctx<'_>, idle_cursors: bool) -> Vec<Document> {
    let seams = ctx.seams;
    let mut out = seams.ops.active(&seams.options.advertised_host);
    if idle_cursors {
        out.extend(idle_streams(ctx));
    }
    out
}

/// `killOp: 1, op: <opid>`: interrupts an operation in flight (`ok` whether or not it still
/// ran, as MongoDB answers).
pub(super) fn kill_op(ctx: &Ctx<'_>) -> Result<Document> {
    admin_only(ctx)?;
    let id = match ctx.cmd.get("op") {
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(d)) if d.fract() == 0.0 => *d as i64,
        _ => {
            return Err(MongoError::failed_to_parse(
                "killOp needs op: the opid currentOp shows",
            ));
        }
    };
    if let Some(key) = ctx.seams.ops.kill(u64::try_from(id).unwrap_or(0)) {
        crate::ops::kill_on_shards(&ctx.seams.transport, &ctx.seams.services, key);
    }
    Ok(doc! {"info": "attempting to kill op", "ok": 1.0})
}

/// The open change-stream cursors as `idleCursor` entries.
fn idle_streams(ctx: &Ctx<'_>) -> Vec<Document> {
    let seams = ctx.seams;
    let now = seams.cluster_time();
    seams
        .cursors
        .streams()
        .into_iter()
        .map(|(id, info)| {
            let lag = info
                .last_token
                .as_ref()
                .and_then(|t| ResumeTokenData::from_document(t).ok())
                .map(|t| i64::from(now.secs.saturating_sub(t.cluster_time().secs)));
            doc! {
                "type": "idleCursor",
                "host": &seams.options.advertised_host,
                "ns": &info.ns,
                "cursor": {
                    "cursorId": id,
                    "createdDate": info.created,
                    "lastAccessDate": info.last_access,
                    "nDocsReturned": info.returned,
                    "tailable": true,
                    "awaitData": true,
                    "originatingCommand": info.originating_command.clone(),
                },
                "changeStream": {
                    "lastResumeToken": info.last_token.clone().map_or(Bson::Null, Bson::Document),
                    "lagSecs": lag.map_or(Bson::Null, Bson::Int64),
                },
            }
        })
        .collect()
}

/// `currentOp: 1` (fields other than its options filter the entries, as in MongoDB).
pub(super) fn current_op(ctx: &Ctx<'_>) -> Result<Document> {
    admin_only(ctx)?;
    let mut filter = Document::new();
    let mut idle_cursors = false;
    for (k, v) in ctx.cmd {
        match k.as_str() {
            "currentOp" | "$all" | "$ownOps" | "$db" | "lsid" | "$clusterTime"
            | "$readPreference" | "apiVersion" | "comment" => {}
            "idleCursors" => idle_cursors = pipeline::value::truthy(v),
            other => {
                filter.insert(other, v.clone());
            }
        }
    }
    let matcher = pipeline::Matcher::parse(&filter)?;
    let inprog: Vec<Bson> = inprog(ctx, idle_cursors)
        .into_iter()
        .filter(|d| matcher.matches(d))
        .map(Bson::Document)
        .collect();
    Ok(doc! {"inprog": inprog, "ok": 1.0})
}

/// `aggregate: 1` on `admin` with `$currentOp` first, then any document stages.
pub(super) async fn aggregate(ctx: &Ctx<'_>, stages: &[Document]) -> Result<Body> {
    admin_only(ctx)?;
    let Some(first) = stages
        .first()
        .and_then(|s| s.get_document("$currentOp").ok())
    else {
        return Err(MongoError::bad_value("$currentOp must be the first stage"));
    };
    let idle_cursors = first
        .get("idleCursors")
        .is_some_and(pipeline::value::truthy);
    let rest = pipeline::agg::Pipeline::parse(&stages[1..])?;
    let out = rest.run(inprog(ctx, idle_cursors))?;
    let ns = "admin.$cmd.aggregate".to_string();
    super::reads::buffered_reply(ctx, ns, out).await
}
