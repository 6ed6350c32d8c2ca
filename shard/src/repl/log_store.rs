//! The Raft log of one member, on disk: entries by index, the vote, the last purged id and the
//! commit point, in a redb file of their own beside the member's storage.
//!
//! Invariants:
//! * Every change (append, vote, truncation, purge) is one durable redb commit, made before
//!   openraft is told: an appended entry is acknowledged to the leader only once it is on
//!   disk, and a vote is never forgotten after a crash. The commit point alone is saved
//!   without an fsync (openraft needs it only to re-apply sooner after a restart).
//! * Entries are stored in `codec`'s frame; a record that does not decode is an I/O error,
//!   which stops the member (see the module header of `repl`).
//! * The file is touched from blocking threads only (`spawn_blocking`), never from the
//!   runtime's workers.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::codec::{decode, decode_entry, encode, encode_entry};

use super::TypeConfig;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const PURGED: &str = "purged";
const COMMITTED: &str = "committed";

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;
type Vote = VoteOf<TypeConfig>;

fn io_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A member's Raft log (cheap to clone: the readers openraft asks for share the file).
#[derive(Clone)]
pub(super) struct LogStore {
    db: Arc<redb::Database>,
}

impl LogStore {
    pub(super) fn open(path: &Path) -> io::Result<LogStore> {
        let db = redb::Database::create(path).map_err(io_error)?;
        let txn = db.begin_write().map_err(io_error)?;
        txn.open_table(LOG).map_err(io_error)?;
        txn.open_table(META).map_err(io_error)?;
        txn.commit().map_err(io_error)?;
        Ok(LogStore { db: Arc::new(db) })
    }

    /// Runs `f` on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::Database) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let db = self.db.clone();
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

    /// Stores `value` under `key` in one commit: durable, or (`durable` false) persisted by the
    /// next durable one.
    async fn put_meta<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        durable: bool,
    ) -> io::Result<()> {
        let bytes = encode(value)?;
        self.blocking(move |db| {
            let mut txn = db.begin_write().map_err(io_error)?;
            if !durable {
                txn.set_durability(redb::Durability::None)
                    .map_err(io_error)?;
            }
            txn.open_table(META)
                .map_err(io_error)?
                .insert(key, bytes.as_slice())
                .map_err(io_error)?;
            txn.commit().map_err(io_error)
        })
        .await
    }
}

/// `range` as owned bounds, so it can cross to a blocking thread.
fn bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let range = bounds(&range);
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(io_error)?;
            let table = txn.open_table(LOG).map_err(io_error)?;
            let mut out = Vec::new();
            for row in table.range::<u64>(range).map_err(io_error)? {
                let (_, v) = row.map_err(io_error)?;
                out.push(decode_entry(v.value())?);
            }
            Ok(out)
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.blocking(|db| LogStore::meta(db, VOTE)).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.blocking(|db| {
            let purged: Option<LogId> = LogStore::meta(db, PURGED)?;
            let txn = db.begin_read().map_err(io_error)?;
            let table = txn.open_table(LOG).map_err(io_error)?;
            let last = match table.last().map_err(io_error)? {
                Some((_, v)) => Some(decode_entry(v.value())?.log_id()),
                None => purged,
            };
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.put_meta(VOTE, vote, true).await
    }

    /// Not durable by itself (the next append's commit persists it): after a crash an older
    /// commit point only means re-applying entries the leader confirms again.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.put_meta(COMMITTED, &committed, false).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        self.blocking(|db| Ok(LogStore::meta::<Option<LogId>>(db, COMMITTED)?.flatten()))
            .await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
    {
        let records = entries
            .into_iter()
            .map(|e| Ok((e.index(), encode_entry(&e)?)))
            .collect::<io::Result<Vec<_>>>()?;
        let written = self
            .blocking(move |db| {
                let txn = db.begin_write().map_err(io_error)?;
                {
                    let mut table = txn.open_table(LOG).map_err(io_error)?;
                    for (index, bytes) in &records {
                        table.insert(index, bytes.as_slice()).map_err(io_error)?;
                    }
                }
                txn.commit().map_err(io_error)
            })
            .await;
        let reported = written.as_ref().map(|_| ()).map_err(io_error);
        callback.io_completed(reported);
        written
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(io_error)?;
            txn.open_table(LOG)
                .map_err(io_error)?
                .retain_in(from.., |_, _| false)
                .map_err(io_error)?;
            txn.commit().map_err(io_error)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let upto = log_id.index();
        let purged = encode(&log_id)?;
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(io_error)?;
            txn.open_table(META)
                .map_err(io_error)?
                .insert(PURGED, purged.as_slice())
                .map_err(io_error)?;
            txn.open_table(LOG)
                .map_err(io_error)?
                .retain_in(..=upto, |_, _| false)
                .map_err(io_error)?;
            txn.commit().map_err(io_error)
        })
        .await
    }
}
