//! `ShardClient`: how the router talks to a shard. Router→shard traffic is MongoDB command
//! documents, so the same router code runs over in-process shards and over TCP.
//!
//! Invariants: a client never invents a reply. A transport failure is a [`TransportError`],
//! never an `ok: 1` document, and it says whether the command may have run. The command comes
//! back whole either way, so the router can send it again without copying it first: always
//! when it was never sent ([`TransportError::Unreachable`]), and when it is safe to run twice
//! (reads, retryable writes) when it was lost on the way.
//!
//! Every call to a remote shard has a deadline: a command with `maxTimeMS` gets that long and
//! [`MAX_TIME_GRACE`] more (the shard reports the expiry itself); any command whose reply is
//! [`LIVENESS_CHECK`] late has its shard pinged on another connection, and fails with
//! `NetworkTimeout` (as lost: it may have run) unless the ping is answered within
//! [`PING_TIMEOUT`]. So a long command on a live shard runs on, and a hung or cut-off shard
//! fails its callers within `LIVENESS_CHECK + PING_TIMEOUT`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::Document;
use wire::raw::Body;
use wire::{ErrorCode, MongoError};

/// Why a shard command produced no reply; the command is handed back.
#[derive(Debug)]
pub enum TransportError {
    /// No connection could be opened: nothing was sent.
    Unreachable { error: MongoError, cmd: Document },
    /// The connection failed after the command was sent: it may or may not have run.
    Lost { error: MongoError, cmd: Document },
    /// The shard refused this router's key file login: nothing was sent, and sending again
    /// will not help.
    Refused { error: MongoError, cmd: Document },
}

impl TransportError {
    pub fn into_error(self) -> MongoError {
        self.into_parts().0
    }

    /// The error, and the command handed back.
    pub fn into_parts(self) -> (MongoError, Document) {
        match self {
            TransportError::Unreachable { error, cmd }
            | TransportError::Lost { error, cmd }
            | TransportError::Refused { error, cmd } => (error, cmd),
        }
    }
}

/// A connection to one shard. `command` returns the shard's reply as is: an `ok: 0` reply is a
/// reply, not an `Err`; `Err` means the shard could not be reached. A reply may come encoded
/// ([`Body::Raw`]: always over TCP, and change-stream batches in process), so a change stream
/// carries its events' bytes through without decoding them.
#[async_trait]
pub trait ShardClient: Send + Sync + 'static {
    /// Runs `cmd` against database `db` on the shard.
    async fn command(&self, db: &str, cmd: Document) -> Result<Body, TransportError>;

    /// The address or name shown in diagnostics.
    fn describe(&self) -> String;

    /// How many members hold the shard's data: the most a write concern's `w` can ask.
    fn members(&self) -> usize {
        1
    }
}

/// A shard running in this process.
pub struct LocalShard {
    shard: Arc<shard::Shard>,
}

impl LocalShard {
    pub fn new(shard: Arc<shard::Shard>) -> Self {
        LocalShard { shard }
    }
}

#[async_trait]
impl ShardClient for LocalShard {
    async fn command(&self, db: &str, mut cmd: Document) -> Result<Body, TransportError> {
        cmd.insert("$db", db);
        Ok(self.shard.run_command_body(cmd).await)
    }

    fn describe(&self) -> String {
        "in-process".to_string()
    }
}

/// How long a reply may be late before the shard is pinged.
pub const LIVENESS_CHECK: Duration = Duration::from_secs(10);

/// How long a shard has to answer that ping.
pub const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than a command's `maxTimeMS` the router waits for the shard's own expiry.
pub const MAX_TIME_GRACE: Duration = Duration::from_secs(5);

/// The hard deadline of `cmd`: its `maxTimeMS` (when positive) and the grace.
fn hard_deadline(cmd: &Document) -> Option<Duration> {
    let ms = match cmd.get("maxTimeMS")? {
        bson::Bson::Int32(n) => i64::from(*n),
        bson::Bson::Int64(n) => *n,
        bson::Bson::Double(f) if f.is_finite() => *f as i64,
        _ => return None,
    };
    (ms > 0).then(|| Duration::from_millis(ms.unsigned_abs()) + MAX_TIME_GRACE)
}

/// Why a remote call ended without a reply of its own.
enum Overdue {
    /// Past the command's `maxTimeMS` and grace.
    PastMaxTime(Duration),
    /// Late, and the shard did not answer a ping either.
    Silent,
}

/// A shard in another process, over the MongoDB wire protocol.
pub struct RemoteShard {
    addr: String,
    client: wire::client::Client,
}

impl RemoteShard {
    pub fn new(addr: impl Into<String>) -> Self {
        RemoteShard::with_tls(addr, None)
    }

    /// A shard reached over TLS when `tls` is given.
    pub fn with_tls(addr: impl Into<String>, tls: Option<wire::tls::ClientTls>) -> Self {
        RemoteShard::secured(addr, tls, None)
    }

    /// A shard reached over TLS when `tls` is given, logged in to with the cluster's `key`
    /// when given.
    pub fn secured(
        addr: impl Into<String>,
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> Self {
        let addr = addr.into();
        RemoteShard {
            client: wire::client::Client::with_tls(addr.clone(), tls).with_key(key),
            addr,
        }
    }
}

impl RemoteShard {
    /// Runs `cmd` until its reply, or until it is overdue ([`Overdue`]).
    async fn call(
        &self,
        db: &str,
        cmd: &Document,
    ) -> Result<Result<bson::RawDocumentBuf, wire::ClientError>, Overdue> {
        let hard = hard_deadline(cmd);
        let started = tokio::time::Instant::now();
        let call = self.client.command_raw(db, cmd);
        tokio::pin!(call);
        loop {
            let check = tokio::time::Instant::now() + LIVENESS_CHECK;
            let wake = hard.map_or(check, |h| check.min(started + h));
            tokio::select! {
                reply = &mut call => return Ok(reply),
                _ = tokio::time::sleep_until(wake) => {}
            }
            if let Some(h) = hard
                && started.elapsed() >= h
            {
                return Err(Overdue::PastMaxTime(h));
            }
            let ping = bson::doc! {"ping": 1};
            match tokio::time::timeout(PING_TIMEOUT, self.client.command_raw("admin", &ping)).await
            {
                Ok(Ok(_)) => continue,
                _ => return Err(Overdue::Silent),
            }
        }
    }
}

impl RemoteShard {
    /// Runs `cmd`, which stays the caller's: the reply, or how the call failed.
    pub async fn send(&self, db: &str, cmd: &Document) -> Result<Body, Failed> {
        let reply = match self.call(db, cmd).await {
            Ok(reply) => reply,
            Err(overdue) => {
                let why = match overdue {
                    Overdue::PastMaxTime(d) => {
                        format!("no reply within the command's maxTimeMS and {d:?} more")
                    }
                    Overdue::Silent => format!(
                        "no reply, and no answer to a ping within {} s",
                        PING_TIMEOUT.as_secs()
                    ),
                };
                let error = MongoError::new(
                    ErrorCode::NETWORK_TIMEOUT,
                    format!("shard {} timed out: {why}", self.addr),
                );
                return Err(Failed::Lost(error));
            }
        };
        match reply {
            Ok(reply) => Ok(Body::Raw(reply)),
            Err(e) if matches!(e, wire::ClientError::Refused { .. }) => {
                Err(Failed::Refused(e.to_mongo_error()))
            }
            Err(e) => {
                let error = MongoError::new(
                    ErrorCode::HOST_UNREACHABLE,
                    format!("error talking to shard {}: {e}", self.addr),
                );
                Err(if e.is_unsent() {
                    Failed::Unsent(error)
                } else {
                    Failed::Lost(error)
                })
            }
        }
    }
}

/// How a call to a remote server failed, the command left with the caller: the
/// [`TransportError`] it becomes once the command is handed back.
#[derive(Debug)]
pub enum Failed {
    Unsent(MongoError),
    Lost(MongoError),
    Refused(MongoError),
}

impl Failed {
    /// The transport error, with `cmd` handed back.
    pub fn with(self, cmd: Document) -> TransportError {
        match self {
            Failed::Unsent(error) => TransportError::Unreachable { error, cmd },
            Failed::Lost(error) => TransportError::Lost { error, cmd },
            Failed::Refused(error) => TransportError::Refused { error, cmd },
        }
    }
}

#[async_trait]
impl ShardClient for RemoteShard {
    async fn command(&self, db: &str, cmd: Document) -> Result<Body, TransportError> {
        self.send(db, &cmd).await.map_err(|f| f.with(cmd))
    }

    fn describe(&self) -> String {
        self.addr.clone()
    }
}
