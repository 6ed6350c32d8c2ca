//! Apply: a batch the writer executed, and whose write set the log made durable, becomes the
//! shard's state: the storage commit, then the observers in a fixed order.
//!
//! The write path is `execute → WriteSet → Log::append → apply → observers` (`writer` runs
//! it): execution decides everything (every key's new bytes, the oplog entries and their
//! times, the clock reservation, the retention trim); apply only makes it visible and tells the
//! in-memory parts, from the values execution handed it.
//!
//! Invariants:
//! * Apply reads no clock, option or catalog of its own: a replica replaying the same write
//!   sets ([`crate::log::replay`]) reaches the same tables, byte for byte.
//! * The batch's history goes in before the commit (a reader whose snapshot has the batch finds
//!   it; one whose snapshot does not never looks at it) and is taken out again if the commit
//!   fails.
//! * The set is durable in the log before the batch is visible: appended, then committed; or,
//!   for a log that applies what it appends (a replicated one), the executed transaction goes
//!   to the log with the set, and the log's apply is the commit (of that transaction, or of
//!   the set replayed).
//! * After the commit, the observers run in this order and no other: commit metrics, oplog
//!   statistics, catalog, clock reservation, tail window, the prepared keys the batch listed,
//!   and last the clock's in-flight release (the high-water mark may pass the batch only once
//!   its entries are published).
//! * A batch that failed to apply is retracted from the log before the next append; one that
//!   applied is reported to the log (which may checkpoint).

use std::sync::Arc;

use bytes::Bytes;
use resume::ClusterTime;

use crate::catalog::Catalog;
use crate::history::Version;
use crate::log::WriteSet;
use crate::retention::OplogStats;
use crate::state::ShardState;
use crate::storage::{StorageResult, WriteTxn};

/// What the writer decided for one batch: the live transaction holding its writes, and the
/// values the observers publish once it commits.
pub(crate) struct Executed {
    /// The storage transaction with every write of the batch (its write set's ops).
    pub txn: Box<dyn WriteTxn>,
    /// The oplog entries the batch wrote, in `ts` order.
    pub entries: Vec<(ClusterTime, Bytes)>,
    /// The catalog as the batch left it.
    pub catalog: Arc<Catalog>,
    /// The oplog's size and truncation point after the batch (and its retention trim).
    pub stats: OplogStats,
    /// The clock reservation the batch stored, when it renewed it.
    pub reservation: Option<ClusterTime>,
    /// What the batch's tracked keys held before it; or, when that was more than the history
    /// keeps, `Err` with the batch's last `ts`: reads before it must be refused from now on.
    pub history: Result<Vec<Version>, Option<ClusterTime>>,
    /// Whether the batch carried jobs (it counts as a commit in `serverStatus`).
    pub has_jobs: bool,
}

/// Appends `set` (the batch's write set) to the log, commits `batch` and runs the observers
/// (see the module header). On failure nothing of the batch is visible.
pub(crate) fn apply(state: &ShardState, batch: Executed, set: &mut WriteSet) -> StorageResult<()> {
    let Executed {
        txn,
        entries,
        catalog,
        stats,
        reservation,
        history,
        has_jobs,
    } = batch;
    let recorded = match history {
        Ok(versions) => state.history.record(versions),
        Err(last) => {
            // Too much to keep: what it replaced is not kept, so reads as of a time before the
            // batch cannot be answered (SnapshotTooOld), never misread.
            if let Some(ts) = last {
                state.history.trim_before(ts);
            }
            0
        }
    };
    if let Err(e) = commit(state, txn, set) {
        state.history.forget_last(recorded);
        return Err(e);
    }
    if has_jobs {
        state.count_commit();
    }
    state.set_oplog_stats(stats);
    state.publish_catalog(catalog);
    if let Some(r) = reservation {
        state.hlc().set_reserved(r);
    }
    state.tail.publish(entries);
    state.prepared.keep_batch();
    state.hlc().clear_inflight();
    Ok(())
}

/// Makes the batch durable and visible: appends its set to the log, then commits `txn`; or,
/// for a log that applies what it appends, hands `txn` to the log with the set.
fn commit(state: &ShardState, txn: Box<dyn WriteTxn>, set: &mut WriteSet) -> StorageResult<()> {
    if set.is_empty() {
        return txn.commit();
    }
    if state.log.applies() {
        return state.log.append_applying(set, txn).map(|_| ());
    }
    let appended = state.log.append(set)?;
    match txn.commit() {
        Ok(()) => {
            state.log.applied(appended);
            Ok(())
        }
        Err(e) => {
            state.log.retract(appended);
            Err(e)
        }
    }
}
