//! [`Handover`]: the transaction a leader's writer executed a batch in, passed to the member's
//! state machine, which commits it as the batch's apply instead of replaying the batch's write
//! set in a transaction of its own (the leader then writes each batch once, not twice).
//!
//! A member's storage has one write transaction at a time, and the writer's stays open from the
//! batch's start until the state machine commits or drops it. Hence the states: `Free`, a batch
//! `Executing`, its transaction `Handed` over (its entry proposed), the state machine `Applying`.
//!
//! Invariants:
//! * Neither side ever waits for a transaction the other holds: a batch begins only while the
//!   state machine is not applying ([`Handover::begin`] waits), and an apply begins only while
//!   no batch is executing and no other apply runs ([`Handover::start_apply`] waits, at most
//!   one batch's execution); an apply takes whatever was handed over, and drops it unless it
//!   commits it, before it opens a transaction of its own. Every write transaction of a
//!   member's state machine (applies, installed snapshots, checkpoints before a snapshot) runs
//!   so.
//! * One writer per member: a batch's transaction frees the handover when it goes without being
//!   handed over, and a stale one found handed over is dropped before the next batch begins.
//! * A handed-over transaction stands for exactly one entry: the one whose proposal is, byte for
//!   byte, the set the transaction recorded (term, promise, ops). It is committed in place of
//!   replaying that entry only when no entry applied before it in the same apply writes
//!   anything, so the storage it executed over is the storage the entry applies to (`apply_all`
//!   in `state_machine`); otherwise it is dropped, and its entry, when committed, is replayed
//!   like any other.
//! * A transaction whose proposal failed is taken back and dropped by the writer.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::Proposal;
use crate::storage::{Storage, StorageResult, Table, WriteTxn};

/// A transaction handed over, and the proposal of the entry it executed.
pub(super) struct Handed {
    pub proposal: Proposal,
    pub txn: Box<dyn WriteTxn>,
}

enum State {
    Free,
    Executing,
    Handed(Handed),
    Applying,
}

/// The writer's transaction on its way to the state machine (see the module header).
pub struct Handover {
    state: Mutex<State>,
    changed: Condvar,
}

impl Handover {
    pub(super) fn new() -> Arc<Handover> {
        Arc::new(Handover {
            state: Mutex::new(State::Free),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    /// Begins the transaction a batch executes in, once no apply is running.
    pub fn begin(self: &Arc<Self>, storage: &dyn Storage) -> StorageResult<Box<dyn WriteTxn>> {
        loop {
            let stale = {
                let mut state = self.lock();
                while matches!(*state, State::Applying) {
                    state = self.wait(state);
                }
                match std::mem::replace(&mut *state, State::Executing) {
                    State::Handed(h) => {
                        *state = State::Free;
                        h
                    }
                    _ => break,
                }
            };
            // A transaction still handed over (never the case while the writer takes back what
            // failed) is dropped, outside the lock, before the storage's next one begins.
            drop(stale);
        }
        let guard = Executing {
            handover: self.clone(),
        };
        let inner = storage.begin_write()?;
        Ok(Box::new(ExecutingTxn {
            inner,
            _guard: guard,
        }))
    }

    /// Hands `txn` (begun by [`Handover::begin`]) over for the entry `proposal` becomes.
    pub(super) fn hand(&self, proposal: Proposal, txn: Box<dyn WriteTxn>) {
        let refused = {
            let mut state = self.lock();
            match *state {
                State::Executing => {
                    *state = State::Handed(Handed { proposal, txn });
                    None
                }
                _ => Some(txn),
            }
        };
        self.changed.notify_all();
        drop(refused);
    }

    /// Takes back a transaction whose proposal failed (none when an apply took it).
    pub(super) fn take_back(&self) -> Option<Box<dyn WriteTxn>> {
        let mut state = self.lock();
        if !matches!(*state, State::Handed(_)) {
            return None;
        }
        match std::mem::replace(&mut *state, State::Free) {
            State::Handed(h) => Some(h.txn),
            _ => None,
        }
    }

    /// Starts an apply unless a batch is executing or another apply runs: what was handed over,
    /// if anything.
    pub(super) fn try_start_apply(self: &Arc<Self>) -> Option<Applying> {
        let mut state = self.lock();
        if matches!(*state, State::Executing | State::Applying) {
            return None;
        }
        Some(self.start(&mut state))
    }

    /// Starts an apply once no batch is executing and no other apply (or other write of the
    /// state machine's, [`Handover::start_other`]) runs: what was handed over, if anything.
    pub(super) fn start_apply(self: &Arc<Self>) -> Applying {
        let mut state = self.lock();
        while matches!(*state, State::Executing | State::Applying) {
            state = self.wait(state);
        }
        self.start(&mut state)
    }

    /// [`Handover::start_apply`] for a write of the state machine's that is not an apply (an
    /// installed snapshot, a checkpoint): what was handed over is dropped first, as its
    /// transaction holds the storage's.
    pub(super) fn start_other(self: &Arc<Self>) -> Applying {
        let mut applying = self.start_apply();
        drop(applying.handed.take());
        applying
    }

    fn start(self: &Arc<Self>, state: &mut State) -> Applying {
        let handed = match std::mem::replace(state, State::Applying) {
            State::Handed(h) => Some(h),
            _ => None,
        };
        Applying {
            handover: self.clone(),
            handed,
        }
    }
}

/// An apply in progress: the transaction handed over (to use or drop); when it ends, batches may
/// begin again.
pub(super) struct Applying {
    handover: Arc<Handover>,
    pub handed: Option<Handed>,
}

impl Drop for Applying {
    fn drop(&mut self) {
        // A transaction not used is dropped before the state says so.
        drop(self.handed.take());
        *self.handover.lock() = State::Free;
        self.handover.changed.notify_all();
    }
}

/// Frees the handover when a batch's transaction goes without being handed over (a batch that
/// failed, or wrote nothing).
struct Executing {
    handover: Arc<Handover>,
}

impl Drop for Executing {
    fn drop(&mut self) {
        let mut state = self.handover.lock();
        if matches!(*state, State::Executing) {
            *state = State::Free;
            drop(state);
            self.handover.changed.notify_all();
        }
    }
}

/// A batch's transaction, begun by [`Handover::begin`].
struct ExecutingTxn {
    inner: Box<dyn WriteTxn>,
    _guard: Executing,
}

crate::storage::reads_through_inner!(ExecutingTxn);

impl WriteTxn for ExecutingTxn {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()> {
        self.inner.put(table, key, value)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool> {
        self.inner.delete(table, key)
    }

    fn replace(
        &mut self,
        table: Table,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> StorageResult<Option<Vec<u8>>> {
        self.inner.replace(table, key, value)
    }

    fn commit(self: Box<Self>) -> StorageResult<()> {
        let ExecutingTxn { inner, _guard } = *self;
        inner.commit()
    }
}
