//! The shards as the router reaches them: [`ShardTransport`] sends a command to a shard by
//! index, waits for a shard it cannot reach (within the caller's patience), sends again what
//! may safely run twice, gossips the router's cluster time on every command and learns the
//! shard's from every reply.
//!
//! [`Shards`] is what callers use: the conveniences (a command, a read, a write, a broadcast)
//! over one `send_body`, implemented by the plain transport and by `txn::Enlisting`, which
//! makes a transaction's statement enlist its shard first.
//!
//! Invariants:
//! * every command leaves with the router's latest `$clusterTime`, and every reply's cluster
//!   time is observed, an error reply's included, before the caller sees it;
//! * a command is sent again only when it was never sent ([`Resend::Unsent`]), or when it may
//!   run twice ([`Resend::Lost`]: reads, retryable writes) and its connection failed after
//!   sending; never past the patience given;
//! * every command sent for a client's operation carries its `clientOperationKey`
//!   ([`OPERATION_KEY`]), so `killOp` reaches its work on the shards.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document};
use futures::future::join_all;
use shard::sharding::ShardId;
use wire::raw::Body;
use wire::{ErrorCode, MongoError, Result};

use super::clock::ClusterClock;
use super::shard_client::{ShardClient, TransportError};

tokio::task_local! {
    /// The `clientOperationKey` of the client operation this task runs: the transport adds it
    /// to every command it sends a shard for the operation.
    pub static OPERATION_KEY: bson::Binary;
    /// Who runs the client write this task serves (`user`, `authenticatedDb`, `appName`,
    /// `comment`): the transport adds it to each write it sends a shard for it, whose oplog
    /// entries record it ([`shard::writer::COMMIT_METADATA_FIELD`]).
    pub static COMMIT_METADATA: std::sync::Arc<Document>;
}

/// Whether writes record who made them (`recordCommitMetadata`, on unless turned off).
static RECORD_COMMIT_METADATA: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

pub fn record_commit_metadata() -> bool {
    RECORD_COMMIT_METADATA.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn set_record_commit_metadata(on: bool) {
    RECORD_COMMIT_METADATA.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The shard commands whose entries record the commit metadata: the writes, the second phase
/// of an ordered insert across shards, and the commits of transactions.
fn records_commit_metadata(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "commitTransaction"
            | "coordinateCommitTransaction"
            | "_shardsvrCommitReservation"
    )
}

/// The key of the operation the calling task runs, if it runs one.
pub fn current_operation_key() -> Option<bson::Binary> {
    OPERATION_KEY.try_with(Clone::clone).ok()
}

/// Pauses between attempts to reach a shard: short at first (a restart takes well under a
/// second), then at most [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Which failed sends [`ShardTransport::send_body`] tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Only commands that were never sent (no connection could be opened).
    Unsent,
    /// Also commands lost after sending: for commands that may run twice.
    Lost,
}

/// The next pause after `pause`.
pub fn backoff(pause: Duration) -> Duration {
    (pause * 2).min(RETRY_MAX)
}

/// Sleeps for `pause`, but not past `deadline`.
pub async fn sleep_before(pause: Duration, deadline: tokio::time::Instant) {
    tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause)).await;
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

/// One shard: its id, its name (`shard0`, ...) and its wire.
pub struct Shard {
    pub id: ShardId,
    pub name: String,
    pub client: Arc<dyn ShardClient>,
}

/// The shards of the cluster, by [`ShardId`] (`ShardId::CONFIG` is the config shard), and the
/// router's clock that their traffic gossips.
pub struct ShardTransport {
    shards: Vec<Shard>,
    clock: Arc<ClusterClock>,
    /// How long a command waits for a shard it cannot reach.
    connect: Duration,
}

impl ShardTransport {
    /// The transport over `clients`, named `shard0..shardN-1` in order.
    pub fn new(
        clients: Vec<Arc<dyn ShardClient>>,
        clock: Arc<ClusterClock>,
        connect: Duration,
    ) -> ShardTransport {
        let shards = clients
            .into_iter()
            .enumerate()
            .map_while(|(i, client)| {
                let id = ShardId::new(i)?;
                Some(Shard {
                    id,
                    name: id.to_string(),
                    client,
                })
            })
            .collect();
        ShardTransport {
            shards,
            clock,
            connect,
        }
    }

    /// The shards, in index order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn clock(&self) -> &ClusterClock {
        &self.clock
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Every shard's id, in order.
    pub fn all(&self) -> Vec<ShardId> {
        self.shards.iter().map(|s| s.id).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.shards.iter().map(|s| s.name.clone()).collect()
    }

    /// The shard `id`, if the cluster has it.
    fn get(&self, id: ShardId) -> Option<&Shard> {
        self.shards.get(id.index())
    }

    /// The name of shard `shard` (`shard0`, ...).
    pub fn name(&self, shard: ShardId) -> Option<&str> {
        self.get(shard).map(|s| s.name.as_str())
    }

    /// The `host:port` of a shard in another process (`None` for one in this process).
    pub fn host(&self, shard: ShardId) -> Option<String> {
        let d = self.get(shard)?.client.describe();
        d.contains(':').then_some(d)
    }

    /// The shard named `name`, or `ShardNotFound`.
    pub fn id(&self, name: &str) -> Result<ShardId> {
        self.shards
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.id)
            .ok_or_else(|| {
                MongoError::new(
                    ErrorCode::SHARD_NOT_FOUND,
                    format!("shard {name} not found"),
                )
            })
    }

    /// Sends `cmd` to a shard, trying again until `patience` runs out when no connection could
    /// be opened, and (with [`Resend::Lost`]) when the connection failed after sending. The
    /// reply comes as the shard gave it (change-stream batches come encoded and stay so).
    pub async fn send_body(
        &self,
        shard: ShardId,
        db: &str,
        mut cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> std::result::Result<Body, TransportError> {
        let Some(target) = self.get(shard) else {
            let error = MongoError::internal(format!("no shard {shard}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        if let Some(key) = current_operation_key()
            && !cmd.contains_key("clientOperationKey")
        {
            cmd.insert("clientOperationKey", key);
        }
        if let Ok(meta) = COMMIT_METADATA.try_with(std::sync::Arc::clone)
            && cmd
                .keys()
                .next()
                .is_some_and(|name| records_commit_metadata(name))
        {
            cmd.insert(shard::writer::COMMIT_METADATA_FIELD, (*meta).clone());
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
}

/// Whether a command is a statement of a transaction (`autocommit: false`).
pub fn in_transaction(cmd: &Document) -> bool {
    matches!(cmd.get("autocommit"), Some(Bson::Boolean(false)))
}

/// Whether a command is a retryable write: `txnNumber` outside a transaction.
pub fn is_retryable_write(cmd: &Document) -> bool {
    cmd.contains_key("txnNumber") && !cmd.contains_key("autocommit")
}

/// Sending commands to shards: one `send_body`, and the ways callers use it. Implemented by
/// [`ShardTransport`] and by `txn::Enlisting` (a transaction's statements enlist their shard).
///
/// Each conveniences' `Result` is the shard's error for an `ok: 0` reply (except
/// [`Shards::command_raw`] and the bodies), or the transport's.
pub trait Shards: Sync {
    /// [`ShardTransport::send_body`].
    fn send_body(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> impl Future<Output = std::result::Result<Body, TransportError>> + Send;

    /// How long a command waits for a shard it cannot reach (`ShardPatience::connect`).
    fn connect_patience(&self) -> Duration;

    /// [`Shards::send_body`] with the reply as a document (an `ok: 0` one included).
    fn send(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> impl Future<Output = std::result::Result<Document, TransportError>> + Send {
        async move {
            let reply = self.send_body(shard, db, cmd, patience, resend).await?;
            Ok(reply.into_document().unwrap_or_else(|e| e.to_document()))
        }
    }

    /// Sends `cmd` with the router's cluster time and returns the reply when it is `ok: 1`,
    /// or its error. The reply's cluster time is observed either way.
    fn command(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Document>> + Send {
        async move { ok(self.command_raw(shard, db, cmd).await?) }
    }

    /// Like [`Shards::command`], but an `ok: 0` reply is returned as a document. A shard that
    /// cannot be reached is waited for ([`Shards::connect_patience`]); `Err` is a transport
    /// failure.
    fn command_raw(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Document>> + Send {
        async move {
            self.send(shard, db, cmd, self.connect_patience(), Resend::Unsent)
                .await
                .map_err(TransportError::into_error)
        }
    }

    /// A command that may run twice: sent again (within the connect patience) also when the
    /// connection failed after sending, as when the shard restarts in the middle of it. For
    /// reads, and for retryable writes (the shard answers a repeated statement with its
    /// recorded result, see `shard::retryable`).
    fn idempotent(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Document>> + Send {
        async move {
            let reply = self
                .send(shard, db, cmd, self.connect_patience(), Resend::Lost)
                .await
                .map_err(TransportError::into_error)?;
            ok(reply)
        }
    }

    /// [`Shards::idempotent`] for a read.
    fn read(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Document>> + Send {
        self.idempotent(shard, db, cmd)
    }

    /// A read whose reply is kept as the shard gave it (an `ok: 0` reply included): sent again
    /// if its shard restarts under it, as [`Shards::read`].
    fn read_body(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Body>> + Send {
        async move {
            self.send_body(shard, db, cmd, self.connect_patience(), Resend::Lost)
                .await
                .map_err(TransportError::into_error)
        }
    }

    /// A write: sent again after a loss only when it is a retryable write (`txnNumber`).
    fn write(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
    ) -> impl Future<Output = Result<Document>> + Send {
        async move {
            if is_retryable_write(&cmd) {
                self.idempotent(shard, db, cmd).await
            } else {
                self.command(shard, db, cmd).await
            }
        }
    }

    /// Sends one command to several shards at once; results in the order of `shards`.
    fn broadcast(
        &self,
        shards: &[ShardId],
        db: &str,
        cmd: &Document,
    ) -> impl Future<Output = Vec<Result<Document>>> + Send {
        join_all(shards.iter().map(|&s| self.command(s, db, cmd.clone())))
    }

    /// [`Shards::broadcast`] for reads: each is sent again if its shard restarts under it.
    fn broadcast_read(
        &self,
        shards: &[ShardId],
        db: &str,
        cmd: &Document,
    ) -> impl Future<Output = Vec<Result<Document>>> + Send {
        join_all(shards.iter().map(|&s| self.read(s, db, cmd.clone())))
    }
}

impl Shards for ShardTransport {
    fn send_body(
        &self,
        shard: ShardId,
        db: &str,
        cmd: Document,
        patience: Duration,
        resend: Resend,
    ) -> impl Future<Output = std::result::Result<Body, TransportError>> + Send {
        ShardTransport::send_body(self, shard, db, cmd, patience, resend)
    }

    fn connect_patience(&self) -> Duration {
        self.connect
    }
}

/// The reply when it is `ok: 1`, else its error.
fn ok(reply: Document) -> Result<Document> {
    match MongoError::from_reply(&reply) {
        None => Ok(reply),
        Some(e) => Err(e),
    }
}

/// `cursor.firstBatch` of a cursor reply.
pub fn first_batch(reply: &Document) -> Result<Vec<Document>> {
    batch(reply, "firstBatch")
}

/// `cursor.nextBatch` of a getMore reply.
pub fn next_batch(reply: &Document) -> Result<Vec<Document>> {
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
pub fn cursor_id(reply: &Document) -> i64 {
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
