//! Routing: shard keys, hashed key values, and the chunk table that maps a key to a shard.
//!
//! Pure. Invariants of a [`ChunkTable`]: chunks are sorted by `min`, contiguous (each chunk's
//! `max` is the next one's `min`), and together cover `[MinKey, MaxKey)` in every key field, so
//! every shard-key value maps to exactly one chunk.

use std::cmp::Ordering;

use bson::{Bson, Document, doc};
use pipeline::value;
pub use pipeline::value::hash::hash_value;
use wire::{ErrorCode, MongoError, Result};

/// How one shard-key field is matched: by value ranges or by the hash of the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Range,
    Hashed,
}

/// A collection's shard key, e.g. `{region: 1, _id: "hashed"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardKey {
    fields: Vec<(String, KeyKind)>,
}

impl ShardKey {
    /// Parses a key pattern as `shardCollection` takes it.
    pub fn parse(pattern: &Document) -> Result<ShardKey> {
        if pattern.is_empty() {
            return Err(MongoError::bad_value("Shard key cannot be empty"));
        }
        // A shard key is an index's key pattern: at most 32 fields, as MongoDB's.
        if pattern.len() > 32 {
            return Err(MongoError::new(
                ErrorCode::CANNOT_CREATE_INDEX,
                format!(
                    "A shard key has {} fields; at most 32 are allowed",
                    pattern.len()
                ),
            ));
        }
        let mut fields = Vec::with_capacity(pattern.len());
        for (name, v) in pattern {
            if name.is_empty() || name.starts_with('$') {
                return Err(MongoError::bad_value(format!(
                    "Invalid shard key field name '{name}'"
                )));
            }
            let kind = match v {
                Bson::String(s) if s == "hashed" => KeyKind::Hashed,
                Bson::Int32(1) | Bson::Int64(1) => KeyKind::Range,
                Bson::Double(d) if *d == 1.0 => KeyKind::Range,
                _ => {
                    return Err(MongoError::bad_value(format!(
                        "Shard key {pattern} must be ascending (1) or 'hashed' in every field"
                    )));
                }
            };
            fields.push((name.clone(), kind));
        }
        if fields.iter().filter(|(_, k)| *k == KeyKind::Hashed).count() > 1 {
            return Err(MongoError::bad_value(
                "A shard key may contain at most one hashed field",
            ));
        }
        Ok(ShardKey { fields })
    }

    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(f, _)| f.as_str())
    }

    pub fn is_hashed(&self) -> bool {
        self.fields.iter().any(|(_, k)| *k == KeyKind::Hashed)
    }

    /// The key pattern document (`{a: 1, b: "hashed"}`).
    pub fn pattern(&self) -> Document {
        let mut d = Document::new();
        for (f, k) in &self.fields {
            match k {
                KeyKind::Range => d.insert(f.clone(), 1),
                KeyKind::Hashed => d.insert(f.clone(), "hashed"),
            };
        }
        d
    }

    /// The routing key of a document: each key field's value (missing = null), hashed where the
    /// key says so. Arrays cannot be shard-key values.
    pub fn key_of_document(&self, doc: &Document) -> Result<Vec<Bson>> {
        self.fields
            .iter()
            .map(|(field, kind)| {
                let v = value::get_path(doc, field).cloned().unwrap_or(Bson::Null);
                if matches!(v, Bson::Array(_)) {
                    return Err(MongoError::new(
                        ErrorCode::BAD_VALUE,
                        format!("Shard key cannot contain an array: field '{field}'"),
                    ));
                }
                Ok(self.routed_value(*kind, v))
            })
            .collect()
    }

    /// The routing key a query pins down by equality on every key field, if it does.
    pub fn key_of_query(&self, filter: &Document) -> Option<Vec<Bson>> {
        self.fields
            .iter()
            .map(|(field, kind)| equality_value(filter, field).map(|v| self.routed_value(*kind, v)))
            .collect()
    }

    fn routed_value(&self, kind: KeyKind, v: Bson) -> Bson {
        match kind {
            KeyKind::Range => v,
            KeyKind::Hashed => Bson::Int64(hash_value(&v)),
        }
    }
}

/// The value a filter requires `field` to equal, from `{field: v}`, `{field: {$eq: v}}` or a
/// top-level `$and` of those. Arrays and regexes match more than one value, so they don't count.
fn equality_value(filter: &Document, field: &str) -> Option<Bson> {
    if let Some(v) = filter.get(field) {
        let found = match v {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                if d.len() == 1 {
                    d.get("$eq").cloned()
                } else {
                    None
                }
            }
            other => Some(other.clone()),
        };
        if let Some(found) = found
            && !matches!(found, Bson::Array(_) | Bson::RegularExpression(_))
        {
            return Some(found);
        }
    }
    if let Ok(clauses) = filter.get_array("$and") {
        return clauses
            .iter()
            .filter_map(Bson::as_document)
            .find_map(|clause| equality_value(clause, field));
    }
    None
}

/// One chunk: the key range `[min, max)` (values in key-field order) and the shard that owns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub min: Vec<Bson>,
    pub max: Vec<Bson>,
    pub shard: String,
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
    pub fn single(key: &ShardKey, shard: &str) -> ChunkTable {
        let n = key.fields.len();
        ChunkTable {
            chunks: vec![Chunk {
                min: vec![Bson::MinKey; n],
                max: vec![Bson::MaxKey; n],
                shard: shard.to_string(),
            }],
        }
    }

    /// A hashed key pre-split evenly: `chunks_per_shard` chunks for each shard, in shard order.
    /// The hashed field must be the first key field.
    pub fn presplit_hashed(
        key: &ShardKey,
        shards: &[String],
        chunks_per_shard: usize,
    ) -> ChunkTable {
        let n_fields = key.fields.len();
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
                shard: shards[i * shards.len() / total].clone(),
            })
            .collect();
        ChunkTable { chunks }
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The shard owning a routing key (from [`ShardKey::key_of_document`]).
    pub fn shard_for(&self, key: &[Bson]) -> &str {
        let idx = self
            .chunks
            .partition_point(|c| compare_keys(&c.min, key).is_le())
            .saturating_sub(1);
        &self.chunks[idx].shard
    }

    /// Every shard that owns at least one chunk, without repeats, in first-chunk order.
    pub fn shards(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.chunks {
            if !out.contains(&c.shard) {
                out.push(c.shard.clone());
            }
        }
        out
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
            .enumerate()
            .map(|(i, c)| {
                doc! {
                    "ns": ns,
                    "min": bound(&c.min),
                    "max": bound(&c.max),
                    "shard": &c.shard,
                    "lastmod": i as i64,
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
                Ok(Chunk {
                    min: values(d, "min")?,
                    max: values(d, "max")?,
                    shard: d.get_str("shard").map_err(|_| bad_chunk(d))?.to_string(),
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

    fn shards(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard{i}")).collect()
    }

    #[test]
    fn equal_numbers_hash_alike() {
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Int64(7)));
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Double(7.0)));
        assert_ne!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Int32(8)));
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
            *per_shard
                .entry(table.shard_for(&k).to_string())
                .or_insert(0) += 1;
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
    }

    #[test]
    fn a_table_with_a_gap_is_rejected() {
        let c = |min: Bson, max: Bson| Chunk {
            min: vec![min],
            max: vec![max],
            shard: "s".into(),
        };
        let gap = vec![
            c(Bson::MinKey, Bson::Int32(5)),
            c(Bson::Int32(6), Bson::MaxKey),
        ];
        assert!(ChunkTable::new(gap).is_err());
    }

    #[test]
    fn range_lookup_uses_half_open_chunks() {
        let c = |min: Bson, max: Bson, s: &str| Chunk {
            min: vec![min],
            max: vec![max],
            shard: s.into(),
        };
        let t = ChunkTable::new(vec![
            c(Bson::Int32(10), Bson::MaxKey, "b"),
            c(Bson::MinKey, Bson::Int32(10), "a"),
        ])
        .unwrap();
        assert_eq!(t.shard_for(&[Bson::Int32(9)]), "a");
        assert_eq!(t.shard_for(&[Bson::Int32(10)]), "b");
        assert_eq!(t.shard_for(&[Bson::String("x".into())]), "b");
        assert_eq!(t.shard_for(&[Bson::Null]), "a");
    }

    #[test]
    fn queries_target_only_with_equality_on_every_key_field() {
        let key = ShardKey::parse(&doc! {"a": 1, "b": 1}).unwrap();
        assert_eq!(
            key.key_of_query(&doc! {"a": 1, "b": {"$eq": 2}}),
            Some(vec![Bson::Int32(1), Bson::Int32(2)])
        );
        assert_eq!(key.key_of_query(&doc! {"a": 1}), None);
        assert_eq!(key.key_of_query(&doc! {"a": 1, "b": {"$gt": 2}}), None);
        assert_eq!(key.key_of_query(&doc! {"a": [1, 2], "b": 1}), None);
        assert_eq!(
            key.key_of_query(&doc! {"$and": [{"a": 1}, {"b": 2}]}),
            Some(vec![Bson::Int32(1), Bson::Int32(2)])
        );
    }
}
