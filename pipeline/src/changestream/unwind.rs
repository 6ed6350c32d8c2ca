//! Unwinding transactions (`$_internalChangeStreamUnwindTransaction`, reference §1.3): a
//! terminal `applyOps` entry, or a `commitTransaction` entry with its prepared chain, becomes
//! one pseudo-entry per inner operation.
//!
//! Owns: walking the `prevOpTime` chain (through a caller-supplied lookup, so no I/O here),
//! replaying it oldest first, and stamping each op.
//!
//! Invariants:
//! * every pseudo-entry carries the committing entry's `ts` and `wall` (so all events of one
//!   transaction share a `clusterTime`), its `lsid`/`txnNumber` and `commitMetadata` when it
//!   has them, and
//!   `txnOpIndex`, `applyOpsIndex`, `applyOpsTs` (and `commitTimestamp` for prepared
//!   transactions);
//! * `txnOpIndex` is 0-based across the whole transaction and counts the ops the namespace and
//!   `fromMigrate` filter drops, so tokens do not depend on the filter;
//! * a chain link that the lookup cannot find fails with `ChangeStreamHistoryLost` (286); a
//!   link that does not go strictly back in time fails too, so a bad oplog cannot loop us.

use bson::{Bson, Document};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError, Result};

use super::oplog_match::{has_prev_op_time, op_matches};
use super::spec::ChangeStreamSpec;

/// An oplog position `{ts, t}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpTime {
    pub ts: ClusterTime,
    pub term: i64,
}

impl OpTime {
    /// Reads `{ts: Timestamp, t: long}`; a missing `t` reads as -1.
    pub fn from_document(d: &Document) -> Option<OpTime> {
        let ts = match d.get("ts")? {
            Bson::Timestamp(ts) => ClusterTime::from(*ts),
            _ => return None,
        };
        let term = match d.get("t") {
            Some(Bson::Int64(t)) => *t,
            Some(Bson::Int32(t)) => i64::from(*t),
            _ => -1,
        };
        Some(OpTime { ts, term })
    }
}

/// Whether `entry` is one the unwind stage expands (`applyOps` or `commitTransaction`).
pub fn is_transaction_entry(entry: &Document) -> bool {
    entry.get_str("op").ok() == Some("c")
        && entry
            .get_document("o")
            .is_ok_and(|o| o.contains_key("applyOps") || o.contains_key("commitTransaction"))
}

/// Expands a terminal `applyOps` or a `commitTransaction` entry into stamped pseudo-entries for
/// the inner ops `spec` watches, oldest first. `lookup` returns the oplog entry at an optime.
pub fn unwind(
    spec: &ChangeStreamSpec,
    entry: &Document,
    lookup: &mut dyn FnMut(OpTime) -> Option<Document>,
) -> Result<Vec<Document>> {
    let o = entry
        .get_document("o")
        .map_err(|_| MongoError::internal("transaction entry without 'o'"))?;
    let commit = o.contains_key("commitTransaction");
    let ts = entry_ts(entry)?;

    // The chain, newest first: the entry itself (unless it is a commit, which holds no ops),
    // then every earlier link.
    let mut chain: Vec<Document> = Vec::new();
    let mut cursor =
        if commit {
            Some(prev_op_time(entry).ok_or_else(|| {
                history_lost(format!("commitTransaction at {ts} has no prevOpTime"))
            })?)
        } else {
            if has_prev_op_time(entry) {
                prev_op_time(entry)
            } else {
                None
            }
        };
    let mut newer = ts;
    while let Some(at) = cursor {
        if at.ts >= newer {
            return Err(history_lost(format!(
                "transaction chain at {ts} does not go back in time at {}",
                at.ts
            )));
        }
        let link = lookup(at).ok_or_else(|| {
            history_lost(format!(
                "transaction chain entry at {} is no longer in the oplog",
                at.ts
            ))
        })?;
        newer = at.ts;
        cursor = if has_prev_op_time(&link) {
            prev_op_time(&link)
        } else {
            None
        };
        chain.push(link);
    }

    let mut out = Vec::new();
    let mut txn_op_index: i64 = 0;
    let links = chain.iter().rev();
    let own = (!commit).then_some(entry);
    for link in links.chain(own) {
        let apply_ops_ts = entry_ts(link)?;
        let ops = link
            .get_document("o")
            .and_then(|o| o.get_array("applyOps"))
            .map_err(|_| history_lost(format!("oplog entry at {apply_ops_ts} is not applyOps")))?;
        for (index, op) in ops.iter().enumerate() {
            let this_index = txn_op_index;
            txn_op_index += 1;
            let Bson::Document(op) = op else { continue };
            if !op_matches(spec, op) {
                continue;
            }
            out.push(stamp(entry, op, this_index, index as i64, apply_ops_ts, o));
        }
    }
    Ok(out)
}

fn stamp(
    committing: &Document,
    op: &Document,
    txn_op_index: i64,
    apply_ops_index: i64,
    apply_ops_ts: ClusterTime,
    committing_o: &Document,
) -> Document {
    let mut d = op.clone();
    for f in ["ts", "wall", "lsid", "txnNumber", "commitMetadata"] {
        match committing.get(f) {
            Some(v) => d.insert(f, v.clone()),
            None => d.remove(f),
        };
    }
    d.insert("txnOpIndex", txn_op_index);
    d.insert("applyOpsIndex", apply_ops_index);
    d.insert("applyOpsTs", Bson::Timestamp(apply_ops_ts.timestamp()));
    if let Some(ct) = committing_o.get("commitTimestamp") {
        d.insert("commitTimestamp", ct.clone());
    }
    d
}

fn entry_ts(entry: &Document) -> Result<ClusterTime> {
    match entry.get("ts") {
        Some(Bson::Timestamp(ts)) => Ok(ClusterTime::from(*ts)),
        _ => Err(MongoError::internal("oplog entry without a Timestamp 'ts'")),
    }
}

fn prev_op_time(entry: &Document) -> Option<OpTime> {
    entry
        .get_document("prevOpTime")
        .ok()
        .and_then(OpTime::from_document)
}

fn history_lost(msg: String) -> MongoError {
    MongoError::new(ErrorCode::CHANGE_STREAM_HISTORY_LOST, msg)
        .with_label("NonResumableChangeStreamError")
}

#[cfg(test)]
mod tests;
