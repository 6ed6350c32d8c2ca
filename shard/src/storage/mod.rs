//! The storage seam: a narrow byte-oriented key/value interface with ACID transactions, and its
//! redb implementation.
//!
//! Everything a shard persists goes through [`Storage`]: the catalog, documents, the oplog,
//! retryable-write records and the clock reservation, each in its own [`Table`]. Keys are
//! compared as bytes, so callers encode keys order-preservingly (big-endian integers,
//! KeyString bytes).
//!
//! Invariants:
//! * A write transaction is all-or-nothing: nothing it wrote is visible to any reader before
//!   [`WriteTxn::commit`] returns `Ok`, and after a crash either all of it or none of it exists.
//! * [`WriteTxn::commit`] returning `Ok` means the data is durable (fsync'd), unless the engine
//!   was opened behind a log ([`RedbStorage::open_behind_log`]), whose append made the
//!   transaction's write set durable before the commit (see [`crate::log`]).
//! * A write transaction reads its own writes; read transactions see one committed snapshot.
//! * There is at most one write transaction at a time (the shard's writer thread).
//!
//! [`RedbStorage`] is the engine: behind a [`crate::log::LocalLog`] (what shards run on) its
//! commits are visible at once and made durable by the log, alone each commit is durable through
//! redb itself. [`FaultyStorage`] wraps any engine and injects I/O errors, for tests.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// The tables a shard keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// key: namespace `db.coll` (UTF-8); value: BSON collection entry.
    Catalog,
    /// key: collection UUID (16 bytes) ++ KeyString of `_id`; value: BSON document.
    Documents,
    /// key: `ts` as big-endian u64 (`secs << 32 | inc`); value: BSON oplog entry.
    Oplog,
    /// key: session id (16 bytes); value: BSON retryable-write record.
    Retryable,
    /// key: UTF-8 name; value: bytes (e.g. the clock reservation).
    Meta,
    /// Secondary index entries and multikey markers (layout in `indexes`). key: collection
    /// UUID ++ index name ++ 0 ++ KeyStrings of the key values (++ of `_id` when not unique);
    /// value: BSON `{_id, k}` of the document holding it.
    Indexes,
    /// Distributed transactions in flight. key: `p` ++ session id (a prepared participant) or
    /// `c` ++ session id (a coordinator); value: BSON state (see `txn`).
    Transactions,
    /// Change-stream pre-images of collections with `changeStreamPreAndPostImages` (MongoDB's
    /// `config.system.preimages`). key: collection UUID ++ `ts` ++ `applyOpsIndex` (both
    /// big-endian u64, see `keys::pre_image_key`); value: the BSON document before the write.
    PreImages,
}

impl Table {
    pub const ALL: [Table; 8] = [
        Table::Catalog,
        Table::Documents,
        Table::Oplog,
        Table::Retryable,
        Table::Meta,
        Table::Indexes,
        Table::Transactions,
        Table::PreImages,
    ];

    /// The table's number on disk (write-ahead log records name tables by it): its position
    /// in [`Table::ALL`], which never changes.
    pub fn index(self) -> u8 {
        self as u8
    }

    /// The table numbered `index` on disk.
    pub fn from_index(index: u8) -> Option<Table> {
        Table::ALL.get(usize::from(index)).copied()
    }

    /// The table with this [`Table::name`].
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The table's name in storage.
    pub fn name(self) -> &'static str {
        match self {
            Table::Catalog => "catalog",
            Table::Documents => "documents",
            Table::Oplog => "oplog",
            Table::Retryable => "retryable",
            Table::Meta => "meta",
            Table::Indexes => "indexes",
            Table::Transactions => "transactions",
            Table::PreImages => "pre_images",
        }
    }

    fn def(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(self.name())
    }
}

/// A storage failure. Never client input: surfaces as `InternalError` to clients
/// (`OutOfDiskSpace` when the disk is full).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    #[error("storage engine error: {0}")]
    Engine(String),
    /// The disk (or the user's quota) is full: the write failed before anything of it was
    /// kept, and the same write may succeed once space is freed.
    #[error("out of disk space: {0}")]
    DiskFull(String),
    #[error("injected storage fault: {0}")]
    Injected(&'static str),
    /// Not a storage failure: the operation was interrupted (`maxTimeMS`, `killOp`), or its
    /// write could not replicate (this member stopped being primary); it answers this error.
    #[error("{}", .0.errmsg)]
    Interrupted(wire::MongoError),
}

impl StorageError {
    /// The error a command answers for this failure.
    pub fn into_mongo(self) -> wire::MongoError {
        match self {
            StorageError::Interrupted(e) => e,
            StorageError::DiskFull(_) => {
                wire::MongoError::new(wire::ErrorCode::OUT_OF_DISK_SPACE, self.to_string())
            }
            other => wire::MongoError::internal(other.to_string()),
        }
    }
}

pub type StorageResult<T> = std::result::Result<T, StorageError>;

pub(crate) fn engine<E: std::fmt::Display>(e: E) -> StorageError {
    let text = e.to_string();
    if is_disk_full(&text) {
        StorageError::DiskFull(text)
    } else {
        StorageError::Engine(text)
    }
}

/// Whether an error says the disk or the quota is full (`ENOSPC`, `EDQUOT`), as an
/// `io::Error` shows it: redb's errors carry the I/O error only as text.
fn is_disk_full(text: &str) -> bool {
    text.contains("(os error 28)") || text.contains("(os error 122)")
}

/// A key range over byte keys.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRange {
    pub start: Bound<Vec<u8>>,
    pub end: Bound<Vec<u8>>,
}

impl KeyRange {
    pub fn all() -> Self {
        KeyRange {
            start: Bound::Unbounded,
            end: Bound::Unbounded,
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        let start = Bound::Included(prefix.to_vec());
        // The smallest key greater than every key with this prefix: increment the last byte
        // that is not 0xff and drop what follows it.
        let mut end = prefix.to_vec();
        while let Some(last) = end.last().copied() {
            if last == 0xff {
                end.pop();
            } else {
                if let Some(l) = end.last_mut() {
                    *l = last + 1;
                }
                break;
            }
        }
        let end = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end)
        };
        KeyRange { start, end }
    }

    /// The keys with `prefix` that sort after `after` (itself a key with that prefix).
    pub fn prefix_after(prefix: &[u8], after: &[u8]) -> Self {
        KeyRange {
            start: Bound::Excluded(after.to_vec()),
            end: KeyRange::prefix(prefix).end,
        }
    }

    pub fn from(start: Bound<Vec<u8>>) -> Self {
        KeyRange {
            start,
            end: Bound::Unbounded,
        }
    }

    fn as_refs(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (as_ref(&self.start), as_ref(&self.end))
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// What a scan visitor returns: keep going or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    Continue,
    Stop,
}

/// Scans `table` in `snapshot` with `overlay` laid over it: `overlay` holds keys of `range`
/// in scan order, each with the value that replaces the snapshot's (`None`: the key is not
/// there). Each key is visited once, the overlay's value winning; the visitor can stop it.
/// (A transaction's own writes over its snapshot; a snapshot's values as of an earlier time.)
pub fn scan_with_overlay(
    snapshot: &dyn ReadTxn,
    table: Table,
    range: &KeyRange,
    reverse: bool,
    overlay: &[(&[u8], Option<&[u8]>)],
    visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
) -> StorageResult<()> {
    if overlay.is_empty() {
        return snapshot.scan(table, range, reverse, visit);
    }
    let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
    let mut next = 0;
    let mut stopped = false;
    snapshot.scan(table, range, reverse, &mut |k, v| {
        // The overlay's keys that sort before this one come first.
        while let Some((ok, value)) = overlay.get(next).copied()
            && before(ok, k)
        {
            next += 1;
            if let Some(value) = value
                && visit(ok, value) == Scan::Stop
            {
                stopped = true;
                return Scan::Stop;
            }
        }
        let step = match overlay.get(next).copied() {
            Some((ok, value)) if ok == k => {
                next += 1;
                match value {
                    Some(value) => visit(k, value),
                    None => Scan::Continue,
                }
            }
            _ => visit(k, v),
        };
        stopped = step == Scan::Stop;
        step
    })?;
    if !stopped {
        for (k, value) in &overlay[next..] {
            if let Some(value) = value
                && visit(k, value) == Scan::Stop
            {
                break;
            }
        }
    }
    Ok(())
}

/// `ReadTxn` for a write-transaction wrapper whose reads are its `inner` transaction's.
macro_rules! reads_through_inner {
    ($ty:ty) => {
        impl $crate::storage::ReadTxn for $ty {
            fn get(
                &self,
                table: $crate::storage::Table,
                key: &[u8],
            ) -> $crate::storage::StorageResult<Option<Vec<u8>>> {
                self.inner.get(table, key)
            }

            fn scan(
                &self,
                table: $crate::storage::Table,
                range: &$crate::storage::KeyRange,
                reverse: bool,
                visit: &mut dyn FnMut(&[u8], &[u8]) -> $crate::storage::Scan,
            ) -> $crate::storage::StorageResult<()> {
                self.inner.scan(table, range, reverse, visit)
            }
        }
    };
}
pub(crate) use reads_through_inner;

/// Reads, in a snapshot (read transaction) or through a write transaction (own writes visible).
pub trait ReadTxn: Send {
    fn get(&self, table: Table, key: &[u8]) -> StorageResult<Option<Vec<u8>>>;

    /// Visits the entries of `range` in key order (descending when `reverse`) until the visitor
    /// says [`Scan::Stop`].
    fn scan(
        &self,
        table: Table,
        range: &KeyRange,
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
    ) -> StorageResult<()>;
}

/// A write transaction.
pub trait WriteTxn: ReadTxn {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()>;
    /// Removes a key; returns whether it existed.
    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool>;
    /// Writes `value` at `key` (removes it for `None`) and returns what was there.
    fn replace(
        &mut self,
        table: Table,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> StorageResult<Option<Vec<u8>>> {
        let before = self.get(table, key)?;
        match value {
            Some(v) => self.put(table, key, v)?,
            None => {
                self.delete(table, key)?;
            }
        }
        Ok(before)
    }
    /// Makes every write of this transaction durable and visible, atomically.
    fn commit(self: Box<Self>) -> StorageResult<()>;
}

/// A storage engine.
pub trait Storage: Send + Sync + 'static {
    fn begin_read(&self) -> StorageResult<Box<dyn ReadTxn>>;
    fn begin_write(&self) -> StorageResult<Box<dyn WriteTxn>>;
    /// A write transaction whose commit is durable and makes every commit before it durable
    /// (a checkpoint of an engine behind a log); an engine whose commits are all durable gives
    /// an ordinary one.
    fn begin_durable(&self) -> StorageResult<Box<dyn WriteTxn>> {
        self.begin_write()
    }
    /// The bytes the engine's page cache holds now (at most [`PAGE_CACHE_BYTES`]).
    fn cache_bytes(&self) -> usize;
}

impl<S: Storage + ?Sized> Storage for Arc<S> {
    fn begin_read(&self) -> StorageResult<Box<dyn ReadTxn>> {
        (**self).begin_read()
    }

    fn begin_write(&self) -> StorageResult<Box<dyn WriteTxn>> {
        (**self).begin_write()
    }

    fn begin_durable(&self) -> StorageResult<Box<dyn WriteTxn>> {
        (**self).begin_durable()
    }

    fn cache_bytes(&self) -> usize {
        (**self).cache_bytes()
    }
}

/// The bound of each shard's page cache (redb's), in bytes.
pub const PAGE_CACHE_BYTES: usize = 256 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// redb

/// The redb engine: one file. Alone, its commits are durable (`Durability::Immediate`, quick
/// repair on); behind a log, they are visible at once and persisted by the next durable commit
/// (the log's checkpoint).
pub struct RedbStorage {
    db: redb::Database,
    /// Whether [`Storage::begin_write`]'s transactions commit durably.
    durable: bool,
}

impl RedbStorage {
    /// Opens (or creates) the database file, every commit durable.
    pub fn open(path: &Path) -> StorageResult<RedbStorage> {
        Self::open_with(path, true)
    }

    /// Opens (or creates) the database file for use behind a log: commits are not durable by
    /// themselves (the log's append was), until the log checkpoints ([`Self::begin_durable`]).
    pub fn open_behind_log(path: &Path) -> StorageResult<RedbStorage> {
        Self::open_with(path, false)
    }

    /// Opens (or creates) the database file and makes sure every table exists.
    fn open_with(path: &Path, durable: bool) -> StorageResult<RedbStorage> {
        let mut builder = redb::Builder::new();
        // The page cache is a cap, not an allocation; several shards may share one process.
        builder.set_cache_size(PAGE_CACHE_BYTES);
        // Repair after a crash is quick because every commit records the allocator state
        // (quick repair, set on each write transaction); the callback only has to let it run.
        builder.set_repair_callback(|_session| {});
        let db = builder.create(path).map_err(engine)?;
        let storage = RedbStorage { db, durable };
        let mut txn = storage.db.begin_write().map_err(engine)?;
        txn.set_quick_repair(true);
        for t in Table::ALL {
            txn.open_table(t.def()).map_err(engine)?;
        }
        txn.commit().map_err(engine)?;
        Ok(storage)
    }

    /// A write transaction: durable (quick repair, `fsync` at commit) or not (visible at
    /// commit, persisted by the next durable commit).
    fn begin(&self, durable: bool) -> StorageResult<redb::WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(engine)?;
        let durability = if durable {
            txn.set_quick_repair(true);
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        };
        txn.set_durability(durability).map_err(engine)?;
        Ok(txn)
    }
}

impl Storage for RedbStorage {
    fn begin_read(&self) -> StorageResult<Box<dyn ReadTxn>> {
        Ok(Box::new(RedbRead(self.db.begin_read().map_err(engine)?)))
    }

    fn begin_write(&self) -> StorageResult<Box<dyn WriteTxn>> {
        Ok(Box::new(RedbWrite(self.begin(self.durable)?)))
    }

    fn begin_durable(&self) -> StorageResult<Box<dyn WriteTxn>> {
        Ok(Box::new(RedbWrite(self.begin(true)?)))
    }

    fn cache_bytes(&self) -> usize {
        redb::ReadableDatabase::cache_stats(&self.db).used_bytes()
    }
}

struct RedbRead(redb::ReadTransaction);
struct RedbWrite(redb::WriteTransaction);

type RangeItem<'a> = Result<
    (
        redb::AccessGuard<'a, &'static [u8]>,
        redb::AccessGuard<'a, &'static [u8]>,
    ),
    redb::StorageError,
>;

fn scan_table<T: ReadableTable<&'static [u8], &'static [u8]>>(
    t: &T,
    range: &KeyRange,
    reverse: bool,
    visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
) -> StorageResult<()> {
    let iter = t.range::<&[u8]>(range.as_refs()).map_err(engine)?;
    let mut step = |item: RangeItem<'_>| {
        let (k, v) = item.map_err(engine)?;
        Ok::<Scan, StorageError>(visit(k.value(), v.value()))
    };
    if reverse {
        for item in iter.rev() {
            if step(item)? == Scan::Stop {
                break;
            }
        }
    } else {
        for item in iter {
            if step(item)? == Scan::Stop {
                break;
            }
        }
    }
    Ok(())
}

/// Reads through a redb read or write transaction: the same code over both table types
/// (`open_table` returns a read-only table on one and a writable table on the other).
macro_rules! redb_read_txn {
    ($txn:ty) => {
        impl ReadTxn for $txn {
            fn get(&self, table: Table, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
                let t = self.0.open_table(table.def()).map_err(engine)?;
                Ok(t.get(key).map_err(engine)?.map(|v| v.value().to_vec()))
            }

            fn scan(
                &self,
                table: Table,
                range: &KeyRange,
                reverse: bool,
                visit: &mut dyn FnMut(&[u8], &[u8]) -> Scan,
            ) -> StorageResult<()> {
                let t = self.0.open_table(table.def()).map_err(engine)?;
                scan_table(&t, range, reverse, visit)
            }
        }
    };
}

redb_read_txn!(RedbRead);
redb_read_txn!(RedbWrite);

impl WriteTxn for RedbWrite {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()> {
        let mut t = self.0.open_table(table.def()).map_err(engine)?;
        t.insert(key, value).map_err(engine)?;
        Ok(())
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool> {
        let mut t = self.0.open_table(table.def()).map_err(engine)?;
        Ok(t.remove(key).map_err(engine)?.is_some())
    }

    fn replace(
        &mut self,
        table: Table,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> StorageResult<Option<Vec<u8>>> {
        let mut t = self.0.open_table(table.def()).map_err(engine)?;
        let before = match value {
            Some(v) => t.insert(key, v).map_err(engine)?,
            None => t.remove(key).map_err(engine)?,
        };
        Ok(before.map(|b| b.value().to_vec()))
    }

    fn commit(self: Box<Self>) -> StorageResult<()> {
        self.0.commit().map_err(engine)
    }
}

// ---------------------------------------------------------------------------------------------
// fault injection

/// Switches shared by a [`FaultyStorage`] and the test that drives it.
#[derive(Debug, Default)]
pub struct Faults {
    /// When set, every commit fails (and nothing of the transaction persists).
    pub fail_commits: AtomicBool,
    /// When ≥ 0, counts down on every put; the put that finds it at 0 fails. -1 disables.
    pub fail_put_after: AtomicI64,
}

impl Faults {
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults {
            fail_commits: AtomicBool::new(false),
            fail_put_after: AtomicI64::new(-1),
        })
    }
}

/// A storage engine that fails on command (tests only, but public so integration tests can use it).
pub struct FaultyStorage<S> {
    inner: S,
    faults: Arc<Faults>,
}

impl<S: Storage> FaultyStorage<S> {
    pub fn new(inner: S, faults: Arc<Faults>) -> Self {
        FaultyStorage { inner, faults }
    }
}

impl<S: Storage> Storage for FaultyStorage<S> {
    fn begin_read(&self) -> StorageResult<Box<dyn ReadTxn>> {
        self.inner.begin_read()
    }

    fn begin_write(&self) -> StorageResult<Box<dyn WriteTxn>> {
        Ok(Box::new(FaultyWrite {
            inner: self.inner.begin_write()?,
            faults: self.faults.clone(),
        }))
    }

    fn cache_bytes(&self) -> usize {
        self.inner.cache_bytes()
    }
}

struct FaultyWrite {
    inner: Box<dyn WriteTxn>,
    faults: Arc<Faults>,
}

reads_through_inner!(FaultyWrite);

impl WriteTxn for FaultyWrite {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()> {
        let left = self.faults.fail_put_after.load(Ordering::SeqCst);
        if left == 0 {
            self.faults.fail_put_after.store(-1, Ordering::SeqCst);
            return Err(StorageError::Injected("put"));
        }
        if left > 0 {
            self.faults.fail_put_after.store(left - 1, Ordering::SeqCst);
        }
        self.inner.put(table, key, value)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool> {
        self.inner.delete(table, key)
    }

    fn commit(self: Box<Self>) -> StorageResult<()> {
        if self.faults.fail_commits.load(Ordering::SeqCst) {
            // Dropping the inner transaction aborts it.
            return Err(StorageError::Injected("commit"));
        }
        self.inner.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_apart_from_other_failures() {
        for full in [28, 122] {
            let e = engine(std::io::Error::from_raw_os_error(full));
            assert!(matches!(e, StorageError::DiskFull(_)), "{e}");
            assert_eq!(e.into_mongo().code_name, "OutOfDiskSpace");
        }
        let eio = engine(std::io::Error::from_raw_os_error(5));
        assert!(matches!(eio, StorageError::Engine(_)), "{eio}");
        assert_eq!(eio.into_mongo().code, 1);
    }

    fn collect(txn: &dyn ReadTxn, table: Table, range: &KeyRange, rev: bool) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        txn.scan(table, range, rev, &mut |k, _| {
            out.push(k.to_vec());
            Scan::Continue
        })
        .unwrap();
        out
    }

    #[test]
    fn table_numbers_on_disk_never_change() {
        let numbered: Vec<(u8, Table)> = Table::ALL.iter().map(|t| (t.index(), *t)).collect();
        assert_eq!(
            numbered,
            vec![
                (0, Table::Catalog),
                (1, Table::Documents),
                (2, Table::Oplog),
                (3, Table::Retryable),
                (4, Table::Meta),
                (5, Table::Indexes),
                (6, Table::Transactions),
                (7, Table::PreImages),
            ]
        );
        for (i, t) in numbered {
            assert_eq!(Table::from_index(i), Some(t));
        }
        assert_eq!(Table::from_index(8), None);
    }

    #[test]
    fn committed_writes_are_visible_and_uncommitted_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStorage::open(&dir.path().join("db")).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put(Table::Meta, b"a", b"1").unwrap();
        assert_eq!(w.get(Table::Meta, b"a").unwrap(), Some(b"1".to_vec()));
        drop(w); // abort
        assert_eq!(
            s.begin_read().unwrap().get(Table::Meta, b"a").unwrap(),
            None
        );
        let mut w = s.begin_write().unwrap();
        w.put(Table::Meta, b"a", b"1").unwrap();
        w.commit().unwrap();
        assert_eq!(
            s.begin_read().unwrap().get(Table::Meta, b"a").unwrap(),
            Some(b"1".to_vec())
        );
    }

    #[test]
    fn prefix_range_covers_exactly_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStorage::open(&dir.path().join("db")).unwrap();
        let mut w = s.begin_write().unwrap();
        for k in [&[1u8, 0xff][..], &[1, 0xff, 0xff], &[2], &[1], &[0, 9]] {
            w.put(Table::Documents, k, b"").unwrap();
        }
        w.commit().unwrap();
        let r = s.begin_read().unwrap();
        let got = collect(&*r, Table::Documents, &KeyRange::prefix(&[1]), false);
        assert_eq!(got, vec![vec![1], vec![1, 0xff], vec![1, 0xff, 0xff]]);
        let got = collect(&*r, Table::Documents, &KeyRange::prefix(&[1, 0xff]), true);
        assert_eq!(got, vec![vec![1, 0xff, 0xff], vec![1, 0xff]]);
    }

    #[test]
    fn injected_commit_failure_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Faults::new();
        let s = FaultyStorage::new(
            RedbStorage::open(&dir.path().join("db")).unwrap(),
            faults.clone(),
        );
        faults.fail_commits.store(true, Ordering::SeqCst);
        let mut w = s.begin_write().unwrap();
        w.put(Table::Meta, b"k", b"v").unwrap();
        assert!(w.commit().is_err());
        assert_eq!(
            s.begin_read().unwrap().get(Table::Meta, b"k").unwrap(),
            None
        );
    }
}
