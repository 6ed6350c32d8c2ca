//! `ShardClient`: how the router talks to a shard. Router→shard traffic is MongoDB command
//! documents, so the same router code runs over in-process shards and over TCP.
//!
//! Invariant: a client never invents a reply. A transport failure becomes a `MongoError`
//! (`HostUnreachable`, labelled retryable for writes by the caller), never an `ok: 1` document.

use std::sync::Arc;

use async_trait::async_trait;
use bson::Document;
use wire::{ErrorCode, MongoError};

/// A connection to one shard. `command` returns the shard's reply document as is: an `ok: 0`
/// reply is a `Document`, not an `Err`; `Err` means the shard could not be reached.
#[async_trait]
pub trait ShardClient: Send + Sync + 'static {
    /// Runs `cmd` against database `db` on the shard.
    async fn command(&self, db: &str, cmd: Document) -> Result<Document, MongoError>;

    /// The address or name shown in diagnostics.
    fn describe(&self) -> String;
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
    async fn command(&self, db: &str, mut cmd: Document) -> Result<Document, MongoError> {
        cmd.insert("$db", db);
        Ok(self.shard.run_command(cmd).await)
    }

    fn describe(&self) -> String {
        "in-process".to_string()
    }
}

/// A shard in another process, over the MongoDB wire protocol.
pub struct RemoteShard {
    addr: String,
    client: wire::client::Client,
}

impl RemoteShard {
    pub fn new(addr: impl Into<String>) -> Self {
        let addr = addr.into();
        RemoteShard {
            client: wire::client::Client::new(addr.clone()),
            addr,
        }
    }
}

#[async_trait]
impl ShardClient for RemoteShard {
    async fn command(&self, db: &str, cmd: Document) -> Result<Document, MongoError> {
        self.client.command(db, cmd).await.map_err(|e| {
            MongoError::new(
                ErrorCode::HOST_UNREACHABLE,
                format!("error talking to shard {}: {e}", self.addr),
            )
        })
    }

    fn describe(&self) -> String {
        self.addr.clone()
    }
}
