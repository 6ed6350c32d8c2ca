//! The router's shared state and its conversation with the shards: the shard clients, the
//! cluster clock, the metadata cache and the cursor table.
//!
//! Invariants: every command sent to a shard carries the router's `$clusterTime`, and every
//! reply's cluster time is observed before the reply is used, so causality crosses shards
//! (a write acknowledged on shard A before a write is sent to shard B has a smaller `ts`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use futures::future::join_all;
use resume::ClusterTime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use wire::{ErrorCode, MongoError, Result};

use crate::clock::ClusterClock;
use crate::cursors::CursorTable;
use crate::metadata::{CONFIG_DB, DatabaseEntry, MetadataCache, Placement, ShardedCollection};
use crate::shard_client::{ShardClient, TransportError};
use wire::raw::Body;

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
    /// clients; a client further behind goes on by itself (see `changestream::hub`).
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
            stream_replies_per_second: crate::changestream::REPLIES_PER_SECOND,
            slow_ms: 100,
            max_clock_drift: Duration::from_secs(365 * 24 * 3600),
            auth: false,
            tls: None,
            shard_tls: None,
            shard_key: None,
            lineage_interval: crate::lineages::INTERVAL,
            client_limits: wire::limits::Limits::default(),
        }
    }
}

/// How long the router waits for a shard it cannot reach (a shard restarting, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPatience {
    /// A command waits this long for a connection to its shard, as mongos's host targeting
    /// waits (`defaultFindReplicaSetHostTimeoutMS`, 15 s), then fails with `HostUnreachable`.
    pub connect: Duration,
    /// An open change stream waits this long for a lost shard to come back, answering empty
    /// batches meanwhile, before its getMore fails with a resumable error.
    pub stream_outage: Duration,
}

impl Default for ShardPatience {
    fn default() -> ShardPatience {
        ShardPatience {
            connect: Duration::from_secs(15),
            stream_outage: Duration::from_secs(60),
        }
    }
}

/// Pauses between attempts to reach a shard: short at first (a restart takes well under a
/// second), then at most [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Which failed sends [`Router::send`] tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only commands that were never sent (no connection could be opened).
    Unsent,
    /// Also commands lost after sending: for commands that may run twice.
    Lost,
}

/// The next pause after `pause`.
pub(crate) fn backoff(pause: Duration) -> Duration {
    (pause * 2).min(RETRY_MAX)
}

/// Sleeps for `pause`, but not past `deadline`.
pub(crate) async fn sleep_before(pause: Duration, deadline: tokio::time::Instant) {
    tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause)).await;
}

pub struct Shard {
    pub name: String,
    pub client: Arc<dyn ShardClient>,
}

/// The router. One per process; shared by every connection.
pub struct Router {
    pub(crate) shards: Vec<Shard>,
    pub(crate) clock: ClusterClock,
    pub(crate) metadata: MetadataCache,
    pub(crate) cursors: CursorTable,
    pub(crate) options: RouterOptions,
    /// The sessions' multi-document transactions.
    pub(crate) sessions: crate::txn::Sessions,
    pub(crate) started: Instant,
    /// The listener's connection limit and counters (`serverStatus.connections`).
    pub(crate) connections: Arc<wire::limits::Connections>,
    pub(crate) failpoints: crate::failpoint::FailPoints,
    /// Fires when the router shuts down; stops the background tasks (change-stream feeds).
    pub(crate) shutdown: CancellationToken,
    /// The router's background tasks, so shutting down can wait for them (they hold the
    /// router, and through it in-process shards).
    pub(crate) tasks: TaskTracker,
    /// Shared change-stream merges, by shard-side spec.
    pub(crate) hubs: crate::changestream::Hubs,
    /// What `--metricsPort` shows.
    pub metrics: crate::metrics::Metrics,
    /// Who each connection authenticated as.
    pub(crate) auth: crate::auth::Auth,
    /// The operations in flight (`currentOp`, `killOp`).
    pub(crate) ops: crate::ops::Ops,
    /// The logical sessions this router has seen (`$listLocalSessions`).
    pub(crate) local_sessions: crate::local_sessions::LocalSessions,
    /// The registry of the shards' histories (`lineages`).
    pub(crate) lineages: crate::lineages::Lineages,
    /// The key that signs cluster times (`--auth`), loaded from the config shard when first
    /// needed.
    pub(crate) cluster_key: tokio::sync::OnceCell<crate::clock::ClusterKey>,
}

impl Router {
    /// A router over `shards`, named `shard0..shardN-1` in order; shard 0 is the config shard.
    pub fn new(shards: Vec<Arc<dyn ShardClient>>, options: RouterOptions) -> Arc<Router> {
        let shards = shards
            .into_iter()
            .enumerate()
            .map(|(i, client)| Shard {
                name: format!("shard{i}"),
                client,
            })
            .collect();
        let connections = Arc::new(wire::limits::Connections::new(options.client_limits));
        Arc::new(Router {
            shards,
            clock: ClusterClock::new(),
            metadata: MetadataCache::default(),
            cursors: CursorTable::default(),
            options,
            sessions: Default::default(),
            started: Instant::now(),
            connections,
            failpoints: Default::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            hubs: Default::default(),
            metrics: Default::default(),
            auth: Default::default(),
            ops: Default::default(),
            local_sessions: Default::default(),
            lineages: Default::default(),
            cluster_key: tokio::sync::OnceCell::new(),
        })
    }

    /// The key that signs cluster times: `admin.system.keys` `_id: 1` on the config shard,
    /// made by the first router that needs it (another router's racing insert loses and reads
    /// the winner's).
    pub(crate) async fn cluster_key(&self) -> Result<&crate::clock::ClusterKey> {
        self.cluster_key
            .get_or_try_init(|| async {
                let find = doc! {"find": "system.keys", "filter": {"_id": 1_i64}, "limit": 1};
                for attempt in 0..2 {
                    let reply = self.shard_command(0, "admin", find.clone()).await?;
                    let found = reply
                        .get_document("cursor")
                        .and_then(|c| c.get_array("firstBatch"))
                        .ok()
                        .and_then(|b| b.first())
                        .and_then(Bson::as_document)
                        .and_then(|d| d.get_binary_generic("key").ok().cloned());
                    if let Some(key) = found {
                        return Ok(crate::clock::ClusterKey { id: 1, key });
                    }
                    if attempt == 0 {
                        let key: Vec<u8> = (0..20).map(|_| rand::random::<u8>()).collect();
                        let doc = doc! {
                            "_id": 1_i64,
                            "purpose": "HMAC",
                            "key": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: key },
                        };
                        // A duplicate means another router made it first: read theirs.
                        let _ = self
                            .shard_command(0, "admin", doc! {"insert": "system.keys", "documents": [doc]})
                            .await?;
                    }
                }
                Err(MongoError::internal("the cluster's signing key could not be made"))
            })
            .await
    }

    /// The token whose cancellation shuts the router down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// After [`Router::shutdown_token`] fired: waits until the background tasks are done.
    pub async fn wait_for_tasks(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    pub fn shard_names(&self) -> Vec<String> {
        self.shards.iter().map(|s| s.name.clone()).collect()
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
        if let Err(e) = self.send(0, "admin", ping, patience, Resend::Unsent).await {
            tracing::debug!(error = %e.into_error(), "the config shard did not give its time");
        }
    }

    /// The `host:port` of a shard in another process (`None` for one in this process).
    pub(crate) fn shard_host(&self, shard: usize) -> Option<String> {
        let d = self.shards.get(shard)?.client.describe();
        d.contains(':').then_some(d)
    }

    pub(crate) fn shard_index(&self, name: &str) -> Result<usize> {
        self.shards
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| {
                MongoError::new(
                    ErrorCode::SHARD_NOT_FOUND,
                    format!("shard {name} not found"),
                )
            })
    }

    /// Sends `cmd` to a shard with the router's cluster time and returns the reply when it is
    /// `ok: 1`, or its error. The reply's cluster time is observed either way.
    pub async fn shard_command(&self, shard: usize, db: &str, cmd: Document) -> Result<Document> {
        let reply = self.shard_command_raw(shard, db, cmd).await?;
        match MongoError::from_reply(&reply) {
            None => Ok(reply),
            Some(e) => Err(e),
        }
    }

    /// Like [`Router::shard_command`], but an `ok: 0` reply is returned as a document. A shard
    /// that cannot be reached is waited for (see [`ShardPatience::connect`]); `Err` is a
    /// transport failure.
    pub async fn shard_command_raw(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Document> {
        self.send(
            shard,
            db,
            cmd,
            self.options.patience.connect,
            Resend::Unsent,
        )
        .await
        .map_err(TransportError::into_error)
    }

    /// A command that may run twice: sent again (within [`ShardPatience::connect`]) also when
    /// the connection failed after sending, as when the shard restarts in the middle of it.
    /// For reads, and for retryable writes (the shard answers a repeated statement with its
    /// recorded result, see `shard::retryable`).
    pub(crate) async fn shard_idempotent(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Document> {
        let reply = self
            .send(shard, db, cmd, self.options.patience.connect, Resend::Lost)
            .await
            .map_err(TransportError::into_error)?;
        match MongoError::from_reply(&reply) {
            None => Ok(reply),
            Some(e) => Err(e),
        }
    }

    /// A read whose reply is kept as the shard gave it (an `ok: 0` reply included): sent again
    /// if its shard restarts under it, as [`Router::shard_read`].
    pub(crate) async fn shard_read_body(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Body> {
        self.send_body(shard, db, cmd, self.options.patience.connect, Resend::Lost)
            .await
            .map_err(TransportError::into_error)
    }

    /// [`Router::shard_idempotent`] for a read.
    pub(crate) async fn shard_read(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Document> {
        self.shard_idempotent(shard, db, cmd).await
    }

    /// A write: sent again after a loss only when it is a retryable write (`txnNumber`).
    pub(crate) async fn shard_write(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Document> {
        if crate::txn::is_retryable_write(&cmd) {
            self.shard_idempotent(shard, db, cmd).await
        } else {
            self.shard_command(shard, db, cmd).await
        }
    }

    /// Sends `cmd` to a shard, trying again until `patience` runs out when no connection could
    /// be opened, and (with [`Resend::Lost`]) when the connection failed after sending.
    pub(crate) async fn send(
        &self,
        shard: usize,
        db: &str,
        cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> std::result::Result<Document, TransportError> {
        let reply = self.send_body(shard, db, cmd, patience, resend).await?;
        Ok(reply.into_document().unwrap_or_else(|e| e.to_document()))
    }

    /// [`Router::send`], with the reply as the shard gave it (change-stream batches come
    /// encoded and stay so).
    pub(crate) async fn send_body(
        &self,
        shard: usize,
        db: &str,
        mut cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> std::result::Result<Body, TransportError> {
        let Some(target) = self.shards.get(shard) else {
            let error = MongoError::internal(format!("no shard with index {shard}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        if let Some(key) = crate::ops::current_key()
            && !cmd.contains_key("clientOperationKey")
        {
            cmd.insert("clientOperationKey", key);
        }
        let mut resend = resend;
        let finishing = matches!(
            cmd.keys().next().map(String::as_str),
            Some("commitTransaction" | "abortTransaction" | "coordinateCommitTransaction")
        );
        if crate::txn::in_transaction(&cmd) && !finishing {
            // A statement of a transaction: the shard becomes a participant, and the statement
            // is never sent twice (the shard would run it twice).
            if let Err(error) = self.sessions.enlist(shard, &mut cmd) {
                return Err(TransportError::Unreachable { error, cmd });
            }
            resend = Resend::Unsent;
        }
        let deadline = tokio::time::Instant::now() + patience;
        let mut pause = RETRY_FIRST;
        loop {
            cmd.insert("$clusterTime", self.clock.gossip());
            let (error, back) = match target.client.command(db, cmd).await {
                Ok(reply) => {
                    match &reply {
                        Body::Document(d) => self.clock.observe_document(d),
                        Body::Raw(raw) => self.clock.observe_raw(raw),
                        // Shards send their replies whole; a spliced one is read whole too.
                        Body::Cursor(c) => {
                            if let Ok(raw) = c.doc.to_raw() {
                                self.clock.observe_raw(&raw);
                            }
                        }
                    }
                    return Ok(reply);
                }
                Err(TransportError::Unreachable { error, cmd }) => (error, cmd),
                Err(TransportError::Lost { error, cmd }) if resend == Resend::Lost => (error, cmd),
                Err(e) => return Err(e),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(TransportError::Unreachable { error, cmd: back });
            }
            tracing::debug!(shard = %target.name, %error, "waiting for the shard");
            sleep_before(pause, deadline).await;
            pause = backoff(pause);
            cmd = back;
        }
    }

    /// Sends one command to several shards at once; results in the order of `shards`.
    pub async fn broadcast(
        &self,
        shards: &[usize],
        db: &str,
        cmd: &Document,
    ) -> Vec<Result<Document>> {
        join_all(
            shards
                .iter()
                .map(|&s| self.shard_command(s, db, cmd.clone())),
        )
        .await
    }

    /// [`Router::broadcast`] for reads: each is sent again if its shard restarts under it
    /// ([`Router::shard_read`]).
    pub(crate) async fn broadcast_read(
        &self,
        shards: &[usize],
        db: &str,
        cmd: &Document,
    ) -> Vec<Result<Document>> {
        join_all(shards.iter().map(|&s| self.shard_read(s, db, cmd.clone()))).await
    }

    pub fn all_shards(&self) -> Vec<usize> {
        (0..self.shards.len()).collect()
    }

    // ----- metadata --------------------------------------------------------------------------

    /// The database's entry, if it exists.
    pub async fn database(&self, db: &str) -> Result<Option<DatabaseEntry>> {
        if let Some(entry) = self.metadata.database(db, Instant::now()) {
            return Ok(entry);
        }
        self.load_database(db).await
    }

    async fn load_database(&self, db: &str) -> Result<Option<DatabaseEntry>> {
        let now = Instant::now();
        let found = self.config_find_one("databases", doc! {"_id": db}).await?;
        let entry = found.map(|d| DatabaseEntry {
            name: db.to_string(),
            primary: d.get_str("primary").unwrap_or("shard0").to_string(),
        });
        self.metadata.set_database(db, entry.clone(), now);
        Ok(entry)
    }

    /// The database's entry, creating it (with the least-loaded shard as primary) if needed.
    pub async fn ensure_database(&self, db: &str) -> Result<DatabaseEntry> {
        if let Some(entry) = self.database(db).await? {
            return Ok(entry);
        }
        validate_db_name(db)?;
        let primary = if db == CONFIG_DB || db == "admin" {
            self.shards[0].name.clone()
        } else {
            self.least_loaded_shard().await?
        };
        let insert = doc! {
            "insert": "databases",
            "documents": [{"_id": db, "primary": &primary}],
        };
        // A concurrent router may win the race; its choice (a duplicate key here) stands.
        self.shard_command(0, CONFIG_DB, insert).await?;
        self.load_database(db).await?.ok_or_else(|| {
            MongoError::internal(format!("database {db} vanished right after its creation"))
        })
    }

    async fn least_loaded_shard(&self) -> Result<String> {
        let mut counts = vec![0usize; self.shards.len()];
        for d in self.config_find("databases", doc! {}).await? {
            if let Ok(i) = self.shard_index(d.get_str("primary").unwrap_or("")) {
                counts[i] += 1;
            }
        }
        let best = (0..self.shards.len())
            .min_by_key(|&i| (counts[i], i))
            .unwrap_or(0);
        Ok(self.shards[best].name.clone())
    }

    /// The sharded collection `ns`, if it is sharded.
    pub async fn sharded_collection(&self, ns: &str) -> Result<Option<Arc<ShardedCollection>>> {
        let now = Instant::now();
        if let Some(entry) = self.metadata.collection(ns, now) {
            return Ok(entry);
        }
        let entry = match self
            .config_find_one("collections", doc! {"_id": ns})
            .await?
        {
            None => None,
            Some(coll) => {
                let chunks = self.config_find("chunks", doc! {"ns": ns}).await?;
                Some(Arc::new(ShardedCollection::from_documents(&coll, &chunks)?))
            }
        };
        self.metadata.set_collection(ns, entry.clone(), now);
        Ok(entry)
    }

    /// Where `db.coll` lives. A database that does not exist yet is created when `create` is set
    /// (writes), else reads go to shard 0 and find nothing.
    pub async fn placement(&self, db: &str, coll: &str, create: bool) -> Result<Placement> {
        let ns = format!("{db}.{coll}");
        if let Some(sharded) = self.sharded_collection(&ns).await? {
            return Ok(Placement::Sharded(sharded));
        }
        let primary = if create {
            self.ensure_database(db).await?.primary
        } else {
            match self.database(db).await? {
                Some(entry) => entry.primary,
                None if db == CONFIG_DB || db == "admin" => self.shards[0].name.clone(),
                None => {
                    return Ok(Placement::Unsharded {
                        primary: String::new(),
                    });
                }
            }
        };
        Ok(Placement::Unsharded { primary })
    }

    pub(crate) fn remember_collection(&self, ns: &str, entry: Option<Arc<ShardedCollection>>) {
        self.metadata.set_collection(ns, entry, Instant::now());
    }

    pub(crate) fn forget_database(&self, db: &str) {
        self.metadata.forget_database(db);
    }

    /// All documents of a `config` collection matching `filter`, from the config shard.
    pub async fn config_find(&self, coll: &str, filter: Document) -> Result<Vec<Document>> {
        let reply = self
            .shard_read(
                0,
                CONFIG_DB,
                doc! {"find": coll, "filter": filter, "batchSize": i32::MAX},
            )
            .await?;
        let mut docs = first_batch(&reply)?;
        let mut cursor_id = cursor_id(&reply);
        while cursor_id != 0 {
            let more = self
                .shard_command(
                    0,
                    CONFIG_DB,
                    doc! {"getMore": cursor_id, "collection": coll},
                )
                .await?;
            docs.extend(next_batch(&more)?);
            cursor_id = self::cursor_id(&more);
        }
        Ok(docs)
    }

    async fn config_find_one(&self, coll: &str, filter: Document) -> Result<Option<Document>> {
        Ok(self.config_find(coll, filter).await?.into_iter().next())
    }
}

pub(crate) fn validate_db_name(db: &str) -> Result<()> {
    let bad = db.is_empty() || db.len() > 63 || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']);
    if bad {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid database name: '{db}'"),
        ));
    }
    Ok(())
}

/// `cursor.firstBatch` of a cursor reply.
pub(crate) fn first_batch(reply: &Document) -> Result<Vec<Document>> {
    batch(reply, "firstBatch")
}

/// `cursor.nextBatch` of a getMore reply.
pub(crate) fn next_batch(reply: &Document) -> Result<Vec<Document>> {
    batch(reply, "nextBatch")
}

fn batch(reply: &Document, field: &str) -> Result<Vec<Document>> {
    let cursor = reply
        .get_document("cursor")
        .map_err(|_| MongoError::internal(format!("shard reply without a cursor: {reply}")))?;
    let docs = cursor
        .get_array(field)
        .map_err(|_| MongoError::internal(format!("shard reply without cursor.{field}")))?;
    Ok(docs
        .iter()
        .filter_map(|d| match d {
            Bson::Document(d) => Some(d.clone()),
            _ => None,
        })
        .collect())
}

/// `cursor.id` of a cursor reply (0 when absent).
pub(crate) fn cursor_id(reply: &Document) -> i64 {
    reply
        .get_document("cursor")
        .ok()
        .and_then(|c| match c.get("id") {
            Some(Bson::Int64(i)) => Some(*i),
            Some(Bson::Int32(i)) => Some(i64::from(*i)),
            _ => None,
        })
        .unwrap_or(0)
}
