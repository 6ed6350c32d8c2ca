//! Open cursors: buffered query results and tailable oplog cursors, by cursor id.
//!
//! Invariants: cursor ids are random, non-zero Int64s, unique among open cursors; a cursor is
//! taken out of the registry while a `getMore` runs on it (so the lock is never held across
//! `.await` and two getMores cannot use it at once) and put back after, unless exhausted;
//! cursors idle longer than [`IDLE_TIMEOUT_MS`] are reaped.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bson::Document;
use resume::ClusterTime;

use std::sync::Arc;

use crate::catalog::CollectionEntry;
use crate::query::Filter;

/// Idle cursors time out after 10 minutes, as in MongoDB.
pub const IDLE_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// Where a cursor's documents come from.
pub enum CursorSource {
    /// Results computed up front.
    Buffered(VecDeque<Document>),
    /// An aggregation's output past its blocking stages, computed as it is read (a sort's
    /// merge of its spilled runs, the stages after it).
    Stream(std::iter::Peekable<pipeline::agg::Docs>),
    /// An unsorted collection scan that resumes after the last key it examined (each getMore
    /// reads a fresh snapshot, as MongoDB's yielding cursors do).
    Scan(Box<ScanCursor>),
    /// A pipeline with no blocking stage over such a scan: each page scanned goes through the
    /// stages as the client reads.
    Piped(Box<Piped>),
    /// A tailable cursor on `local.oplog.rs`: entries after `last` matching `filter`.
    OplogTail {
        filter: Box<Filter>,
        last: ClusterTime,
        await_data: bool,
    },
}

/// The position and options of a streaming scan (of the collection or an index).
pub struct ScanCursor {
    pub coll: Arc<CollectionEntry>,
    /// What the scan reads (the plan chosen when the cursor opened).
    pub access: crate::indexes::plan::Access,
    /// The documents a multikey index scan has produced (see `query::run_plan`).
    pub seen: std::collections::HashSet<Vec<u8>>,
    pub filter: Filter,
    pub projection: Option<crate::query::Output>,
    /// The last key examined (of the plan's key space); `None` before the first document.
    pub after: Option<Vec<u8>>,
    /// Documents still allowed by the query's `limit`.
    pub remaining: Option<usize>,
    /// Matches still to skip (only non-zero when the first batch was empty).
    pub skip: usize,
    /// A tailable cursor (capped collections) stays open at the end, and with `await_data` a
    /// getMore that finds nothing waits for a write.
    pub tailable: bool,
    pub await_data: bool,
}

/// A scan feeding a pipeline run whose stages all stream.
pub struct Piped {
    pub scan: ScanCursor,
    pub run: pipeline::agg::PushRun,
    /// What the stages passed and the client has not had yet.
    pub ready: VecDeque<Document>,
    /// The scan has more, and the run wants it.
    pub scanning: bool,
}

pub struct Cursor {
    pub ns: String,
    pub source: CursorSource,
    /// Default batch size for getMore when the request has none.
    pub last_used_ms: u64,
}

#[derive(Default)]
pub struct CursorRegistry {
    map: Mutex<HashMap<i64, Cursor>>,
}

impl CursorRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Cursor>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a cursor and returns its new id.
    pub fn insert(&self, cursor: Cursor) -> i64 {
        let mut map = self.lock();
        loop {
            let id = (rand::random::<u64>() >> 1) as i64;
            if id != 0 && !map.contains_key(&id) {
                map.insert(id, cursor);
                return id;
            }
        }
    }

    /// Takes a cursor out for a getMore.
    pub fn take(&self, id: i64) -> Option<Cursor> {
        self.lock().remove(&id)
    }

    /// Puts a cursor back after a getMore.
    pub fn put_back(&self, id: i64, cursor: Cursor) {
        self.lock().insert(id, cursor);
    }

    pub fn kill(&self, id: i64) -> bool {
        self.lock().remove(&id).is_some()
    }

    /// Drops cursors idle for longer than the timeout.
    pub fn reap(&self, now_ms: u64) {
        self.lock()
            .retain(|_, c| now_ms.saturating_sub(c.last_used_ms) < IDLE_TIMEOUT_MS);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(at: u64) -> Cursor {
        Cursor {
            ns: "d.c".into(),
            source: CursorSource::Buffered(VecDeque::new()),
            last_used_ms: at,
        }
    }

    #[test]
    fn ids_are_nonzero_and_idle_cursors_are_reaped() {
        let r = CursorRegistry::default();
        let a = r.insert(cursor(0));
        let b = r.insert(cursor(IDLE_TIMEOUT_MS));
        assert!(a != 0 && b != 0 && a != b);
        r.reap(IDLE_TIMEOUT_MS + 1);
        assert!(r.take(a).is_none());
        assert!(r.take(b).is_some());
    }
}
