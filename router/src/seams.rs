//! What a command runs on: the seams the composition root (`router.rs`) builds once — the
//! shard transport and the config store of `kernel`, the clock, the metadata cache, the cursor
//! table, the sessions, change streams, auth — as one plain value the commands share.
//!
//! Invariants: a command reaches the shards through [`Seams::shards`], so a statement of a
//! transaction enlists its shard (`txn::Enlisting`); background work (streams, lineages)
//! uses the transport itself, which carries the router's `$clusterTime` on every command
//! and observes every reply's (see `kernel::transport`). Nothing here starts, stops or
//! serves the router: that is the launcher's (`router.rs`, `server.rs`, `launch.rs`).

use std::time::{Duration, Instant};

use bson::doc;
use resume::ClusterTime;
use shard::sharding::ShardId;
use wire::{MongoError, Result};

use crate::cursors::CursorTable;
use crate::kernel::catalog::Catalog;
use crate::kernel::clock::ClusterClock;
use crate::kernel::config::ConfigStore;
use crate::kernel::services::Services;
use crate::kernel::transport::{Resend, ShardTransport};
use crate::options::RouterOptions;
use std::sync::Arc;

pub(crate) struct Seams {
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
    /// The transport as commands use it ([`Seams::shards`]).
    pub(crate) enlisting: crate::txn::Enlisting,
    pub(crate) started: Instant,
    /// The listener's connection limit and counters (`serverStatus.connections`).
    pub(crate) connections: Arc<wire::limits::Connections>,
    pub(crate) failpoints: crate::failpoint::FailPoints,
    /// Background work, and the router's shutdown.
    pub(crate) services: Services,
    /// What change streams run on.
    pub(crate) streams: Arc<crate::streams::Streams>,
    /// The consumers of subscriptions this router serves.
    pub(crate) subscriptions: Arc<crate::subscriptions::Subscriptions>,
    /// What `--metricsPort` shows.
    pub(crate) metrics: crate::metrics::Metrics,
    /// Who each connection authenticated as.
    pub(crate) auth: crate::auth::Auth,
    /// The operations in flight (`currentOp`, `killOp`).
    pub(crate) ops: crate::ops::Ops,
    /// The logical sessions this router has seen (`$listLocalSessions`).
    pub(crate) local_sessions: crate::local_sessions::LocalSessions,
    /// The application name each open connection gave in its handshake.
    pub(crate) app_names: AppNames,
    /// The registry of the shards' histories (`lineages`).
    pub(crate) lineages: Arc<crate::kernel::lineages::Lineages>,
    /// The key that signs cluster times (`--auth`), loaded from the config shard when first
    /// needed.
    pub(crate) cluster_key: tokio::sync::OnceCell<crate::kernel::clock::ClusterKey>,
}

impl Seams {
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

    pub(crate) fn cluster_time(&self) -> ClusterTime {
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

/// The application name (`client.application.name`) each open connection gave in its
/// handshake: `appName` for fail points and for the commit metadata writes record. Bounded by
/// the open connections (a name is forgotten when its connection closes) and by
/// [`AppNames::MAX_LEN`] bytes a name.
#[derive(Default)]
pub(crate) struct AppNames {
    names: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<str>>>,
}

impl AppNames {
    /// MongoDB's bound on `client.application.name`.
    pub const MAX_LEN: usize = 128;

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, std::sync::Arc<str>>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers the name a handshake (`hello`) gives, if it gives one.
    pub fn note_handshake(&self, connection: u64, hello: &bson::Document) {
        let name = hello
            .get_document("client")
            .and_then(|c| c.get_document("application"))
            .and_then(|a| a.get_str("name"));
        if let Ok(name) = name {
            let mut end = name.len().min(Self::MAX_LEN);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            self.lock()
                .insert(connection, std::sync::Arc::from(&name[..end]));
        }
    }

    pub fn get(&self, connection: u64) -> Option<std::sync::Arc<str>> {
        self.lock().get(&connection).cloned()
    }

    pub fn closed(&self, connection: u64) {
        self.lock().remove(&connection);
    }
}
