//! A member of a replicated shard: its Raft replica and storage, and the [`Shard`] it serves
//! while it leads its set (`design/replication.md`).
//!
//! Every member applies committed entries to its storage (`repl`); the member that becomes
//! leader opens a `Shard` over that storage, which recovers the catalog, the clock, the tail
//! window and the prepared transactions exactly as at a restart, from the committed state, and
//! writes through [`RaftLog`]. It closes the shard when it stops leading.
//!
//! Invariants:
//! * A member serves a shard only while it leads, and only once it has applied the first entry
//!   of its term: every entry of earlier terms is then applied, so the recovered clock starts
//!   above every `ts` and every reservation in the log (no `ts` is ever handed out twice), and
//!   the shard's first write (its boot lineage record) is the term's first batch.
//! * A shard whose log lost track of a write (its outcome unknown) is closed and opened again
//!   from storage once everything in the member's log is applied: its in-memory state never
//!   lags what its storage holds while it takes writes.
//! * A member that does not lead answers every command but `hello`-like ones with 10107
//!   `NotWritablePrimary` (until secondaries serve reads): a client retries on the primary.

use std::sync::Arc;
use std::time::Duration;

use bson::Document;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wire::{ErrorCode, MongoError};

use crate::repl::{RaftLog, Replica};
use crate::storage::Storage;
use crate::{Shard, ShardOptions};

/// One member of a replica set (see the module header).
pub struct ReplicaSetMember {
    replica: Arc<Replica>,
    primary: watch::Receiver<Option<Arc<Shard>>>,
    cancel: CancellationToken,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ReplicaSetMember {
    /// Starts following `replica`'s leadership: while it leads, a shard named by `opts` runs
    /// over `storage`, appending through the replica with `patience` for a majority.
    pub fn start(
        opts: ShardOptions,
        replica: Arc<Replica>,
        storage: Arc<dyn Storage>,
        patience: Duration,
    ) -> Arc<ReplicaSetMember> {
        let (tx, rx) = watch::channel(None);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(lead(
            opts,
            replica.clone(),
            storage,
            patience,
            tx,
            cancel.clone(),
        ));
        Arc::new(ReplicaSetMember {
            replica,
            primary: rx,
            cancel,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The shard this member serves as primary now, if it leads.
    pub fn primary(&self) -> Option<Arc<Shard>> {
        self.primary.borrow().clone()
    }

    /// Waits until this member serves as primary, for at most `patience`.
    pub async fn wait_primary(&self, patience: Duration) -> Option<Arc<Shard>> {
        let mut rx = self.primary.clone();
        tokio::time::timeout(patience, async move {
            loop {
                if let Some(shard) = rx.borrow_and_update().clone() {
                    return Some(shard);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// Runs a command on the primary's shard; on any other member, 10107.
    pub async fn run_command(&self, cmd: Document) -> Document {
        match self.primary() {
            Some(shard) => shard.run_command(cmd).await,
            None => not_primary(self.replica.leader()).to_document(),
        }
    }

    /// Stops serving (closing the shard if open) and stops the replica.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
        self.replica.shutdown().await;
    }
}

fn not_primary(leader: Option<u64>) -> MongoError {
    let known = leader.map_or_else(|| "not known".to_string(), |l| format!("member {l}"));
    MongoError::new(
        ErrorCode::NOT_WRITABLE_PRIMARY,
        format!("not primary: this member does not lead its replica set (the primary is {known})"),
    )
    .with_label("RetryableWriteError")
}

/// While `replica` leads, serves a shard over `storage` and publishes it on `tx`.
async fn lead(
    opts: ShardOptions,
    replica: Arc<Replica>,
    storage: Arc<dyn Storage>,
    patience: Duration,
    tx: watch::Sender<Option<Arc<Shard>>>,
    cancel: CancellationToken,
) {
    const LOOK: Duration = Duration::from_millis(500);
    while !cancel.is_cancelled() {
        if !replica.wait_leading(LOOK).await {
            continue;
        }
        let Some(term) = replica.leading_term() else {
            continue;
        };
        let log = Arc::new(RaftLog::new(
            replica.clone(),
            tokio::runtime::Handle::current(),
            patience,
        ));
        let shard = match Shard::open_with_storage(opts.clone(), storage.clone(), log.clone()).await
        {
            Ok(shard) => shard,
            Err(e) => {
                tracing::warn!(error = %e, term, "the new primary could not open its shard");
                tokio::time::sleep(LOOK).await;
                continue;
            }
        };
        tracing::info!(term, member = replica.id(), "primary: serving the shard");
        tx.send_replace(Some(shard.clone()));
        tokio::select! {
            () = replica.wait_not_leading(term) => {}
            () = log.poisoned() => {
                tracing::warn!(term, "a write's outcome is unknown: the shard reopens from storage");
            }
            () = cancel.cancelled() => {}
        }
        tx.send_replace(None);
        tracing::info!(
            term,
            member = replica.id(),
            "no longer primary: the shard closes"
        );
        shard.shutdown().await;
    }
}
