//! A member's snapshot as Raft carries it ([`Snapshot`], the state machine's `SnapshotData`):
//! every row of every table, in pieces of about [`PIECE`] bytes, each a write set of puts, so
//! that no member holds more than a piece or two of it in memory, however large its data.
//!
//! * Taken from a member's storage, a snapshot is a read transaction and a cursor in it
//!   ([`Rows`]): the rows as they were when it was taken (the applied id and membership are
//!   read in the same transaction), read a piece at a time as they are sent or installed.
//! * Received from a peer, it is a file beside the member's Raft log holding the pieces as they
//!   arrived, each behind its length ([`Receiving`], then [`Received`]), removed when the
//!   snapshot is dropped.
//!
//! Invariants:
//! * The pieces, in order, are the rows in table order, then key order, each exactly once.
//! * A piece holds whole rows: at most [`PIECE`] bytes, or one row when a row alone is larger.
//! * Every piece of a received snapshot decodes as a write set: a piece is checked when it
//!   arrives, and one that does not decode is refused before it is kept.
//! * Reading and writing pieces is blocking I/O: callers run it off the async workers.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::ops::Bound;
use std::path::Path;

use crate::log::{Op, WriteSet};
use crate::storage::{KeyRange, ReadTxn, Scan, Table};

/// The bytes of rows a piece holds before it is cut (a row larger than this is a piece alone).
pub const PIECE: usize = 8 << 20;

/// The largest piece a received file may hold: a full piece and one row of a document at the
/// 16 MiB limit, with room to spare. Anything longer is corrupt.
const MAX_STORED_PIECE: usize = PIECE + (40 << 20);

fn io_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A snapshot's rows: read from a storage, or received from a peer.
pub enum Snapshot {
    Rows(Rows),
    Received(Received),
}

impl Snapshot {
    /// The next piece, `None` after the last.
    pub fn next_piece(&mut self) -> io::Result<Option<WriteSet>> {
        match self {
            Snapshot::Rows(rows) => rows.next_piece(),
            Snapshot::Received(received) => received.next_piece(),
        }
    }

    /// [`Snapshot::next_piece`] on a blocking thread: the snapshot goes there and comes back.
    pub async fn next_piece_off_runtime(self) -> io::Result<(Snapshot, Option<WriteSet>)> {
        tokio::task::spawn_blocking(move || {
            let mut snapshot = self;
            let piece = snapshot.next_piece()?;
            Ok((snapshot, piece))
        })
        .await
        .map_err(io_error)?
    }
}

/// The rows of a storage as one read transaction sees them, and how far they have been read.
pub struct Rows {
    txn: Box<dyn ReadTxn>,
    /// The table being read (an index into [`Table::ALL`]).
    table: usize,
    /// The last key read in that table; `None` before its first.
    after: Option<Vec<u8>>,
}

impl Rows {
    pub fn new(txn: Box<dyn ReadTxn>) -> Rows {
        Rows {
            txn,
            table: 0,
            after: None,
        }
    }

    /// The rows after the last one read, up to a piece's worth.
    pub fn next_piece(&mut self) -> io::Result<Option<WriteSet>> {
        let mut set = WriteSet::with_prefix(0, 1 << 16);
        while let Some(&table) = Table::ALL.get(self.table) {
            let range = KeyRange::from(match self.after.take() {
                Some(key) => Bound::Excluded(key),
                None => Bound::Unbounded,
            });
            let mut last: Option<Vec<u8>> = None;
            let mut full = false;
            let mut refused = None;
            self.txn
                .scan(table, &range, false, &mut |key, value| {
                    if !set.is_empty() && set.encoded().len() + key.len() + value.len() > PIECE {
                        full = true;
                        return Scan::Stop;
                    }
                    let op = Op {
                        table: table.index(),
                        key,
                        value: Some(value),
                    };
                    if let Err(e) = set.push(op) {
                        refused = Some(e);
                        return Scan::Stop;
                    }
                    let last = last.get_or_insert_with(Vec::new);
                    last.clear();
                    last.extend_from_slice(key);
                    Scan::Continue
                })
                .map_err(io_error)?;
            if let Some(e) = refused {
                return Err(io_error(e));
            }
            if full {
                self.after = last;
                return Ok(Some(set));
            }
            self.table += 1;
        }
        Ok((!set.is_empty()).then_some(set))
    }
}

/// A snapshot being received: its pieces written to a file as they arrive.
pub struct Receiving {
    file: BufWriter<tempfile::NamedTempFile>,
    /// The bytes of pieces taken so far.
    pub received: u64,
}

impl Receiving {
    /// A new file for a snapshot's pieces in `dir`.
    pub fn start(dir: &Path) -> io::Result<Receiving> {
        let file = tempfile::Builder::new()
            .prefix("snapshot-")
            .suffix(".incoming")
            .tempfile_in(dir)?;
        Ok(Receiving {
            file: BufWriter::new(file),
            received: 0,
        })
    }

    /// Keeps `piece` (its bytes must decode as a write set: checked by the caller).
    pub fn take(&mut self, piece: &WriteSet) -> io::Result<()> {
        let bytes = piece.encoded();
        let len = u32::try_from(bytes.len()).map_err(io_error)?;
        self.file.write_all(&len.to_le_bytes())?;
        self.file.write_all(bytes)?;
        self.received += bytes.len() as u64;
        Ok(())
    }

    /// Every piece arrived: the snapshot to install.
    pub fn finish(self) -> io::Result<Received> {
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        let reader = BufReader::new(file.reopen()?);
        Ok(Received {
            _file: file,
            reader,
        })
    }
}

/// A received snapshot: its file (removed when this is dropped) and a reader over it.
pub struct Received {
    _file: tempfile::NamedTempFile,
    reader: BufReader<File>,
}

impl Received {
    fn next_piece(&mut self) -> io::Result<Option<WriteSet>> {
        let mut len = [0u8; 4];
        match self.reader.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_STORED_PIECE {
            return Err(io_error(format!(
                "a received snapshot's piece of {len} bytes"
            )));
        }
        let mut bytes = vec![0; len];
        self.reader.read_exact(&mut bytes)?;
        WriteSet::from_vec(bytes).map(Some).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::storage::{RedbStorage, Storage};

    /// Every piece of `snapshot`, concatenated.
    fn all(mut snapshot: Snapshot) -> (Vec<u8>, usize) {
        let (mut bytes, mut pieces) = (Vec::new(), 0);
        while let Some(piece) = snapshot.next_piece().unwrap() {
            assert!(!piece.is_empty(), "an empty piece");
            bytes.extend_from_slice(piece.encoded());
            pieces += 1;
        }
        (bytes, pieces)
    }

    #[test]
    fn rows_come_in_pieces_each_once_in_table_and_key_order_and_survive_the_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RedbStorage::open(&dir.path().join("s.redb")).unwrap();
        let mut txn = storage.begin_write().unwrap();
        // 3 tables with rows of 1 MiB: a piece holds 7 of them.
        let value = vec![7u8; 1 << 20];
        let tables = [Table::Catalog, Table::Documents, Table::PreImages];
        let mut expected = WriteSet::with_prefix(0, 0);
        for table in tables {
            for k in 0..10u32 {
                let key = k.to_be_bytes();
                txn.put(table, &key, &value).unwrap();
                expected
                    .push(Op {
                        table: table.index(),
                        key: &key,
                        value: Some(&value),
                    })
                    .unwrap();
            }
        }
        // A row larger than a piece is a piece alone.
        let big = vec![1u8; PIECE + 1];
        txn.put(Table::PreImages, b"z", &big).unwrap();
        expected
            .push(Op {
                table: Table::PreImages.index(),
                key: b"z",
                value: Some(&big),
            })
            .unwrap();
        txn.commit().unwrap();

        let rows = Snapshot::Rows(Rows::new(storage.begin_read().unwrap()));
        let (bytes, pieces) = all(rows);
        assert_eq!(bytes, expected.encoded());
        assert_eq!(
            pieces, 6,
            "30 rows of 1 MiB in pieces of 7, then the large row"
        );

        let mut receiving = Receiving::start(dir.path()).unwrap();
        let mut rows = Rows::new(storage.begin_read().unwrap());
        while let Some(piece) = rows.next_piece().unwrap() {
            receiving.take(&piece).unwrap();
        }
        assert_eq!(receiving.received, expected.encoded().len() as u64);
        let received = receiving.finish().unwrap();
        assert_eq!(all(Snapshot::Received(received)).0, expected.encoded());
        // Dropped, the received file is gone.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".incoming"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn an_empty_storage_is_a_snapshot_without_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RedbStorage::open(&dir.path().join("s.redb")).unwrap();
        let rows = Snapshot::Rows(Rows::new(storage.begin_read().unwrap()));
        assert_eq!(all(rows), (Vec::new(), 0));
    }
}
