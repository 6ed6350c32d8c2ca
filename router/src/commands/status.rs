//! `tributaryStatus`: the cluster's state in one reply, as `GET /v1/status` serves it and
//! `tributary status` prints it: per shard its oplog window, size, high-water mark and whether
//! it answers; the open change streams and shared merges with their lag; the subscriptions;
//! and the events delivered.
//!
//! Invariants: reading the status never waits on a shard, or on the config shard, for more
//! than [`ASK_PATIENCE`] (one that does not answer is shown down, not waited for); the lists
//! are bounded ([`MAX_LISTED`]).

use std::time::Duration;

use bson::{Bson, Document, doc};
use serde_json::{Value, json};
use wire::{MongoError, Result};

use super::Ctx;
use crate::kernel::transport::Shards;
use crate::seams::Seams;

/// How long the status waits for any one shard.
const ASK_PATIENCE: Duration = Duration::from_secs(1);
/// The most streams and subscriptions listed.
const MAX_LISTED: usize = 100;

/// `tributaryStatus: 1` (on `admin`): [`cluster_status`] as a document.
pub(super) async fn tributary_status(ctx: &Ctx<'_>) -> Result<Document> {
    super::admin::admin_only(ctx)?;
    let status = cluster_status(ctx.seams).await;
    let mut reply = match Bson::try_from(status) {
        Ok(Bson::Document(d)) => d,
        _ => return Err(MongoError::internal("the status is not a document")),
    };
    reply.insert("ok", 1.0);
    Ok(reply)
}

fn time(ts: Option<bson::Timestamp>) -> Value {
    ts.map_or(Value::Null, |t| json!({"t": t.time, "i": t.increment}))
}

/// The seconds from `then` to `now`, never negative.
fn lag(now: resume::ClusterTime, then: resume::ClusterTime) -> f64 {
    f64::from(now.secs.saturating_sub(then.secs))
}

/// The cluster's status as JSON: what `GET /v1/status` serves and `tributaryStatus` returns.
pub async fn cluster_status(seams: &Seams) -> Value {
    let now = seams.cluster_time();
    let transport = &seams.transport;
    let asks = transport.all().into_iter().map(|s| async move {
        let ask = transport.command(s, "admin", doc! {"serverStatus": 1});
        tokio::time::timeout(ASK_PATIENCE, ask).await
    });
    let answers = futures::future::join_all(asks).await;
    let shards: Vec<Value> = transport
        .names()
        .into_iter()
        .zip(answers)
        .map(|(name, answer)| match answer {
            Ok(Ok(status)) => {
                let oplog = status.get_document("oplog").ok();
                let ts = |k: &str| oplog.and_then(|o| o.get_timestamp(k).ok());
                let n = |k: &str| {
                    oplog
                        .and_then(|o| o.get(k))
                        .and_then(Bson::as_i64)
                        .unwrap_or(0)
                };
                json!({
                    "name": name,
                    "up": true,
                    "oplog": {
                        "earliest": time(ts("oldest")),
                        "current": time(ts("newest")),
                        "bytes": n("sizeBytes"),
                        "entries": n("entries"),
                    },
                    "highWaterMark": time(status.get_timestamp("highWaterMark").ok()),
                })
            }
            _ => json!({"name": name, "up": false, "oplog": null, "highWaterMark": null}),
        })
        .collect();
    let open = seams.cursors.streams();
    let lags: Vec<f64> = open
        .iter()
        .map(|(_, info)| {
            info.last_token
                .as_ref()
                .and_then(|t| resume::token::ResumeTokenData::from_document(t).ok())
                .map_or(0.0, |t| lag(now, t.cluster_time()))
        })
        .collect();
    let list: Vec<Value> = open
        .iter()
        .zip(&lags)
        .take(MAX_LISTED)
        .map(|((id, info), lag)| json!({"cursorId": id.to_string(), "ns": info.ns, "lagSecs": lag}))
        .collect();
    json!({
        "router": {
            "host": seams.subscriptions.router_id(),
            "uptimeSecs": seams.started.elapsed().as_secs_f64(),
            "clusterTime": {"t": now.secs, "i": now.inc},
            "connections": seams.connections.counts().current,
            "cursors": seams.cursors.len(),
        },
        "shards": shards,
        "streams": {
            "open": open.len(),
            "sharedMerges": seams.streams.hubs.stats().0,
            "maxLagSecs": lags.iter().copied().fold(0.0, f64::max),
            "eventsDelivered": seams.metrics.events_delivered_total(),
            "list": list,
        },
        "subscriptions": subscriptions(seams).await,
    })
}

/// The subscriptions defined (at most [`MAX_LISTED`]) with their consumers; empty when the
/// config shard does not answer in time.
async fn subscriptions(seams: &Seams) -> Vec<Value> {
    use crate::subscriptions::spec::{CONSUMERS, DEFINITIONS, STATE_DB};
    let read = |coll: &str, limit: i64, projection: Document| {
        let cmd = doc! {"find": coll, "filter": {}, "projection": projection, "limit": limit,
        "batchSize": limit, "singleBatch": true};
        tokio::time::timeout(
            ASK_PATIENCE,
            seams
                .transport
                .read(shard::sharding::ShardId::CONFIG, STATE_DB, cmd),
        )
    };
    let first_batch = |reply: Document| -> Vec<Document> {
        reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .map(|b| b.iter().filter_map(|d| d.as_document().cloned()).collect())
            .unwrap_or_default()
    };
    let Ok(Ok(defs)) = read(DEFINITIONS, MAX_LISTED as i64, doc! {"db": 1, "name": 1}).await else {
        return Vec::new();
    };
    let consumers = match read(CONSUMERS, 10_000, doc! {"_id": 1}).await {
        Ok(Ok(reply)) => first_batch(reply),
        _ => Vec::new(),
    };
    first_batch(defs)
        .into_iter()
        .map(|d| {
            let id = d.get_str("_id").unwrap_or("");
            let n = consumers
                .iter()
                .filter(|c| {
                    c.get_document("_id")
                        .and_then(|i| i.get_str("s"))
                        .is_ok_and(|s| s == id)
                })
                .count();
            json!({
                "db": d.get_str("db").unwrap_or(""),
                "name": d.get_str("name").unwrap_or(""),
                "consumers": n,
            })
        })
        .collect()
}
