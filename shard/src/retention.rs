//! Oplog retention: the oplog is truncated from the front when it grows past a size limit
//! (`--oplogSizeMB`), except for entries younger than the minimum retention
//! (`--oplogMinRetentionHours`, as MongoDB's), or when its oldest entries pass an age limit.
//!
//! Invariants:
//! * Truncation runs inside the writer's batch transaction, so the size counter, the truncation
//!   point and the deletions commit together.
//! * `truncated_through` only grows; every entry with `ts <= truncated_through` is gone and
//!   every committed entry above it is still in storage. A reader that needs entries after `T`
//!   with `T < truncated_through` has lost history (`ChangeStreamHistoryLost`).
//! * Entries written by the running batch are never truncated by it.
//! * An entry whose `commitMetadata` refers to an earlier entry's is never kept without that
//!   entry (a run of at most `COMMIT_METADATA_RUN` entries is truncated whole or not at all).

use bson::RawDocument;
use resume::ClusterTime;

use crate::oplog::{commit_metadata_reference, ts_of_key};
use crate::pins::Pins;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table, WriteTxn};

/// Meta-table key of the persisted [`OplogStats`].
pub const STATS_KEY: &[u8] = b"oplog.stats";

/// The most entries one batch truncates (bounds the work added to a commit).
const MAX_TRIM_PER_BATCH: usize = 10_000;

/// How much oplog to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Truncate while the oplog's entries total more bytes than this.
    pub max_bytes: u64,
    /// Truncate entries older than this many seconds (by `ts`), if set.
    pub max_age_secs: Option<u32>,
    /// Never truncate for size an entry younger than this many seconds (by `ts`): the oplog
    /// may then outgrow `max_bytes`.
    pub min_retention_secs: Option<u32>,
}

impl Retention {
    /// Truncation by size alone.
    pub fn bytes(max_bytes: u64) -> Retention {
        Retention {
            max_bytes,
            ..Retention::default()
        }
    }

    /// `--oplogSizeMB` and `--oplogMinRetentionHours` (0: none), as MongoDB takes them.
    pub fn from_flags(size_mb: u64, min_retention_hours: f64) -> Retention {
        let secs = (min_retention_hours * 3600.0).clamp(0.0, f64::from(u32::MAX)) as u32;
        Retention {
            max_bytes: size_mb.saturating_mul(1024 * 1024),
            max_age_secs: None,
            min_retention_secs: (secs > 0).then_some(secs),
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_bytes: 1024 * 1024 * 1024,
            max_age_secs: None,
            min_retention_secs: None,
        }
    }
}

/// The oplog's committed size and truncation point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OplogStats {
    pub bytes: u64,
    pub truncated_through: ClusterTime,
    /// How many entries the oplog holds.
    pub entries: u64,
}

impl OplogStats {
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.bytes.to_be_bytes());
        out[8..16].copy_from_slice(&self.truncated_through.as_u64().to_be_bytes());
        out[16..].copy_from_slice(&self.entries.to_be_bytes());
        out
    }

    /// Decodes the stats; `entries` is `None` in the 16-byte form written before they were
    /// counted.
    pub fn decode(b: &[u8]) -> Option<(OplogStats, bool)> {
        let bytes = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
        let t = u64::from_be_bytes(b.get(8..16)?.try_into().ok()?);
        let entries = match b.get(16..24) {
            Some(e) => Some(u64::from_be_bytes(e.try_into().ok()?)),
            None => None,
        };
        Some((
            OplogStats {
                bytes,
                truncated_through: ClusterTime::from_u64(t),
                entries: entries.unwrap_or(0),
            },
            entries.is_some(),
        ))
    }

    /// Loads the stats, counting what an older file did not record by a scan.
    /// The statistics as stored by the last commit (exact or not), without counting the oplog.
    pub fn stored(txn: &dyn ReadTxn) -> StorageResult<Option<OplogStats>> {
        Ok(txn
            .get(Table::Meta, STATS_KEY)?
            .and_then(|b| OplogStats::decode(&b))
            .map(|(s, _)| s))
    }

    pub fn load(txn: &dyn ReadTxn) -> StorageResult<OplogStats> {
        let stored = txn
            .get(Table::Meta, STATS_KEY)?
            .and_then(|b| OplogStats::decode(&b));
        if let Some((s, true)) = stored {
            return Ok(s);
        }
        let (mut bytes, mut entries) = (0u64, 0u64);
        txn.scan(Table::Oplog, &KeyRange::all(), false, &mut |_, v| {
            bytes += v.len() as u64;
            entries += 1;
            Scan::Continue
        })?;
        Ok(OplogStats {
            bytes,
            truncated_through: stored.map_or(ClusterTime::ZERO, |(s, _)| s.truncated_through),
            entries,
        })
    }
}

/// Truncates the front of the oplog per `retention`, never touching entries at or after
/// `keep_from` or the oldest live pin (`pins`, unless it is further behind than its maxLag
/// allows: then it expires and trimming goes on); updates `stats`. Returns whether a pin
/// expired (the caller stores `pins` in the same transaction).
pub fn trim(
    txn: &mut dyn WriteTxn,
    stats: &mut OplogStats,
    retention: Retention,
    wall_secs: u32,
    keep_from: Option<ClusterTime>,
    pins: &mut Pins,
) -> StorageResult<bool> {
    let mut doomed = Vec::new();
    let mut bytes = stats.bytes;
    let mut changed = pins.expire_by_age(wall_secs);
    let mut pinned = pins.keep_from();
    // The entry holding the commit metadata the first kept entry refers to, if any.
    let mut referred = None;
    txn.scan(Table::Oplog, &KeyRange::all(), false, &mut |k, v| {
        let Some(ts) = ts_of_key(k) else {
            return Scan::Stop;
        };
        let keep = |referred: &mut Option<ClusterTime>| {
            *referred = RawDocument::from_bytes(v)
                .ok()
                .and_then(commit_metadata_reference);
            Scan::Stop
        };
        if keep_from.is_some_and(|f| ts >= f) || doomed.len() >= MAX_TRIM_PER_BATCH {
            return keep(&mut referred);
        }
        let young = retention
            .min_retention_secs
            .is_some_and(|min| u64::from(ts.secs) + u64::from(min) >= u64::from(wall_secs));
        let too_big = bytes > retention.max_bytes && !young;
        let too_old = retention
            .max_age_secs
            .is_some_and(|age| u64::from(ts.secs) + u64::from(age) < u64::from(wall_secs));
        if !(too_big || too_old) {
            return keep(&mut referred);
        }
        // A consumer needs this entry: keep it, unless its pin lags past its bound.
        while pinned.is_some_and(|p| ts >= p) {
            if !pins.expire_by_size(bytes) {
                return keep(&mut referred);
            }
            changed = true;
            pinned = pins.keep_from();
        }
        bytes = bytes.saturating_sub(v.len() as u64);
        doomed.push((k.to_vec(), ts, v.len() as u64));
        Scan::Continue
    })?;
    // Never keep a reference to commit metadata without the entry holding it: the run it
    // belongs to (at most `COMMIT_METADATA_RUN` entries) stays whole.
    if let Some(at) = referred {
        let cut = doomed.partition_point(|(_, ts, _)| *ts < at);
        for (_, _, len) in doomed.drain(cut..) {
            bytes = bytes.saturating_add(len);
        }
    }
    for (k, ts, _) in doomed {
        txn.delete(Table::Oplog, &k)?;
        stats.truncated_through = stats.truncated_through.max(ts);
        stats.entries = stats.entries.saturating_sub(1);
    }
    stats.bytes = bytes;
    Ok(changed)
}

/// The bytes of the oplog's entries at or after each of `froms` (a consumer's lag in bytes),
/// in one scan from the oldest of them on.
pub fn bytes_since(txn: &dyn ReadTxn, froms: &[ClusterTime]) -> StorageResult<Vec<u64>> {
    let mut sorted: Vec<ClusterTime> = froms.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let Some(&oldest) = sorted.first() else {
        return Ok(Vec::new());
    };
    // `bucket[i]`: the bytes of entries at or after `sorted[i]` and before `sorted[i + 1]`.
    let mut bucket = vec![0u64; sorted.len()];
    let range = KeyRange {
        start: std::ops::Bound::Included(crate::oplog::oplog_key(oldest).to_vec()),
        end: std::ops::Bound::Unbounded,
    };
    txn.scan(Table::Oplog, &range, false, &mut |k, v| {
        if let Some(ts) = ts_of_key(k) {
            let reached = sorted.partition_point(|f| *f <= ts);
            if let Some(b) = reached.checked_sub(1).and_then(|i| bucket.get_mut(i)) {
                *b += v.len() as u64;
            }
        }
        Scan::Continue
    })?;
    for i in (0..bucket.len().saturating_sub(1)).rev() {
        bucket[i] += bucket[i + 1];
    }
    Ok(froms
        .iter()
        .map(|f| bucket[sorted.partition_point(|s| s < f)])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip() {
        let s = OplogStats {
            bytes: 123,
            truncated_through: ClusterTime::new(4, 5),
            entries: 7,
        };
        assert_eq!(OplogStats::decode(&s.encode()), Some((s, true)));
        assert_eq!(OplogStats::decode(&[1, 2]), None);
        let old = &s.encode()[..16];
        assert_eq!(
            OplogStats::decode(old).map(|(d, counted)| (d.bytes, counted)),
            Some((123, false)),
            "the form without the count still reads"
        );
    }

    /// An oplog in `dir` of `n` entries at `(1, 1..=n)`, each recording commit metadata (in runs
    /// as the writer does when `meta` is set), committed.
    fn oplog(dir: &std::path::Path, n: u32, meta: bool) -> crate::storage::RedbStorage {
        use crate::storage::Storage;
        let storage = crate::storage::RedbStorage::open(&dir.join("o.redb")).unwrap();
        let mut txn = storage.begin_write().unwrap();
        let mut run = None;
        for i in 1..=n {
            let ts = ClusterTime::new(1, i);
            let mut entry = bson::doc! {"ts": ts.timestamp(), "op": "n", "o": {}};
            if meta {
                match run {
                    Some(first) if i % crate::writer::COMMIT_METADATA_RUN != 1 => {
                        entry.insert("commitMetadata", bson::Bson::Timestamp(first))
                    }
                    _ => {
                        run = Some(ts.timestamp());
                        entry.insert("commitMetadata", bson::doc! {"appName": "a"})
                    }
                };
            }
            let mut bytes = Vec::new();
            entry.to_writer(&mut bytes).unwrap();
            txn.put(Table::Oplog, &crate::oplog::oplog_key(ts), &bytes)
                .unwrap();
        }
        txn.commit().unwrap();
        storage
    }

    /// Trims `storage`'s oplog (of `total` bytes) to `max_bytes`: the entries left.
    fn trimmed(storage: &crate::storage::RedbStorage, total: u64, max_bytes: u64) -> u64 {
        use crate::storage::Storage;
        let mut stats = OplogStats {
            bytes: total,
            truncated_through: ClusterTime::ZERO,
            entries: 0,
        };
        let mut txn = storage.begin_write().unwrap();
        trim(
            &mut *txn,
            &mut stats,
            Retention::bytes(max_bytes),
            1,
            None,
            &mut Pins::default(),
        )
        .unwrap();
        txn.commit().unwrap();
        let read = storage.begin_read().unwrap();
        let mut left = 0;
        read.scan(Table::Oplog, &KeyRange::all(), false, &mut |_, _| {
            left += 1;
            Scan::Continue
        })
        .unwrap();
        left
    }

    fn total_bytes(storage: &crate::storage::RedbStorage) -> u64 {
        use crate::storage::Storage;
        let read = storage.begin_read().unwrap();
        let mut total = 0;
        read.scan(Table::Oplog, &KeyRange::all(), false, &mut |_, v| {
            total += v.len() as u64;
            Scan::Continue
        })
        .unwrap();
        total
    }

    #[test]
    fn a_run_of_shared_commit_metadata_is_truncated_whole() {
        let run = u64::from(crate::writer::COMMIT_METADATA_RUN);
        // Without metadata, trimming to 45 % keeps 45 %, entry by entry.
        let dir = tempfile::tempdir().unwrap();
        let plain = oplog(dir.path(), 4 * run as u32, false);
        let total = total_bytes(&plain);
        let left = trimmed(&plain, total, total * 45 / 100);
        assert!(
            left > run && left < 3 * run && !left.is_multiple_of(run),
            "{left}"
        );
        // With metadata shared in runs, the entries kept start a run: never a reference whose
        // entry is gone.
        let dir = tempfile::tempdir().unwrap();
        let shared = oplog(dir.path(), 4 * run as u32, true);
        let total = total_bytes(&shared);
        let left = trimmed(&shared, total, total * 45 / 100);
        assert!(left.is_multiple_of(run), "{left} entries left");
        assert!(left > run && left < 4 * run, "{left}");
    }
}
