//! The router's composition root: builds the seams (the shard transport and the config store
//! of `kernel`, the clock, the metadata cache, the cursor table, the sessions, change streams)
//! once, as a [`Seams`] the commands share, and is the launcher's handle on them: shutdown,
//! the background tasks, the metrics page.
//!
//! Invariant: only the launcher (`server.rs`, `launch.rs`) holds a `Router`; commands see the
//! [`Seams`] alone, so no command can start, stop or serve the router.

use std::sync::Arc;
use std::time::Instant;

use resume::ClusterTime;
use tokio_util::sync::CancellationToken;

use crate::cursors::CursorTable;
use crate::kernel::catalog::Catalog;
use crate::kernel::clock::ClusterClock;
use crate::kernel::config::ConfigStore;
use crate::kernel::services::Services;
use crate::kernel::shard_client::ShardClient;
pub use crate::kernel::transport::ShardPatience;
use crate::kernel::transport::ShardTransport;
pub use crate::options::{Presentation, RouterOptions};
use crate::seams::Seams;

pub struct Router {
    seams: Arc<Seams>,
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
        let subscriptions =
            crate::subscriptions::Subscriptions::new(streams.clone(), transport.clone());
        let seams = Seams {
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
            subscriptions,
            streams,
            metrics,
            auth: Default::default(),
            ops: Default::default(),
            local_sessions: Default::default(),
            app_names: Default::default(),
            lineages,
            cluster_key: tokio::sync::OnceCell::new(),
        };
        Arc::new(Router {
            seams: Arc::new(seams),
        })
    }

    /// What the commands run on.
    pub(crate) fn seams(&self) -> &Arc<Seams> {
        &self.seams
    }

    /// The token whose cancellation shuts the router down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        self.seams.services.shutdown()
    }

    /// After [`Router::shutdown_token`] fired: waits until the background tasks are done.
    pub async fn wait_for_tasks(&self) {
        self.seams.services.stopped().await;
    }

    pub fn shard_names(&self) -> Vec<String> {
        self.seams.transport.names()
    }

    pub fn cluster_time(&self) -> ClusterTime {
        self.seams.cluster_time()
    }

    /// The `--metricsPort` page: the counters, with the figures read now.
    pub async fn render_metrics(&self) -> String {
        crate::http::status::render_metrics(&self.seams).await
    }
}
