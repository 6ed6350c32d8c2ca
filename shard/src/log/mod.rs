//! The log: where a batch's [`WriteSet`] becomes durable before the batch is applied.
//!
//! The writer executes a batch against the latest applied state, capturing its physical writes
//! as a write set; it hands the set to [`Log::append`], then applies the batch (the storage
//! commit and the observers, [`crate::apply`]). A log is what stands between "executed" and
//! "visible": [`LocalLog`] is a write-ahead file on this machine; `repl::RaftLog` replicates
//! the set to a majority of the shard's replica set, whose state machine then applies it on
//! every member ([`Log::applies`]).
//!
//! Invariants every log keeps:
//! * [`Log::append`] returns only once the set is durable, after every set appended before it;
//!   replaying the appended sets in order over the storage's last durable state gives the state
//!   of the last applied batch.
//! * A set whose batch was not applied is [retracted](Log::retract) before the next append: it
//!   is never replayed.
//! * A log never reads a clock, an option or the catalog: what it replays is what the writer
//!   decided.

mod local;

pub use local::{CHECKPOINT_BYTES, GROW_BYTES, LocalLog, log_path};

use resume::ClusterTime;

use crate::storage::{Storage, StorageError, StorageResult, Table, WriteTxn};
pub use crate::write::write_set::{DecodeError, Op, Ops, WriteSet};

/// Where an appended set sits in its log, for [`Log::retract`] and [`Log::applied`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The record's first byte in the log.
    pub at: u64,
    /// The record's length, frame included.
    pub len: u64,
}

/// A durable, ordered log of write sets (see the module header). Called from the writer thread
/// only, once or twice per batch: plain calls, no async.
pub trait Log: Send + Sync + 'static {
    /// An empty write set with the room this log's record needs in front of the ops (its
    /// frame), so appending it copies nothing. `promise` is the writer's high-water mark as
    /// the batch starts: a replicated log carries it to the members that apply the set.
    fn write_set(&self, promise: ClusterTime) -> WriteSet;

    /// Makes `set` durable after every set appended before it. After an error nothing of it
    /// may be applied.
    fn append(&self, set: &mut WriteSet) -> StorageResult<Appended>;

    /// The term the entries of the next write set are written under (the oplog's `t`): the
    /// leader's Raft term for a replicated log, 1 for a single copy (as a MongoDB standalone
    /// replica set that never held an election).
    fn term(&self) -> i64 {
        1
    }

    /// Whether [`Log::append`] also applies the set to the storage, as a replicated log's state
    /// machine does on every member, the leader included: the writer then hands the transaction
    /// it executed the batch in to [`Log::append_applying`] and commits nothing itself.
    fn applies(&self) -> bool {
        false
    }

    /// Begins the storage transaction a batch executes in.
    fn begin(&self, storage: &dyn Storage) -> StorageResult<Box<dyn WriteTxn>> {
        storage.begin_write()
    }

    /// For a log that applies what it appends: appends `set`, whose batch executed in `txn`
    /// (from [`Log::begin`]), and returns once it is applied. The log may apply the batch by
    /// committing `txn` itself; by default it drops `txn` and the set is replayed.
    fn append_applying(
        &self,
        set: &mut WriteSet,
        txn: Box<dyn WriteTxn>,
    ) -> StorageResult<Appended> {
        drop(txn);
        self.append(set)
    }

    /// Whether an append's outcome was not known (a replicated log's entry may still commit
    /// through another leader): what the writer ticked since may yet become visible, so its
    /// times stay in flight and the high-water mark never passes them again on this log.
    fn in_doubt(&self) -> bool {
        false
    }

    /// The set at `appended` was not applied (its commit failed): it must not be replayed.
    fn retract(&self, appended: Appended);

    /// The set at `appended` was applied; the log may drop what the storage now holds.
    fn applied(&self, appended: Appended);
}

/// No log: the storage's own commit is durable (redb's durable commits, or a test's). Appends
/// nothing and never fails.
pub struct Unlogged;

impl Log for Unlogged {
    fn write_set(&self, _promise: ClusterTime) -> WriteSet {
        WriteSet::with_prefix(0, 256)
    }

    fn append(&self, _set: &mut WriteSet) -> StorageResult<Appended> {
        Ok(Appended { at: 0, len: 0 })
    }

    fn retract(&self, _appended: Appended) {}

    fn applied(&self, _appended: Appended) {}
}

/// Applies a write set's ops, in order, through `txn`: how a log is replayed over the storage
/// (and how a replica will apply what its leader executed). It reads nothing but the set.
pub fn replay(txn: &mut dyn WriteTxn, set: &WriteSet) -> StorageResult<()> {
    for op in set {
        let table = Table::from_index(op.table).ok_or_else(|| {
            StorageError::Engine(format!("write set names no table numbered {}", op.table))
        })?;
        match op.value {
            Some(value) => txn.put(table, op.key, value)?,
            None => {
                txn.delete(table, op.key)?;
            }
        }
    }
    Ok(())
}
