//! Retention pins: positions in this shard's oplog that subscriptions' consumers still need.
//! The oplog's trim keeps every entry at or after the oldest live pin, unless that pin is
//! further behind than its `maxLag` allows: then the pin expires (its consumer must be reset)
//! and trimming goes on.
//!
//! Invariants: the pins live in the `Meta` table under [`PINS_KEY`] and change only inside the
//! writer's batch transaction (a pin set, dropped or expired commits with the trim that reads
//! it, and a replicated shard's members get them with the batch's write set); a live pin's
//! `from` is above the truncation point when it is set (a pin set at or below it is expired at
//! once: that history is gone); an expired pin holds nothing and stays expired until it is set
//! again; at most [`MAX_PINS`] pins.

use std::collections::BTreeMap;

use bson::{Bson, Document, doc};
use resume::ClusterTime;

use crate::storage::{ReadTxn, StorageResult, Table, WriteTxn};

/// Meta-table key of the pins.
pub const PINS_KEY: &[u8] = b"retention.pins";

/// The most pins a shard keeps.
pub const MAX_PINS: usize = 10_000;

/// One pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// The oldest entry's time the pin needs: entries at or after it are kept.
    pub from: ClusterTime,
    /// Expire rather than keep more than this many bytes of oplog from `from` on.
    pub max_lag_bytes: Option<u64>,
    /// Expire rather than keep entries more than this many seconds older than now.
    pub max_lag_secs: Option<u32>,
    pub expired: bool,
}

/// The shard's pins, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins(pub BTreeMap<String, Pin>);

impl Pins {
    pub fn load(txn: &dyn ReadTxn) -> StorageResult<Pins> {
        Ok(txn
            .get(Table::Meta, PINS_KEY)?
            .and_then(|b| Pins::decode(&b))
            .unwrap_or_default())
    }

    pub fn save(&self, txn: &mut dyn WriteTxn) -> StorageResult<()> {
        if self.0.is_empty() {
            return txn.delete(Table::Meta, PINS_KEY).map(|_| ());
        }
        txn.put(Table::Meta, PINS_KEY, &self.encode())
    }

    fn encode(&self) -> Vec<u8> {
        let mut d = Document::new();
        for (id, p) in &self.0 {
            let mut pin = doc! {"from": p.from.as_u64() as i64, "expired": p.expired};
            if let Some(b) = p.max_lag_bytes {
                pin.insert("maxLagBytes", b as i64);
            }
            if let Some(s) = p.max_lag_secs {
                pin.insert("maxLagSecs", i64::from(s));
            }
            d.insert(id.clone(), pin);
        }
        d.to_vec().unwrap_or_default()
    }

    fn decode(bytes: &[u8]) -> Option<Pins> {
        let d = Document::from_reader(bytes).ok()?;
        let mut out = BTreeMap::new();
        for (id, v) in &d {
            let Bson::Document(p) = v else { continue };
            let from = ClusterTime::from_u64(p.get_i64("from").ok()? as u64);
            out.insert(
                id.clone(),
                Pin {
                    from,
                    max_lag_bytes: p.get_i64("maxLagBytes").ok().map(|b| b as u64),
                    max_lag_secs: p.get_i64("maxLagSecs").ok().map(|s| s as u32),
                    expired: p.get_bool("expired").unwrap_or(false),
                },
            );
        }
        Some(Pins(out))
    }

    /// The oldest time a live pin holds.
    pub fn keep_from(&self) -> Option<ClusterTime> {
        self.0.values().filter(|p| !p.expired).map(|p| p.from).min()
    }

    /// Expires every live pin older than its `maxLagSecs` at `wall_secs`; returns whether any
    /// did.
    pub fn expire_by_age(&mut self, wall_secs: u32) -> bool {
        let mut changed = false;
        for p in self.0.values_mut().filter(|p| !p.expired) {
            if p.max_lag_secs
                .is_some_and(|max| u64::from(p.from.secs) + u64::from(max) < u64::from(wall_secs))
            {
                p.expired = true;
                changed = true;
            }
        }
        changed
    }

    /// The trim has reached the oldest live pins with `bytes` of oplog left from them on:
    /// those allowed fewer bytes expire. Returns whether any did.
    pub fn expire_by_size(&mut self, bytes: u64) -> bool {
        let Some(oldest) = self.keep_from() else {
            return false;
        };
        let mut changed = false;
        for p in self
            .0
            .values_mut()
            .filter(|p| !p.expired && p.from == oldest)
        {
            if p.max_lag_bytes.is_some_and(|max| bytes > max) {
                p.expired = true;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(from: u32, bytes: Option<u64>, secs: Option<u32>) -> Pin {
        Pin {
            from: ClusterTime::new(from, 1),
            max_lag_bytes: bytes,
            max_lag_secs: secs,
            expired: false,
        }
    }

    #[test]
    fn pins_round_trip_and_the_oldest_live_one_holds() {
        let mut pins = Pins::default();
        pins.0.insert("a".into(), pin(10, Some(5), None));
        pins.0.insert("b".into(), pin(20, None, Some(60)));
        assert_eq!(Pins::decode(&pins.encode()), Some(pins.clone()));
        assert_eq!(pins.keep_from(), Some(ClusterTime::new(10, 1)));
        pins.0.get_mut("a").unwrap().expired = true;
        assert_eq!(
            pins.keep_from(),
            Some(ClusterTime::new(20, 1)),
            "expired pins hold nothing"
        );
    }

    #[test]
    fn a_pin_expires_past_its_max_lag_only() {
        let mut pins = Pins::default();
        pins.0.insert("a".into(), pin(10, Some(100), None));
        pins.0.insert("b".into(), pin(10, None, None));
        assert!(!pins.expire_by_size(100), "at its bound it still holds");
        assert!(pins.expire_by_size(101));
        assert!(pins.0["a"].expired);
        assert_eq!(
            pins.keep_from(),
            Some(ClusterTime::new(10, 1)),
            "b holds the same time"
        );
        let mut aged = Pins::default();
        aged.0.insert("c".into(), pin(10, None, Some(60)));
        assert!(!aged.expire_by_age(70));
        assert!(aged.expire_by_age(71));
        assert_eq!(aged.keep_from(), None);
    }
}
