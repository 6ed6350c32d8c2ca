//! Recent history of a shard's documents, for reads as of a cluster time.
//!
//! For every document and unique-index key the writer overwrites or deletes, the history keeps
//! the value the key had before and the `ts` of the write that replaced it, in memory, for a
//! bounded window. With a storage snapshot taken at or after a time `T`, that is enough to read
//! the data exactly as of `T` ([`AsOf`]): undo, key by key, the writes in `(T, snapshot]`. A
//! multi-document transaction reads through it, so every shard it touches answers as of the
//! same cluster time, and so do `readConcern: snapshot` reads.
//!
//! Invariants:
//! * a key's versions are in `ts` order; each is the value the key had just before the write at
//!   that `ts`, `None` for a key that did not exist;
//! * the writer records a batch's versions before the batch commits and forgets them if the
//!   commit fails, so a reader whose snapshot includes a batch always finds its versions (and a
//!   reader never looks past its own snapshot's time);
//! * every version with `ts > floor` is kept: a read as of `T < floor` is refused
//!   (`SnapshotTooOld`), never answered from incomplete history. Trimming (by bytes, and by
//!   age: [`WINDOW`]) only raises `floor`.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::oplog;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table, scan_with_overlay};

/// The tables whose history is kept: what reads of documents look at.
pub const TRACKED: [Table; 2] = [Table::Documents, Table::Indexes];

/// The default bound of a shard's history, in bytes of the values it keeps.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// How far back reads as of a cluster time may go (MongoDB's
/// `minSnapshotHistoryWindowInSeconds`), history permitting.
pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

pub const SNAPSHOT_TOO_OLD: ErrorCode = ErrorCode::SNAPSHOT_TOO_OLD;

/// One overwritten value: the key, the `ts` of the write that replaced it, the value before.
pub type Version = (Table, Vec<u8>, ClusterTime, Option<Vec<u8>>);

type Key = (Table, Vec<u8>);

/// A key's versions: (ts of the write, value before it), oldest first.
type Versions = VecDeque<(ClusterTime, Option<Arc<[u8]>>)>;

#[derive(Default)]
struct Inner {
    versions: BTreeMap<Key, Versions>,
    /// Every version's (ts, key), oldest first: what trimming drops first.
    order: VecDeque<(ClusterTime, Key)>,
    bytes: usize,
    floor: ClusterTime,
}

/// The history of one shard.
pub struct History {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

fn cost(key: &Key, value: &Option<Arc<[u8]>>) -> usize {
    key.1.len() + value.as_ref().map_or(0, |v| v.len()) + 64
}

impl History {
    /// An empty history: reads as of a time before `floor` (the shard's last `ts` when it
    /// opened) are refused.
    pub fn new(floor: ClusterTime, max_bytes: usize) -> History {
        History {
            inner: Mutex::new(Inner {
                floor,
                ..Inner::default()
            }),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads as of a time before this are refused.
    pub fn floor(&self) -> ClusterTime {
        self.lock().floor
    }

    /// Adds a batch's versions (before its commit), then trims to the bound; returns how many
    /// it added (for [`History::forget_last`]).
    pub fn record(&self, versions: Vec<Version>) -> usize {
        let n = versions.len();
        if n == 0 {
            return 0;
        }
        let mut inner = self.lock();
        for (table, key, ts, before) in versions {
            let k = (table, key);
            let before: Option<Arc<[u8]>> = before.map(Arc::from);
            inner.bytes += cost(&k, &before);
            inner.order.push_back((ts, k.clone()));
            inner.versions.entry(k).or_default().push_back((ts, before));
        }
        while inner.bytes > self.max_bytes {
            if !Self::drop_oldest(&mut inner) {
                break;
            }
        }
        n
    }

    /// Forgets the last `n` versions recorded (a batch whose commit failed; trimming may have
    /// dropped some of them already).
    pub fn forget_last(&self, n: usize) {
        let mut inner = self.lock();
        for _ in 0..n {
            let Some((_, k)) = inner.order.pop_back() else {
                break;
            };
            let mut empty = false;
            let mut freed = 0;
            if let Some(list) = inner.versions.get_mut(&k) {
                if let Some((_, v)) = list.pop_back() {
                    freed = cost(&k, &v);
                }
                empty = list.is_empty();
            }
            inner.bytes -= freed;
            if empty {
                inner.versions.remove(&k);
            }
        }
    }

    /// Moves the window's start to `before`: reads as of an earlier time are refused from now
    /// on, and the versions only they needed are dropped.
    pub fn trim_before(&self, before: ClusterTime) {
        let mut inner = self.lock();
        while inner.order.front().is_some_and(|(ts, _)| *ts < before) {
            Self::drop_oldest(&mut inner);
        }
        inner.floor = inner.floor.max(before);
    }

    fn drop_oldest(inner: &mut Inner) -> bool {
        let Some((ts, k)) = inner.order.pop_front() else {
            return false;
        };
        let mut empty = false;
        let mut freed = 0;
        if let Some(list) = inner.versions.get_mut(&k) {
            if let Some((_, v)) = list.pop_front() {
                freed = cost(&k, &v);
            }
            empty = list.is_empty();
        }
        inner.bytes -= freed;
        if empty {
            inner.versions.remove(&k);
        }
        // A read as of a time before this write could need the dropped value.
        inner.floor = inner.floor.max(ts);
        true
    }

    /// The most the history holds, in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The bytes the history holds.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Every key of `table` in `range` written in `(at, through]`, with its value as of `at`,
    /// in key order.
    fn changed(
        &self,
        table: Table,
        range: &KeyRange,
        at: ClusterTime,
        through: ClusterTime,
    ) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let inner = self.lock();
        let lower = match &range.start {
            Bound::Included(k) => Bound::Included((table, k.clone())),
            Bound::Excluded(k) => Bound::Excluded((table, k.clone())),
            Bound::Unbounded => Bound::Included((table, Vec::new())),
        };
        let in_upper = |k: &[u8]| match &range.end {
            Bound::Included(e) => k <= e.as_slice(),
            Bound::Excluded(e) => k < e.as_slice(),
            Bound::Unbounded => true,
        };
        inner
            .versions
            .range((lower, Bound::Unbounded))
            .take_while(|((t, k), _)| *t == table && in_upper(k))
            .filter_map(|((_, k), list)| {
                value_at(list, at, through).map(|v| (k.clone(), v.map(|b| b.to_vec())))
            })
            .collect()
    }

    /// The value of one key as of `at`, if a write in `(at, through]` changed it since.
    fn value_of(
        &self,
        table: Table,
        key: &[u8],
        at: ClusterTime,
        through: ClusterTime,
    ) -> Option<Option<Vec<u8>>> {
        let inner = self.lock();
        let list = inner.versions.get(&(table, key.to_vec()))?;
        value_at(list, at, through).map(|v| v.map(|b| b.to_vec()))
    }
}

/// The value before the first write in `(at, through]`, if there is one.
fn value_at(list: &Versions, at: ClusterTime, through: ClusterTime) -> Option<Option<&Arc<[u8]>>> {
    let first = list.partition_point(|(ts, _)| *ts <= at);
    match list.get(first) {
        Some((ts, before)) if *ts <= through => Some(before.as_ref()),
        _ => None,
    }
}

/// A storage snapshot read as of cluster time `at` (at or before the snapshot's own time).
pub struct AsOf {
    snapshot: Box<dyn ReadTxn>,
    history: Arc<History>,
    at: ClusterTime,
    /// The `ts` of the snapshot's last oplog entry: writes after it are not in the snapshot.
    through: ClusterTime,
}

impl AsOf {
    /// Reads `snapshot` as of `at`; refused when the history no longer reaches back there.
    pub fn new(
        snapshot: Box<dyn ReadTxn>,
        history: Arc<History>,
        at: ClusterTime,
    ) -> Result<AsOf, MongoError> {
        let through = oplog::last_ts_in_storage(&*snapshot)
            .map_err(|e| MongoError::internal(format!("storage: {e}")))?
            .unwrap_or(ClusterTime::ZERO);
        if at < history.floor() {
            return Err(MongoError::new(
                SNAPSHOT_TOO_OLD,
                format!(
                    "Read timestamp {at:?} is older than the oldest available timestamp {:?}",
                    history.floor()
                ),
            ));
        }
        Ok(AsOf {
            snapshot,
            history,
            at,
            through,
        })
    }

    pub fn at(&self) -> ClusterTime {
        self.at
    }
}

impl ReadTxn for AsOf {
    fn get(&self, table: Table, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        if TRACKED.contains(&table)
            && let Some(v) = self.history.value_of(table, key, self.at, self.through)
        {
            return Ok(v);
        }
        self.snapshot.get(table, key)
    }

    fn scan(
        &self,
        table: Table,
        range: &KeyRange,
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
    ) -> StorageResult<()> {
        if !TRACKED.contains(&table) {
            return self.snapshot.scan(table, range, reverse, visit);
        }
        let mut changed = self.history.changed(table, range, self.at, self.through);
        if reverse {
            changed.reverse();
        }
        let overlay: Vec<(&[u8], Option<&[u8]>)> = changed
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        scan_with_overlay(&*self.snapshot, table, range, reverse, &overlay, visit)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::storage::{RedbStorage, Storage};

    fn t(i: u32) -> ClusterTime {
        ClusterTime::new(100, i)
    }

    /// Applies `writes` at `ts` to storage (with an oplog entry at `ts`) and records their
    /// history, as the writer does.
    fn write(s: &RedbStorage, h: &History, ts: ClusterTime, writes: &[(&str, Option<&str>)]) {
        let mut w = s.begin_write().unwrap();
        let mut versions = Vec::new();
        for (k, v) in writes {
            let before = w.get(Table::Documents, k.as_bytes()).unwrap();
            versions.push((Table::Documents, k.as_bytes().to_vec(), ts, before));
            match v {
                Some(v) => w.put(Table::Documents, k.as_bytes(), v.as_bytes()).unwrap(),
                None => {
                    w.delete(Table::Documents, k.as_bytes()).unwrap();
                }
            }
        }
        w.put(Table::Oplog, &oplog::oplog_key(ts), b"entry")
            .unwrap();
        h.record(versions);
        w.commit().unwrap();
    }

    fn all(r: &AsOf, reverse: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        r.scan(Table::Documents, &KeyRange::all(), reverse, &mut |k, v| {
            out.push((
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
            Scan::Continue
        })
        .unwrap();
        out
    }

    fn kv(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_snapshot_reads_exactly_as_of_any_time_inside_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStorage::open(&dir.path().join("h.redb")).unwrap();
        let h = Arc::new(History::new(ClusterTime::ZERO, usize::MAX));
        write(&s, &h, t(1), &[("a", Some("a1")), ("b", Some("b1"))]);
        write(&s, &h, t(2), &[("a", Some("a2")), ("c", Some("c2"))]);
        write(&s, &h, t(3), &[("b", None), ("a", Some("a3"))]);
        let at = |ts| AsOf::new(s.begin_read().unwrap(), h.clone(), ts).unwrap();
        assert_eq!(all(&at(t(1)), false), kv(&[("a", "a1"), ("b", "b1")]));
        assert_eq!(
            all(&at(t(2)), false),
            kv(&[("a", "a2"), ("b", "b1"), ("c", "c2")])
        );
        assert_eq!(
            all(&at(t(2)), true),
            kv(&[("c", "c2"), ("b", "b1"), ("a", "a2")])
        );
        assert_eq!(all(&at(t(3)), false), kv(&[("a", "a3"), ("c", "c2")]));
        assert_eq!(
            all(&at(t(0)), false),
            kv(&[]),
            "before anything was written"
        );
        let r = at(t(2));
        assert_eq!(
            r.get(Table::Documents, b"b").unwrap().as_deref(),
            Some(&b"b1"[..])
        );
        assert_eq!(
            r.get(Table::Documents, b"a").unwrap().as_deref(),
            Some(&b"a2"[..])
        );
        // A snapshot taken before a later write does not look past its own time.
        let early = at(t(2));
        write(&s, &h, t(4), &[("c", None)]);
        assert_eq!(
            all(&early, false),
            kv(&[("a", "a2"), ("b", "b1"), ("c", "c2")])
        );
        assert_eq!(all(&at(t(4)), false), kv(&[("a", "a3")]));
    }

    #[test]
    fn trimming_raises_the_floor_and_older_reads_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStorage::open(&dir.path().join("h.redb")).unwrap();
        let h = Arc::new(History::new(ClusterTime::ZERO, usize::MAX));
        write(&s, &h, t(1), &[("a", Some("a1"))]);
        write(&s, &h, t(2), &[("a", Some("a2"))]);
        h.trim_before(t(2));
        assert_eq!(h.floor(), t(2));
        let e = AsOf::new(s.begin_read().unwrap(), h.clone(), t(0))
            .err()
            .unwrap();
        assert_eq!(e.code, 239);
        let r = AsOf::new(s.begin_read().unwrap(), h.clone(), t(2)).unwrap();
        assert_eq!(all(&r, false), kv(&[("a", "a2")]));
        assert_eq!(
            AsOf::new(s.begin_read().unwrap(), h.clone(), t(1))
                .err()
                .map(|e| e.code),
            Some(239)
        );
        // A bound in bytes drops the oldest versions first.
        let small = History::new(ClusterTime::ZERO, 200);
        for i in 1..=10 {
            small.record(vec![(
                Table::Documents,
                vec![b'k'],
                t(i),
                Some(vec![0; 40]),
            )]);
        }
        assert!(small.bytes() <= 200);
        assert!(small.floor() >= t(7), "{:?}", small.floor());
    }

    #[test]
    fn a_failed_batch_is_forgotten() {
        let h = History::new(ClusterTime::ZERO, usize::MAX);
        h.record(vec![(Table::Documents, b"a".to_vec(), t(1), None)]);
        h.record(vec![
            (Table::Documents, b"a".to_vec(), t(2), Some(b"x".to_vec())),
            (Table::Documents, b"b".to_vec(), t(2), None),
        ]);
        h.forget_last(2);
        let all = KeyRange::all();
        assert_eq!(
            h.changed(Table::Documents, &all, t(0), t(9)),
            vec![(b"a".to_vec(), None)]
        );
        assert_eq!(h.changed(Table::Documents, &all, t(1), t(9)), vec![]);
    }
}
