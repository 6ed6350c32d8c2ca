//! A sharded collection's chunks: the key ranges each shard owns.
//!
//! Pure. Invariants of a [`ChunkTable`]: chunks are sorted by `min`, contiguous (each chunk's
//! `max` is the next one's `min`), and together cover `[MinKey, MaxKey)` in every key field, so
//! every shard-key value maps to exactly one chunk; each chunk has a version
//! ([`ChunkVersion`]), and the table's version is the greatest.

use std::cmp::Ordering;

use bson::{Bson, Document, doc};
use pipeline::value;
use wire::{ErrorCode, MongoError, Result};

use super::{ChunkVersion, ShardId, ShardKey};

/// One chunk: the key range `[min, max)` (values in key-field order) and the shard that owns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub min: Vec<Bson>,
    pub max: Vec<Bson>,
    pub shard: ShardId,
    pub version: ChunkVersion,
}

fn compare_keys(a: &[Bson], b: &[Bson]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| value::compare(x, y))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// A sharded collection's chunks. See the module invariants.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkTable {
    chunks: Vec<Chunk>,
}

impl ChunkTable {
    /// Builds a table, checking the invariants: sorted, contiguous, covering MinKey..MaxKey.
    pub fn new(mut chunks: Vec<Chunk>) -> Result<ChunkTable> {
        chunks.sort_by(|a, b| compare_keys(&a.min, &b.min));
        let covers = chunks
            .first()
            .is_some_and(|c| c.min.iter().all(|v| *v == Bson::MinKey))
            && chunks
                .last()
                .is_some_and(|c| c.max.iter().all(|v| *v == Bson::MaxKey))
            && chunks
                .windows(2)
                .all(|w| compare_keys(&w[0].max, &w[1].min).is_eq());
        if !covers {
            return Err(MongoError::new(
                ErrorCode::INCOMPATIBLE_SHARDING_METADATA,
                "chunk table does not cover the whole key space",
            ));
        }
        Ok(ChunkTable { chunks })
    }

    /// One chunk over the whole key space, owned by `shard`.
    pub fn single(key: &ShardKey, shard: ShardId) -> ChunkTable {
        let n = key.len();
        ChunkTable {
            chunks: vec![Chunk {
                min: vec![Bson::MinKey; n],
                max: vec![Bson::MaxKey; n],
                shard,
                version: ChunkVersion::FIRST,
            }],
        }
    }

    /// A hashed key pre-split evenly: `chunks_per_shard` chunks for each shard, in shard order.
    /// The hashed field must be the first key field.
    pub fn presplit_hashed(
        key: &ShardKey,
        shards: &[ShardId],
        chunks_per_shard: usize,
    ) -> ChunkTable {
        let n_fields = key.len();
        let total = (shards.len() * chunks_per_shard).max(1);
        let step = (u64::MAX / total as u64) as i128;
        let bound = |i: usize| -> Vec<Bson> {
            let mut b = vec![Bson::MinKey; n_fields];
            b[0] = Bson::Int64((i64::MIN as i128 + step * i as i128) as i64);
            b
        };
        let chunks = (0..total)
            .map(|i| Chunk {
                min: if i == 0 {
                    vec![Bson::MinKey; n_fields]
                } else {
                    bound(i)
                },
                max: if i + 1 == total {
                    vec![Bson::MaxKey; n_fields]
                } else {
                    bound(i + 1)
                },
                shard: shards[i * shards.len() / total],
                version: ChunkVersion {
                    major: 1,
                    minor: i as u32,
                },
            })
            .collect();
        ChunkTable { chunks }
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The shard owning a routing key (from [`ShardKey::key_of_document`]).
    pub fn shard_for(&self, key: &[Bson]) -> ShardId {
        let idx = self
            .chunks
            .partition_point(|c| compare_keys(&c.min, key).is_le())
            .saturating_sub(1);
        self.chunks[idx].shard
    }

    /// Every shard that owns at least one chunk, without repeats, in first-chunk order.
    pub fn shards(&self) -> Vec<ShardId> {
        let mut out: Vec<ShardId> = Vec::new();
        for c in &self.chunks {
            if !out.contains(&c.shard) {
                out.push(c.shard);
            }
        }
        out
    }

    /// The collection's version: its chunks' greatest.
    pub fn version(&self) -> ChunkVersion {
        self.chunks
            .iter()
            .map(|c| c.version)
            .max()
            .unwrap_or_default()
    }

    /// The chunks as `config.chunks` documents for the collection `uuid`.
    pub fn to_documents(&self, key: &ShardKey, ns: &str) -> Vec<Document> {
        let names: Vec<&str> = key.fields().collect();
        let bound = |vals: &[Bson]| -> Document {
            names
                .iter()
                .zip(vals)
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect()
        };
        self.chunks
            .iter()
            .map(|c| {
                doc! {
                    "ns": ns,
                    "min": bound(&c.min),
                    "max": bound(&c.max),
                    "shard": c.shard.to_string(),
                    "lastmod": c.version.to_bson(),
                }
            })
            .collect()
    }

    /// Reads `config.chunks` documents back.
    pub fn from_documents(key: &ShardKey, docs: &[Document]) -> Result<ChunkTable> {
        let names: Vec<&str> = key.fields().collect();
        let values = |d: &Document, which: &str| -> Result<Vec<Bson>> {
            let b = d.get_document(which).map_err(|_| bad_chunk(d))?;
            names
                .iter()
                .map(|n| b.get(*n).cloned().ok_or_else(|| bad_chunk(d)))
                .collect()
        };
        let chunks = docs
            .iter()
            .map(|d| {
                let shard = d.get_str("shard").ok().and_then(ShardId::parse);
                let version = d.get("lastmod").and_then(ChunkVersion::from_bson);
                Ok(Chunk {
                    min: values(d, "min")?,
                    max: values(d, "max")?,
                    shard: shard.ok_or_else(|| bad_chunk(d))?,
                    version: version.ok_or_else(|| bad_chunk(d))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ChunkTable::new(chunks)
    }
}

fn bad_chunk(d: &Document) -> MongoError {
    MongoError::new(
        ErrorCode::INCOMPATIBLE_SHARDING_METADATA,
        format!("malformed chunk document {d}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(n: usize) -> Vec<ShardId> {
        (0..n).filter_map(ShardId::new).collect()
    }

    fn shard(i: usize) -> ShardId {
        ShardId::new(i).unwrap()
    }

    #[test]
    fn presplit_hashed_table_covers_the_key_space_and_spreads_keys() {
        let key = ShardKey::parse(&doc! {"_id": "hashed"}).unwrap();
        let table = ChunkTable::presplit_hashed(&key, &shards(3), 2);
        assert_eq!(table.chunks().len(), 6);
        assert!(ChunkTable::new(table.chunks().to_vec()).is_ok());
        let mut per_shard = std::collections::HashMap::new();
        for i in 0..3000 {
            let k = key.key_of_document(&doc! {"_id": i}).unwrap();
            *per_shard.entry(table.shard_for(&k)).or_insert(0) += 1;
        }
        assert_eq!(per_shard.len(), 3);
        assert!(per_shard.values().all(|&n| n > 700), "{per_shard:?}");
    }

    #[test]
    fn chunk_documents_round_trip() {
        let key = ShardKey::parse(&doc! {"a": "hashed", "b": 1}).unwrap();
        let table = ChunkTable::presplit_hashed(&key, &shards(2), 2);
        let docs = table.to_documents(&key, "db.c");
        assert_eq!(ChunkTable::from_documents(&key, &docs).unwrap(), table);
        assert_eq!(table.version(), ChunkVersion { major: 1, minor: 3 });
    }

    #[test]
    fn chunk_documents_of_earlier_releases_read_with_their_versions() {
        let key = ShardKey::parse(&doc! {"a": 1}).unwrap();
        let docs = vec![
            doc! {"ns": "db.c", "min": {"a": Bson::MinKey}, "max": {"a": 0}, "shard": "shard1", "lastmod": 0_i64},
            doc! {"ns": "db.c", "min": {"a": 0}, "max": {"a": Bson::MaxKey}, "shard": "shard0", "lastmod": 1_i64},
        ];
        let table = ChunkTable::from_documents(&key, &docs).unwrap();
        assert_eq!(table.shards(), vec![shard(1), shard(0)]);
        assert_eq!(table.version(), ChunkVersion { major: 1, minor: 1 });
        let mut unnamed = docs[0].clone();
        unnamed.insert("shard", "elsewhere");
        assert!(ChunkTable::from_documents(&key, &[unnamed, docs[1].clone()]).is_err());
    }

    #[test]
    fn a_table_with_a_gap_is_rejected() {
        let c = |min: Bson, max: Bson| Chunk {
            min: vec![min],
            max: vec![max],
            shard: shard(0),
            version: ChunkVersion::FIRST,
        };
        let gap = vec![
            c(Bson::MinKey, Bson::Int32(5)),
            c(Bson::Int32(6), Bson::MaxKey),
        ];
        assert!(ChunkTable::new(gap).is_err());
    }

    #[test]
    fn range_lookup_uses_half_open_chunks() {
        let c = |min: Bson, max: Bson, s: usize| Chunk {
            min: vec![min],
            max: vec![max],
            shard: shard(s),
            version: ChunkVersion::FIRST,
        };
        let t = ChunkTable::new(vec![
            c(Bson::Int32(10), Bson::MaxKey, 1),
            c(Bson::MinKey, Bson::Int32(10), 0),
        ])
        .unwrap();
        assert_eq!(t.shard_for(&[Bson::Int32(9)]), shard(0));
        assert_eq!(t.shard_for(&[Bson::Int32(10)]), shard(1));
        assert_eq!(t.shard_for(&[Bson::String("x".into())]), shard(1));
        assert_eq!(t.shard_for(&[Bson::Null]), shard(0));
    }
}
