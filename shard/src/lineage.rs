//! A shard's lineage: which history its oplog belongs to, and the stretches of time that
//! history may be missing. This is how a resume token (or `startAtOperationTime`) from a
//! history the cluster no longer has is refused instead of resumed with a silent gap.
//!
//! The representation. Resume tokens stay exactly MongoDB's (the public decoder reads them);
//! the history identity lives with the data instead, as time ranges:
//! * `historyId`: a random id made when the shard's store is created. An empty data
//!   directory at the same address is a new history; `began` is where it starts, and a token
//!   from before it names a history this shard never had (an older shard at this address, or
//!   another cluster).
//! * one boot per restart: `from` is the highest time the previous run could have handed out
//!   (its durable clock reservation, or its last entry) and `to` where this run's clock starts.
//!   After an ordinary restart nothing was handed out in `(from, to)`: the router never lets a
//!   token pass a shard's high-water mark, which never passes its reservation. After the data
//!   directory is restored from an older copy, `from` is the copy's, and the history the shard
//!   went on to make after it (tokens included) lies in `(from, to)`, which this data no longer
//!   has.
//! * a boot is marked `lost` when the cluster knows the history had gone past `from` before it
//!   (the router's registry of what each shard's history reached, on the config shard). A
//!   start point inside a lost boot's `(from, to)` is refused with 286
//!   `ChangeStreamHistoryLost`, non-resumable; a token from before `began` with 280.
//!
//! Invariants: the record is in the `Meta` table (`lineage`), written at open in the same
//! commit as nothing else (before the writer starts) and, by a writer job, when a boot is
//! marked lost; boots are in `to` order and `to` values are unique; the checks are pure.
//!
//! The reservation window: times are whole seconds plus a counter, and a restarted clock
//! starts at `max(wall clock, reservation)`. When the copy is taken, the lost run writes and
//! the copy is put back all within the clock's reservation window (three seconds), the
//! restored run starts inside the lost run's times. Marking the boot lost then widens it to
//! end just past what the history had reached (`mark_lost`), and the shard fences its clock
//! there: every time of the lost run is refused (with the few the restored run made before
//! the router noticed, a refusal that costs a client a fresh start, never a silent gap), and
//! the restored run's times after the fence are its own. Routers gossip the fenced time to the
//! other shards with their next command. Still open: a new, empty shard started within the
//! same second as the old one's last time (its `began` is that second).

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::storage::{ReadTxn, StorageResult, Table, WriteTxn};

/// The `Meta` key of the record.
pub const LINEAGE_KEY: &[u8] = b"lineage";

/// The field of a shard's `$changeStream` aggregate that says its `startAtOperationTime` is
/// the router's "now" (the client gave no start point): nothing to check against lost history.
pub const STARTS_NOW: &str = "$_tributaryStartsNow";

/// Boots older than the oldest oplog entry are forgotten past this many.
const BOOTS_KEPT: usize = 64;

/// One restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub from: ClusterTime,
    pub to: ClusterTime,
    pub lost: bool,
}

/// A shard's lineage (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub history_id: bson::Uuid,
    pub began: ClusterTime,
    pub boots: Vec<Boot>,
}

fn ts(t: ClusterTime) -> Bson {
    Bson::Timestamp(t.timestamp())
}

fn from_ts(v: Option<&Bson>) -> Option<ClusterTime> {
    match v {
        Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
        _ => None,
    }
}

impl Lineage {
    /// The record in storage, if there is one.
    pub fn load(read: &dyn ReadTxn) -> StorageResult<Option<Lineage>> {
        Ok(read
            .get(Table::Meta, LINEAGE_KEY)?
            .and_then(|b| Document::from_reader(b.as_slice()).ok())
            .and_then(|d| Lineage::from_document(&d)))
    }

    pub fn save(&self, txn: &mut dyn WriteTxn) -> StorageResult<()> {
        let mut buf = Vec::new();
        let _ = self.to_document().to_writer(&mut buf);
        txn.put(Table::Meta, LINEAGE_KEY, &buf)
    }

    /// The lineage after a start: a new history when there was none (`had_data`: a store from
    /// before lineages were kept, whose beginning is unknown), else one more boot.
    pub fn started(
        previous: Option<Lineage>,
        had_data: bool,
        from: ClusterTime,
        to: ClusterTime,
    ) -> Lineage {
        match previous {
            Some(mut l) => {
                if l.boots.last().is_none_or(|b| b.to < to) {
                    l.boots.push(Boot {
                        from,
                        to,
                        lost: false,
                    });
                }
                l
            }
            None => Lineage {
                history_id: bson::Uuid::new(),
                began: if had_data { ClusterTime::ZERO } else { to },
                boots: Vec::new(),
            },
        }
    }

    /// Forgets boots that end before the oldest oplog entry (a start there is refused as lost
    /// history anyway), keeping at most [`BOOTS_KEPT`] of them.
    pub fn prune(&mut self, oldest_entry: ClusterTime) {
        while self.boots.len() > BOOTS_KEPT
            || self.boots.first().is_some_and(|b| b.to < oldest_entry) && self.boots.len() > 1
        {
            self.boots.remove(0);
        }
    }

    /// Marks the boot that ended at `to` lost, the history having reached `reached` before
    /// it; the end of the lost stretch when this changed anything. When the restored run
    /// started at or below `reached`
    /// (the copy was put back within the clock's reservation window), the lost stretch is
    /// widened to end just past `reached`: every time the lost run may have handed out is
    /// refused, and the caller fences the clock above it, so this run's new history never
    /// shares a time with the lost one.
    pub fn mark_lost(
        &mut self,
        to: ClusterTime,
        reached: Option<ClusterTime>,
    ) -> Option<ClusterTime> {
        let fence = reached.map(|r| r.next());
        let later = self.boots.iter().filter(|b| b.to > to).map(|b| b.to).min();
        match self.boots.iter_mut().find(|b| b.to == to) {
            Some(b) if !b.lost => {
                b.lost = true;
                if let Some(fence) = fence.filter(|f| *f > b.to && later.is_none_or(|l| *f < l)) {
                    b.to = fence;
                }
                Some(b.to)
            }
            _ => None,
        }
    }

    /// The earliest start [`Lineage::check_start`] takes: the history's beginning, or the
    /// end of the last stretch lost after it.
    pub fn resumable_from(&self) -> ClusterTime {
        self.boots
            .iter()
            .filter(|b| b.lost)
            .map(|b| b.to)
            .fold(self.began, ClusterTime::max)
    }

    /// Whether a stream may start at `start` on this shard (`token`: the start point is a
    /// resume token, else `startAtOperationTime`).
    pub fn check_start(
        &self,
        shard: &str,
        start: ClusterTime,
        token: bool,
    ) -> Result<(), MongoError> {
        if token && start < self.began && start > ClusterTime::ZERO {
            return Err(MongoError::new(
                ErrorCode::CHANGE_STREAM_FATAL_ERROR,
                format!(
                    "cannot resume stream: the resume token ({start}) is from before shard \
                     {shard}'s history began ({}): it comes from another cluster, or from a \
                     shard this one replaced",
                    self.began
                ),
            )
            .with_label("NonResumableChangeStreamError"));
        }
        if let Some(b) = self
            .boots
            .iter()
            .find(|b| b.lost && b.from < start && start < b.to)
        {
            return Err(MongoError::new(
                ErrorCode::CHANGE_STREAM_HISTORY_LOST,
                format!(
                    "cannot resume stream at {start}: shard {shard} no longer has that history. \
                     Its data was restored from a copy that ends at {}; what happened after \
                     that, up to {}, is gone. Start a new stream, or resume from before {}",
                    b.from, b.to, b.from
                ),
            )
            .with_label("NonResumableChangeStreamError"));
        }
        Ok(())
    }

    pub fn to_document(&self) -> Document {
        let boots: Vec<Bson> = self
            .boots
            .iter()
            .map(|b| Bson::Document(doc! {"from": ts(b.from), "to": ts(b.to), "lost": b.lost}))
            .collect();
        doc! {
            "historyId": self.history_id,
            "began": ts(self.began),
            "boots": boots,
        }
    }

    pub fn from_document(d: &Document) -> Option<Lineage> {
        let history_id = match d.get("historyId") {
            Some(Bson::Binary(b)) => bson::Uuid::from_bytes(b.bytes.as_slice().try_into().ok()?),
            _ => return None,
        };
        let boots = d
            .get_array("boots")
            .ok()?
            .iter()
            .map(|b| {
                let b = b.as_document()?;
                Some(Boot {
                    from: from_ts(b.get("from"))?,
                    to: from_ts(b.get("to"))?,
                    lost: b.get_bool("lost").unwrap_or(false),
                })
            })
            .collect::<Option<Vec<Boot>>>()?;
        Some(Lineage {
            history_id,
            began: from_ts(d.get("began"))?,
            boots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u32) -> ClusterTime {
        ClusterTime::new(secs, 0)
    }

    #[test]
    fn a_new_store_begins_a_history_and_restarts_add_boots() {
        let l = Lineage::started(None, false, ClusterTime::ZERO, t(100));
        assert_eq!(l.began, t(100));
        assert!(l.boots.is_empty());
        let l2 = Lineage::started(Some(l.clone()), true, t(150), t(200));
        assert_eq!(l2.history_id, l.history_id);
        assert_eq!(
            l2.boots,
            vec![Boot {
                from: t(150),
                to: t(200),
                lost: false
            }]
        );
        let old = Lineage::started(None, true, t(5), t(10));
        assert_eq!(old.began, ClusterTime::ZERO, "a store from before lineages");
        assert_eq!(Lineage::from_document(&l2.to_document()), Some(l2));
    }

    #[test]
    fn only_lost_stretches_and_foreign_tokens_are_refused() {
        let mut l = Lineage::started(None, false, ClusterTime::ZERO, t(100));
        l = Lineage::started(Some(l), true, t(150), t(200));
        // An ordinary restart: nothing was handed out in the gap, nothing is refused.
        for start in [t(120), t(160), t(250)] {
            assert!(l.check_start("s", start, true).is_ok());
            assert!(l.check_start("s", start, false).is_ok());
        }
        assert_eq!(
            l.check_start("s", t(50), true).unwrap_err().code,
            280,
            "from before the history began"
        );
        assert!(
            l.check_start("s", t(50), false).is_ok(),
            "a time is not a token"
        );
        assert_eq!(l.mark_lost(t(200), None), Some(t(200)));
        assert_eq!(l.mark_lost(t(200), None), None, "once");
        let e = l.check_start("s", t(160), true).unwrap_err();
        assert_eq!(e.code, 286);
        assert!(e.errmsg.contains("restored"), "{}", e.errmsg);
        assert_eq!(l.check_start("s", t(160), false).unwrap_err().code, 286);
        assert!(
            l.check_start("s", t(150), true).is_ok(),
            "up to the copy's end"
        );
        assert!(l.check_start("s", t(200), true).is_ok(), "the new history");
    }

    #[test]
    fn a_copy_put_back_within_the_reservation_window_loses_all_the_lost_run_reached() {
        // The copy reserved up to 150; the lost run wrote up to 160; the restored run's clock
        // started at 155, inside the lost run's times.
        let l = Lineage::started(None, false, ClusterTime::ZERO, t(100));
        let mut l = Lineage::started(Some(l), true, t(150), t(155));
        assert!(
            l.check_start("s", t(158), true).is_ok(),
            "not known lost yet"
        );
        assert_eq!(l.mark_lost(t(155), Some(t(160))), Some(t(160).next()));
        for lost in [t(151), t(155), t(158), t(160)] {
            assert_eq!(
                l.check_start("s", lost, true).unwrap_err().code,
                286,
                "{lost}"
            );
        }
        assert!(
            l.check_start("s", t(160).next().next(), true).is_ok(),
            "past the fence"
        );
        assert!(
            l.check_start("s", t(150), true).is_ok(),
            "up to the copy's end"
        );
        // A restart after it keeps the boots in order: the fence never passes a later boot.
        let mut l = Lineage::started(Some(l), true, t(170), t(180));
        assert_eq!(l.mark_lost(t(180), Some(t(400))), Some(t(400).next()));
        assert_eq!(l.boots.last().map(|b| b.to), Some(t(400).next()));
    }

    #[test]
    fn old_boots_are_pruned() {
        let mut l = Lineage::started(None, false, ClusterTime::ZERO, t(1));
        for i in 0..100 {
            l = Lineage::started(Some(l), true, t(10 * i + 5), t(10 * i + 10));
        }
        l.prune(t(500));
        assert_eq!(l.boots.first().map(|b| b.to), Some(t(500)));
        l.prune(t(2000));
        assert_eq!(l.boots.len(), 1, "the latest boot is kept");
    }
}
