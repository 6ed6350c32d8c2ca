//! The router's wire server: each request becomes a command run by [`crate::commands`].
//!
//! Connections are admitted, bounded and counted by `wire::server` against the router's
//! `client_limits` (`--maxConns`, `--frameTimeoutMS`); the counters it keeps are the router's
//! `connections`, which `serverStatus` reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::server::{ConnectionInfo, Handler, Reply, Request};

use crate::kernel::services::Service;
use crate::router::Router;
use crate::seams::Seams;
use wire::raw::Body;

/// Serves drivers on `listener` until `cancel` fires.
pub async fn serve(router: Arc<Router>, listener: TcpListener, cancel: CancellationToken) {
    let seams = router.seams().clone();
    seams.services.start(IdleCursors {
        seams: seams.clone(),
    });
    seams.services.start(StreamMemory {
        seams: seams.clone(),
    });
    crate::kernel::lineages::keep_up(&seams.services, &seams.lineages);
    if let Ok(addr) = listener.local_addr() {
        seams.subscriptions.set_router_id(addr.to_string());
    }
    seams.subscriptions.start(&seams.services);
    let tls = seams.options.tls.clone();
    let connections = seams.connections.clone();
    let handler = Arc::new(RouterHandler { seams });
    wire::server::serve_with(listener, handler, cancel, tls, connections).await;
}

struct RouterHandler {
    seams: Arc<Seams>,
}

#[async_trait]
impl Handler for RouterHandler {
    async fn handle(&self, conn: &ConnectionInfo, mut req: Request) -> Reply {
        let started = Instant::now();
        crate::commands::stamp_session_owner(&self.seams, conn, &mut req.body);
        let Some(reply) = crate::commands::run(&self.seams, conn, &req).await else {
            return Reply::CloseConnection;
        };
        self.account(&req, &reply, started.elapsed());
        match reply {
            _ if req.more_to_come => Reply::NoReply,
            Body::Document(reply) => Reply::Document(reply),
            Body::Raw(reply) => Reply::Raw(reply),
            Body::Cursor(reply) => Reply::Cursor(reply),
        }
    }

    fn closed(&self, conn: &ConnectionInfo) {
        self.seams.auth.closed(conn.id);
        self.seams.app_names.closed(conn.id);
    }
}

impl RouterHandler {
    /// Counts a command in the metrics, and logs it when it took longer than `--slowms`, as
    /// mongod logs slow operations.
    fn account(&self, req: &Request, reply: &Body, took: Duration) {
        let name = req.body.keys().next().map_or("", String::as_str);
        let reply = reply_fields(reply);
        let metrics = &self.seams.metrics;
        metrics.command(name, reply.code_name.as_deref(), took);
        if reply.code_name.is_none() {
            let op = match name {
                "insert" => Some("insert"),
                "update" => Some("update"),
                "delete" => Some("delete"),
                _ => None,
            };
            if let Some(op) = op {
                metrics.documents_written(op, reply.n);
            }
        }
        let slow = self.seams.options.slow_ms;
        if took >= Duration::from_millis(slow) && !is_awaiting(name, &req.body) {
            let ns = match req.body.values().next() {
                Some(bson::Bson::String(coll)) => {
                    format!("{}.{coll}", req.body.get_str("$db").unwrap_or(""))
                }
                _ => req.body.get_str("$db").unwrap_or("").to_string(),
            };
            tracing::info!(
                command = name,
                ns = %ns,
                duration_ms = took.as_millis() as u64,
                outcome = reply.code_name.as_deref().unwrap_or("ok"),
                "Slow query"
            );
        }
    }
}

/// A getMore of a tailable-await cursor (change streams), a blocked `hello` or a subscription
/// read with `waitMS` waits on purpose: its time is not slowness.
fn is_awaiting(name: &str, body: &bson::Document) -> bool {
    name == "getMore"
        || matches!(name, "hello" | "isMaster" | "ismaster") && body.contains_key("maxAwaitTimeMS")
        || name == "readSubscription" && body.contains_key("waitMS")
}

/// What the metrics read from a reply: its error's `codeName`, and `n`.
struct ReplyFields {
    code_name: Option<String>,
    n: u64,
}

fn reply_fields(reply: &Body) -> ReplyFields {
    let (ok, code_name, n) = match reply {
        Body::Document(d) => (
            d.get("ok").and_then(number),
            d.get_str("codeName").ok().map(str::to_string),
            d.get("n").and_then(number),
        ),
        Body::Raw(r) => (
            r.get("ok")
                .ok()
                .flatten()
                .and_then(|v| bson::Bson::try_from(v).ok())
                .as_ref()
                .and_then(number),
            r.get_str("codeName").ok().map(str::to_string),
            r.get("n")
                .ok()
                .flatten()
                .and_then(|v| bson::Bson::try_from(v).ok())
                .as_ref()
                .and_then(number),
        ),
        // A cursor body is an `ok` reply, with no `n`.
        Body::Cursor(_) => (Some(1.0), None, None),
    };
    let failed = ok.is_some_and(|ok| ok != 1.0);
    ReplyFields {
        code_name: failed.then(|| code_name.unwrap_or_else(|| "UnknownError".to_string())),
        n: n.map_or(0, |n| n.max(0.0) as u64),
    }
}

fn number(v: &bson::Bson) -> Option<f64> {
    match v {
        bson::Bson::Double(d) => Some(*d),
        bson::Bson::Int32(i) => Some(f64::from(*i)),
        bson::Bson::Int64(i) => Some(*i as f64),
        _ => None,
    }
}

/// Keeps the shard replies change streams hold on the router under
/// `changeStreamHeldReplyBytesLimit`: past it, streams unread for [`PARK_AFTER`] are parked,
/// the least recently read first, until three quarters of the limit is held (a parked stream
/// holds nothing and re-opens where its client stands when it is read again). A stream in
/// use is never parked.
///
/// [`PARK_AFTER`]: crate::cursors::PARK_AFTER
struct StreamMemory {
    seams: Arc<Seams>,
}

impl Service for StreamMemory {
    const NAME: &'static str = "stream_memory";

    fn period(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn pass(&mut self) {
        let limit = self.seams.cursors.stream_held_bytes();
        if crate::streams::held_bytes() <= limit {
            return;
        }
        let target = limit / 4 * 3;
        let idle = self
            .seams
            .cursors
            .idle_streams(crate::cursors::PARK_AFTER, Instant::now());
        for cursor in idle {
            if crate::streams::held_bytes() <= target {
                break;
            }
            let stopping = cursor.try_lock().ok().and_then(|mut c| c.park());
            if let Some(stopping) = stopping {
                stopping.stop().await;
            }
        }
    }
}

/// Kills cursors nobody has used for `cursorTimeoutMillis`, looking a few times per timeout
/// (at least every second, so a new timeout takes effect at once).
struct IdleCursors {
    seams: Arc<Seams>,
}

impl Service for IdleCursors {
    const NAME: &'static str = "idle_cursors";

    fn period(&self) -> Duration {
        (self.seams.cursors.idle_timeout() / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    async fn pass(&mut self) {
        for cursor in self.seams.cursors.take_idle(Instant::now()) {
            cursor.lock().await.kill(self.seams.shards()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::is_awaiting;

    #[test]
    fn commands_that_wait_on_purpose_are_not_slow() {
        assert!(is_awaiting("getMore", &doc! {"getMore": 1_i64}));
        assert!(is_awaiting(
            "hello",
            &doc! {"hello": 1, "maxAwaitTimeMS": 10_000}
        ));
        assert!(is_awaiting(
            "readSubscription",
            &doc! {"readSubscription": "s", "waitMS": 2_000}
        ));
        assert!(!is_awaiting("hello", &doc! {"hello": 1}));
        assert!(!is_awaiting(
            "readSubscription",
            &doc! {"readSubscription": "s"}
        ));
        assert!(!is_awaiting("find", &doc! {"find": "c"}));
    }
}
