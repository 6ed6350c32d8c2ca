//! Purging the expired entries of a table in bounded passes (change-stream pre-images,
//! retryable-write session records).
//!
//! Owns: one pass. A read snapshot picks up to a limit of keys that look expired; one writer
//! job deletes each of them that is still expired when the job runs, checked against the job's
//! own state, so an entry rewritten in between is kept.
//!
//! Invariants: a pass holds the writer for at most its limit of deletes; nothing is deleted
//! that the job itself does not find expired.

use bson::doc;
use wire::MongoError;

use crate::state::ShardState;
use crate::storage::{KeyRange, Scan, StorageError, StorageResult, Table};
use crate::writer::{WriteCtx, WriteOutput, Writer};

/// Deletes up to `limit` entries of `table` that `looks_expired` picks (by key and value, on
/// a read snapshot) and `still_expired` confirms inside the writer job; how many it deleted.
pub async fn purge_pass(
    state: &ShardState,
    writer: &Writer,
    table: Table,
    limit: usize,
    mut looks_expired: impl FnMut(&[u8], &[u8]) -> bool,
    still_expired: impl Fn(&WriteCtx<'_>, &[u8]) -> StorageResult<bool> + Send + 'static,
) -> Result<usize, MongoError> {
    let storage = |e: StorageError| MongoError::internal(format!("storage: {e}"));
    let mut doomed = Vec::new();
    {
        let read = state.storage.begin_read().map_err(storage)?;
        read.scan(table, &KeyRange::all(), false, &mut |k, v| {
            if looks_expired(k, v) {
                doomed.push(k.to_vec());
            }
            if doomed.len() >= limit {
                Scan::Stop
            } else {
                Scan::Continue
            }
        })
        .map_err(storage)?;
    }
    if doomed.is_empty() {
        return Ok(0);
    }
    let job = move |w: &mut WriteCtx<'_>| {
        let mut n = 0_i64;
        for k in doomed {
            if still_expired(w, &k)? && w.txn_mut().delete(table, &k)? {
                n += 1;
            }
        }
        Ok(WriteOutput {
            reply: doc! {"n": n, "ok": 1.0},
            op_time: None,
        })
    };
    let out = writer.submit(Box::new(job)).await?;
    Ok(usize::try_from(out.reply.get_i64("n").unwrap_or(0)).unwrap_or(0))
}
