//! How a router is configured: what its command line and config file set, read by the parts
//! that apply them. A leaf: it names the values, nothing of the router.

use std::sync::Arc;
use std::time::Duration;

use crate::kernel::transport::ShardPatience;

/// How the router presents itself to drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Presentation {
    /// A mongos (`msg: "isdbgrid"`).
    #[default]
    Mongos,
    /// A single-node replica set primary.
    ReplicaSet,
}

#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// `host:port` drivers dial, as shown in `hello`.
    pub advertised_host: String,
    pub presentation: Presentation,
    pub argv: Vec<String>,
    /// `--enableTestCommands`: `configureFailPoint` and the fail points are available.
    pub enable_test_commands: bool,
    pub patience: ShardPatience,
    /// Memory, in bytes, of released events a shared change-stream merge keeps for its slower
    /// clients; a client further behind goes on by itself (see `streams::hub`).
    pub stream_buffer_bytes: usize,
    /// About how many batches with events a shared merge sends per second over all its
    /// clients: each client's replies are spaced `clients ÷ this` apart (at most 100 ms), so
    /// many caught-up watchers get events in larger batches instead of one round trip per
    /// event each; a lone client is never held back; 0 turns pacing off.
    pub stream_replies_per_second: u32,
    /// `--slowms`: commands that take longer are logged (`Slow query`), as mongod's
    /// `slowOpThresholdMs` (100 by default).
    pub slow_ms: u64,
    /// `maxAcceptableLogicalClockDriftSecs`: how far ahead of the wall clock a client's
    /// `$clusterTime` may be (one year by default, as MongoDB).
    pub max_clock_drift: Duration,
    /// `--auth`: clients must authenticate (see `auth`).
    pub auth: bool,
    /// TLS on the router's port (`--tlsMode` and its files); `None`: plain only.
    pub tls: Option<Arc<wire::tls::ServerTls>>,
    /// TLS to the shards (a router over remote shards with `preferTLS` or `requireTLS`).
    pub shard_tls: Option<wire::tls::ClientTls>,
    /// The cluster's key file, which the router logs in to remote shards with.
    pub shard_key: Option<Arc<wire::keyfile::KeyFile>>,
    /// How often the shards' lineages are recorded on the config shard (`lineages`); zero:
    /// only before resumes (for tests that count a shard's commits).
    pub lineage_interval: Duration,
    /// What the router bounds for its clients: `--maxConns` (mongod's 1,000,000 by default,
    /// capped at 80 % of the open-files limit as mongod does) and `--frameTimeoutMS` (30 s: a
    /// frame that has begun must arrive whole, a reply go out and a TLS handshake finish
    /// within it). See `wire::limits`.
    pub client_limits: wire::limits::Limits,
}

impl Default for RouterOptions {
    fn default() -> RouterOptions {
        RouterOptions {
            advertised_host: String::new(),
            presentation: Presentation::default(),
            argv: Vec::new(),
            enable_test_commands: false,
            patience: ShardPatience::default(),
            stream_buffer_bytes: 16 << 20,
            stream_replies_per_second: crate::streams::REPLIES_PER_SECOND,
            slow_ms: 100,
            max_clock_drift: Duration::from_secs(365 * 24 * 3600),
            auth: false,
            tls: None,
            shard_tls: None,
            shard_key: None,
            lineage_interval: crate::kernel::lineages::INTERVAL,
            client_limits: wire::limits::Limits::default(),
        }
    }
}
