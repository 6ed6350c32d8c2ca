//! The state machine: committed entries applied to a member's storage, and snapshots of it.
//!
//! Invariants:
//! * The entries of one `apply` call go in one storage transaction, with the id of the last
//!   of them and the membership they leave: what is applied and what says so commit together.
//! * A normal entry's writes apply only under the term they were executed in (the term fence
//!   of `repl`); a blank or membership entry writes nothing but the applied id.
//! * On the leader, the entry of its own batch is applied by committing the transaction its
//!   writer executed the batch in (`handover`), when that is the first entry of the apply
//!   that writes: the same writes over the same storage, made once.
//! * A snapshot is every row of every table read in one read transaction, with the applied id
//!   and membership read in that same transaction, in pieces (`snapshot`); installing one
//!   replaces every table's rows with the snapshot's, in one durable transaction, a piece at a
//!   time.
//! * An apply of at most [`INLINE_APPLY_BYTES`] of write sets runs on the task that asks for
//!   it (a redb commit without an fsync: tens of microseconds, where a hand-off to a blocking
//!   thread and back costs two thread wake-ups); a larger one on a blocking thread, so no
//!   runtime thread is held for long.
//! * Applies commit without an fsync: the storage sits behind the Raft log, which holds every
//!   entry durably. A crash loses only applies whose entries the log still has, and openraft
//!   applies them again from the applied id on disk (redo is idempotent). The log is purged
//!   only up to a snapshot, and a snapshot is taken after a durable checkpoint (an installed
//!   one is committed durably), so nothing purged exists only in memory.

use std::io;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::EntryPayload;
use openraft::alias::{EntryOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};

use super::handover::{Handed, Handover};
use super::snapshot::{Rows, Snapshot};
use super::{Applied, TypeConfig, codec};
use crate::log::WriteSet;
use crate::storage::{KeyRange, ReadTxn, Scan, Storage, Table};

/// Rows deleted per scan while an installed snapshot clears the tables (the keys are held
/// until deleted).
const CLEAR_BATCH: usize = 4096;

/// The most write-set bytes one apply runs without leaving its task (see the module header).
const INLINE_APPLY_BYTES: usize = 64 << 10;

/// `Meta` key of the last applied log id.
const APPLIED_KEY: &[u8] = b"repl.applied";
/// `Meta` key of the membership the applied entries leave.
const MEMBERSHIP_KEY: &[u8] = b"repl.membership";
/// `Meta` key of the highest promise the applied entries carried ([`super::Proposal`]'s
/// `promise`; big-endian), what a member that does not lead may promise once it applied them.
const PROMISE_KEY: &[u8] = b"repl.promise";

/// The highest promise of the entries applied to what `txn` sees ([`PROMISE_KEY`]): every entry
/// not applied yet has a greater `ts`.
pub fn applied_promise(txn: &dyn ReadTxn) -> io::Result<resume::ClusterTime> {
    let stored = txn.get(Table::Meta, PROMISE_KEY).map_err(io_error)?;
    Ok(match stored.as_deref().map(<[u8; 8]>::try_from) {
        Some(Ok(bytes)) => resume::ClusterTime::from_u64(u64::from_be_bytes(bytes)),
        Some(Err(_)) => return Err(io_error("a corrupt applied promise")),
        None => resume::ClusterTime::ZERO,
    })
}

type LogId = LogIdOf<TypeConfig>;
type Membership = StoredMembershipOf<TypeConfig>;

fn io_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The applied id and membership as `txn` sees them.
fn applied_state(txn: &dyn ReadTxn) -> io::Result<(Option<LogId>, Membership)> {
    let applied = match txn.get(Table::Meta, APPLIED_KEY).map_err(io_error)? {
        Some(bytes) => codec::decode(&bytes)?,
        None => None,
    };
    let membership = match txn.get(Table::Meta, MEMBERSHIP_KEY).map_err(io_error)? {
        Some(bytes) => codec::decode(&bytes)?,
        None => Membership::default(),
    };
    Ok((applied, membership))
}

/// A member's storage as Raft's state machine.
pub(super) struct StateMachine {
    storage: Arc<dyn Storage>,
    handover: Arc<Handover>,
    applied: Option<LogId>,
    membership: Membership,
}

impl StateMachine {
    pub(super) async fn open(
        storage: Arc<dyn Storage>,
        handover: Arc<Handover>,
    ) -> io::Result<StateMachine> {
        let read = storage.clone();
        let (applied, membership) = tokio::task::spawn_blocking(move || {
            applied_state(read.begin_read().map_err(io_error)?.as_ref())
        })
        .await
        .map_err(io_error)??;
        Ok(StateMachine {
            storage,
            handover,
            applied,
            membership,
        })
    }
}

/// The proposal of `entry` when it writes: a normal entry under the term it was executed in.
fn writes(entry: &EntryOf<TypeConfig>) -> Option<&super::Proposal> {
    match &entry.payload {
        EntryPayload::Normal(p) if p.term == entry.log_id.leader_id.term => Some(p),
        _ => None,
    }
}

/// Applies `entries` in one transaction of `storage` (or, when the first of them that writes
/// is the batch `handed` was executed for, in that batch's transaction); what each did, in
/// order.
fn apply_all(
    storage: &dyn Storage,
    entries: &[EntryOf<TypeConfig>],
    mut membership: Membership,
    handed: Option<Handed>,
) -> io::Result<(Vec<Applied>, Membership)> {
    let own = handed.and_then(|h| {
        let first = entries.iter().position(|e| writes(e).is_some())?;
        (writes(&entries[first]) == Some(&h.proposal)).then_some((first, h.txn))
    });
    let (mut txn, own) = match own {
        Some((at, txn)) => (txn, Some(at)),
        None => (storage.begin_write().map_err(io_error)?, None),
    };
    let mut out = Vec::with_capacity(entries.len());
    let mut promise = None;
    for (at, entry) in entries.iter().enumerate() {
        let term = entry.log_id.leader_id.term;
        let executed = match &entry.payload {
            EntryPayload::Normal(p) if p.term == term => {
                if own != Some(at) {
                    let set = WriteSet::decode(&p.ops).map_err(io_error)?;
                    crate::log::replay(txn.as_mut(), &set).map_err(io_error)?;
                }
                promise = promise.max(Some(p.promise));
                true
            }
            EntryPayload::Normal(_) | EntryPayload::Blank => false,
            EntryPayload::Membership(m) => {
                membership = Membership::new(Some(entry.log_id), m.clone());
                false
            }
        };
        out.push(Applied {
            index: entry.log_id.index,
            term,
            executed,
        });
    }
    if let Some(last) = entries.last() {
        txn.put(
            Table::Meta,
            APPLIED_KEY,
            &codec::encode(&Some(last.log_id))?,
        )
        .map_err(io_error)?;
        txn.put(Table::Meta, MEMBERSHIP_KEY, &codec::encode(&membership)?)
            .map_err(io_error)?;
    }
    if let Some(promise) = promise {
        // Promises of later leaders may be lower (each starts from its own clock); every one
        // given stays true, so the highest is kept.
        let kept = applied_promise(&*txn)?.as_u64();
        if promise > kept {
            txn.put(Table::Meta, PROMISE_KEY, &promise.to_be_bytes())
                .map_err(io_error)?;
        }
    }
    txn.commit().map_err(io_error)?;
    Ok((out, membership))
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Snapshot;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), io::Error> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            batch.push(entry);
            responders.push(responder);
        }
        let Some(last) = batch.last().map(|e| e.log_id) else {
            return Ok(());
        };
        let bytes: usize = batch
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(p) => p.ops.len(),
                _ => 0,
            })
            .sum();
        let membership = self.membership.clone();
        let inline = (bytes <= INLINE_APPLY_BYTES)
            .then(|| self.handover.try_start_apply())
            .flatten();
        let (applied, membership) = match inline {
            Some(mut applying) => {
                let handed = applying.handed.take();
                apply_all(self.storage.as_ref(), &batch, membership, handed)?
            }
            None => {
                // A large apply, or one that waits for the batch executing now.
                let (storage, handover) = (self.storage.clone(), self.handover.clone());
                tokio::task::spawn_blocking(move || {
                    let mut applying = handover.start_apply();
                    let handed = applying.handed.take();
                    apply_all(storage.as_ref(), &batch, membership, handed)
                })
                .await
                .map_err(io_error)??
            }
        };
        self.applied = Some(last);
        self.membership = membership;
        for (result, responder) in applied.into_iter().zip(responders) {
            if let Some(responder) = responder {
                responder.send(result);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            storage: self.storage.clone(),
            handover: self.handover.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Snapshot,
    ) -> Result<(), io::Error> {
        let (storage, handover) = (self.storage.clone(), self.handover.clone());
        tokio::task::spawn_blocking(move || {
            // Whatever a writer handed over is dropped before the install's transaction begins.
            let _applying = handover.start_other();
            install(storage.as_ref(), snapshot)
        })
        .await
        .map_err(io_error)??;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    /// A snapshot of the storage as it is now (built afresh: the storage is the snapshot);
    /// none before anything was applied.
    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Snapshot>>, io::Error> {
        if self.applied.is_none() {
            return Ok(None);
        }
        let mut builder = self.get_snapshot_builder().await;
        builder.build_snapshot().await.map(Some)
    }
}

/// Replaces every table's rows with the snapshot's, in one transaction, a piece at a time.
fn install(storage: &dyn Storage, mut snapshot: Snapshot) -> io::Result<()> {
    // Durable: the log before the snapshot may be purged once it is installed.
    let mut txn = storage.begin_durable().map_err(io_error)?;
    for table in Table::ALL {
        loop {
            let mut keys = Vec::new();
            txn.scan(table, &KeyRange::all(), false, &mut |k, _| {
                keys.push(k.to_vec());
                if keys.len() < CLEAR_BATCH {
                    Scan::Continue
                } else {
                    Scan::Stop
                }
            })
            .map_err(io_error)?;
            for k in &keys {
                txn.delete(table, k).map_err(io_error)?;
            }
            if keys.len() < CLEAR_BATCH {
                break;
            }
        }
    }
    while let Some(piece) = snapshot.next_piece()? {
        crate::log::replay(txn.as_mut(), &piece).map_err(io_error)?;
    }
    txn.commit().map_err(io_error)
}

/// Builds a snapshot of a member's storage.
pub(super) struct SnapshotBuilder {
    storage: Arc<dyn Storage>,
    handover: Arc<Handover>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Snapshot;

    /// A read transaction over the storage as it is now, with the applied id and membership it
    /// sees: its rows are read as the snapshot is sent or installed.
    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Snapshot>, io::Error> {
        let (storage, handover) = (self.storage.clone(), self.handover.clone());
        let (applied, membership, txn) = tokio::task::spawn_blocking(move || {
            // A checkpoint first: the log up to the snapshot may be purged once it is taken,
            // so what it holds must be on disk, not only visible.
            let applying = handover.start_other();
            storage
                .begin_durable()
                .and_then(|t| t.commit())
                .map_err(io_error)?;
            drop(applying);
            let txn = storage.begin_read().map_err(io_error)?;
            let (applied, membership) = applied_state(txn.as_ref())?;
            Ok::<_, io::Error>((applied, membership, txn))
        })
        .await
        .map_err(io_error)??;
        Ok(openraft::Snapshot {
            meta: openraft::SnapshotMeta {
                last_log_id: applied,
                last_membership: membership,
            },
            snapshot: Snapshot::Rows(Rows::new(txn)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::log::Op;
    use crate::repl::Proposal;
    use crate::storage::RedbStorage;

    fn storage() -> (tempfile::TempDir, Arc<dyn Storage>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = RedbStorage::open_behind_log(&dir.path().join("member.redb")).expect("open");
        (dir, Arc::new(storage))
    }

    /// A normal entry at `index` of term 1 whose set puts `value` at `key` in `Documents`.
    fn entry(index: u64, key: &[u8], value: &[u8]) -> EntryOf<TypeConfig> {
        let mut set = WriteSet::with_prefix(0, 64);
        set.push(Op {
            table: Table::Documents.index(),
            key,
            value: Some(value),
        })
        .expect("push");
        openraft::Entry {
            log_id: openraft::LogId::new_term_index(1, index),
            payload: EntryPayload::Normal(Proposal {
                term: 1,
                promise: index,
                ops: set.encoded().to_vec(),
            }),
        }
    }

    fn proposal(e: &EntryOf<TypeConfig>) -> Proposal {
        match &e.payload {
            EntryPayload::Normal(p) => p.clone(),
            _ => unreachable!("a normal entry"),
        }
    }

    fn get(storage: &dyn Storage, key: &[u8]) -> Option<Vec<u8>> {
        let read = storage.begin_read().expect("read");
        read.get(Table::Documents, key).expect("get")
    }

    /// A writer's transaction, handed over for `e`, that wrote `value` at `key` (another value
    /// than `e`'s set, so the test sees which of the two was applied).
    fn hand(
        handover: &Arc<Handover>,
        storage: &dyn Storage,
        e: &EntryOf<TypeConfig>,
        key: &[u8],
        value: &[u8],
    ) {
        let mut txn = handover.begin(storage).expect("begin");
        txn.put(Table::Documents, key, value).expect("put");
        handover.hand(proposal(e), txn);
    }

    /// Applies `entries` as the state machine does, with what was handed over.
    fn apply_handed(
        handover: &Arc<Handover>,
        storage: &dyn Storage,
        entries: &[EntryOf<TypeConfig>],
    ) -> (Vec<Applied>, Membership) {
        let mut applying = handover.start_apply();
        apply_all(
            storage,
            entries,
            Membership::default(),
            applying.handed.take(),
        )
        .expect("apply")
    }

    #[test]
    fn the_leaders_entry_commits_the_transaction_it_was_executed_in() {
        let (_dir, storage) = storage();
        let handover = Handover::new();
        let own = entry(1, b"k", b"from the set");
        hand(&handover, &*storage, &own, b"k", b"executed");
        let (applied, _) = apply_handed(&handover, &*storage, &[own]);
        assert!(applied[0].executed);
        assert_eq!(get(&*storage, b"k").as_deref(), Some(&b"executed"[..]));
        let read = storage.begin_read().expect("read");
        assert_eq!(
            applied_state(&*read).expect("state").0.map(|l| l.index),
            Some(1)
        );
    }

    #[test]
    fn an_entry_that_writes_before_the_leaders_own_makes_it_replay() {
        let (_dir, storage) = storage();
        let handover = Handover::new();
        let before = entry(1, b"a", b"before");
        let own = entry(2, b"k", b"from the set");
        hand(&handover, &*storage, &own, b"k", b"executed");
        apply_handed(&handover, &*storage, &[before, own]);
        assert_eq!(get(&*storage, b"a").as_deref(), Some(&b"before"[..]));
        assert_eq!(get(&*storage, b"k").as_deref(), Some(&b"from the set"[..]));
    }

    #[test]
    fn a_transaction_handed_over_for_another_entry_is_dropped() {
        let (_dir, storage) = storage();
        let handover = Handover::new();
        let other = entry(1, b"k", b"other");
        let own = entry(2, b"k", b"own");
        hand(&handover, &*storage, &own, b"x", b"executed");
        apply_handed(&handover, &*storage, &[other]);
        assert_eq!(get(&*storage, b"k").as_deref(), Some(&b"other"[..]));
        assert_eq!(
            get(&*storage, b"x"),
            None,
            "nothing of the dropped transaction"
        );
        // Its entry, when it comes, is replayed.
        apply_all(&*storage, &[own], Membership::default(), None).expect("apply");
        assert_eq!(get(&*storage, b"k").as_deref(), Some(&b"own"[..]));
    }

    #[test]
    fn batches_and_applies_wait_for_each_other_and_a_failed_proposal_is_taken_back() {
        let (_dir, storage) = storage();
        let handover = Handover::new();
        // An apply waits while a batch executes...
        let txn = handover.begin(&*storage).expect("begin");
        assert!(handover.try_start_apply().is_none());
        let waiting = {
            let handover = handover.clone();
            std::thread::spawn(move || drop(handover.start_apply()))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished());
        drop(txn); // a batch that wrote nothing frees the handover
        waiting.join().expect("apply");
        // ...and a batch waits while an apply runs.
        let applying = handover.start_apply();
        let beginning = {
            let (handover, storage) = (handover.clone(), storage.clone());
            std::thread::spawn(move || handover.begin(&*storage).map(drop).is_ok())
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!beginning.is_finished());
        drop(applying);
        assert!(beginning.join().expect("begin"));
        // A proposal that failed: its transaction comes back, and the storage is free again.
        let own = entry(1, b"k", b"v");
        hand(&handover, &*storage, &own, b"k", b"v");
        assert!(handover.take_back().is_some());
        assert!(handover.take_back().is_none());
        assert!(handover.try_start_apply().is_some());
        drop(storage.begin_write().expect("the storage is free"));

        // A write that is not an apply (a checkpoint, an installed snapshot) drops what was
        // handed over before it begins its own transaction.
        hand(&handover, &*storage, &own, b"k", b"v");
        let other = handover.start_other();
        storage
            .begin_durable()
            .and_then(|t| t.commit())
            .expect("the storage is free");
        drop(other);
        // A transaction left handed over is dropped when the next batch begins, which keeps the
        // handover until it goes.
        hand(&handover, &*storage, &own, b"k", b"v");
        let next = handover.begin(&*storage).expect("begin");
        assert!(handover.try_start_apply().is_none(), "a batch is executing");
        drop(next);
        assert!(handover.try_start_apply().is_some());
    }
}
