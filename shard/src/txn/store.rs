//! A transaction's storage: the snapshot it started on, with its own writes laid over it.
//!
//! Reads see the snapshot as of the transaction's first statement plus the transaction's
//! writes, in key order; writes go to an in-memory write set and nowhere else until commit.
//! For every key it writes, the store remembers what the snapshot held there (`seen`): the
//! commit checks that nobody changed it since, which is what makes a write-write conflict
//! fail instead of silently overwriting.
//!
//! Invariants:
//! * nothing written here reaches storage except through the commit, which applies the whole
//!   write set in one storage transaction;
//! * `seen` is the snapshot's value, taken the first time the key is written;
//! * a scan yields each key once, the write set's value over the snapshot's, deleted keys
//!   never.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::storage::{
    KeyRange, ReadTxn, Scan, StorageError, StorageResult, Table, WriteTxn, scan_with_overlay,
};

/// One key the transaction wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The transaction's value (`None`: deleted).
    pub value: Option<Vec<u8>>,
    /// The snapshot's value when the transaction first wrote the key.
    pub seen: Option<Vec<u8>>,
}

/// A snapshot and a write set over it. The snapshot is usually a storage read transaction
/// (`'static`); a dry run lays the write set over the writer's own transaction instead
/// ([`Borrowed`]).
pub struct TxnStore<'a> {
    snapshot: Box<dyn ReadTxn + 'a>,
    writes: BTreeMap<(Table, Vec<u8>), Written>,
    /// Keys first written since the last [`TxnStore::take_fresh`].
    fresh: Vec<(Table, Vec<u8>)>,
}

impl<'a> TxnStore<'a> {
    pub fn new(snapshot: Box<dyn ReadTxn + 'a>) -> TxnStore<'a> {
        TxnStore {
            snapshot,
            writes: BTreeMap::new(),
            fresh: Vec::new(),
        }
    }

    /// Every key written, in order.
    pub fn writes(&self) -> &BTreeMap<(Table, Vec<u8>), Written> {
        &self.writes
    }

    pub fn into_writes(self) -> BTreeMap<(Table, Vec<u8>), Written> {
        self.writes
    }

    /// The keys written for the first time since the last call.
    pub fn take_fresh(&mut self) -> Vec<(Table, Vec<u8>)> {
        std::mem::take(&mut self.fresh)
    }

    fn write(&mut self, table: Table, key: &[u8], value: Option<Vec<u8>>) -> StorageResult<()> {
        match self.writes.get_mut(&(table, key.to_vec())) {
            Some(w) => w.value = value,
            None => {
                let seen = self.snapshot.get(table, key)?;
                self.writes
                    .insert((table, key.to_vec()), Written { value, seen });
                self.fresh.push((table, key.to_vec()));
            }
        }
        Ok(())
    }

    /// The write set's entries of `table` within `range`, in scan order.
    fn overlay(&self, table: Table, range: &KeyRange, reverse: bool) -> Vec<(&[u8], &Written)> {
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
        let mut out: Vec<(&[u8], &Written)> = self
            .writes
            .range((lower, Bound::Unbounded))
            .take_while(|((t, k), _)| *t == table && in_upper(k))
            .map(|((_, k), w)| (k.as_slice(), w))
            .collect();
        if reverse {
            out.reverse();
        }
        out
    }
}

impl ReadTxn for TxnStore<'_> {
    fn get(&self, table: Table, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        match self.writes.get(&(table, key.to_vec())) {
            Some(w) => Ok(w.value.clone()),
            None => self.snapshot.get(table, key),
        }
    }

    fn scan(
        &self,
        table: Table,
        range: &KeyRange,
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
    ) -> StorageResult<()> {
        let overlay: Vec<(&[u8], Option<&[u8]>)> = self
            .overlay(table, range, reverse)
            .into_iter()
            .map(|(k, w)| (k, w.value.as_deref()))
            .collect();
        scan_with_overlay(&*self.snapshot, table, range, reverse, &overlay, visit)
    }
}

impl WriteTxn for TxnStore<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()> {
        self.write(table, key, Some(value.to_vec()))
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool> {
        let existed = self.get(table, key)?.is_some();
        self.write(table, key, None)?;
        Ok(existed)
    }

    /// A transaction's writes are committed by the writer, never from here.
    fn commit(self: Box<Self>) -> StorageResult<()> {
        Err(StorageError::Engine(
            "a transaction's store is committed through the writer".into(),
        ))
    }
}

/// Reads through a borrowed write transaction (never writes it): the base of a dry run's
/// store.
pub struct Borrowed<'a> {
    pub inner: &'a mut dyn WriteTxn,
}

crate::storage::reads_through_inner!(Borrowed<'_>);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::storage::{RedbStorage, Storage};

    fn storage(dir: &std::path::Path) -> RedbStorage {
        let s = RedbStorage::open(&dir.join("t.redb")).unwrap();
        let mut w = s.begin_write().unwrap();
        for k in [b"b", b"d", b"f"] {
            w.put(Table::Documents, k, k).unwrap();
        }
        w.put(Table::Meta, b"a", b"meta").unwrap();
        w.commit().unwrap();
        s
    }

    fn keys(store: &TxnStore, range: &KeyRange, reverse: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        store
            .scan(Table::Documents, range, reverse, &mut |k, v| {
                out.push((
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                ));
                Scan::Continue
            })
            .unwrap();
        out
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_see_the_snapshot_with_the_transactions_writes_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = storage(dir.path());
        let mut store = TxnStore::new(s.begin_read().unwrap());
        store.put(Table::Documents, b"a", b"new-a").unwrap();
        store.put(Table::Documents, b"d", b"new-d").unwrap();
        assert!(store.delete(Table::Documents, b"f").unwrap());
        store.put(Table::Documents, b"g", b"new-g").unwrap();
        assert_eq!(
            keys(&store, &KeyRange::all(), false),
            pairs(&[("a", "new-a"), ("b", "b"), ("d", "new-d"), ("g", "new-g")])
        );
        assert_eq!(
            keys(&store, &KeyRange::all(), true),
            pairs(&[("g", "new-g"), ("d", "new-d"), ("b", "b"), ("a", "new-a")])
        );
        let from_c = KeyRange {
            start: Bound::Included(b"c".to_vec()),
            end: Bound::Excluded(b"g".to_vec()),
        };
        assert_eq!(keys(&store, &from_c, false), pairs(&[("d", "new-d")]));
        assert_eq!(store.get(Table::Documents, b"f").unwrap(), None);
        assert_eq!(
            store.get(Table::Meta, b"a").unwrap().as_deref(),
            Some(&b"meta"[..]),
            "other tables are the snapshot's"
        );
    }

    #[test]
    fn a_scan_stops_where_the_visitor_says_in_the_overlay_too() {
        let dir = tempfile::tempdir().unwrap();
        let s = storage(dir.path());
        let mut store = TxnStore::new(s.begin_read().unwrap());
        store.put(Table::Documents, b"a", b"1").unwrap();
        store.put(Table::Documents, b"z", b"2").unwrap();
        let mut seen = Vec::new();
        store
            .scan(Table::Documents, &KeyRange::all(), false, &mut |k, _| {
                seen.push(k.to_vec());
                if seen.len() == 2 {
                    Scan::Stop
                } else {
                    Scan::Continue
                }
            })
            .unwrap();
        assert_eq!(seen, vec![b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn nothing_reaches_storage_and_seen_is_the_snapshots_value() {
        let dir = tempfile::tempdir().unwrap();
        let s = storage(dir.path());
        let mut store = TxnStore::new(s.begin_read().unwrap());
        store.put(Table::Documents, b"b", b"x").unwrap();
        store.put(Table::Documents, b"b", b"y").unwrap();
        store.put(Table::Documents, b"c", b"z").unwrap();
        assert_eq!(
            store.take_fresh(),
            vec![
                (Table::Documents, b"b".to_vec()),
                (Table::Documents, b"c".to_vec())
            ]
        );
        store.put(Table::Documents, b"b", b"w").unwrap();
        assert!(store.take_fresh().is_empty(), "b was written before");
        let w = &store.writes()[&(Table::Documents, b"b".to_vec())];
        assert_eq!(w.seen.as_deref(), Some(&b"b"[..]));
        assert_eq!(w.value.as_deref(), Some(&b"w"[..]));
        let fresh = s.begin_read().unwrap();
        assert_eq!(
            fresh.get(Table::Documents, b"b").unwrap().as_deref(),
            Some(&b"b"[..])
        );
        assert_eq!(fresh.get(Table::Documents, b"c").unwrap(), None);
        assert!(Box::new(store).commit().is_err());
    }
}
