//! The state machine: committed entries applied to a member's storage, and snapshots of it.
//!
//! Invariants:
//! * The entries of one `apply` call go in one storage transaction, with the id of the last
//!   of them and the membership they leave: what is applied and what says so commit together.
//! * A normal entry's writes apply only under the term they were executed in (the term fence
//!   of `repl`); a blank or membership entry writes nothing but the applied id.
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
    applied: Option<LogId>,
    membership: Membership,
}

impl StateMachine {
    pub(super) async fn open(storage: Arc<dyn Storage>) -> io::Result<StateMachine> {
        let read = storage.clone();
        let (applied, membership) = tokio::task::spawn_blocking(move || {
            applied_state(read.begin_read().map_err(io_error)?.as_ref())
        })
        .await
        .map_err(io_error)??;
        Ok(StateMachine {
            storage,
            applied,
            membership,
        })
    }
}

/// Applies `entries` in one transaction of `storage`; what each did, in order.
fn apply_all(
    storage: &dyn Storage,
    entries: &[EntryOf<TypeConfig>],
    mut membership: Membership,
) -> io::Result<(Vec<Applied>, Membership)> {
    let mut txn = storage.begin_write().map_err(io_error)?;
    let mut out = Vec::with_capacity(entries.len());
    let mut promise = None;
    for entry in entries {
        let term = entry.log_id.leader_id.term;
        let executed = match &entry.payload {
            EntryPayload::Normal(p) if p.term == term => {
                let set = WriteSet::decode(&p.ops).map_err(io_error)?;
                crate::log::replay(txn.as_mut(), &set).map_err(io_error)?;
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
        let (applied, membership) = if bytes <= INLINE_APPLY_BYTES {
            apply_all(self.storage.as_ref(), &batch, membership)?
        } else {
            let storage = self.storage.clone();
            tokio::task::spawn_blocking(move || apply_all(storage.as_ref(), &batch, membership))
                .await
                .map_err(io_error)??
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
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Snapshot,
    ) -> Result<(), io::Error> {
        let storage = self.storage.clone();
        tokio::task::spawn_blocking(move || install(storage.as_ref(), snapshot))
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
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Snapshot;

    /// A read transaction over the storage as it is now, with the applied id and membership it
    /// sees: its rows are read as the snapshot is sent or installed.
    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Snapshot>, io::Error> {
        let storage = self.storage.clone();
        let (applied, membership, txn) = tokio::task::spawn_blocking(move || {
            // A checkpoint first: the log up to the snapshot may be purged once it is taken,
            // so what it holds must be on disk, not only visible.
            storage
                .begin_durable()
                .and_then(|t| t.commit())
                .map_err(io_error)?;
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
