//! Shared readers: change-stream cursors with the same shard-side spec (the namespace, the
//! `$changeStream` options other than the start, the pushed-down stages) share one read and one
//! transform of each oplog entry. The reader runs the stages once and keeps the events it made
//! (encoded once, shared by reference) in a log bounded by bytes; each cursor keeps its own
//! position in it, its own pending events and its own batches.
//!
//! A cursor joins its spec's reader once its own stages hold nothing a fresh copy would not
//! (its resume point is behind it) and its position lies within what the reader has: at or
//! after the log's base, at or before the reader's position. Until then it reads by itself,
//! from the window or from storage; a cursor that falls behind the log's base leaves and goes
//! on by itself, and joins again once it has caught up. No cursor waits for another: a reader
//! reads as far as the cursor asking needs, and the log drops its oldest events past its bound.
//!
//! Invariants:
//! * the log holds, in token order, every event the reader's stages made from the entries with
//!   `base < ts <= position`, each once, and no event of an entry at or before `base` (an
//!   entry's events are kept all or none); `base` and `position` only grow;
//! * a cursor at position `p` (`base <= p <= position`) is given exactly the events of entries
//!   after `p`, so it sees what its own stages would have made;
//! * a reader lives while a cursor holds it; the registry keeps only weak references. Its
//!   log is bounded by [`LOG_BYTES`] whatever its cursors do.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::Result;

use super::{Pending, Reading};
use crate::state::ShardState;

/// What a reader's log may hold, in bytes of event (a cursor that lags by more leaves).
pub(super) const LOG_BYTES: usize = 8 * 1024 * 1024;

/// The shard's readers, by shard-side spec.
#[derive(Default)]
pub(super) struct Readers {
    map: Mutex<HashMap<Vec<u8>, Weak<Reader>>>,
}

impl Readers {
    /// The reader of `key` that can serve a cursor at `position`; a new one starting there when
    /// the spec has none (or its reader has ended). `None` when the spec's reader cannot serve
    /// this cursor yet: the cursor reads by itself and asks again later.
    pub fn join(
        &self,
        key: &[u8],
        position: ClusterTime,
        fresh: impl FnOnce() -> Reading,
    ) -> Option<Arc<Reader>> {
        let mut map = lock(&self.map);
        map.retain(|_, r| r.strong_count() > 0);
        if let Some(reader) = map.get(key).and_then(Weak::upgrade) {
            let log = lock(&reader.log);
            if log.reading.stream.invalidated().is_none() {
                let serves = log.base <= position && position <= log.reading.position;
                drop(log);
                return serves.then_some(reader);
            }
        }
        let reader = Arc::new(Reader {
            log: Mutex::new(Log::new(fresh(), position)),
            max_bytes: LOG_BYTES,
        });
        map.insert(key.to_vec(), Arc::downgrade(&reader));
        Some(reader)
    }

    /// Readers alive now (for tests and diagnostics).
    pub fn len(&self) -> usize {
        lock(&self.map)
            .values()
            .filter(|r| r.strong_count() > 0)
            .count()
    }
}

/// One shared reader.
pub(super) struct Reader {
    log: Mutex<Log>,
    max_bytes: usize,
}

/// What a cursor takes from a reader.
pub(super) struct Taken {
    pub events: Vec<Arc<Pending>>,
    /// The cursor's new position: the reader's.
    pub position: ClusterTime,
    /// The reader read every entry that was visible when it looked.
    pub read_through: bool,
}

impl Reader {
    /// The events after `position`, reading on (through the stages, once for every cursor)
    /// until there are `want` of them or every visible entry is read. `None` when `position`
    /// is behind what the log keeps.
    pub fn read(
        &self,
        state: &ShardState,
        position: ClusterTime,
        want: usize,
    ) -> Result<Option<Taken>> {
        let mut log = lock(&self.log);
        if position < log.base || position > log.reading.position {
            return Ok(None);
        }
        let mut read_through = false;
        while log.after(position) < want.max(1) {
            let mut made = VecDeque::new();
            read_through = log.reading.step(state, &mut made)?;
            log.push(made, self.max_bytes);
            if read_through {
                break;
            }
        }
        if position < log.base {
            // What this cursor needs was dropped while reading: it goes on by itself.
            return Ok(None);
        }
        let events = log.events_after(position);
        let now = log.reading.position;
        Ok(Some(Taken {
            events,
            position: now,
            read_through,
        }))
    }
}

/// A reader's stages and the events they made.
struct Log {
    reading: Reading,
    events: VecDeque<Arc<Pending>>,
    base: ClusterTime,
    bytes: usize,
}

impl Log {
    fn new(reading: Reading, base: ClusterTime) -> Log {
        Log {
            reading,
            events: VecDeque::new(),
            base,
            bytes: 0,
        }
    }

    fn cost(e: &Pending) -> usize {
        e.bytes.len() + e.token.data().len() + 64
    }

    /// Appends newly made events and drops the oldest past `max_bytes`. The log's base rises
    /// to the entry of each dropped event: a cursor behind it needs that entry's events.
    fn push(&mut self, made: VecDeque<Arc<Pending>>, max_bytes: usize) {
        for e in made {
            self.bytes += Log::cost(&e);
            self.events.push_back(e);
        }
        while self.bytes > max_bytes {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= Log::cost(&old);
            self.base = self.base.max(old.ts);
        }
        // The log keeps all of an entry's events or none: one entry (a large transaction) can
        // make more than the bound, and a cursor must not be given only its last ones.
        while self.events.front().is_some_and(|e| e.ts <= self.base) {
            if let Some(old) = self.events.pop_front() {
                self.bytes -= Log::cost(&old);
            }
        }
    }

    fn first_after(&self, position: ClusterTime) -> usize {
        self.events.partition_point(|e| e.ts <= position)
    }

    fn after(&self, position: ClusterTime) -> usize {
        self.events.len() - self.first_after(position)
    }

    fn events_after(&self, position: ClusterTime) -> Vec<Arc<Pending>> {
        self.events
            .range(self.first_after(position)..)
            .cloned()
            .collect()
    }
}

/// The readers' key of a shard `aggregate`: its namespace and pipeline without the start
/// (`resumeAfter`, `startAfter`, `startAtOperationTime`). `None` for a malformed command (it
/// fails to parse before this is asked).
pub(super) fn key(db: &str, cmd: &Document) -> Option<Vec<u8>> {
    let mut pipeline = cmd.get_array("pipeline").ok()?.clone();
    let Some(Bson::Document(first)) = pipeline.first_mut() else {
        return None;
    };
    let spec = first.get_document_mut("$changeStream").ok()?;
    for start in ["resumeAfter", "startAfter", "startAtOperationTime"] {
        spec.remove(start);
    }
    let target = cmd.get("aggregate").cloned().unwrap_or(Bson::Null);
    doc! {"db": db, "target": target, "pipeline": pipeline}
        .to_vec()
        .ok()
}

/// Never held across `.await`; a poisoned lock is still consistent (every update is whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use pipeline::changestream::shard::ShardStream;
    use pipeline::changestream::spec::{ChangeStreamSpec, StreamLevel};
    use resume::token::{ResumeTokenData, TokenVersion};

    use super::*;

    fn at(i: u32) -> ClusterTime {
        ClusterTime::new(100, i)
    }

    fn event(ts: ClusterTime, size: usize) -> Arc<Pending> {
        let token = ResumeTokenData::high_water_mark(ts, TokenVersion::default()).encode();
        Arc::new(Pending {
            ts,
            token,
            bytes: Bytes::from(vec![0u8; size]),
            invalidate: false,
        })
    }

    fn log() -> Log {
        let spec = ChangeStreamSpec::new(StreamLevel::Collection, "db", Some("c"));
        let reading = Reading {
            stream: ShardStream::new(spec, vec![]),
            position: at(0),
        };
        Log::new(reading, at(0))
    }

    #[test]
    fn the_log_keeps_to_its_bound_and_its_base_follows_what_it_dropped() {
        let mut log = log();
        let one = Log::cost(&event(at(1), 1000));
        for i in 1..=10 {
            log.push(VecDeque::from([event(at(i), 1000)]), 3 * one);
        }
        assert_eq!(log.events.len(), 3);
        assert!(log.bytes <= 3 * one);
        assert_eq!(
            log.base,
            at(7),
            "a cursor at (100,7) or later can still be served"
        );
        assert_eq!(log.after(at(7)), 3);
        assert_eq!(log.after(at(9)), 1);
        assert_eq!(log.events_after(at(8))[0].ts, at(9));
    }

    #[test]
    fn the_events_of_one_entry_are_all_after_the_entry_before_it() {
        let mut log = log();
        // A transaction: three events of the entry at (100,2).
        log.push(
            VecDeque::from([
                event(at(1), 10),
                event(at(2), 10),
                event(at(2), 10),
                event(at(2), 10),
            ]),
            usize::MAX,
        );
        assert_eq!(log.after(at(1)), 3);
        assert_eq!(log.after(at(2)), 0);
        // Dropping one of them drops the entry's others too: a cursor before the entry reads
        // it by itself, one past it needs none of them.
        let one = Log::cost(&event(at(1), 10));
        log.push(VecDeque::new(), 2 * one);
        assert_eq!(log.events.len(), 0);
        assert_eq!(log.base, at(2));
    }

    #[test]
    fn an_entry_whose_events_outgrow_the_bound_leaves_none_of_them() {
        let mut l = log();
        let one = Log::cost(&event(at(1), 100));
        l.push((0..5).map(|_| event(at(2), 100)).collect(), 3 * one);
        assert!(
            l.events.is_empty(),
            "none of the entry's events, not its last three"
        );
        assert_eq!(
            l.base,
            at(2),
            "a cursor before the entry reads it by itself"
        );
        assert_eq!(l.bytes, 0);
    }

    #[test]
    fn the_key_ignores_the_start_only() {
        let cmd = |start: Document, more: Option<Document>| {
            let mut spec = doc! {"fullDocument": "updateLookup"};
            spec.extend(start);
            let mut pipeline = vec![Bson::Document(doc! {"$changeStream": spec})];
            pipeline.extend(more.map(Bson::Document));
            doc! {"aggregate": "c", "pipeline": pipeline, "cursor": {}}
        };
        let a = key("db", &cmd(doc! {"resumeAfter": {"_data": "82"}}, None));
        let b = key(
            "db",
            &cmd(
                doc! {"startAtOperationTime": bson::Timestamp { time: 1, increment: 1 }},
                None,
            ),
        );
        let c = key(
            "db",
            &cmd(doc! {}, Some(doc! {"$match": {"operationType": "insert"}})),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, key("other", &cmd(doc! {}, None)));
    }
}
