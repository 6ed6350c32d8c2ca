//! `GET /v1/status` (the cluster's status, as the `tributaryStatus` command reports it:
//! `commands::status`), the page at `GET /` that draws it, and `GET /metrics`.
//!
//! Invariant: the status is the caller's own command, so it needs exactly the rights the
//! command needs (those of `serverStatus`).

use bson::{Bson, doc};
use serde_json::Value;
use wire::Result;

use super::Caller;
use crate::seams::Seams;

/// The status page: one file, no framework, drawn from `/v1/status`.
pub const PAGE: &str = include_str!("status.html");

/// The metrics in Prometheus's text format, with the figures read now.
pub(crate) async fn render_metrics(seams: &Seams) -> String {
    let streams = seams.cursors.streams();
    let live = crate::metrics::Live {
        connections: seams.connections.counts().current,
        cursors: seams.cursors.len(),
        change_streams: streams.len(),
        stream_tokens: streams
            .into_iter()
            .filter_map(|(_, info)| info.last_token)
            .collect(),
        shared_merges: seams.streams.hubs.stats().0,
        now: seams.cluster_time(),
    };
    seams.metrics.render(live, &seams.transport).await
}

/// The caller's `tributaryStatus` (which needs the rights `serverStatus` needs), as JSON.
pub async fn status(caller: &Caller) -> Result<Value> {
    let mut reply = caller.run("admin", doc! {"tributaryStatus": 1}).await?;
    for gossip in ["ok", "$clusterTime", "operationTime"] {
        reply.remove(gossip);
    }
    Ok(Bson::Document(reply).into_relaxed_extjson())
}
