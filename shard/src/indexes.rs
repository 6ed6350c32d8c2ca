//! Unique secondary indexes: one storage entry per indexed document, so uniqueness is checked
//! with a point lookup instead of a collection scan.
//!
//! Invariants (maintained by the write primitives, in the same transaction as the document
//! change): for every unique index of a collection and every document the index covers (see
//! [`covers`]: sparse and partial indexes skip some), there is exactly one entry keyed by the
//! document's key values, holding its `_id`; no other entries exist for that index. `_id_` is
//! not stored here (the documents table is keyed by `_id`).

use bson::{Bson, Document, doc};

use crate::catalog::{CollectionEntry, get_dotted};
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table, WriteTxn};

/// The unique secondary indexes of a collection: `(spec, key pattern, name)`.
pub fn unique_indexes(coll: &CollectionEntry) -> Vec<(&Document, &Document, &str)> {
    coll.indexes
        .iter()
        .filter(|s| {
            s.get("unique")
                .and_then(crate::commands::as_bool)
                .unwrap_or(false)
        })
        .filter_map(|s| Some((s, s.get_document("key").ok()?, s.get_str("name").ok()?)))
        .collect()
}

/// Whether an index has an entry for `doc`: sparse indexes skip documents missing every key
/// field, partial indexes those not matching `partialFilterExpression`.
pub fn covers(spec: &Document, pattern: &Document, doc: &Document) -> bool {
    if spec
        .get("sparse")
        .and_then(crate::commands::as_bool)
        .unwrap_or(false)
        && pattern.keys().all(|f| get_dotted(doc, f).is_none())
    {
        return false;
    }
    if let Ok(pfe) = spec.get_document("partialFilterExpression") {
        return pipeline::Matcher::parse(pfe).is_ok_and(|m| m.matches(doc));
    }
    true
}

/// The values of an index's key fields in `doc` (missing → null), as `{field: value}`.
pub fn key_value(pattern: &Document, doc: &Document) -> Document {
    let mut out = Document::new();
    for (f, _) in pattern {
        out.insert(f.clone(), get_dotted(doc, f).cloned().unwrap_or(Bson::Null));
    }
    out
}

fn index_prefix(coll: &CollectionEntry, name: &str) -> Vec<u8> {
    let mut k = keys::collection_prefix(&coll.uuid);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k
}

fn entry_key(coll: &CollectionEntry, name: &str, value: &Document) -> Vec<u8> {
    let mut k = index_prefix(coll, name);
    let values: Vec<Bson> = value.values().cloned().collect();
    k.extend_from_slice(&resume::keystring::key_bytes(&Bson::Array(values)));
    k
}

/// The storage keys of `doc`'s entries in its collection's unique indexes.
pub fn entry_keys(coll: &CollectionEntry, doc: &Document) -> Vec<Vec<u8>> {
    named_entry_keys(coll, doc)
        .into_iter()
        .map(|(_, key)| key)
        .collect()
}

/// [`entry_keys`], each with its index's name.
pub fn named_entry_keys<'a>(coll: &'a CollectionEntry, doc: &Document) -> Vec<(&'a str, Vec<u8>)> {
    unique_indexes(coll)
        .into_iter()
        .filter(|(spec, pattern, _)| covers(spec, pattern, doc))
        .map(|(_, pattern, name)| (name, entry_key(coll, name, &key_value(pattern, doc))))
        .collect()
}

/// The index name an entry's storage key belongs to (of a collection's entries).
pub fn index_of_entry<'k>(coll: &CollectionEntry, key: &'k [u8]) -> Option<&'k str> {
    let rest = key.strip_prefix(keys::collection_prefix(&coll.uuid).as_slice())?;
    let end = rest.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

fn id_of(doc: &Document) -> Bson {
    doc.get("_id").cloned().unwrap_or(Bson::Null)
}

/// A unique index `doc` would violate: `(name, pattern, key value)`.
pub type Conflict = (String, Document, Document);

/// The first unique index on which another document already holds `doc`'s key.
pub fn find_conflict(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    doc: &Document,
) -> StorageResult<Option<Conflict>> {
    let id = id_of(doc);
    for (spec, pattern, name) in unique_indexes(coll) {
        if !covers(spec, pattern, doc) {
            continue;
        }
        let value = key_value(pattern, doc);
        if let Some(holder) = txn.get(Table::UniqueIndexes, &entry_key(coll, name, &value))? {
            let holder_id = Document::from_reader(holder.as_slice())
                .ok()
                .and_then(|d| d.get("_id").cloned())
                .unwrap_or(Bson::Null);
            if !pipeline::value::equal(&holder_id, &id) {
                return Ok(Some((name.to_string(), pattern.clone(), value)));
            }
        }
    }
    Ok(None)
}

fn put_entry(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    name: &str,
    pattern: &Document,
    doc: &Document,
) -> StorageResult<()> {
    let mut buf = Vec::new();
    let _ = doc! {"_id": id_of(doc)}.to_writer(&mut buf);
    txn.put(
        Table::UniqueIndexes,
        &entry_key(coll, name, &key_value(pattern, doc)),
        &buf,
    )
}

/// Adds `doc`'s entries (after [`find_conflict`] found none).
pub fn add(txn: &mut dyn WriteTxn, coll: &CollectionEntry, doc: &Document) -> StorageResult<()> {
    for (spec, pattern, name) in unique_indexes(coll) {
        if covers(spec, pattern, doc) {
            put_entry(txn, coll, name, pattern, doc)?;
        }
    }
    Ok(())
}

/// Removes `doc`'s entries.
pub fn remove(txn: &mut dyn WriteTxn, coll: &CollectionEntry, doc: &Document) -> StorageResult<()> {
    for (spec, pattern, name) in unique_indexes(coll) {
        if covers(spec, pattern, doc) {
            txn.delete(
                Table::UniqueIndexes,
                &entry_key(coll, name, &key_value(pattern, doc)),
            )?;
        }
    }
    Ok(())
}

fn delete_range(txn: &mut dyn WriteTxn, range: &KeyRange) -> StorageResult<()> {
    let mut doomed = Vec::new();
    txn.scan(Table::UniqueIndexes, range, false, &mut |k, _| {
        doomed.push(k.to_vec());
        Scan::Continue
    })?;
    for k in doomed {
        txn.delete(Table::UniqueIndexes, &k)?;
    }
    Ok(())
}

/// Removes every entry of one index.
pub fn drop_index(txn: &mut dyn WriteTxn, coll: &CollectionEntry, name: &str) -> StorageResult<()> {
    delete_range(txn, &KeyRange::prefix(&index_prefix(coll, name)))
}

/// Removes every entry of every index of a collection.
pub fn drop_all(txn: &mut dyn WriteTxn, coll: &CollectionEntry) -> StorageResult<()> {
    delete_range(txn, &KeyRange::prefix(&keys::collection_prefix(&coll.uuid)))
}

/// Builds a new unique index over the existing documents; returns the first duplicate key
/// instead (and then writes nothing the caller keeps: it fails the whole DDL).
pub fn build(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    spec: &Document,
) -> StorageResult<Option<Document>> {
    let (Ok(pattern), Ok(name)) = (spec.get_document("key"), spec.get_str("name")) else {
        return Ok(None);
    };
    let mut docs = Vec::new();
    crate::writer::scan_collection(&*txn, coll, &mut |d| {
        if covers(spec, pattern, &d) {
            docs.push(d);
        }
        Scan::Continue
    })?;
    // Check everything first so a duplicate leaves no entries behind.
    let mut seen = std::collections::HashSet::new();
    for d in &docs {
        if !seen.insert(entry_key(coll, name, &key_value(pattern, d))) {
            return Ok(Some(key_value(pattern, d)));
        }
    }
    for d in &docs {
        put_entry(txn, coll, name, pattern, d)?;
    }
    Ok(None)
}
