//! Which shard: one type for what was an index in one place and a `"shard0"` string in
//! another.
//!
//! Invariants: a shard's id is its index in the cluster's list of shards, fixed for the
//! cluster's life; shard 0 is the config shard; its name, on the wire and in `config`
//! documents, is `shard<index>`, and a name parses back to the same id.

use std::fmt;

/// A shard of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(u16);

impl ShardId {
    /// The config shard, which holds the cluster's metadata.
    pub const CONFIG: ShardId = ShardId(0);

    /// The shard at `index` in the cluster's list (`None` past what a cluster may have).
    pub fn new(index: usize) -> Option<ShardId> {
        u16::try_from(index).ok().map(ShardId)
    }

    /// The shard's index in the cluster's list.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The shard named `name` (`shard<index>`, the index in decimal without leading zeros).
    pub fn parse(name: &str) -> Option<ShardId> {
        let digits = name.strip_prefix("shard")?;
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || (digits.len() > 1 && digits.starts_with('0'))
        {
            return None;
        }
        digits.parse().ok().map(ShardId)
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_parses_back_to_its_id() {
        for i in [0usize, 1, 9, 10, 65_535] {
            let id = ShardId::new(i).unwrap();
            assert_eq!(ShardId::parse(&id.to_string()), Some(id));
            assert_eq!(id.index(), i);
        }
        assert_eq!(ShardId::CONFIG.to_string(), "shard0");
    }

    #[test]
    fn other_names_are_no_shard() {
        for name in [
            "",
            "shard",
            "shard01",
            "shard-1",
            "shard1x",
            "Shard1",
            "shard65536",
            "s1",
        ] {
            assert_eq!(ShardId::parse(name), None, "{name}");
        }
        assert_eq!(ShardId::new(65_536), None);
    }
}
