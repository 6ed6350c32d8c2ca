//! A follower: the read-only shard a replica-set member serves while it does not lead, over the
//! storage its state machine applies committed entries to (`design/replication.md`, "Reads on
//! secondaries").
//!
//! The member's applier is the storage's only writer; a follower reads what it committed and
//! catches its in-memory parts up after each apply ([`Shard::catch_up`]): the catalog (loaded
//! again only when its rows changed), the lineage, the oplog's statistics, the tail window
//! (every entry after the last it published), and last its high-water mark.
//!
//! Invariants:
//! * A follower writes nothing: its writer refuses every job (10107) before it opens a storage
//!   transaction, and it runs no background service (TTL, expiry, retention and reservation
//!   renewal are the primary's, whose entries it applies).
//! * Its high-water mark is `min(max(last applied ts, the highest promise its applied entries
//!   carried), lowest undecided prepare ts − 1)`, never its clock's: every entry not applied yet
//!   comes later in the log, so it has a greater `ts` than the last applied one and than the
//!   promise the leader made before executing it. The mark only rises, and only after the tail
//!   window holds every entry at or below it.
//! * Everything it shows is committed: a member applies only committed entries, so a read
//!   here is `majority` whatever it asks (MongoDB's secondaries show the same for `local`
//!   once applied).

use std::sync::Arc;

use resume::ClusterTime;

use crate::clock::Hlc;
use crate::log::Unlogged;
use crate::oplog::{self, TailWindow};
use crate::state::{Recovered, ShardState};
use crate::storage::{KeyRange, ReadTxn, Scan, Storage, StorageResult, Table};
use crate::writer::Writer;
use crate::{Shard, ShardError, ShardOptions, Stored, TAIL_WINDOW_BYTES};

/// How many oplog entries one step of a catch-up publishes to the tail window.
const CATCH_UP_STEP: usize = 1024;

impl Shard {
    /// Opens the read-only shard of a member that does not lead, over the storage its applier
    /// writes (see the module header).
    pub async fn open_follower(
        opts: ShardOptions,
        storage: Arc<dyn Storage>,
    ) -> Result<Arc<Shard>, ShardError> {
        let read = storage.begin_read()?;
        let Stored {
            catalog,
            reserved,
            last,
            oplog_stats,
            lineage,
        } = Stored::load(&*read)?;
        drop(read);
        let state = Arc::new(ShardState::new(
            opts.name.clone(),
            storage,
            Arc::new(Unlogged),
            opts.clock.clone(),
            Recovered {
                hlc: Hlc::recover(reserved, last),
                catalog,
                tail: TailWindow::new(last, TAIL_WINDOW_BYTES),
                oplog_stats,
            },
        ));
        state.make_follower(ClusterTime::ZERO);
        if let Some(lineage) = lineage {
            state.set_lineage(lineage);
        }
        let shard = Shard::assemble(state.clone(), Writer::start(state));
        shard.catch_up()?;
        crate::services::start_follower(&shard);
        Ok(shard)
    }

    /// A follower catches up with its storage (see the module header): called after the
    /// member applied more entries; a no-op on a shard that leads.
    pub fn catch_up(&self) -> Result<(), ShardError> {
        let state = &self.state;
        if !state.follows() {
            return Ok(());
        }
        let read = state.storage.begin_read()?;
        let promise = crate::repl::applied_promise(&*read).map_err(|e| {
            ShardError::Storage(crate::storage::StorageError::Engine(e.to_string()))
        })?;
        let rows = catalog_rows(&*read)?;
        {
            let mut loaded = state
                .follower_catalog
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *loaded != rows {
                state.publish_catalog(Arc::new(crate::load_catalog(&*read)?));
                *loaded = rows;
            }
        }
        if let Some(lineage) = crate::lineage::Lineage::load(&*read)? {
            state.set_lineage(lineage);
        }
        if let Some(stats) = crate::retention::OplogStats::stored(&*read)? {
            state.set_oplog_stats(stats);
        }
        loop {
            let batch = oplog::read_from_storage(&*read, state.tail.visible(), CATCH_UP_STEP)?;
            let more = batch.len() == CATCH_UP_STEP;
            state.tail.publish(batch);
            if !more {
                break;
            }
        }
        let held = crate::txn::lowest_prepare(&*read)
            .map_err(|_| ShardError::Corrupt("prepared transaction record"))?;
        let mark = state.tail.visible().max(promise);
        state.raise_follower_mark(held.map_or(mark, |p| mark.min(p.prev())));
        Ok(())
    }
}

/// The catalog table's rows as one byte string, each key and value behind its length: equal
/// strings are equal catalogs.
fn catalog_rows(read: &dyn ReadTxn) -> StorageResult<Vec<u8>> {
    let mut rows = Vec::new();
    read.scan(Table::Catalog, &KeyRange::all(), false, &mut |k, v| {
        for part in [k, v] {
            rows.extend_from_slice(&(part.len() as u64).to_le_bytes());
            rows.extend_from_slice(part);
        }
        Scan::Continue
    })?;
    Ok(rows)
}
