//! [`RaftLog`]: the [`Log`] of a shard whose writer runs on its replica set's leader. Appending
//! a batch's write set proposes it and returns once a majority holds it and this member's
//! state machine applied it; the writer's own transaction was abandoned before (see
//! [`Log::applies`]).
//!
//! Invariants:
//! * A set carries the term it was executed under: [`RaftLog::write_set`] writes the term in
//!   the set's prefix when the batch starts, and the proposal takes it from there, so a batch
//!   executed by a leader that lost its term in between applies nowhere (the term fence).
//! * An append that did not apply is an error: not the leader (nothing was appended), a
//!   fenced set, or an outcome not known in time (the entry may still apply; the writer's
//!   in-memory state must then be rebuilt from storage before it is trusted, which the
//!   followers' apply path will provide).

use std::sync::Arc;
use std::time::Duration;

use super::{Proposal, Replica};
use crate::log::{Appended, Log, WriteSet};
use crate::storage::{StorageError, StorageResult};

/// The prefix of a set: the term it is executed under (big-endian).
const TERM_BYTES: usize = 8;

/// A replicated shard's log (see the module header).
pub struct RaftLog {
    replica: Arc<Replica>,
    /// The runtime the replica runs on: the writer thread blocks on it while a set replicates.
    runtime: tokio::runtime::Handle,
    /// How long an append waits for a majority.
    patience: Duration,
}

impl RaftLog {
    pub fn new(replica: Arc<Replica>, runtime: tokio::runtime::Handle, patience: Duration) -> Self {
        RaftLog {
            replica,
            runtime,
            patience,
        }
    }
}

impl Log for RaftLog {
    fn write_set(&self) -> WriteSet {
        let mut set = WriteSet::with_prefix(TERM_BYTES, 256);
        set.prefix_mut()
            .copy_from_slice(&self.replica.term().to_be_bytes());
        set
    }

    fn append(&self, set: &mut WriteSet) -> StorageResult<Appended> {
        let term = set
            .prefixed()
            .get(..TERM_BYTES)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| StorageError::Engine("a write set without its term".into()))?;
        let proposal = Proposal {
            term,
            ops: set.encoded().to_vec(),
        };
        let applied = self
            .runtime
            .block_on(self.replica.propose(proposal, self.patience))
            .map_err(|e| StorageError::Engine(e.to_string()))?;
        if !applied.executed {
            return Err(StorageError::Engine(format!(
                "the batch was executed in term {term}, which ended before it replicated"
            )));
        }
        Ok(Appended {
            at: applied.index,
            len: 0,
        })
    }

    fn applies(&self) -> bool {
        true
    }

    fn retract(&self, _appended: Appended) {}

    fn applied(&self, _appended: Appended) {}
}
