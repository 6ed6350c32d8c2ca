//! The Raft log of one member, on disk: its entries in segment files ([`Segments`]), the vote
//! and the last purged id in a small redb file beside them.
//!
//! Every change goes to one thread of the member's own (the log's writer), in the order
//! openraft makes them; the writer takes whatever has queued up, writes it and syncs once
//! (group commit), then tells openraft which appends are on disk. openraft's core only
//! queues: it replicates an entry to the followers and applies committed ones while the
//! leader's own fsync runs, instead of waiting for it (a batch's round trip holds one fsync,
//! the slowest of the leader's and a follower's, not the leader's and then a follower's).
//!
//! Invariants:
//! * Changes reach the disk in the order they were made, and an append's callback fires only
//!   after the commit holding it is durable: an entry is acknowledged to the leader only once
//!   it is on disk. A vote, a truncation and a purge return only once durable too, so a vote
//!   is never forgotten after a crash. The commit point is not saved: after a restart the
//!   state machine's applied id is where applying resumes, and the leader confirms the rest.
//! * Once a change fails, every later one fails too (a later entry must never be durable
//!   while an earlier one is not); openraft stops the member at the first error.
//! * Readers see every appended entry at once, durable or not (the leader replicates entries
//!   before its own fsync): the newest entries are held in memory ([`Tail`]), a suffix of the
//!   log, until they are durable and more than [`TAIL_BYTES`] newer ones follow. Older ones
//!   are read from the file.
//! * Entries are stored in `codec`'s frame; a record that does not decode is an I/O error,
//!   which stops the member (see the module header of `repl`).
//! * The files are touched from the writer and from blocking threads only, never from the
//!   runtime's workers.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, mpsc};
use std::thread::JoinHandle;

use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use redb::{ReadableDatabase, TableDefinition};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use super::codec::{decode, encode, encode_entry};
use super::segments::Segments;

use super::TypeConfig;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const PURGED: &str = "purged";

/// Bytes of durable entries the [`Tail`] keeps in memory for readers (replication to a
/// follower a little behind, the state machine's apply) besides the ones not yet durable.
const TAIL_BYTES: usize = 8 << 20;

/// The most changes one commit of the writer takes.
const GROUP: usize = 1024;

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

fn io_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A change to the log, queued for the writer in the order it was made.
enum Change {
    /// Entries (log id, record), the `seq` they were queued under, and whom to tell once
    /// they are durable.
    Append {
        records: Vec<(LogId, Vec<u8>)>,
        seq: u64,
        flushed: IOFlushed<TypeConfig>,
    },
    Vote(Vec<u8>, Done),
    /// Deletes every entry from `from` on.
    Truncate {
        from: u64,
        done: Done,
    },
    /// Deletes every entry up to `upto`, and records `id` as the last purged.
    Purge {
        upto: u64,
        id: Vec<u8>,
        done: Done,
    },
}

type Done = oneshot::Sender<io::Result<()>>;

/// The newest entries, in memory: a suffix of the log, each with the `seq` of the change
/// that appended it. An entry leaves from the front only once durable and more than
/// [`TAIL_BYTES`] newer ones follow, so whatever the file does not hold yet is here.
#[derive(Default)]
struct Tail {
    entries: VecDeque<Held>,
    bytes: usize,
    /// The last `seq` queued, and the last one whose commit is durable.
    queued: u64,
    durable: u64,
}

struct Held {
    entry: Entry,
    bytes: usize,
    seq: u64,
}

impl Tail {
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|h| h.entry.index())
    }

    fn last(&self) -> Option<LogId> {
        self.entries.back().map(|h| h.entry.log_id())
    }

    /// Holds `entries`, appended by the change `seq`. openraft appends right after the last
    /// entry (it truncates first when it overwrites, and purges past the end before a snapshot
    /// moves the log on); were a gap ever to appear, the tail starts over at the new entry, so
    /// it stays a suffix of the log.
    fn push(&mut self, entries: Vec<(Entry, usize)>, seq: u64) {
        for (entry, bytes) in entries {
            if self
                .last()
                .is_some_and(|last| last.index() + 1 != entry.index())
            {
                self.entries.clear();
                self.bytes = 0;
            }
            self.bytes += bytes;
            self.entries.push_back(Held { entry, bytes, seq });
        }
    }

    /// Every change up to `seq` is durable: entries beyond the budget may leave.
    fn made_durable(&mut self, seq: u64) {
        self.durable = self.durable.max(seq);
        while self.bytes > TAIL_BYTES
            && let Some(front) = self.entries.front()
            && front.seq <= self.durable
        {
            self.bytes -= front.bytes;
            self.entries.pop_front();
        }
    }

    fn truncate(&mut self, from: u64) {
        while let Some(back) = self.entries.back()
            && back.entry.index() >= from
        {
            self.bytes -= back.bytes;
            self.entries.pop_back();
        }
    }

    fn purge(&mut self, upto: u64) {
        while let Some(front) = self.entries.front()
            && front.entry.index() <= upto
        {
            self.bytes -= front.bytes;
            self.entries.pop_front();
        }
    }

    /// The entries held in `[start, end)`, and where the file must supply the ones before
    /// them: `[start, from_file_end)`.
    fn read(&self, start: u64, end: u64) -> (Vec<Entry>, u64) {
        let Some(first) = self.first() else {
            return (Vec::new(), end);
        };
        let skip = start.saturating_sub(first);
        let held = self
            .entries
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .take_while(|h| h.entry.index() < end)
            .map(|h| h.entry.clone())
            .collect();
        (held, end.min(first))
    }
}

/// What the log's handles share; dropping the last one stops the writer and waits for it.
struct Shared {
    db: Arc<redb::Database>,
    segments: Arc<RwLock<Segments>>,
    tail: Arc<Mutex<Tail>>,
    queue: Option<mpsc::Sender<Change>>,
    writer: Option<JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// A member's Raft log (cheap to clone: the readers openraft asks for share the file).
#[derive(Clone)]
pub(super) struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    pub(super) fn open(path: &Path) -> io::Result<LogStore> {
        let db = redb::Database::create(path).map_err(io_error)?;
        let txn = db.begin_write().map_err(io_error)?;
        txn.open_table(META).map_err(io_error)?;
        txn.commit().map_err(io_error)?;
        let purged: Option<LogId> = LogStore::meta(&db, PURGED)?;
        let segments = Segments::open(&path.with_extension("segments"), purged.map(|p| p.index()))?;
        let segments = Arc::new(RwLock::new(segments));
        let db = Arc::new(db);
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (queue, changes) = mpsc::channel();
        let writer = std::thread::Builder::new().name("raft-log".into()).spawn({
            let (db, segments, tail) = (db.clone(), segments.clone(), tail.clone());
            move || write(&db, &segments, &changes, &tail)
        })?;
        Ok(LogStore {
            shared: Arc::new(Shared {
                db,
                segments,
                tail,
                queue: Some(queue),
                writer: Some(writer),
            }),
        })
    }

    /// Runs `f` on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::Database) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let db = self.shared.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(io_error)?
    }

    fn meta<T: DeserializeOwned>(db: &redb::Database, key: &str) -> io::Result<Option<T>> {
        let txn = db.begin_read().map_err(io_error)?;
        let table = txn.open_table(META).map_err(io_error)?;
        match table.get(key).map_err(io_error)? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Queues `change` behind every change made before it (the caller holds the tail, so
    /// the queue's order is the tail's).
    fn queue(&self, _tail: &mut Tail, change: Change) -> io::Result<()> {
        self.shared
            .queue
            .as_ref()
            .and_then(|q| q.send(change).ok())
            .ok_or_else(|| io_error("the Raft log's writer has stopped"))
    }

    /// Queues a change that returns once durable, and waits for it.
    async fn durably(&self, change: impl FnOnce(&mut Tail, Done) -> Change) -> io::Result<()> {
        let (done, durable) = oneshot::channel();
        {
            let mut tail = lock(&self.shared.tail);
            let change = change(&mut tail, done);
            self.queue(&mut tail, change)?;
        }
        durable
            .await
            .map_err(|_| io_error("the Raft log's writer has stopped"))?
    }
}

/// The writer: takes every change queued so far, makes them in order and syncs, then answers
/// them.
fn write(
    db: &redb::Database,
    segments: &RwLock<Segments>,
    changes: &mpsc::Receiver<Change>,
    tail: &Mutex<Tail>,
) {
    let mut broken: Option<String> = None;
    while let Ok(first) = changes.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP
            && let Ok(next) = changes.try_recv()
        {
            batch.push(next);
        }
        let outcome = match &broken {
            Some(e) => Err(e.clone()),
            None => make(db, segments, &batch).map_err(|e| e.to_string()),
        };
        match &outcome {
            Ok(()) => {
                let seq = batch.iter().filter_map(|c| match c {
                    Change::Append { seq, .. } => Some(*seq),
                    _ => None,
                });
                if let Some(seq) = seq.max() {
                    lock(tail).made_durable(seq);
                }
            }
            Err(e) => broken = Some(e.clone()),
        }
        for change in batch {
            let result = outcome.clone().map_err(io_error);
            match change {
                Change::Append { flushed, .. } => flushed.io_completed(result),
                Change::Vote(_, done)
                | Change::Truncate { done, .. }
                | Change::Purge { done, .. } => {
                    let _ = done.send(result);
                }
            }
        }
    }
}

fn write_lock(segments: &RwLock<Segments>) -> std::sync::RwLockWriteGuard<'_, Segments> {
    segments.write().unwrap_or_else(|e| e.into_inner())
}

fn read_lock(segments: &RwLock<Segments>) -> std::sync::RwLockReadGuard<'_, Segments> {
    segments.read().unwrap_or_else(|e| e.into_inner())
}

/// Makes `batch`'s changes in order: appends are written at once and synced together, before
/// any other change and at the end.
fn make(db: &redb::Database, segments: &RwLock<Segments>, batch: &[Change]) -> io::Result<()> {
    let sync = || -> io::Result<()> {
        let files = write_lock(segments).take_unsynced();
        files.iter().try_for_each(|f| f.sync_data())
    };
    let put = |key: &str, value: &[u8]| -> io::Result<()> {
        let txn = db.begin_write().map_err(io_error)?;
        txn.open_table(META)
            .map_err(io_error)?
            .insert(key, value)
            .map_err(io_error)?;
        txn.commit().map_err(io_error)
    };
    for change in batch {
        match change {
            Change::Append { records, .. } => write_lock(segments).write(records)?,
            Change::Vote(vote, _) => {
                sync()?;
                put(VOTE, vote)?;
            }
            Change::Truncate { from, .. } => {
                sync()?;
                write_lock(segments).truncate(*from)?;
            }
            Change::Purge { upto, id, .. } => {
                sync()?;
                put(PURGED, id)?;
                write_lock(segments).purge(*upto)?;
            }
        }
    }
    sync()
}

/// `range` as `[start, end)`.
fn half_open(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (start, end) = half_open(&range);
        let (held, file_end) = lock(&self.shared.tail).read(start, end);
        if start >= file_end {
            return Ok(held);
        }
        let segments = self.shared.segments.clone();
        let mut out =
            tokio::task::spawn_blocking(move || read_lock(&segments).read(start, file_end))
                .await
                .map_err(io_error)??;
        out.extend(held);
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.blocking(|db| LogStore::meta(db, VOTE)).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let held = lock(&self.shared.tail).last();
        let written = read_lock(&self.shared.segments).last();
        let purged: Option<LogId> = self.blocking(|db| LogStore::meta(db, PURGED)).await?;
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: held.or(written).or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let vote = encode(vote)?;
        self.durably(|_, done| Change::Vote(vote, done)).await
    }

    /// Holds the entries for readers and queues them; `callback` fires once they are durable.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
    {
        let mut held = Vec::new();
        let mut records = Vec::new();
        for entry in entries {
            let record = encode_entry(&entry)?;
            let (id, bytes) = (entry.log_id(), record.len());
            records.push((id, record));
            held.push((entry, bytes));
        }
        let mut tail = lock(&self.shared.tail);
        tail.queued += 1;
        let seq = tail.queued;
        tail.push(held, seq);
        self.queue(
            &mut tail,
            Change::Append {
                records,
                seq,
                flushed: callback,
            },
        )
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        self.durably(|tail, done| {
            tail.truncate(from);
            Change::Truncate { from, done }
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let upto = log_id.index();
        let id = encode(&log_id)?;
        self.durably(|tail, done| {
            tail.purge(upto);
            Change::Purge { upto, id, done }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank(index: u64) -> (Entry, usize) {
        let entry = openraft::Entry {
            log_id: openraft::LogId::new_term_index(1, index),
            payload: openraft::EntryPayload::Blank,
        };
        (entry, TAIL_BYTES / 4)
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.index()).collect()
    }

    #[test]
    fn the_tail_serves_entries_before_they_are_durable_and_keeps_them_until_they_are() {
        let mut tail = Tail::default();
        tail.push((1..=8).map(blank).collect(), 1);
        // Nothing durable: all eight held, twice the budget, none read from the file.
        let (held, file_end) = tail.read(3, 6);
        assert_eq!((indexes(&held), file_end), (vec![3, 4, 5], 1));
        assert_eq!(tail.read(0, 100).1, 1, "only index 0 comes from the file");
        // Durable: the oldest leave until the rest fit the budget; those come from the file.
        tail.made_durable(1);
        assert_eq!(tail.first(), Some(5));
        let (held, file_end) = tail.read(2, 7);
        assert_eq!((indexes(&held), file_end), (vec![5, 6], 5));
        // A change not yet durable keeps its entries whatever the budget.
        tail.push((9..=16).map(blank).collect(), 2);
        tail.made_durable(1);
        assert_eq!(tail.first(), Some(9));
        assert_eq!(tail.bytes, 2 * TAIL_BYTES);
        tail.made_durable(2);
        assert_eq!(tail.first(), Some(13));
    }

    #[test]
    fn truncation_and_purging_keep_the_tail_a_suffix_of_the_log() {
        let mut tail = Tail::default();
        tail.push((1..=4).map(blank).collect(), 1);
        tail.truncate(3);
        assert_eq!(tail.last().map(|l| l.index()), Some(2));
        tail.push((3..=3).map(blank).collect(), 2);
        assert_eq!(indexes(&tail.read(0, 10).0), vec![1, 2, 3]);
        tail.purge(2);
        assert_eq!(indexes(&tail.read(0, 10).0), vec![3]);
        assert_eq!(tail.bytes, TAIL_BYTES / 4);
        // A gap (never made by openraft) starts the tail over.
        tail.push((7..=7).map(blank).collect(), 3);
        assert_eq!(indexes(&tail.read(0, 10).0), vec![7]);
        tail.purge(7);
        assert_eq!((tail.first(), tail.bytes), (None, 0));
    }
}
