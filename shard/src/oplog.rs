//! The oplog: entries in MongoDB's format (`ts, t, v, op, ns, ui, o, o2, wall`, plus
//! `lsid/txnNumber/stmtId/prevOpTime` for retryable writes), stored in
//! [`Table::Oplog`](crate::storage::Table::Oplog) keyed by `ts`, and the in-memory tail window of
//! recently committed entries that tailing readers share.
//!
//! Invariants:
//! * `ts` strictly increases in storage order; an entry never changes once visible.
//! * An entry is written in the same commit as the data change it describes.
//! * The tail window holds only committed entries, published in `ts` order by the writer, and
//!   `visible` (the watch value) is the `ts` of the last published entry. Every committed entry
//!   with `floor < ts <= visible` is in the window; entries at or below `floor` must be read from
//!   storage. The window is bounded by bytes; eviction raises `floor`.
//! * Readers never hold a skiplist entry across `.await`: they copy entries out in batches.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bson::{Bson, Document, Timestamp, Uuid, doc};
use bytes::Bytes;
use crossbeam_skiplist::SkipMap;
use resume::ClusterTime;
use tokio::sync::watch;

use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table};

/// The storage key of an oplog entry.
pub fn oplog_key(ts: ClusterTime) -> [u8; 8] {
    ts.as_u64().to_be_bytes()
}

pub fn ts_of_key(key: &[u8]) -> Option<ClusterTime> {
    let arr: [u8; 8] = key.try_into().ok()?;
    Some(ClusterTime::from_u64(u64::from_be_bytes(arr)))
}

/// The session part of a retryable write's entry.
#[derive(Debug, Clone)]
pub struct SessionFields {
    pub lsid: Document,
    pub txn_number: i64,
    /// The statement of a retryable write; `None` on a transaction's entries.
    pub stmt_id: Option<i32>,
    /// The previous entry of the same `(lsid, txnNumber)`, or `None` for the first.
    pub prev_op_time: Option<ClusterTime>,
}

/// `{ts, t}` as MongoDB writes an OpTime; the null OpTime is `{ts: Timestamp(0, 0), t: -1}`.
pub fn op_time_doc(op_time: Option<(ClusterTime, i64)>) -> Document {
    match op_time {
        Some((ts, t)) => doc! {"ts": ts.timestamp(), "t": t},
        None => doc! {"ts": Timestamp { time: 0, increment: 0 }, "t": -1_i64},
    }
}

/// What an entry describes, before `ts` and `wall` are stamped on.
#[derive(Debug, Clone)]
pub struct EntrySpec {
    pub op: &'static str,
    pub ns: String,
    pub ui: Option<Uuid>,
    pub o: Document,
    pub o2: Option<Document>,
    pub session: Option<SessionFields>,
    /// The document before the write, kept as the entry's change-stream pre-image (for a
    /// collection with `changeStreamPreAndPostImages`); never part of the entry itself.
    pub pre_image: Option<Document>,
}

impl EntrySpec {
    pub fn insert(ns: String, ui: Uuid, doc: Document, key: Document) -> Self {
        EntrySpec {
            op: "i",
            ns,
            ui: Some(ui),
            o: doc,
            o2: Some(key),
            session: None,
            pre_image: None,
        }
    }

    /// `o` is `{$v: 2, diff}` or a whole replacement document.
    pub fn update(ns: String, ui: Uuid, o: Document, key: Document) -> Self {
        EntrySpec {
            op: "u",
            ns,
            ui: Some(ui),
            o,
            o2: Some(key),
            session: None,
            pre_image: None,
        }
    }

    pub fn delete(ns: String, ui: Uuid, key: Document) -> Self {
        EntrySpec {
            op: "d",
            ns,
            ui: Some(ui),
            o: key,
            o2: None,
            session: None,
            pre_image: None,
        }
    }

    /// A DDL entry on `<db>.$cmd`.
    pub fn command(db: &str, ui: Option<Uuid>, o: Document, o2: Option<Document>) -> Self {
        EntrySpec {
            op: "c",
            ns: format!("{db}.$cmd"),
            ui,
            o,
            o2,
            session: None,
            pre_image: None,
        }
    }

    pub fn noop(ns: String, ui: Option<Uuid>, o: Document, o2: Option<Document>) -> Self {
        EntrySpec {
            op: "n",
            ns,
            ui,
            o,
            o2,
            session: None,
            pre_image: None,
        }
    }

    /// Keeps `before` as the write's pre-image when `record` (its collection records them).
    pub fn with_pre_image(mut self, record: bool, before: &Document) -> Self {
        if record {
            self.pre_image = Some(before.clone());
        }
        self
    }

    /// The entry as one operation of a transaction's `applyOps` (no time or session fields:
    /// those are the `applyOps` entry's).
    pub fn apply_ops_entry(self) -> Document {
        let mut d = Document::new();
        d.insert("op", self.op);
        d.insert("ns", self.ns);
        if let Some(ui) = self.ui {
            d.insert("ui", ui);
        }
        d.insert("o", self.o);
        if let Some(o2) = self.o2 {
            d.insert("o2", o2);
        }
        d
    }

    /// The full entry, in MongoDB's field order; `term` is its `t`.
    /// The entry at `ts` in `term`; `prev_term` is the term of the entry its `prevOpTime`
    /// names (the writer reads it from the oplog).
    pub fn build(self, ts: ClusterTime, term: i64, wall_millis: u64, prev_term: i64) -> Document {
        let mut d = Document::new();
        if let Some(s) = &self.session {
            d.insert("lsid", s.lsid.clone());
            d.insert("txnNumber", s.txn_number);
        }
        d.insert("op", self.op);
        d.insert("ns", self.ns);
        if let Some(ui) = self.ui {
            d.insert("ui", ui);
        }
        d.insert("o", self.o);
        if let Some(o2) = self.o2 {
            d.insert("o2", o2);
        }
        if let Some(id) = self.session.as_ref().and_then(|s| s.stmt_id) {
            d.insert("stmtId", id);
        }
        d.insert("ts", ts.timestamp());
        d.insert("t", term);
        d.insert("v", 2_i64);
        d.insert(
            "wall",
            bson::DateTime::from_millis(i64::try_from(wall_millis).unwrap_or(i64::MAX)),
        );
        if let Some(s) = &self.session {
            d.insert(
                "prevOpTime",
                op_time_doc(s.prev_op_time.map(|prev| (prev, prev_term))),
            );
        }
        d
    }
}

/// The `ts` of an entry document.
pub fn entry_ts(d: &Document) -> Option<ClusterTime> {
    match d.get("ts") {
        Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
        _ => None,
    }
}

/// Reads committed entries with `ts > after` from storage, at most `limit`, in order.
pub fn read_from_storage(
    txn: &dyn ReadTxn,
    after: ClusterTime,
    limit: usize,
) -> StorageResult<Vec<(ClusterTime, Bytes)>> {
    let mut out = Vec::new();
    let range = KeyRange::from(std::ops::Bound::Excluded(oplog_key(after).to_vec()));
    txn.scan(Table::Oplog, &range, false, &mut |k, v| {
        if let Some(ts) = ts_of_key(k) {
            out.push((ts, Bytes::copy_from_slice(v)));
        }
        if out.len() >= limit {
            Scan::Stop
        } else {
            Scan::Continue
        }
    })?;
    Ok(out)
}

/// The first (oldest) entry's `ts` in storage.
pub fn first_ts_in_storage(txn: &dyn ReadTxn) -> StorageResult<Option<ClusterTime>> {
    edge_ts_in_storage(txn, false)
}

/// The last entry's `ts` in storage.
pub fn last_ts_in_storage(txn: &dyn ReadTxn) -> StorageResult<Option<ClusterTime>> {
    edge_ts_in_storage(txn, true)
}

fn edge_ts_in_storage(txn: &dyn ReadTxn, last: bool) -> StorageResult<Option<ClusterTime>> {
    let mut edge = None;
    txn.scan(Table::Oplog, &KeyRange::all(), last, &mut |k, _| {
        edge = ts_of_key(k);
        Scan::Stop
    })?;
    Ok(edge)
}

/// The in-memory window of recently committed entries.
pub struct TailWindow {
    entries: SkipMap<u64, Bytes>,
    bytes: AtomicUsize,
    max_bytes: usize,
    /// Entries with `ts <= floor` may be missing from the window.
    floor: AtomicU64,
    visible: watch::Sender<ClusterTime>,
}

/// What [`TailWindow::read_after`] found.
#[derive(Debug)]
pub enum WindowRead {
    /// The entries after the position, up to the visible point (possibly none).
    Entries(Vec<(ClusterTime, Bytes)>),
    /// The window no longer covers the position: read from storage.
    Behind,
}

impl TailWindow {
    /// A window whose coverage starts after `last_committed`.
    pub fn new(last_committed: ClusterTime, max_bytes: usize) -> TailWindow {
        let (visible, _) = watch::channel(last_committed);
        TailWindow {
            entries: SkipMap::new(),
            bytes: AtomicUsize::new(0),
            max_bytes,
            floor: AtomicU64::new(last_committed.as_u64()),
            visible,
        }
    }

    /// The bytes of entries the window holds (at most its bound, plus one batch).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The writer publishes a committed batch, in `ts` order.
    pub fn publish(&self, batch: Vec<(ClusterTime, Bytes)>) {
        let Some(last) = batch.last().map(|(ts, _)| *ts) else {
            return;
        };
        for (ts, bytes) in batch {
            self.bytes.fetch_add(bytes.len(), Ordering::SeqCst);
            self.entries.insert(ts.as_u64(), bytes);
        }
        self.visible.send_replace(last);
        while self.bytes.load(Ordering::SeqCst) > self.max_bytes {
            let Some(front) = self.entries.pop_front() else {
                break;
            };
            self.floor.fetch_max(*front.key(), Ordering::SeqCst);
            self.bytes.fetch_sub(front.value().len(), Ordering::SeqCst);
        }
    }

    /// The `ts` of the last committed, visible entry.
    pub fn visible(&self) -> ClusterTime {
        *self.visible.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<ClusterTime> {
        self.visible.subscribe()
    }

    /// Up to `limit` visible entries with `ts > after`.
    pub fn read_after(&self, after: ClusterTime, limit: usize) -> WindowRead {
        if after.as_u64() < self.floor.load(Ordering::SeqCst) {
            return WindowRead::Behind;
        }
        let visible = self.visible().as_u64();
        let mut out = Vec::new();
        let start = after.as_u64().saturating_add(1);
        if start <= visible {
            for e in self.entries.range(start..=visible) {
                out.push((ClusterTime::from_u64(*e.key()), e.value().clone()));
                if out.len() >= limit {
                    break;
                }
            }
        }
        // Eviction may have raced with the copy: only trust it if coverage still holds.
        if after.as_u64() < self.floor.load(Ordering::SeqCst) {
            return WindowRead::Behind;
        }
        WindowRead::Entries(out)
    }
}

/// The `ts` an oplog entry's `commitMetadata` refers to, when it is a reference to an earlier
/// entry of its run rather than the document (see `writer::CommitMetadata`).
pub fn commit_metadata_reference(entry: &bson::RawDocument) -> Option<ClusterTime> {
    match entry.get("commitMetadata") {
        Ok(Some(bson::RawBsonRef::Timestamp(ts))) => Some(ClusterTime::from(ts)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u32) -> (ClusterTime, Bytes) {
        (ClusterTime::new(n, 1), Bytes::from(vec![0u8; 10]))
    }

    #[test]
    fn window_serves_entries_after_a_position_up_to_visible() {
        let w = TailWindow::new(ClusterTime::ZERO, 1 << 20);
        w.publish(vec![entry(1), entry(2), entry(3)]);
        assert_eq!(w.visible(), ClusterTime::new(3, 1));
        match w.read_after(ClusterTime::new(1, 1), 10) {
            WindowRead::Entries(v) => {
                assert_eq!(v.len(), 2);
                assert_eq!(v[0].0, ClusterTime::new(2, 1));
            }
            WindowRead::Behind => panic!("window should cover"),
        }
    }

    #[test]
    fn window_is_bounded_by_bytes_and_reports_evicted_positions_as_behind() {
        let w = TailWindow::new(ClusterTime::ZERO, 25);
        w.publish(vec![entry(1), entry(2), entry(3), entry(4)]);
        assert!(matches!(
            w.read_after(ClusterTime::ZERO, 10),
            WindowRead::Behind
        ));
        match w.read_after(ClusterTime::new(2, 1), 10) {
            WindowRead::Entries(v) => assert_eq!(v.len(), 2),
            WindowRead::Behind => panic!("should cover after the floor"),
        }
    }

    #[test]
    fn entries_have_mongodb_field_order() {
        let ui = Uuid::new();
        let e = EntrySpec::insert("d.c".into(), ui, doc! {"_id": 1}, doc! {"_id": 1}).build(
            ClusterTime::new(5, 2),
            1,
            5_000,
            1,
        );
        let keys: Vec<&str> = e.keys().map(String::as_str).collect();
        assert_eq!(keys, ["op", "ns", "ui", "o", "o2", "ts", "t", "v", "wall"]);
        assert_eq!(e.get_i64("t").unwrap(), 1);
        assert_eq!(e.get_i64("v").unwrap(), 2);
    }

    #[test]
    fn a_retryable_write_s_prev_op_time_names_its_entry_s_term() {
        let ui = Uuid::new();
        let mut spec = EntrySpec::insert("d.c".into(), ui, doc! {"_id": 1}, doc! {"_id": 1});
        spec.session = Some(SessionFields {
            lsid: doc! {"id": 1},
            txn_number: 4,
            stmt_id: Some(1),
            prev_op_time: Some(ClusterTime::new(5, 1)),
        });
        let e = spec.build(ClusterTime::new(9, 1), 7, 5_000, 6);
        assert_eq!(
            e.get_document("prevOpTime").unwrap(),
            &doc! {"ts": ClusterTime::new(5, 1).timestamp(), "t": 6_i64}
        );
        assert_eq!(e.get_i64("t").unwrap(), 7);
        let mut first = EntrySpec::insert("d.c".into(), ui, doc! {"_id": 2}, doc! {"_id": 2});
        first.session = Some(SessionFields {
            lsid: doc! {"id": 1},
            txn_number: 4,
            stmt_id: Some(0),
            prev_op_time: None,
        });
        let e = first.build(ClusterTime::new(9, 2), 7, 5_000, 7);
        assert_eq!(
            e.get_document("prevOpTime").unwrap(),
            &doc! {"ts": bson::Timestamp { time: 0, increment: 0 }, "t": -1_i64}
        );
    }
}
