//! [`Segments`]: the entries of a member's Raft log, appended to files of their own.
//!
//! An append writes each entry as one checksummed record at the end of the newest segment and
//! a sync `fdatasync`s it: one sequential write and one flush per group of appends, where a
//! durable redb commit rewrote its b-tree's pages (about 100 KB per commit here). A segment is
//! named after the index of its first entry; past [`SEGMENT_BYTES`] the next append starts a
//! new one, so purging the log's front deletes whole files.
//!
//! A segment grows by [`GROW_BYTES`] of written zeros at a time, and records overwrite them:
//! an `fdatasync` then flushes data only, not the file's size and block map as well (one
//! synchronous write fewer per flush, as in the single copy's write-ahead log).
//!
//! Invariants:
//! * The segments hold consecutive indexes, segment after segment, from the first entry not
//!   purged to the last written. Truncating deletes later segments before shortening the one
//!   it ends in, and purging deletes only segments wholly at or below the purge point, so a
//!   crash between two steps leaves a log that still holds consecutive indexes.
//! * A record is `len: u32, crc32c: u32` (little-endian), then the entry in `codec`'s frame;
//!   its length is never 0, so a zero frame is where a segment's records end. On open, a
//!   record that does not hold ends the newest segment (a torn write that was never
//!   acknowledged); anywhere else it is corruption, an error that stops the member, as is a
//!   record whose index is not the next one.
//! * Nothing follows the newest segment's last record but zeros: on open, whatever follows it
//!   (a torn write's bytes, the zeros not yet used) is cut off, and a truncation cuts the file
//!   where it ends, so no record of an older write can ever follow a newer one.
//! * Nothing is acknowledged from here: the caller syncs ([`Segments::sync`]) before telling
//!   openraft an append is durable.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::alias::{EntryOf, LogIdOf};
use openraft::entry::RaftEntry;

use super::TypeConfig;
use super::codec::decode_entry;

/// The size past which the next append starts a new segment.
pub(super) const SEGMENT_BYTES: u64 = 64 << 20;

/// How much a segment grows by when a record does not fit (written as zeros).
const GROW_BYTES: u64 = 4 << 20;

/// The largest record read back: a longer length field is a torn or corrupt record. A
/// batch's write set is far smaller (a reply's 16 MiB documents, several times over at most).
const MAX_RECORD: usize = 1 << 30;

const FRAME: usize = 8;

type Entry = EntryOf<TypeConfig>;
type LogId = LogIdOf<TypeConfig>;

fn corrupt(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("the Raft log: {what}"))
}

/// One file: the entries from `first`, each record starting at its offset.
struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    offsets: Vec<u64>,
    /// Where its records end.
    len: u64,
    /// The file's size: zeros from `len` on.
    size: u64,
}

impl Segment {
    fn end(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    /// Writes zeros past the file's end until `need` bytes fit, [`GROW_BYTES`] at a time.
    fn grow(&mut self, need: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let target = need.div_ceil(GROW_BYTES) * GROW_BYTES;
        while self.size < target {
            let n = (target - self.size).min(ZEROS.len() as u64);
            self.file.write_all_at(&ZEROS[..n as usize], self.size)?;
            self.size += n;
        }
        Ok(())
    }

    /// The record of entry `index` (which this segment holds).
    fn read(&self, index: u64) -> io::Result<Entry> {
        let at = index
            .checked_sub(self.first)
            .and_then(|at| usize::try_from(at).ok())
            .filter(|&at| at < self.offsets.len())
            .ok_or_else(|| corrupt(format!("entry {index} read from the wrong segment")))?;
        let start = self.offsets[at];
        let end = self.offsets.get(at + 1).copied().unwrap_or(self.len);
        let mut record = vec![0; usize::try_from(end - start).map_err(corrupt)?];
        self.file.read_exact_at(&mut record, start)?;
        let payload = record
            .get(FRAME..)
            .ok_or_else(|| corrupt("a short record"))?;
        decode_entry(payload)
    }
}

/// The log's entries on disk (see the module header).
pub(super) struct Segments {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    /// The first index not purged: entries below it may still sit in the first segment.
    first: u64,
    last: Option<LogId>,
    /// Segments written to since the last sync.
    unsynced: Vec<Arc<File>>,
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.log")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Segments {
    /// Opens the segments in `dir` (created if missing), dropping what `purged` covers.
    pub(super) fn open(dir: &Path, purged: Option<u64>) -> io::Result<Segments> {
        std::fs::create_dir_all(dir)?;
        let mut firsts = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let name = item?.file_name();
            let name = name.to_string_lossy();
            if let Some(first) = name
                .strip_suffix(".log")
                .and_then(|n| n.parse::<u64>().ok())
            {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let first = purged.map_or(0, |p| p + 1);
        let mut log = Segments {
            dir: dir.to_path_buf(),
            segments: VecDeque::new(),
            first,
            last: None,
            unsynced: Vec::new(),
        };
        let count = firsts.len();
        for (i, start) in firsts.into_iter().enumerate() {
            let path = dir.join(segment_name(start));
            let (segment, last) = scan(path, start, i + 1 == count)?;
            if let Some(previous) = log.segments.back()
                && previous.end() != segment.first
            {
                return Err(corrupt(format!(
                    "segment {} follows one that ends at {}",
                    segment.first,
                    previous.end()
                )));
            }
            if last.is_some() {
                log.last = last;
            }
            log.segments.push_back(segment);
        }
        // A purge that stopped before deleting its segments finishes now.
        while log.segments.front().is_some_and(|s| s.end() <= first) {
            if let Some(s) = log.segments.pop_front() {
                std::fs::remove_file(&s.path)?;
            }
        }
        if log.segments.is_empty() {
            log.last = None;
        }
        Ok(log)
    }

    /// The last entry written.
    pub(super) fn last(&self) -> Option<LogId> {
        self.last
    }

    /// Writes `records` (index, entry in `codec`'s frame, the entry's log id last) after the
    /// last entry; durable after the next [`Segments::sync`].
    pub(super) fn write(&mut self, records: &[(LogId, Vec<u8>)]) -> io::Result<()> {
        for (id, payload) in records {
            let index = id.index();
            let rolls = self.segments.back().is_none_or(|s| s.len >= SEGMENT_BYTES);
            if let Some(s) = self.segments.back()
                && s.end() != index
            {
                return Err(corrupt(format!(
                    "entry {index} appended after entry {}",
                    s.end().wrapping_sub(1)
                )));
            }
            if rolls {
                let path = self.dir.join(segment_name(index));
                let file = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&path)?;
                sync_dir(&self.dir)?;
                self.segments.push_back(Segment {
                    first: index,
                    path,
                    file: Arc::new(file),
                    offsets: Vec::new(),
                    len: 0,
                    size: 0,
                });
            }
            let Some(segment) = self.segments.back_mut() else {
                return Err(corrupt("no segment to write to"));
            };
            let len = u32::try_from(payload.len()).map_err(corrupt)?;
            let mut record = Vec::with_capacity(FRAME + payload.len());
            record.extend_from_slice(&len.to_le_bytes());
            record.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
            record.extend_from_slice(payload);
            let end = segment.len + record.len() as u64;
            if end > segment.size {
                segment.grow(end)?;
            }
            segment.file.write_all_at(&record, segment.len)?;
            segment.offsets.push(segment.len);
            segment.len += record.len() as u64;
            if !self
                .unsynced
                .last()
                .is_some_and(|f| Arc::ptr_eq(f, &segment.file))
            {
                self.unsynced.push(segment.file.clone());
            }
            self.last = Some(*id);
        }
        Ok(())
    }

    /// The files written since the last sync, to flush (outside any lock).
    pub(super) fn take_unsynced(&mut self) -> Vec<Arc<File>> {
        std::mem::take(&mut self.unsynced)
    }

    /// Deletes every entry from `from` on, durably.
    pub(super) fn truncate(&mut self, from: u64) -> io::Result<()> {
        while let Some(s) = self.segments.back()
            && s.first >= from
        {
            std::fs::remove_file(&s.path)?;
            self.segments.pop_back();
        }
        sync_dir(&self.dir)?;
        if let Some(s) = self.segments.back_mut()
            && s.end() > from
        {
            let keep = usize::try_from(from - s.first).map_err(corrupt)?;
            s.len = *s
                .offsets
                .get(keep)
                .ok_or_else(|| corrupt("a truncation past the end"))?;
            s.offsets.truncate(keep);
            s.file.set_len(s.len)?;
            s.file.sync_all()?;
            s.size = s.len;
        }
        self.unsynced
            .retain(|f| self.segments.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        self.last = match self.segments.back() {
            Some(s) if s.end() > s.first.max(self.first) => Some(s.read(s.end() - 1)?.log_id()),
            _ => None,
        };
        Ok(())
    }

    /// Forgets every entry up to `upto` (the caller has recorded the purge), deleting the
    /// segments that hold nothing later.
    pub(super) fn purge(&mut self, upto: u64) -> io::Result<()> {
        self.first = self.first.max(upto + 1);
        while let Some(s) = self.segments.front()
            && s.end() <= self.first
        {
            std::fs::remove_file(&s.path)?;
            self.segments.pop_front();
        }
        self.unsynced
            .retain(|f| self.segments.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        if self.segments.is_empty() {
            self.last = None;
        }
        Ok(())
    }

    /// The entries in `[start, end)` that are not purged (fewer when the log ends first).
    pub(super) fn read(&self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        let start = start.max(self.first);
        for segment in &self.segments {
            let (from, to) = (start.max(segment.first), end.min(segment.end()));
            for index in from..to {
                out.push(segment.read(index)?);
            }
        }
        Ok(out)
    }
}

/// Reads the segment at `path` whose first entry is `first`: its records end at a zero frame;
/// a bad record ends it when it is the newest segment, and is an error anywhere else. The
/// newest segment is cut off where its records end (see the module header).
fn scan(path: PathBuf, first: u64, newest: bool) -> io::Result<(Segment, Option<LogId>)> {
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let size = file.metadata()?.len();
    let mut offsets = Vec::new();
    let mut at = 0;
    let mut last = None;
    let torn = loop {
        let mut frame = [0; FRAME];
        if at == size {
            break None;
        }
        if size - at < FRAME as u64 {
            break Some("a torn frame");
        }
        file.read_exact_at(&mut frame, at)?;
        if frame == [0; FRAME] {
            break None;
        }
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        let crc = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
        if len == 0 || len > MAX_RECORD || size - at - (FRAME as u64) < len as u64 {
            break Some("a record's length runs past the file");
        }
        let mut payload = vec![0; len];
        file.read_exact_at(&mut payload, at + FRAME as u64)?;
        if crc32c::crc32c(&payload) != crc {
            break Some("a record's checksum does not hold");
        }
        let entry = decode_entry(&payload)?;
        let expected = first + offsets.len() as u64;
        if entry.index() != expected {
            return Err(corrupt(format!(
                "{} holds entry {} where {expected} belongs",
                path.display(),
                entry.index()
            )));
        }
        last = Some(entry.log_id());
        offsets.push(at);
        at += (FRAME + len) as u64;
    };
    if let Some(why) = torn
        && !newest
    {
        return Err(corrupt(format!("{}: {why} at {at}", path.display())));
    }
    let mut size = size;
    if newest && size > at {
        file.set_len(at)?;
        file.sync_all()?;
        size = at;
    }
    let segment = Segment {
        first,
        path,
        file: Arc::new(file),
        offsets,
        len: at,
        size,
    };
    Ok((segment, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::Proposal;
    use crate::repl::codec::encode_entry;

    fn record(term: u64, index: u64, bytes: usize) -> (LogId, Vec<u8>) {
        let entry = openraft::Entry {
            log_id: openraft::LogId::new_term_index(term, index),
            payload: openraft::EntryPayload::Normal(Proposal {
                term,
                promise: index,
                ops: vec![7; bytes],
            }),
        };
        (entry.log_id, encode_entry(&entry).expect("encode"))
    }

    fn indexes(log: &Segments) -> Vec<u64> {
        log.read(0, u64::MAX)
            .expect("read")
            .iter()
            .map(|e| e.index())
            .collect()
    }

    fn write(log: &mut Segments, term: u64, range: std::ops::RangeInclusive<u64>, bytes: usize) {
        let records: Vec<_> = range.map(|i| record(term, i, bytes)).collect();
        log.write(&records).expect("write");
        for f in log.take_unsynced() {
            f.sync_data().expect("sync");
        }
    }

    #[test]
    fn entries_come_back_after_a_reopen_across_segments_truncation_and_purging() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = (SEGMENT_BYTES / 3) as usize;
        let mut log = Segments::open(dir.path(), None).expect("open");
        write(&mut log, 1, 1..=5, big);
        assert_eq!(log.segments.len(), 2, "three records fill a segment");
        log.truncate(4).expect("truncate");
        write(&mut log, 2, 4..=4, 10);
        assert_eq!(
            log.last().map(|l| (l.leader_id.term, l.index())),
            Some((2, 4))
        );
        drop(log);

        let mut log = Segments::open(dir.path(), None).expect("reopen");
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
        assert_eq!(log.read(4, 5).expect("read")[0].log_id.leader_id.term, 2);
        // Purging up to 3 deletes the first segment (1..=3); its purge point hides nothing else.
        log.purge(3).expect("purge");
        assert_eq!(log.segments.len(), 1);
        drop(log);
        let log = Segments::open(dir.path(), Some(3)).expect("reopen");
        assert_eq!(indexes(&log), vec![4]);
        assert_eq!(log.last().map(|l| l.index()), Some(4));
    }

    /// A log of three records in one segment, closed: its directory, the segment's path and
    /// where its records end.
    fn three_records() -> (tempfile::TempDir, PathBuf, u64) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = Segments::open(dir.path(), None).expect("open");
        write(&mut log, 1, 1..=3, 100);
        let (path, end) = (log.segments[0].path.clone(), log.segments[0].len);
        (dir, path, end)
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_a_bad_record_elsewhere_is_an_error() {
        let (dir, path, end) = three_records();
        // Half of a fourth record where the records end, as a crash mid-write leaves it.
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        let (_, torn) = record(1, 4, 100);
        file.write_all_at(
            &[
                &(torn.len() as u32).to_le_bytes()[..],
                &[1, 2, 3, 4],
                &torn[..20],
            ]
            .concat(),
            end,
        )
        .expect("write");
        let mut log = Segments::open(dir.path(), None).expect("reopen");
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        assert_eq!(
            std::fs::metadata(&path).expect("size").len(),
            end,
            "cut off"
        );
        write(&mut log, 1, 4..=4, 100);
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
        let fourth = log.segments[0].offsets[3];
        drop(log);

        // The same damage in a segment that is not the newest is corruption.
        let later = dir.path().join(segment_name(5));
        std::fs::write(&later, b"").expect("segment");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[fourth as usize + FRAME + 5] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert!(Segments::open(dir.path(), None).is_err());
    }

    #[test]
    fn segments_grow_by_zeros_and_nothing_past_the_records_survives_a_reopen() {
        let (dir, path, end) = three_records();
        assert_eq!(
            std::fs::metadata(&path).expect("size").len(),
            GROW_BYTES,
            "records overwrite zeros written ahead"
        );
        // A whole record written past a hole (a torn write whose first blocks never landed):
        // it follows no record, so it is cut off with the zeros.
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        let (_, stray) = record(1, 5, 100);
        let stray = [
            &(stray.len() as u32).to_le_bytes()[..],
            &crc32c::crc32c(&stray).to_le_bytes(),
            &stray,
        ]
        .concat();
        file.write_all_at(&stray, end + 4096).expect("write");
        let mut log = Segments::open(dir.path(), None).expect("reopen");
        assert_eq!(indexes(&log), vec![1, 2, 3]);
        assert_eq!(std::fs::metadata(&path).expect("size").len(), end);
        // Appends go on where the records end, the file growing again.
        write(&mut log, 2, 4..=6, 100);
        drop(log);
        let log = Segments::open(dir.path(), None).expect("reopen");
        assert_eq!(indexes(&log), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(log.read(5, 6).expect("read")[0].log_id.leader_id.term, 2);
    }

    #[test]
    fn an_append_that_is_not_the_next_index_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = Segments::open(dir.path(), None).expect("open");
        write(&mut log, 1, 1..=2, 10);
        assert!(log.write(&[record(1, 4, 10)]).is_err());
        assert_eq!(indexes(&log), vec![1, 2]);
    }
}
