//! The router's composition root: the seams (the shard transport and the config store of
//! `kernel`, the clock, the metadata cache, the cursor table, the sessions) built once and
//! handed to the commands that run on them.
//!
//! Invariants: a command reaches the shards through [`Router::shards`], so a statement of a
//! transaction enlists its shard (`txn::Enlisting`); background work (streams, lineages)
//! uses the transport itself, which carries the router's `$clusterTime` on every command
//! and observes every reply's (see `kernel::transport`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use resume::ClusterTime;
use shard::sharding::ShardId;
use tokio_util::sync::CancellationToken;
use wire::{MongoError, Result};

use crate::cursors::CursorTable;
use crate::kernel::catalog::Catalog;
use crate::kernel::clock::ClusterClock;
use crate::kernel::config::ConfigStore;
use crate::kernel::services::Services;
use crate::kernel::shard_client::ShardClient;
pub use crate::kernel::transport::ShardPatience;
use crate::kernel::transport::{Resend, ShardTransport};
pub use crate::options::{Presentation, RouterOptions};

pub struct Router {
    /// The shards, by `ShardId` (`ShardId::CONFIG` is the config shard).
    pub(crate) transport: Arc<ShardTransport>,
    /// The config shard's collections.
    pub(crate) config: ConfigStore,
    /// The cluster time this router has seen (the transport's, shared).
    pub(crate) clock: Arc<ClusterClock>,
    /// Where data lives, and so which shards a command reaches.
    pub(crate) catalog: Catalog,
    pub(crate) cursors: CursorTable,
    pub(crate) options: RouterOptions,
    /// The sessions' multi-document transactions.
    pub(crate) sessions: Arc<crate::txn::Sessions>,
    /// The transport as commands use it ([`Router::shards`]).
    enlisting: crate::txn::Enlisting,
    pub(crate) started: Instant,
    /// The listener's connection limit and counters (`serverStatus.connections`).
    pub(crate) connections: Arc<wire::limits::Connections>,
    pub(crate) failpoints: crate::failpoint::FailPoints,
    /// Background work, and the router's shutdown.
    pub(crate) services: Services,
    /// What change streams run on.
    pub(crate) streams: Arc<crate::streams::Streams>,
    /// What `--metricsPort` shows.
    pub metrics: crate::metrics::Metrics,
    /// Who each connection authenticated as.
    pub(crate) auth: crate::auth::Auth,
    /// The operations in flight (`currentOp`, `killOp`).
    pub(crate) ops: crate::ops::Ops,
    /// The logical sessions this router has seen (`$listLocalSessions`).
    pub(crate) local_sessions: crate::local_sessions::LocalSessions,
    /// The registry of the shards' histories (`lineages`).
    pub(crate) lineages: Arc<crate::kernel::lineages::Lineages>,
    /// The key that signs cluster times (`--auth`), loaded from the config shard when first
    /// needed.
    pub(crate) cluster_key: tokio::sync::OnceCell<crate::kernel::clock::ClusterKey>,
}

impl Router {
    /// A router over `shards`, named `shard0..shardN-1` in order; shard 0 is the config shard.
    pub fn new(shards: Vec<Arc<dyn ShardClient>>, options: RouterOptions) -> Arc<Router> {
        let clock = Arc::new(ClusterClock::new());
        let transport = Arc::new(ShardTransport::new(
            shards,
            clock.clone(),
            options.patience.connect,
        ));
        let connections = Arc::new(wire::limits::Connections::new(options.client_limits));
        let lineages = Arc::new(crate::kernel::lineages::Lineages::new(
            transport.clone(),
            options.lineage_interval,
        ));
        let metrics = crate::metrics::Metrics::default();
        let services = Services::default();
        let streams = Arc::new(crate::streams::Streams {
            transport: transport.clone(),
            lineages: lineages.clone(),
            hubs: Default::default(),
            patience: options.patience,
            buffer_bytes: options.stream_buffer_bytes,
            replies_per_second: options.stream_replies_per_second,
            services: services.clone(),
            idle_shard_nudges: metrics.idle_shard_nudges(),
        });
        let catalog = Catalog::new(ConfigStore::new(transport.clone()), transport.len());
        let sessions = Arc::new(crate::txn::Sessions::default());
        let enlisting = crate::txn::Enlisting::new(transport.clone(), sessions.clone());
        Arc::new(Router {
            config: ConfigStore::new(transport.clone()),
            transport,
            clock,
            catalog,
            cursors: CursorTable::default(),
            options,
            enlisting,
            sessions,
            started: Instant::now(),
            connections,
            failpoints: Default::default(),
            services,
            streams,
            metrics,
            auth: Default::default(),
            ops: Default::default(),
            local_sessions: Default::default(),
            lineages,
            cluster_key: tokio::sync::OnceCell::new(),
        })
    }

    /// The key that signs cluster times: `admin.system.keys` `_id: 1` on the config shard,
    /// made by the first router that needs it (another router's racing insert loses and reads
    /// the winner's).
    pub(crate) async fn cluster_key(&self) -> Result<&crate::kernel::clock::ClusterKey> {
        self.cluster_key
            .get_or_try_init(|| async {
                let key: Vec<u8> = (0..20).map(|_| rand::random::<u8>()).collect();
                let ours = doc! {
                    "_id": 1_i64,
                    "purpose": "HMAC",
                    "key": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: key },
                };
                let stored = self
                    .config
                    .get_or_insert("admin", "system.keys", ours)
                    .await?;
                let key = stored
                    .get_binary_generic("key")
                    .map_err(|_| MongoError::internal("the cluster's signing key is not binary"))?;
                Ok(crate::kernel::clock::ClusterKey {
                    id: 1,
                    key: key.clone(),
                })
            })
            .await
    }

    /// The token whose cancellation shuts the router down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        self.services.shutdown()
    }

    /// After [`Router::shutdown_token`] fired: waits until the background tasks are done.
    pub async fn wait_for_tasks(&self) {
        self.services.stopped().await;
    }

    pub fn shard_names(&self) -> Vec<String> {
        self.transport.names()
    }

    /// The shards as a command reaches them: a statement of a transaction enlists its shard.
    pub(crate) fn shards(&self) -> &crate::txn::Enlisting {
        &self.enlisting
    }

    /// What authentication and the user and role commands use.
    pub(crate) fn auth_cx(&self) -> crate::auth::AuthCx<'_> {
        crate::auth::AuthCx {
            auth: &self.auth,
            transport: &self.transport,
            required: self.options.auth,
        }
    }

    /// The parts `getParameter` and `setParameter` read and set.
    pub(crate) fn knobs(&self) -> crate::parameters::Knobs<'_> {
        crate::parameters::Knobs {
            cursors: &self.cursors,
            enable_test_commands: self.options.enable_test_commands,
            max_clock_drift: self.options.max_clock_drift,
        }
    }

    /// The `--metricsPort` page: the counters, with the figures read now.
    pub async fn render_metrics(&self) -> String {
        let streams = self.cursors.streams();
        let live = crate::metrics::Live {
            connections: self.connections.counts().current,
            cursors: self.cursors.len(),
            change_streams: streams.len(),
            stream_tokens: streams
                .into_iter()
                .filter_map(|(_, info)| info.last_token)
                .collect(),
            shared_merges: self.streams.hubs.stats().0,
            now: self.cluster_time(),
        };
        self.metrics.render(live, &self.transport).await
    }

    pub fn cluster_time(&self) -> ClusterTime {
        self.clock.now()
    }

    /// The router's clock starts at zero and learns the cluster's time from the shards'
    /// replies. Until it has, a reply's `operationTime` would be `Timestamp(0, 0)`, which a
    /// connector takes as the start of its change stream (and which precedes all history), so
    /// a command that arrives first asks the config shard for its time (a `ping`).
    pub(crate) async fn learn_cluster_time(&self, patience: Duration) {
        if self.clock.now() > ClusterTime::ZERO {
            return;
        }
        let ping = doc! {"ping": 1};
        let sent =
            self.transport
                .send_body(ShardId::CONFIG, "admin", ping, patience, Resend::Unsent);
        if let Err(e) = sent.await {
            tracing::debug!(error = %e.into_error(), "the config shard did not give its time");
        }
    }
}
