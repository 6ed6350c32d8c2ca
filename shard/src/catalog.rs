//! The catalog: which collections exist, with their UUIDs, options, index specs and shard keys.
//!
//! The writer owns the only mutable copy while a batch runs and publishes it (an `Arc` swap)
//! after the batch commits, so readers always see the catalog of a committed state. Each entry is
//! persisted in [`Table::Catalog`](crate::storage::Table::Catalog) under its namespace, in the
//! same commit as the oplog entry of the DDL that changed it.
//!
//! Invariants: a namespace maps to at most one collection; UUIDs are unique among live
//! collections; a database exists exactly when it has at least one collection; the `_id_` index
//! is implicit and never stored in `indexes`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::{Bson, Document, Uuid, doc};
use wire::{ErrorCode, MongoError};

/// One collection.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionEntry {
    pub db: String,
    pub name: String,
    pub uuid: Uuid,
    /// `create` options as given (without `create` and internal fields).
    pub options: Document,
    /// Index specs other than `_id_`, each `{v: 2, key, name, ...}`.
    pub indexes: Vec<Document>,
    /// The shard key pattern, when the collection is sharded.
    pub shard_key: Option<Document>,
    pub unique_shard_key: bool,
}

impl CollectionEntry {
    /// Whether its updates, replaces and deletes keep change-stream pre-images
    /// (`changeStreamPreAndPostImages: {enabled: true}`).
    pub fn records_pre_images(&self) -> bool {
        self.options
            .get_document("changeStreamPreAndPostImages")
            .is_ok_and(|o| o.get_bool("enabled").unwrap_or(false))
    }

    /// The collection's default collation (`None`: simple), which commands and new indexes
    /// without one of their own take.
    pub fn collation(&self) -> Option<pipeline::collation::Collation> {
        let spec = self.options.get_document("collation").ok()?;
        pipeline::collation::Collation::parse_doc(spec)
            .ok()
            .flatten()
    }

    pub fn new(db: &str, name: &str, uuid: Uuid, options: Document) -> Self {
        CollectionEntry {
            db: db.to_string(),
            name: name.to_string(),
            uuid,
            options,
            indexes: Vec::new(),
            shard_key: None,
            unique_shard_key: false,
        }
    }

    pub fn ns(&self) -> String {
        format!("{}.{}", self.db, self.name)
    }

    pub fn id_index() -> Document {
        doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    }

    /// Every index spec, `_id_` first.
    pub fn all_indexes(&self) -> Vec<Document> {
        let mut v = vec![Self::id_index()];
        v.extend(self.indexes.iter().cloned());
        v
    }

    /// The document key of `doc`: `{_id}` unsharded; shard-key fields in key order then `_id`
    /// (unless the key contains `_id`) when sharded. Missing shard-key fields are omitted, as
    /// MongoDB does for documents inserted before sharding.
    pub fn document_key(&self, doc: &Document) -> Document {
        let mut key = Document::new();
        let mut has_id = false;
        if let Some(pattern) = &self.shard_key {
            for (field, _) in pattern {
                if field == "_id" {
                    has_id = true;
                }
                if let Some(v) = get_dotted(doc, field) {
                    key.insert(field.clone(), v.clone());
                }
            }
        }
        if !has_id && let Some(id) = doc.get("_id") {
            key.insert("_id", id.clone());
        }
        key
    }

    /// The top-level (or dotted) fields an update may not change: the shard key's.
    pub fn immutable_paths(&self) -> Vec<String> {
        match &self.shard_key {
            Some(k) => k.keys().cloned().collect(),
            None => Vec::new(),
        }
    }

    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "db": &self.db,
            "name": &self.name,
            "uuid": self.uuid,
            "options": self.options.clone(),
            "indexes": self.indexes.iter().cloned().map(Bson::Document).collect::<Vec<_>>(),
            "unique": self.unique_shard_key,
        };
        if let Some(k) = &self.shard_key {
            d.insert("shardKey", k.clone());
        }
        d
    }

    pub fn from_document(d: &Document) -> Option<CollectionEntry> {
        let uuid = match d.get("uuid")? {
            Bson::Binary(b) => b.to_uuid().ok()?,
            _ => return None,
        };
        Some(CollectionEntry {
            db: d.get_str("db").ok()?.to_string(),
            name: d.get_str("name").ok()?.to_string(),
            uuid,
            options: d.get_document("options").ok()?.clone(),
            indexes: d
                .get_array("indexes")
                .ok()?
                .iter()
                .filter_map(|b| b.as_document().cloned())
                .collect(),
            shard_key: d.get_document("shardKey").ok().cloned(),
            unique_shard_key: d.get_bool("unique").unwrap_or(false),
        })
    }
}

/// The value at a dotted path, without array traversal.
pub fn get_dotted<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut cur = doc.get(first)?;
    for p in parts {
        cur = match cur {
            Bson::Document(d) => d.get(p)?,
            Bson::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// All collections of the shard, by namespace.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    colls: BTreeMap<String, Arc<CollectionEntry>>,
}

impl Catalog {
    pub fn get(&self, ns: &str) -> Option<&Arc<CollectionEntry>> {
        self.colls.get(ns)
    }

    pub fn lookup(&self, db: &str, coll: &str) -> Option<&Arc<CollectionEntry>> {
        self.colls.get(&format!("{db}.{coll}"))
    }

    pub fn put(&mut self, entry: CollectionEntry) {
        self.colls.insert(entry.ns(), Arc::new(entry));
    }

    pub fn remove(&mut self, ns: &str) -> Option<Arc<CollectionEntry>> {
        self.colls.remove(ns)
    }

    pub fn collections(&self) -> impl Iterator<Item = &Arc<CollectionEntry>> {
        self.colls.values()
    }

    pub fn collections_in<'a>(
        &'a self,
        db: &'a str,
    ) -> impl Iterator<Item = &'a Arc<CollectionEntry>> + 'a {
        self.colls.values().filter(move |c| c.db == db)
    }

    /// Database names with at least one collection, sorted.
    pub fn databases(&self) -> Vec<String> {
        let mut v: Vec<String> = self.colls.values().map(|c| c.db.clone()).collect();
        v.dedup();
        v.sort();
        v.dedup();
        v
    }
}

/// Validates a database name as MongoDB does.
pub fn check_db_name(db: &str) -> Result<(), MongoError> {
    if db.is_empty()
        || db.len() >= 64
        || db
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0'))
    {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid database name: '{db}'"),
        ));
    }
    Ok(())
}

/// Validates a collection name for writes as MongoDB does.
pub fn check_coll_name(db: &str, coll: &str) -> Result<(), MongoError> {
    check_db_name(db)?;
    if coll.is_empty() || coll.contains('$') || coll.contains('\0') || coll.starts_with('.') {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid namespace specified '{db}.{coll}'"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_key_puts_shard_key_fields_first_then_id() {
        let mut c = CollectionEntry::new("d", "c", Uuid::new(), Document::new());
        let d = doc! {"x": 1, "_id": 5, "a": {"b": 2}};
        assert_eq!(c.document_key(&d), doc! {"_id": 5});
        c.shard_key = Some(doc! {"a.b": 1, "x": "hashed"});
        assert_eq!(c.document_key(&d), doc! {"a.b": 2, "x": 1, "_id": 5});
        c.shard_key = Some(doc! {"_id": 1, "x": 1});
        assert_eq!(c.document_key(&d), doc! {"_id": 5, "x": 1});
    }

    #[test]
    fn entry_round_trips_through_bson() {
        let mut c = CollectionEntry::new("d", "c", Uuid::new(), doc! {"capped": false});
        c.indexes
            .push(doc! {"v": 2, "key": {"a": 1}, "name": "a_1"});
        c.shard_key = Some(doc! {"a": 1});
        assert_eq!(CollectionEntry::from_document(&c.to_document()), Some(c));
    }
}
