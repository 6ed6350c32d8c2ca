//! A chunk's version, as MongoDB's `lastmod`: a major and a minor number. A migration that
//! moves a chunk bumps the major version (every router must refresh before routing by the old
//! table); a split bumps the minor one.
//!
//! Invariants: versions order by (major, minor); a collection's version is its chunks'
//! greatest. Stored as MongoDB stores `lastmod`, a timestamp `(major, minor)`; a plain
//! integer `n` (the form earlier releases stored) reads as `(1, n)`.

use bson::{Bson, Timestamp};

/// A chunk's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ChunkVersion {
    pub major: u32,
    pub minor: u32,
}

impl ChunkVersion {
    /// The version of a collection's first chunks.
    pub const FIRST: ChunkVersion = ChunkVersion { major: 1, minor: 0 };

    /// `lastmod` as stored.
    pub fn to_bson(self) -> Bson {
        Bson::Timestamp(Timestamp {
            time: self.major,
            increment: self.minor,
        })
    }

    /// A stored `lastmod`, in either form (see the module's invariants).
    pub fn from_bson(v: &Bson) -> Option<ChunkVersion> {
        match v {
            Bson::Timestamp(t) => Some(ChunkVersion {
                major: t.time,
                minor: t.increment,
            }),
            Bson::Int64(n) => u32::try_from(*n)
                .ok()
                .map(|minor| ChunkVersion { major: 1, minor }),
            Bson::Int32(n) => u32::try_from(*n)
                .ok()
                .map(|minor| ChunkVersion { major: 1, minor }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_by_major_then_minor() {
        let v = |major, minor| ChunkVersion { major, minor };
        assert!(v(1, 9) < v(2, 0));
        assert!(v(2, 0) < v(2, 1));
        assert!(ChunkVersion::FIRST < v(1, 1));
    }

    #[test]
    fn lastmod_reads_back_in_either_form() {
        let v = ChunkVersion { major: 3, minor: 7 };
        assert_eq!(ChunkVersion::from_bson(&v.to_bson()), Some(v));
        assert_eq!(
            ChunkVersion::from_bson(&Bson::Int64(4)),
            Some(ChunkVersion { major: 1, minor: 4 })
        );
        assert_eq!(ChunkVersion::from_bson(&Bson::Int64(-1)), None);
        assert_eq!(ChunkVersion::from_bson(&Bson::String("1".into())), None);
    }
}
