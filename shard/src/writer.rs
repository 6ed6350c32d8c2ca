//! The single writer: one thread per shard that group-commits every write.
//!
//! Write commands are closures sent over a channel. The writer takes whatever is queued (up to
//! [`MAX_BATCH`] jobs) and runs the write path on them (house.md §3):
//!
//! 1. **Execute**: the jobs run in order inside ONE storage write transaction, which records
//!    every write as the batch's [`WriteSet`] (and what tracked keys held before, for the
//!    history); the retention trim and, when needed, the clock reservation's renewal are writes
//!    of the same transaction.
//! 2. **Log**: the write set is appended to the shard's [`Log`](crate::log::Log), which makes
//!    it durable (one `fdatasync` for a [`LocalLog`](crate::log::LocalLog); a majority of the
//!    replica set for a replicated log).
//! 3. **Apply** ([`crate::apply`], which also does step 2): the storage commit, then the
//!    observers publish the new catalog and oplog entries; then each job is acknowledged.
//!
//! Invariants:
//! * A job is acknowledged only after its effects are durable and applied.
//! * Every write of a shard passes here, decided by the writer: its data, its lineage marks,
//!   its clock reservations and its retention trims. Nothing is recomputed when applying.
//! * A job's client-visible failure (duplicate key, bad update) is detected before it writes
//!   anything for that statement, so it leaves nothing behind and never fails its batch-mates.
//! * A storage or log failure aborts the whole batch: every job in it gets an error and nothing
//!   of the batch persists or becomes visible (catalog and tail window are published only after
//!   commit).
//! * Oplog entries are published to the tail window in `ts` order, after commit, and the HLC's
//!   in-flight hold on the high-water mark is released only after that, or after a failure
//!   that leaves nothing to show; never after one whose outcome is unknown (a replicated set
//!   another leader may still commit).

use std::sync::Arc;
use std::thread::JoinHandle;

use bson::{Bson, Document};
use bytes::Bytes;
use resume::ClusterTime;
use tokio::sync::{mpsc, oneshot};
use wire::MongoError;

use crate::apply::Executed;
use crate::catalog::{Catalog, CollectionEntry};
use crate::keys;
use crate::oplog::{EntrySpec, oplog_key};
use crate::state::ShardState;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageError, StorageResult, Table, WriteTxn};
use crate::write::write_set::{Op, WriteSet};

/// The most jobs one commit carries.
pub const MAX_BATCH: usize = 256;

/// Meta-table key of the clock reservation.
pub const RESERVATION_KEY: &[u8] = b"clock.reserved";

/// What a write job returns: its reply and the `ts` of its last oplog entry.
#[derive(Debug, Clone)]
pub struct WriteOutput {
    pub reply: Document,
    pub op_time: Option<ClusterTime>,
}

pub use crate::documents::{decode_doc, scan_collection};
pub use crate::write::{OpError, OpResult};

pub type WriteFn = Box<dyn FnOnce(&mut WriteCtx<'_>) -> StorageResult<WriteOutput> + Send>;

/// Where a job's answer goes.
type Ack = oneshot::Sender<Result<WriteOutput, MongoError>>;

enum Job {
    Write(WriteFn, Ack),
    Renew,
    Shutdown,
}

/// What the tracked keys of a batch held before the batch overwrote them ([`History`]): each
/// write is stamped with the `ts` of the next entry its job logs (the entry that describes it).
/// A batch that overwrites more than the history may hold (a drop of a large collection) keeps
/// none of it: the history could not keep it anyway, and the batch must not hold it all in
/// memory on the way; the history's floor moves to the batch's end instead
/// ([`Recorder::finish`]).
///
/// [`History`]: crate::history::History
struct Recorder {
    /// (table, key, value before) of the writes no entry has described yet.
    unstamped: std::sync::Mutex<Vec<Unstamped>>,
    stamped: std::sync::Mutex<Vec<crate::history::Version>>,
    /// What the versions kept so far take, and the most they may.
    bytes: std::sync::atomic::AtomicUsize,
    budget: usize,
    overflowed: std::sync::atomic::AtomicBool,
}

impl Recorder {
    fn new(budget: usize) -> Recorder {
        Recorder {
            unstamped: Default::default(),
            stamped: Default::default(),
            bytes: Default::default(),
            budget,
            overflowed: Default::default(),
        }
    }

    fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, table: Table, key: &[u8], before: Option<Vec<u8>>) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.overflowed.load(Relaxed) {
            return;
        }
        let cost = key.len() + before.as_ref().map_or(0, Vec::len) + 64;
        if self.bytes.fetch_add(cost, Relaxed) + cost > self.budget {
            self.overflowed.store(true, Relaxed);
            Self::lock(&self.unstamped).clear();
            Self::lock(&self.stamped).clear();
            return;
        }
        Self::lock(&self.unstamped).push((table, key.to_vec(), before));
    }

    /// The writes so far belong to the entry at `ts`.
    fn stamp(&self, ts: ClusterTime) {
        let pending = std::mem::take(&mut *Self::lock(&self.unstamped));
        Self::lock(&self.stamped).extend(pending.into_iter().map(|(t, k, v)| (t, k, ts, v)));
    }

    /// Every version of the batch (writes no entry followed take the batch's last `ts`); or,
    /// when the batch overflowed, none, and `Err(last)`: reads as of a time before the batch's
    /// last entry must be refused from now on.
    fn finish(
        &self,
        last: Option<ClusterTime>,
    ) -> Result<Vec<crate::history::Version>, Option<ClusterTime>> {
        if self.overflowed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(last);
        }
        if let Some(ts) = last {
            self.stamp(ts);
        }
        Ok(std::mem::take(&mut *Self::lock(&self.stamped)))
    }
}

type Unstamped = (Table, Vec<u8>, Option<Vec<u8>>);

/// The batch's storage transaction: it records every write in the batch's [`WriteSet`] and
/// hands what each tracked key held to the [`Recorder`].
struct Recording<'r> {
    inner: Box<dyn WriteTxn>,
    recorder: &'r Recorder,
    /// The batch's writes, in order, behind the room the log's record needs.
    set: WriteSet,
    /// Whether anything was written: a batch of read-only jobs (validations) commits nothing.
    wrote: bool,
}

impl Recording<'_> {
    fn record(&mut self, table: Table, key: &[u8], value: Option<&[u8]>) -> StorageResult<()> {
        let op = Op {
            table: table.index(),
            key,
            value,
        };
        self.set
            .push(op)
            .map_err(|e| StorageError::Engine(e.to_string()))
    }
}

crate::storage::reads_through_inner!(Recording<'_>);

impl WriteTxn for Recording<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> StorageResult<()> {
        self.wrote = true;
        if crate::history::TRACKED.contains(&table) {
            let before = self.inner.replace(table, key, Some(value))?;
            self.recorder.push(table, key, before);
        } else {
            self.inner.put(table, key, value)?;
        }
        self.record(table, key, Some(value))
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> StorageResult<bool> {
        self.wrote = true;
        let existed = if crate::history::TRACKED.contains(&table) {
            let before = self.inner.replace(table, key, None)?;
            let existed = before.is_some();
            if existed {
                self.recorder.push(table, key, before);
            }
            existed
        } else {
            self.inner.delete(table, key)?
        };
        if existed {
            self.record(table, key, None)?;
        }
        Ok(existed)
    }

    fn commit(self: Box<Self>) -> StorageResult<()> {
        self.inner.commit()
    }
}

/// Where a job's oplog entries go.
enum LogTo<'a> {
    /// The batch's entries: each stamped with a fresh `ts` and written to the oplog, the
    /// recorder told which writes it describes.
    Oplog(&'a mut Vec<(ClusterTime, Bytes)>, &'a Recorder),
    /// A multi-document transaction's operations, written at its commit as one `applyOps`
    /// entry; until then a statement's time is the transaction's read time.
    Transaction {
        ops: &'a mut Vec<TxnOp>,
        read_time: ClusterTime,
    },
}

/// One operation of a multi-document transaction, as its `applyOps` entry will hold it, with
/// its change-stream pre-image (collection UUID and the document before) when its collection
/// records them: the pre-image is keyed by the `applyOps` entry's `ts`, known at the commit.
#[derive(Debug, Clone)]
pub struct TxnOp {
    pub entry: Document,
    pub pre_image: Option<(bson::Uuid, Document)>,
}

/// The field of a write command (and of `commitTransaction`) in which the router sends who
/// made the writes: its entries record it as `commitMetadata`.
pub const COMMIT_METADATA_FIELD: &str = "tributaryCommit";

/// How many entries of one job share a recorded `commitMetadata`: the first of every run of
/// this many carries the document, the others refer to it by its `ts` (see [`CommitMetadata`]).
pub const COMMIT_METADATA_RUN: u32 = 32;

/// A command's commit metadata, encoded once as the `commitMetadata` element its entries end
/// with. The entries of one job share it in runs of [`COMMIT_METADATA_RUN`]: the first entry of
/// a run carries the document, the rest carry `commitMetadata: Timestamp`, the `ts` of that
/// first entry (a reference is 24 bytes where a document with a comment is about 100). Change
/// streams resolve a reference (`pipeline::changestream::shard::ShardStream`), and retention
/// never keeps one without its entry ([`crate::retention::trim`]). A run never spans two jobs,
/// so it never spans two commits.
#[derive(Debug, Clone)]
pub struct CommitMetadata {
    element: std::sync::Arc<[u8]>,
    /// The entry carrying the document of the current run, and how many entries the run has.
    run: Option<(ClusterTime, u32)>,
}

impl CommitMetadata {
    pub fn new(meta: &Document) -> CommitMetadata {
        let mut element = vec![0x03];
        element.extend_from_slice(b"commitMetadata\0");
        // Writing a document to a Vec cannot fail.
        let _ = meta.to_writer(&mut element);
        CommitMetadata {
            element: element.into(),
            run: None,
        }
    }

    /// Appends to the encoded entry `doc`, logged at `ts`, its `commitMetadata` (its last
    /// field): the document, or a reference to the run's entry that carries it.
    fn append_to(&mut self, doc: &mut Vec<u8>, ts: ClusterTime) {
        if doc.len() < 5 {
            return;
        }
        doc.pop();
        match &mut self.run {
            Some((first, len)) if *len < COMMIT_METADATA_RUN => {
                *len += 1;
                doc.push(0x11);
                doc.extend_from_slice(b"commitMetadata\0");
                // A BSON Timestamp is `secs << 32 | inc`, little-endian.
                doc.extend_from_slice(&first.as_u64().to_le_bytes());
            }
            _ => {
                self.run = Some((ts, 1));
                doc.extend_from_slice(&self.element);
            }
        }
        doc.push(0);
        let len = i32::try_from(doc.len()).unwrap_or(i32::MAX);
        doc[..4].copy_from_slice(&len.to_le_bytes());
    }
}

/// The view a write job has of the shard: the batch's transaction and catalog copy (or, for a
/// statement of a multi-document transaction, that transaction's store and catalog copy).
pub struct WriteCtx<'a> {
    txn: &'a mut dyn WriteTxn,
    catalog: &'a mut Arc<Catalog>,
    state: &'a ShardState,
    log: LogTo<'a>,
    /// The `ts` of the last entry the current job wrote.
    last_logged: Option<ClusterTime>,
    /// Mark the current job's entries `fromMigrate: true`: internal writes change streams
    /// hide, such as the copies of a sharded collection's DDL on its non-primary shards.
    pub from_migrate: bool,
    /// The ordered batch whose reservation the current job commits: the keys it holds are
    /// this job's to write.
    pub own_reservation: Option<u64>,
    /// The current job's `bypassDocumentValidation`: its documents skip the collection's
    /// validator (see [`crate::validation`]).
    pub bypass_validation: bool,
    /// Who made the current job's writes and how (`user`, `authenticatedDb`, `appName`,
    /// `comment`, as the router sent them): recorded as `commitMetadata` in each entry the
    /// job logs, for change streams with `showCommitMetadata`.
    pub commit_metadata: Option<CommitMetadata>,
    /// A dry run ([`WriteCtx::dry_run`]): writes go to an overlay, held keys are checked.
    dry_run: bool,
    pub wall_ms: u64,
}

impl<'a> WriteCtx<'a> {
    /// The context of one statement of a multi-document transaction: it reads and writes the
    /// transaction's store and catalog copy, and its oplog entries become `ops` of the
    /// transaction's `applyOps`.
    pub(crate) fn in_transaction(
        txn: &'a mut dyn WriteTxn,
        catalog: &'a mut Arc<Catalog>,
        state: &'a ShardState,
        ops: &'a mut Vec<TxnOp>,
        read_time: ClusterTime,
    ) -> WriteCtx<'a> {
        WriteCtx {
            txn,
            catalog,
            state,
            log: LogTo::Transaction { ops, read_time },
            last_logged: None,
            from_migrate: false,
            own_reservation: None,
            bypass_validation: false,
            commit_metadata: None,
            dry_run: false,
            wall_ms: state.now_millis(),
        }
    }

    /// The writes made so far by the job belong to cluster time `ts` (a prepared
    /// transaction's commit timestamp), not to the next entry it logs.
    pub(crate) fn writes_belong_to(&mut self, ts: ClusterTime) {
        if let LogTo::Oplog(_, recorder) = &self.log {
            recorder.stamp(ts);
        }
    }

    /// Whether the job runs inside a multi-document transaction.
    pub fn in_multi_document_transaction(&self) -> bool {
        matches!(self.log, LogTo::Transaction { .. })
    }

    pub fn state(&self) -> &ShardState {
        self.state
    }

    pub fn txn(&self) -> &dyn ReadTxn {
        &*self.txn
    }

    pub fn txn_mut(&mut self) -> &mut dyn WriteTxn {
        &mut *self.txn
    }

    /// The `ts` of the last oplog entry the running job wrote (its `operationTime`).
    pub fn last_logged(&self) -> Option<ClusterTime> {
        self.last_logged
    }

    pub fn catalog(&self) -> &Catalog {
        self.catalog
    }

    /// Writes an oplog entry at a fresh `ts`; returns the `ts`. Inside a transaction the
    /// entry becomes one of its operations instead, and the time is its read time.
    pub fn log(&mut self, mut spec: EntrySpec) -> StorageResult<ClusterTime> {
        if self.dry_run {
            // Nothing of a dry run is kept: its entries are not even built.
            return Ok(ClusterTime::ZERO);
        }
        let pre_image = spec.pre_image.take().zip(spec.ui);
        let (pending, recorder) = match &mut self.log {
            LogTo::Oplog(pending, recorder) => (pending, *recorder),
            LogTo::Transaction { ops, read_time } => {
                ops.push(TxnOp {
                    entry: spec.apply_ops_entry(),
                    pre_image: pre_image.map(|(doc, ui)| (ui, doc)),
                });
                self.last_logged = Some(*read_time);
                return Ok(*read_time);
            }
        };
        let ts = self.state.hlc().tick(self.wall_ms);
        // The pre-image goes in the entry's own commit, keyed by its `ts`.
        if let Some((before, ui)) = pre_image {
            let mut bytes = Vec::new();
            before
                .to_writer(&mut bytes)
                .map_err(|e| StorageError::Engine(format!("serializing a pre-image: {e}")))?;
            self.txn
                .put(Table::PreImages, &keys::pre_image_key(&ui, ts, 0), &bytes)?;
        }
        let term = self.state.log.term();
        // `prevOpTime.t`: the term the previous entry of the session was written in (it may
        // be an earlier primary's), read from the oplog; this term if it has been truncated.
        let prev_term = match spec.session.as_ref().and_then(|s| s.prev_op_time) {
            Some(prev) => self
                .txn
                .get(Table::Oplog, &oplog_key(prev))?
                .and_then(|b| bson::RawDocument::from_bytes(&b).ok()?.get_i64("t").ok())
                .unwrap_or(term),
            None => term,
        };
        let mut entry = spec.build(ts, term, self.wall_ms, prev_term);
        if self.from_migrate {
            entry.insert("fromMigrate", true);
        }
        let mut buf = Vec::new();
        entry
            .to_writer(&mut buf)
            .map_err(|e| StorageError::Engine(format!("serializing oplog entry: {e}")))?;
        if let Some(m) = &mut self.commit_metadata {
            m.append_to(&mut buf, ts);
        }
        self.txn.put(Table::Oplog, &oplog_key(ts), &buf)?;
        recorder.stamp(ts);
        pending.push((ts, Bytes::from(buf)));
        self.last_logged = Some(ts);
        Ok(ts)
    }

    /// Refuses to write `doc` (its document or a unique-index entry of it) while another
    /// holds it: a prepared transaction (which can no longer fail) until its decision, or an
    /// ordered batch between its validation and its commit. The statement fails with
    /// [`held_error`], and the command waits and runs it again.
    pub fn check_not_held(&self, coll: &CollectionEntry, doc: &Document) -> OpResult<()> {
        let (prepared, reserved) = (&self.state.prepared, &self.state.reservations);
        if !prepared.any() && !reserved.any()
            || self.in_multi_document_transaction() && !self.dry_run
        {
            return Ok(());
        }
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let keys: Vec<(Table, Vec<u8>)> =
            std::iter::once((Table::Documents, keys::doc_key(&coll.uuid, &id)))
                .chain(
                    crate::indexes::entry_keys(coll, doc)
                        .into_iter()
                        .map(|k| (Table::Indexes, k)),
                )
                .collect();
        let other = |(t, k): &(Table, Vec<u8>)| {
            prepared.contains(*t, k)
                || reserved
                    .holder(*t, k)
                    .is_some_and(|h| Some(h) != self.own_reservation)
        };
        if keys.iter().any(other) {
            return Err(OpError::Mongo(held_error()));
        }
        Ok(())
    }

    /// Runs `f` as a dry run: it reads what this batch has written so far and writes into a
    /// throwaway overlay (its oplog entries become discarded transaction operations, its
    /// collection creations a discarded catalog copy), and it meets held keys as a plain write
    /// would. Returns `f`'s result and the document and unique-index keys it would have
    /// written.
    pub fn dry_run<R>(
        &mut self,
        f: impl FnOnce(&mut WriteCtx<'_>) -> R,
    ) -> (R, Vec<(Table, Vec<u8>)>) {
        let mut store = crate::txn::store::TxnStore::new(Box::new(crate::txn::store::Borrowed {
            inner: &mut *self.txn,
        }));
        let mut catalog = self.catalog.clone();
        let mut ops = Vec::new();
        let result = {
            let mut ctx = WriteCtx::in_transaction(
                &mut store,
                &mut catalog,
                self.state,
                &mut ops,
                ClusterTime::ZERO,
            );
            ctx.wall_ms = self.wall_ms;
            ctx.bypass_validation = self.bypass_validation;
            ctx.dry_run = true;
            f(&mut ctx)
        };
        let keys = store
            .into_writes()
            .into_keys()
            .filter(|(t, _)| matches!(t, Table::Documents | Table::Indexes))
            .collect();
        (result, keys)
    }

    pub fn get_doc(&self, coll: &CollectionEntry, id: &Bson) -> StorageResult<Option<Document>> {
        match self
            .txn
            .get(Table::Documents, &keys::doc_key(&coll.uuid, id))?
        {
            Some(bytes) => Ok(decode_doc(&bytes)),
            None => Ok(None),
        }
    }

    /// Visits the collection's documents in `_id` order.
    pub fn scan_docs(
        &self,
        coll: &CollectionEntry,
        visit: &mut dyn FnMut(Document) -> Scan,
    ) -> StorageResult<()> {
        scan_collection(&*self.txn, coll, visit)
    }

    /// Whether the collection has a document with this `_id`.
    pub fn has_doc(&self, coll: &CollectionEntry, id: &Bson) -> StorageResult<bool> {
        Ok(self
            .txn
            .get(Table::Documents, &keys::doc_key(&coll.uuid, id))?
            .is_some())
    }

    pub fn put_doc(&mut self, coll: &CollectionEntry, doc: &Document) -> StorageResult<()> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let key = keys::doc_key(&coll.uuid, &id);
        if self.dry_run {
            // A dry run only needs to know the key is taken.
            return self.txn.put(Table::Documents, &key, &[]);
        }
        let mut buf = Vec::new();
        doc.to_writer(&mut buf)
            .map_err(|e| StorageError::Engine(format!("serializing document: {e}")))?;
        self.txn.put(Table::Documents, &key, &buf)
    }

    pub fn delete_doc(&mut self, coll: &CollectionEntry, id: &Bson) -> StorageResult<bool> {
        self.txn
            .delete(Table::Documents, &keys::doc_key(&coll.uuid, id))
    }

    /// Removes every document of a collection.
    pub fn clear_collection(&mut self, coll: &CollectionEntry) -> StorageResult<u64> {
        let mut keys_to_delete = Vec::new();
        let range = KeyRange::prefix(&keys::collection_prefix(&coll.uuid));
        self.txn
            .scan(Table::Documents, &range, false, &mut |k, _| {
                keys_to_delete.push(k.to_vec());
                Scan::Continue
            })?;
        for k in &keys_to_delete {
            self.txn.delete(Table::Documents, k)?;
        }
        crate::indexes::drop_all(&mut *self.txn, coll)?;
        Ok(keys_to_delete.len() as u64)
    }

    /// Stores a catalog entry (in this batch's copy and in storage).
    pub fn save_collection(
        &mut self,
        entry: CollectionEntry,
    ) -> StorageResult<Arc<CollectionEntry>> {
        let ns = entry.ns();
        let mut buf = Vec::new();
        entry
            .to_document()
            .to_writer(&mut buf)
            .map_err(|e| StorageError::Engine(format!("serializing catalog entry: {e}")))?;
        self.txn.put(Table::Catalog, ns.as_bytes(), &buf)?;
        Arc::make_mut(self.catalog).put(entry);
        self.catalog
            .get(&ns)
            .cloned()
            .ok_or_else(|| StorageError::Engine("catalog entry vanished".into()))
    }

    pub fn remove_collection(&mut self, ns: &str) -> StorageResult<()> {
        self.txn.delete(Table::Catalog, ns.as_bytes())?;
        Arc::make_mut(self.catalog).remove(ns);
        Ok(())
    }
}

/// The handle commands use to submit writes.
pub struct Writer {
    tx: mpsc::UnboundedSender<Job>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// The writer thread's stack.
const WRITER_STACK_BYTES: usize = 16 << 20;

impl Writer {
    pub fn start(state: Arc<ShardState>) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        let name = format!("{}-writer", state.name);
        // Updates recurse as deep as a document nests (200 levels at most): room for that
        // in a debug build too.
        let thread = std::thread::Builder::new()
            .name(name)
            .stack_size(WRITER_STACK_BYTES)
            .spawn(move || writer_loop(state, rx))
            .ok();
        Writer {
            tx,
            thread: std::sync::Mutex::new(thread),
        }
    }

    /// Runs a write job in the next batch; resolves after its commit.
    pub async fn submit(&self, f: WriteFn) -> Result<WriteOutput, MongoError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Job::Write(f, tx))
            .map_err(|_| shutting_down())?;
        rx.await.map_err(|_| shutting_down())?
    }

    /// Asks the writer to renew the clock reservation if it is running out.
    pub fn renew(&self) {
        let _ = self.tx.send(Job::Renew);
    }

    /// Stops the writer after the queued jobs; returns its thread to join (once).
    pub fn stop(&self) -> Option<JoinHandle<()>> {
        let _ = self.tx.send(Job::Shutdown);
        self.thread.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The statement error of a write that met a held key (an ordered batch's or a prepared
/// transaction's). It never reaches a
/// client: the shard's write commands wait for the batch and run such statements again (see
/// `commands::write`); the marker field tells them apart from other conflicts.
pub fn held_error() -> MongoError {
    MongoError::new(
        wire::ErrorCode::WRITE_CONFLICT,
        "the document's key is held by an ordered batch or a prepared transaction",
    )
    .with_extra(bson::doc! {HELD_MARKER: true})
}

/// The field [`held_error`] adds to its write error.
pub const HELD_MARKER: &str = "$heldKey";

fn shutting_down() -> MongoError {
    MongoError::new(
        wire::ErrorCode::SHUTDOWN_IN_PROGRESS,
        "The shard is shutting down",
    )
}

fn writer_loop(state: Arc<ShardState>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let _span = tracing::info_span!("writer", shard = %state.name).entered();
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let stop = jobs.iter().any(|j| matches!(j, Job::Shutdown));
        run_batch(&state, jobs);
        if stop {
            break;
        }
    }
}

/// Runs the write path on one batch (see the module header).
fn run_batch(state: &ShardState, jobs: Vec<Job>) {
    let mut writes = Vec::new();
    for j in jobs {
        if let Job::Write(f, tx) = j {
            writes.push((f, tx));
        }
    }
    if state.follows() {
        // A follower's storage has one writer, its member's applier (`follower`).
        for (_, tx) in writes {
            let refused = MongoError::new(
                wire::ErrorCode::NOT_WRITABLE_PRIMARY,
                "not primary: this member does not lead its replica set",
            )
            .with_label("RetryableWriteError");
            let _ = tx.send(Err(refused));
        }
        return;
    }
    let wall_ms = state.now_millis();
    let renewal = state.hlc().reservation_needed(wall_ms);
    if writes.is_empty() && renewal.is_none() {
        return;
    }
    // What this shard promises before the batch: every entry from here on has a greater `ts`
    // (a replicated log carries it to the members that apply the batch).
    let promise = state.hlc().high_water_mark(wall_ms);
    let recorder = Recorder::new(state.history.max_bytes());
    let mut txn = match state.log.begin(&*state.storage) {
        Ok(inner) => Recording {
            inner,
            recorder: &recorder,
            set: state.log.write_set(promise),
            wrote: false,
        },
        Err(e) => {
            let acks = writes.into_iter().map(|(_, tx)| (tx, None)).collect();
            return fail(state, acks, &e);
        }
    };
    let mut catalog = state.catalog();
    let mut pending = Vec::new();
    let mut acks = Vec::with_capacity(writes.len());
    let mut failure = None;
    {
        let mut ctx = WriteCtx {
            txn: &mut txn,
            catalog: &mut catalog,
            state,
            log: LogTo::Oplog(&mut pending, &recorder),
            last_logged: None,
            from_migrate: false,
            own_reservation: None,
            bypass_validation: false,
            commit_metadata: None,
            dry_run: false,
            wall_ms,
        };
        for (f, tx) in writes {
            if failure.is_some() {
                acks.push((tx, None));
                continue;
            }
            ctx.last_logged = None;
            ctx.from_migrate = false;
            ctx.own_reservation = None;
            ctx.bypass_validation = false;
            ctx.commit_metadata = None;
            // A bug in a job must not take the writer thread down: treat a panic like a
            // storage failure (the whole batch is abandoned, nothing of it persists).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut ctx)))
                .unwrap_or_else(|_| Err(StorageError::Engine("write job panicked".into())));
            match result {
                Ok(out) => acks.push((tx, Some(out))),
                Err(e) => {
                    failure = Some(e);
                    acks.push((tx, None));
                }
            }
        }
    }
    // Jobs that only read (an ordered batch's validation) need no commit: what they read is
    // committed by now, or in a batch before this one.
    if failure.is_none() && !txn.wrote && pending.is_empty() && renewal.is_none() {
        drop(txn);
        return acknowledge(acks);
    }
    // Oplog accounting and retention, in this same transaction.
    let mut stats = state.oplog_stats();
    if failure.is_none() {
        stats.bytes += pending.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        stats.entries += pending.len() as u64;
        let keep_from = pending.first().map(|(ts, _)| *ts);
        let trimmed = crate::pins::Pins::load(&txn)
            .and_then(|mut pins| {
                let expired = crate::retention::trim(
                    &mut txn,
                    &mut stats,
                    state.retention(),
                    crate::clock::wall_secs(wall_ms),
                    keep_from,
                    &mut pins,
                )?;
                if expired {
                    pins.save(&mut txn)?;
                }
                Ok(())
            })
            .and_then(|()| txn.put(Table::Meta, crate::retention::STATS_KEY, &stats.encode()));
        if let Err(e) = trimmed {
            failure = Some(e);
        }
    }
    // Renew the reservation in this same transaction, covering every ts the batch handed out.
    let renewal = match failure {
        None => state.hlc().reservation_needed(wall_ms),
        Some(_) => None,
    };
    if failure.is_none()
        && let Some(r) = renewal
        && let Err(e) = txn.put(Table::Meta, RESERVATION_KEY, &r.as_u64().to_be_bytes())
    {
        failure = Some(e);
    }
    if let Some(e) = failure {
        return fail(state, acks, &e);
    }
    // Executed: the write set goes to the log, then the batch is applied.
    let Recording { inner, mut set, .. } = txn;
    let executed = Executed {
        txn: inner,
        history: recorder.finish(pending.last().map(|(ts, _)| *ts)),
        entries: pending,
        catalog,
        stats,
        reservation: renewal,
        has_jobs: !acks.is_empty(),
    };
    match crate::apply::apply(state, executed, &mut set) {
        Ok(()) => acknowledge(acks),
        Err(e) => fail(state, acks, &e),
    }
}

/// Answers every job of an applied batch.
fn acknowledge(acks: Vec<(Ack, Option<WriteOutput>)>) {
    for (tx, out) in acks {
        if let Some(out) = out {
            let _ = tx.send(Ok(out));
        }
    }
}

/// Fails every job of a batch of which nothing persisted; the `ts` values it ticked are simply
/// skipped. Unless the log is in doubt ([`Log::in_doubt`](crate::log::Log::in_doubt)): a set whose outcome is unknown may
/// still become visible, so what was ticked stays in flight (and its holds stay), keeping the
/// high-water mark, and every promise a change stream gives here, below it.
fn fail(state: &ShardState, acks: Vec<(Ack, Option<WriteOutput>)>, e: &StorageError) {
    state.prepared.abandon_batch();
    if !state.log.in_doubt() {
        state.hlc().abandon_batch_holds();
        state.hlc().clear_inflight();
    }
    let error = match e {
        StorageError::Interrupted(answer) => answer.clone(),
        StorageError::DiskFull(_) => {
            tracing::error!(error = %e, "write batch failed: the disk is full");
            e.clone().into_mongo()
        }
        other => {
            tracing::error!(error = %other, "write batch failed");
            MongoError::internal(format!("write failed: {other}"))
        }
    };
    for (tx, _) in acks {
        let _ = tx.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::clock::{Hlc, SystemClock};
    use crate::oplog::TailWindow;
    use crate::state::Recovered;
    use crate::storage::RedbStorage;

    fn state(dir: &std::path::Path) -> Arc<ShardState> {
        state_with_log(dir, Arc::new(crate::log::Unlogged))
    }

    #[test]
    fn commit_metadata_is_appended_as_the_last_field() {
        use bson::doc;
        let entry = doc! {"op": "i", "o": {"_id": 1}};
        let mut bytes = Vec::new();
        entry.to_writer(&mut bytes).unwrap();
        let meta = doc! {"user": "ada", "comment": {"why": [1, 2]}};
        CommitMetadata::new(&meta).append_to(&mut bytes, ClusterTime::new(7, 1));
        let back = Document::from_reader(bytes.as_slice()).unwrap();
        assert_eq!(
            back,
            doc! {"op": "i", "o": {"_id": 1}, "commitMetadata": meta}
        );
    }

    #[test]
    fn a_jobs_entries_share_the_recorded_metadata_in_runs() {
        use bson::doc;
        let meta = doc! {"appName": "app", "comment": "nightly"};
        let mut recorded = CommitMetadata::new(&meta);
        let first = ClusterTime::new(7, 1);
        let entries: Vec<Document> = (0..=COMMIT_METADATA_RUN)
            .map(|i| {
                let mut bytes = Vec::new();
                doc! {"op": "i", "o": {"_id": i}}
                    .to_writer(&mut bytes)
                    .unwrap();
                recorded.append_to(&mut bytes, ClusterTime::new(7, 1 + i));
                Document::from_reader(bytes.as_slice()).unwrap()
            })
            .collect();
        assert_eq!(entries[0].get_document("commitMetadata").ok(), Some(&meta));
        for e in &entries[1..COMMIT_METADATA_RUN as usize] {
            assert_eq!(
                e.get_timestamp("commitMetadata").ok(),
                Some(first.timestamp())
            );
        }
        // The next run starts with the document again.
        assert_eq!(
            entries[COMMIT_METADATA_RUN as usize]
                .get_document("commitMetadata")
                .ok(),
            Some(&meta)
        );
        let mut bytes = Vec::new();
        entries[1].to_writer(&mut bytes).unwrap();
        let raw = bson::RawDocument::from_bytes(&bytes).unwrap();
        assert_eq!(crate::oplog::commit_metadata_reference(raw), Some(first));
    }

    /// A fresh shard's state in `dir`, writing through `log`.
    fn state_with_log(dir: &std::path::Path, log: Arc<dyn crate::log::Log>) -> Arc<ShardState> {
        Arc::new(ShardState::new(
            "t".into(),
            Arc::new(RedbStorage::open(&dir.join("w.redb")).unwrap()),
            log,
            Arc::new(SystemClock),
            Recovered {
                hlc: Hlc::recover(ClusterTime::ZERO, ClusterTime::ZERO),
                catalog: Catalog::default(),
                tail: TailWindow::new(ClusterTime::ZERO, 1 << 20),
                oplog_stats: crate::retention::OplogStats::default(),
            },
        ))
    }

    fn put_job(key: &'static [u8]) -> WriteFn {
        Box::new(move |w: &mut WriteCtx<'_>| {
            w.txn_mut().put(Table::Meta, key, b"v")?;
            Ok(WriteOutput {
                reply: Document::new(),
                op_time: None,
            })
        })
    }

    #[tokio::test]
    async fn a_panicking_job_fails_its_batch_but_not_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        let writer = Writer::start(st.clone());
        let bad: WriteFn = Box::new(|_w: &mut WriteCtx<'_>| panic!("bug in a job"));
        assert!(writer.submit(bad).await.is_err());
        writer.submit(put_job(b"after")).await.unwrap();
        let r = st.storage.begin_read().unwrap();
        assert!(r.get(Table::Meta, b"after").unwrap().is_some());
        if let Some(h) = writer.stop() {
            h.join().unwrap();
        }
    }

    /// A replicated log whose appends' outcomes are never known (the entry may commit through
    /// another leader), as when a leader loses its majority mid-append.
    struct InDoubt(std::sync::atomic::AtomicBool);

    impl crate::log::Log for InDoubt {
        fn write_set(&self, _promise: ClusterTime) -> WriteSet {
            WriteSet::with_prefix(0, 256)
        }

        fn append(&self, _set: &mut WriteSet) -> StorageResult<crate::log::Appended> {
            self.0.store(true, std::sync::atomic::Ordering::Release);
            Err(StorageError::Interrupted(MongoError::new(
                wire::ErrorCode::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
                "outcome unknown",
            )))
        }

        fn applies(&self) -> bool {
            true
        }

        fn in_doubt(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::Acquire)
        }

        fn retract(&self, _appended: crate::log::Appended) {}

        fn applied(&self, _appended: crate::log::Appended) {}
    }

    #[tokio::test]
    async fn a_batch_whose_outcome_is_unknown_keeps_the_high_water_mark_below_it_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let st = state_with_log(dir.path(), Arc::new(InDoubt(Default::default())));
        // A reservation well ahead, as a leader's renewals keep it: only the hold bounds `H`.
        let wall = crate::clock::wall_secs(st.now_millis());
        st.hlc().set_reserved(ClusterTime::new(wall + 60, 0));
        let writer = Writer::start(st.clone());
        let ticked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let insert = |ticked: Arc<std::sync::Mutex<Vec<ClusterTime>>>| -> WriteFn {
            Box::new(move |w: &mut WriteCtx<'_>| {
                let spec = EntrySpec::insert(
                    "db.c".into(),
                    bson::Uuid::new(),
                    bson::doc! {"_id": 1},
                    bson::doc! {"_id": 1},
                );
                ticked.lock().unwrap().push(w.log(spec)?);
                Ok(WriteOutput {
                    reply: Document::new(),
                    op_time: None,
                })
            })
        };
        assert!(writer.submit(insert(ticked.clone())).await.is_err());
        // A later batch fails too (the log takes no more), and time passes.
        assert!(writer.submit(insert(ticked.clone())).await.is_err());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let first = ticked.lock().unwrap()[0];
        assert!(
            st.high_water_mark() < first,
            "a change stream could be promised past {first}, which may still commit"
        );
        if let Some(h) = writer.stop() {
            h.join().unwrap();
        }
    }

    #[tokio::test]
    async fn acknowledged_jobs_are_committed_and_renewal_persists_the_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        let writer = Writer::start(st.clone());
        writer.submit(put_job(b"k")).await.unwrap();
        let r = st.storage.begin_read().unwrap();
        assert!(r.get(Table::Meta, b"k").unwrap().is_some());
        let reserved = r.get(Table::Meta, RESERVATION_KEY).unwrap().unwrap();
        let reserved = ClusterTime::from_u64(u64::from_be_bytes(reserved.try_into().unwrap()));
        assert_eq!(reserved, st.hlc().reserved());
        assert!(reserved > st.cluster_time());
        if let Some(h) = writer.stop() {
            h.join().unwrap();
        }
    }
}
