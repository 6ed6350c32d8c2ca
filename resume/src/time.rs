//! `ClusterTime`: the `(secs, inc)` BSON Timestamp every oplog entry and event is ordered by.
//!
//! Invariant: the order is lexicographic on `(secs, inc)`, which equals the order of
//! [`ClusterTime::as_u64`], so it can key ordered storage directly.

use bson::Timestamp;

/// A hybrid logical clock reading / oplog timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ClusterTime {
    pub secs: u32,
    pub inc: u32,
}

impl ClusterTime {
    pub const ZERO: ClusterTime = ClusterTime { secs: 0, inc: 0 };
    pub const MAX: ClusterTime = ClusterTime {
        secs: u32::MAX,
        inc: u32::MAX,
    };

    pub const fn new(secs: u32, inc: u32) -> Self {
        ClusterTime { secs, inc }
    }

    /// `secs << 32 | inc`: order-preserving, used as the oplog key.
    pub const fn as_u64(self) -> u64 {
        ((self.secs as u64) << 32) | self.inc as u64
    }

    pub const fn from_u64(v: u64) -> Self {
        ClusterTime {
            secs: (v >> 32) as u32,
            inc: v as u32,
        }
    }

    /// The next tick (`inc + 1`, carrying into `secs`).
    pub const fn next(self) -> Self {
        ClusterTime::from_u64(self.as_u64().saturating_add(1))
    }

    /// The previous tick, saturating at zero.
    pub const fn prev(self) -> Self {
        ClusterTime::from_u64(self.as_u64().saturating_sub(1))
    }

    pub const fn timestamp(self) -> Timestamp {
        Timestamp {
            time: self.secs,
            increment: self.inc,
        }
    }
}

impl From<Timestamp> for ClusterTime {
    fn from(ts: Timestamp) -> Self {
        ClusterTime::new(ts.time, ts.increment)
    }
}

impl From<ClusterTime> for Timestamp {
    fn from(t: ClusterTime) -> Self {
        t.timestamp()
    }
}

impl From<ClusterTime> for bson::Bson {
    fn from(t: ClusterTime) -> Self {
        bson::Bson::Timestamp(t.timestamp())
    }
}

impl std::fmt::Display for ClusterTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Timestamp({}, {})", self.secs, self.inc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_order_equals_logical_order() {
        let a = ClusterTime::new(1, u32::MAX);
        let b = ClusterTime::new(2, 0);
        assert!(a < b);
        assert!(a.as_u64() < b.as_u64());
        assert_eq!(a.next(), b);
        assert_eq!(b.prev(), a);
        assert_eq!(ClusterTime::from_u64(a.as_u64()), a);
    }
}
