//! [`RaftLog`]: the [`Log`] of a shard whose writer runs on its replica set's leader. Appending
//! a batch's write set proposes it and returns once a majority holds it and this member's
//! state machine applied it, by committing the writer's own transaction, handed over with the
//! proposal (`handover`), or by replaying the set (see [`Log::applies`]).
//!
//! Invariants:
//! * A set carries the term it was executed under: [`RaftLog::write_set`] writes the term in
//!   the set's prefix when the batch starts, and the proposal takes it from there, so a batch
//!   executed by a leader that lost its term in between applies nowhere (the term fence).
//! * An append that did not apply is an error the jobs answer as MongoDB does: not the leader
//!   or a fenced set (nothing applies: 10107), or an outcome not known in time (the entry may
//!   still apply: 11602). After an unknown outcome the shard's in-memory state may lag its
//!   storage, and its high-water mark stays below the set in doubt for good
//!   ([`Log::in_doubt`]: a new leader may commit it, so no change stream may be promised past
//!   it); the member reopens the shard from storage once everything it holds is applied
//!   (`replica_set`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wire::{ErrorCode, MongoError};

use resume::ClusterTime;

use super::{Proposal, ReplError, Replica};
use crate::log::{Appended, Log, WriteSet};
use crate::storage::{Storage, StorageError, StorageResult, WriteTxn};

/// The prefix of a set: the term it is executed under, then the writer's promise (both
/// big-endian `u64`s).
const TERM_BYTES: usize = 8;
const PREFIX_BYTES: usize = 16;

/// A replicated shard's log (see the module header).
pub struct RaftLog {
    replica: Arc<Replica>,
    /// Set once an append's outcome was not known: this log takes no more appends (the
    /// writer's next batch could not know what state it executes over), and the member
    /// reopens its shard from storage ([`RaftLog::poisoned`]).
    poisoned: AtomicBool,
    poison: tokio::sync::Notify,
    /// The runtime the replica runs on: the writer thread blocks on it while a set replicates.
    runtime: tokio::runtime::Handle,
    /// How long an append waits for a majority.
    patience: Duration,
}

impl RaftLog {
    pub fn new(replica: Arc<Replica>, runtime: tokio::runtime::Handle, patience: Duration) -> Self {
        RaftLog {
            replica,
            poisoned: AtomicBool::new(false),
            poison: tokio::sync::Notify::new(),
            runtime,
            patience,
        }
    }

    /// Returns once an append's outcome was not known (see `poisoned`).
    pub async fn poisoned(&self) {
        let notified = self.poison.notified();
        if self.poisoned.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

impl Log for RaftLog {
    fn write_set(&self, promise: ClusterTime) -> WriteSet {
        let mut set = WriteSet::with_prefix(PREFIX_BYTES, 256);
        let prefix = set.prefix_mut();
        prefix[..TERM_BYTES].copy_from_slice(&self.replica.term().to_be_bytes());
        prefix[TERM_BYTES..].copy_from_slice(&promise.as_u64().to_be_bytes());
        set
    }

    fn term(&self) -> i64 {
        i64::try_from(self.replica.term()).unwrap_or(i64::MAX)
    }

    fn append(&self, set: &mut WriteSet) -> StorageResult<Appended> {
        self.propose(set, None)
    }

    fn begin(&self, storage: &dyn Storage) -> StorageResult<Box<dyn WriteTxn>> {
        self.replica.handover().begin(storage)
    }

    fn append_applying(
        &self,
        set: &mut WriteSet,
        txn: Box<dyn WriteTxn>,
    ) -> StorageResult<Appended> {
        self.propose(set, Some(txn))
    }

    fn applies(&self) -> bool {
        true
    }

    fn in_doubt(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    fn retract(&self, _appended: Appended) {}

    fn applied(&self, _appended: Appended) {}
}

impl RaftLog {
    /// Proposes `set`, handing `txn` (the transaction it was executed in) over to this member's
    /// state machine; returns once the entry is applied here.
    fn propose(
        &self,
        set: &mut WriteSet,
        txn: Option<Box<dyn WriteTxn>>,
    ) -> StorageResult<Appended> {
        let prefix = |at: usize| {
            set.prefixed()
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| StorageError::Engine("a write set without its prefix".into()))
        };
        let (term, promise) = (prefix(0)?, prefix(TERM_BYTES)?);
        let proposal = Proposal {
            term,
            promise,
            ops: set.encoded().to_vec(),
        };
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StorageError::Interrupted(
                MongoError::new(
                    ErrorCode::NOT_WRITABLE_PRIMARY,
                    "the primary is recovering its state after a write whose outcome it does not \
                     know",
                )
                .with_label("RetryableWriteError"),
            ));
        }
        let handover = self.replica.handover();
        if let Some(txn) = txn {
            handover.hand(proposal.clone(), txn);
        }
        let proposed = self
            .runtime
            .block_on(self.replica.propose(proposal, self.patience));
        // Applied, the transaction was taken (committed or dropped); not applied, it is dropped.
        drop(handover.take_back());
        if matches!(proposed, Err(ReplError::Unknown | ReplError::TimedOut(_))) {
            self.poisoned.store(true, Ordering::Release);
            self.poison.notify_waiters();
        }
        let applied = proposed.map_err(answer)?;
        if !applied.executed {
            return Err(StorageError::Interrupted(
                MongoError::new(
                    ErrorCode::NOT_WRITABLE_PRIMARY,
                    format!(
                        "the batch was executed in term {term}, which ended before it replicated"
                    ),
                )
                .with_label("RetryableWriteError"),
            ));
        }
        Ok(Appended {
            at: applied.index,
            len: 0,
        })
    }
}

/// What the writer's jobs answer when their batch did not replicate: 10107 when nothing was
/// appended (a client may resend it anywhere), 11602 when it may still apply (only a retryable
/// write may be resent: its record makes the resend a no-op if it did), both labelled as
/// MongoDB labels them.
fn answer(e: ReplError) -> StorageError {
    let (code, msg) = match &e {
        ReplError::NotLeader { .. } => (ErrorCode::NOT_WRITABLE_PRIMARY, e.to_string()),
        ReplError::Unknown | ReplError::TimedOut(_) => (
            ErrorCode::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
            e.to_string(),
        ),
        ReplError::Stopped(_) | ReplError::Reconfig { .. } => {
            return StorageError::Engine(e.to_string());
        }
    };
    StorageError::Interrupted(MongoError::new(code, msg).with_label("RetryableWriteError"))
}
