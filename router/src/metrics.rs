//! Prometheus metrics: what the router counts as it serves, and the HTTP endpoint
//! (`--metricsPort`) that shows them with the figures read at scrape time (connections,
//! cursors, each shard's oplog and high-water mark).
//!
//! Owns: the counters and histograms, their names and labels, and their rendering in
//! Prometheus's text format (served at `GET /metrics` by [`crate::http`]).
//!
//! Invariants:
//! * label values are bounded: a command's label is its name, or `other` for a name the router
//!   does not know (answered `CommandNotFound`); an outcome is `ok` or the error's `codeName`;
//!   so a client cannot grow the label sets without bound;
//! * counters only grow; gauges are set from the live state at each scrape;
//! * a scrape never waits on a shard for more than a second (a shard that does not answer is
//!   left out of that scrape) and never fails the router.

use std::time::Duration;

use bson::{Document, doc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use resume::ClusterTime;

use crate::kernel::transport::{ShardTransport, Shards};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandOutcome {
    command: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandName {
    command: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteKind {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForeignRead {
    read: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardName {
    shard: String,
}

type Seconds = Family<CommandName, Histogram, fn() -> Histogram>;

/// Latency buckets: 100 µs to about 26 s, ×4 apart.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 10))
}

/// The router's metrics.
pub struct Metrics {
    registry: Registry,
    commands: Family<CommandOutcome, Counter>,
    command_seconds: Seconds,
    documents_written: Family<WriteKind, Counter>,
    foreign_documents_read: Family<ForeignRead, Counter>,
    events_delivered: Counter,
    idle_shard_nudges: Counter,
    connections: Gauge,
    cursors: Gauge,
    change_stream_cursors: Gauge,
    shared_merges: Gauge,
    stream_lag_seconds: Gauge,
    oplog_bytes: Family<ShardName, Gauge>,
    oplog_entries: Family<ShardName, Gauge>,
    high_water_mark: Family<ShardName, Gauge>,
    shard_up: Family<ShardName, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("tributary"),
            commands: Family::default(),
            command_seconds: Family::new_with_constructor(latency_histogram),
            documents_written: Family::default(),
            foreign_documents_read: Family::default(),
            events_delivered: Counter::default(),
            idle_shard_nudges: Counter::default(),
            connections: Gauge::default(),
            cursors: Gauge::default(),
            change_stream_cursors: Gauge::default(),
            shared_merges: Gauge::default(),
            stream_lag_seconds: Gauge::default(),
            oplog_bytes: Family::default(),
            oplog_entries: Family::default(),
            high_water_mark: Family::default(),
            shard_up: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            "commands",
            "Commands run, by name and outcome (ok or the error's codeName)",
            m.commands.clone(),
        );
        r.register(
            "command_duration_seconds",
            "Time to answer a command, by name",
            m.command_seconds.clone(),
        );
        r.register(
            "documents_written",
            "Documents inserted, updated (matched) and deleted by acknowledged writes",
            m.documents_written.clone(),
        );
        r.register(
            "foreign_documents_read",
            "Documents of other collections read for $lookup and $graphLookup: only what the \
             input joins or reaches (joined), or the whole collection (whole)",
            m.foreign_documents_read.clone(),
        );
        r.register(
            "change_stream_events_delivered",
            "Change-stream events sent to clients",
            m.events_delivered.clone(),
        );
        r.register(
            "idle_shard_nudges",
            "Times a change-stream merge asked an idle shard to promise past a buffered event",
            m.idle_shard_nudges.clone(),
        );
        r.register(
            "connections",
            "Client connections open",
            m.connections.clone(),
        );
        r.register("cursors_open", "Cursors open", m.cursors.clone());
        r.register(
            "change_stream_cursors_open",
            "Change-stream cursors open",
            m.change_stream_cursors.clone(),
        );
        r.register(
            "change_stream_shared_merges",
            "Shard merges shared by change streams with the same shard-side spec",
            m.shared_merges.clone(),
        );
        r.register(
            "change_stream_max_lag_seconds",
            "The largest lag of an open change stream: cluster time now minus its last token's",
            m.stream_lag_seconds.clone(),
        );
        r.register(
            "oplog_bytes",
            "A shard's oplog size in bytes",
            m.oplog_bytes.clone(),
        );
        r.register(
            "oplog_entries",
            "A shard's oplog entries",
            m.oplog_entries.clone(),
        );
        r.register(
            "high_water_mark_seconds",
            "A shard's high-water mark (seconds of its cluster time)",
            m.high_water_mark.clone(),
        );
        r.register(
            "shard_up",
            "1 when the shard answered this scrape, 0 when not",
            m.shard_up.clone(),
        );
        m
    }

    /// Counts a command's outcome and time; `outcome` is `None` for success, else the
    /// error's `codeName`.
    pub fn command(&self, name: &str, outcome: Option<&str>, took: Duration) {
        let command = if crate::command::Command::named(name).is_some() {
            name.to_string()
        } else {
            "other".to_string()
        };
        let outcome = outcome.unwrap_or("ok").to_string();
        self.command_seconds
            .get_or_create(&CommandName {
                command: command.clone(),
            })
            .observe(took.as_secs_f64());
        self.commands
            .get_or_create(&CommandOutcome { command, outcome })
            .inc();
    }

    /// Counts documents an acknowledged write touched (`op`: insert, update or delete).
    pub fn documents_written(&self, op: &str, n: u64) {
        if n > 0 {
            self.documents_written
                .get_or_create(&WriteKind { op: op.to_string() })
                .inc_by(n);
        }
    }

    /// Counts documents read from another collection for a pipeline stage; `joined` when a
    /// `$lookup` / `$graphLookup` read only what its input joins or reaches, else the
    /// collection was read whole.
    pub fn foreign_documents_read(&self, joined: bool, n: u64) {
        let read = if joined { "joined" } else { "whole" };
        self.foreign_documents_read
            .get_or_create(&ForeignRead { read: read.into() })
            .inc_by(n);
    }

    pub fn events_delivered(&self, n: u64) {
        self.events_delivered.inc_by(n);
    }

    /// Change-stream events sent to clients since the router started.
    pub fn events_delivered_total(&self) -> u64 {
        self.events_delivered.get()
    }

    /// The counter of idle shards' nudges, which change streams count into.
    pub fn idle_shard_nudges(&self) -> Counter {
        self.idle_shard_nudges.clone()
    }

    /// The metrics in Prometheus's text format, with the `live` figures and each shard's
    /// status (asked over `transport` now).
    pub async fn render(&self, live: Live, transport: &ShardTransport) -> String {
        self.connections
            .set(i64::try_from(live.connections).unwrap_or(i64::MAX));
        self.cursors
            .set(i64::try_from(live.cursors).unwrap_or(i64::MAX));
        self.change_stream_cursors
            .set(i64::try_from(live.change_streams).unwrap_or(i64::MAX));
        self.shared_merges
            .set(i64::try_from(live.shared_merges).unwrap_or(i64::MAX));
        let lag = live
            .stream_tokens
            .iter()
            .filter_map(|t| resume::token::ResumeTokenData::from_document(t).ok())
            .map(|t| i64::from(live.now.secs.saturating_sub(t.cluster_time().secs)))
            .max()
            .unwrap_or(0);
        self.stream_lag_seconds.set(lag);
        let names = transport.names();
        let asks = transport.all().into_iter().map(|s| async move {
            let ask = transport.command(s, "admin", doc! {"serverStatus": 1});
            tokio::time::timeout(Duration::from_secs(1), ask).await
        });
        for (name, status) in names.iter().zip(futures::future::join_all(asks).await) {
            let shard = ShardName {
                shard: name.clone(),
            };
            let Ok(Ok(status)) = status else {
                self.shard_up.get_or_create(&shard).set(0);
                continue;
            };
            self.shard_up.get_or_create(&shard).set(1);
            let oplog = status.get_document("oplog").ok();
            let get = |k: &str| {
                oplog
                    .and_then(|o| o.get(k))
                    .and_then(|v| match v {
                        bson::Bson::Int64(n) => Some(*n),
                        bson::Bson::Int32(n) => Some(i64::from(*n)),
                        bson::Bson::Double(d) => Some(*d as i64),
                        _ => None,
                    })
                    .unwrap_or(0)
            };
            self.oplog_bytes.get_or_create(&shard).set(get("sizeBytes"));
            self.oplog_entries.get_or_create(&shard).set(get("entries"));
            if let Ok(hwm) = status.get_timestamp("highWaterMark") {
                self.high_water_mark
                    .get_or_create(&shard)
                    .set(i64::from(hwm.time));
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// What the router's other parts hold at a scrape, read by the router for [`Metrics::render`].
pub struct Live {
    /// The listener's count: connections still in their TLS handshake included, as
    /// `serverStatus.connections.current`.
    pub connections: u64,
    /// Open router cursors, and how many of them are change streams.
    pub cursors: usize,
    pub change_streams: usize,
    /// The resume tokens the change-stream cursors last returned.
    pub stream_tokens: Vec<Document>,
    /// Shared merges (hubs) serving change streams.
    pub shared_merges: usize,
    /// The router's cluster time.
    pub now: ClusterTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_labels_are_bounded() {
        let m = Metrics::new();
        m.command("find", None, Duration::from_millis(2));
        m.command("noSuchCommand-1", Some("CommandNotFound"), Duration::ZERO);
        m.command("noSuchCommand-2", Some("CommandNotFound"), Duration::ZERO);
        // Refused before dispatch (say, unauthorized): still not a label of its own.
        m.command("noSuchCommand-3", Some("Unauthorized"), Duration::ZERO);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).expect("encode");
        assert!(
            out.contains(r#"tributary_commands_total{command="find",outcome="ok"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(
                r#"tributary_commands_total{command="other",outcome="CommandNotFound"} 2"#
            ),
            "{out}"
        );
        assert!(!out.contains("noSuchCommand"), "{out}");
        assert!(
            out.contains(r#"tributary_commands_total{command="other",outcome="Unauthorized"} 1"#),
            "{out}"
        );
        assert!(
            out.contains("tributary_command_duration_seconds_bucket"),
            "{out}"
        );
    }
}
