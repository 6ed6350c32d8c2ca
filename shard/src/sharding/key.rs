//! A collection's shard key: its fields, each matched by value ranges or by the hash of the
//! value, and the routing key of a document or of a query that pins every field down.
//!
//! Pure. Invariants: a key has 1 to 32 fields, named, each ascending or hashed, at most one
//! hashed; a document's routing key has one value per field (missing is null, hashed where
//! the key says), and never an array.

use bson::{Bson, Document};
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

    /// How many fields the key has.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
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

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    #[test]
    fn equal_numbers_hash_alike() {
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Int64(7)));
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Double(7.0)));
        assert_ne!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Int32(8)));
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
