//! Secondary indexes: their entries, written in the same storage transaction as the document
//! change that causes them, and the key encoding the query planner ([`plan`]) scans.
//!
//! Layout (table [`Table::Indexes`]): an entry's key is the collection's UUID ++ the index name
//! ++ 0 ++ one KeyString per key field (its bytes inverted for a descending field; a hashed
//! field holds the KeyString of the value's 64-bit hash) ++, for a non-unique index, the
//! KeyString of the document's `_id`. Its value is BSON `{_id, k: [key values]}`. A unique
//! index's key has no `_id`, so a point lookup finds the one document holding a key. Because
//! every KeyString is prefix-free and orders as MongoDB compares values, the entries of one
//! index sort in the index's order.
//!
//! An index with a collation stores each string as its collation key ([`pipeline::collation::Collation::fold`]), so
//! its order and its unique constraint are the collation's.
//!
//! A document with an array on an indexed path has one entry per element (multikey; an empty
//! array is indexed as `undefined`, a missing field as `null`). The first such document also
//! writes the index's multikey marker (UUID ++ name ++ 1), which is never cleared: the planner
//! neither intersects range bounds on a multikey index nor lets it provide a sort.
//!
//! Invariants: for every materialized index (see [`Index::materialized`]) and every document it
//! covers ([`covers`]: sparse and partial indexes skip some), exactly that document's entries
//! exist, and no others; `_id_` has none (the documents table is keyed by `_id`). Text and
//! geospatial indexes are recorded in the catalog but not materialized.

pub mod plan;

use std::collections::BTreeSet;

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError};

use crate::catalog::{CollectionEntry, get_dotted};
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table, WriteTxn};

/// One index entry of a document: its storage key and its key values.
pub type Entry = (Vec<u8>, Vec<Bson>);

/// How one key field orders its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ascending,
    Descending,
    Hashed,
}

/// One secondary index of a collection, as its catalog spec describes it.
#[derive(Debug, Clone)]
pub struct Index<'a> {
    pub name: &'a str,
    pub spec: &'a Document,
    pub pattern: &'a Document,
    pub unique: bool,
    /// The key fields, or `None` when a field is of a kind that is not materialized.
    fields: Option<Vec<(&'a str, Direction)>>,
}

fn flag(spec: &Document, field: &str) -> bool {
    spec.get(field)
        .and_then(crate::args::as_bool)
        .unwrap_or(false)
}

impl<'a> Index<'a> {
    fn new(spec: &'a Document) -> Option<Index<'a>> {
        let pattern = spec.get_document("key").ok()?;
        let name = spec.get_str("name").ok()?;
        let fields = pattern
            .iter()
            .map(|(f, v)| {
                let dir = match v {
                    Bson::String(s) if s == "hashed" => Direction::Hashed,
                    Bson::String(_) => return None,
                    other => match pipeline::value::as_f64(other) {
                        Some(n) if n < 0.0 => Direction::Descending,
                        _ => Direction::Ascending,
                    },
                };
                Some((f.as_str(), dir))
            })
            .collect();
        Some(Index {
            name,
            spec,
            pattern,
            unique: flag(spec, "unique"),
            fields,
        })
    }

    /// Whether the index has entries (text and geospatial indexes do not).
    pub fn materialized(&self) -> bool {
        self.fields.is_some()
    }

    pub fn fields(&self) -> &[(&'a str, Direction)] {
        self.fields.as_deref().unwrap_or(&[])
    }

    pub fn sparse(&self) -> bool {
        flag(self.spec, "sparse")
    }

    pub fn partial(&self) -> Option<&'a Document> {
        self.spec.get_document("partialFilterExpression").ok()
    }

    /// The index's collation (`None`: simple). Its string keys are this collation's keys.
    pub fn collation(&self) -> Option<pipeline::collation::Collation> {
        let spec = self.spec.get_document("collation").ok()?;
        pipeline::collation::Collation::parse_doc(spec)
            .ok()
            .flatten()
    }

    /// The TTL of a TTL index, in seconds.
    pub fn expire_after_seconds(&self) -> Option<i64> {
        let v = self.spec.get("expireAfterSeconds")?;
        pipeline::value::as_f64(v).map(|s| s as i64)
    }

    /// The storage key prefix of this index's entries.
    pub fn prefix(&self, coll: &CollectionEntry) -> Vec<u8> {
        let mut k = keys::collection_prefix(&coll.uuid);
        k.extend_from_slice(self.name.as_bytes());
        k.push(0);
        k
    }

    fn multikey_marker(&self, coll: &CollectionEntry) -> Vec<u8> {
        let mut k = keys::collection_prefix(&coll.uuid);
        k.extend_from_slice(self.name.as_bytes());
        k.push(1);
        k
    }

    /// Whether some document has given this index more than one entry.
    pub fn is_multikey(&self, txn: &dyn ReadTxn, coll: &CollectionEntry) -> StorageResult<bool> {
        Ok(txn
            .get(Table::Indexes, &self.multikey_marker(coll))?
            .is_some())
    }

    /// The entries of `doc` in this index (none when the index does not cover it): each with
    /// its key values, deduplicated. Fails for parallel arrays and arrays under a hashed field.
    pub fn entries(
        &self,
        coll: &CollectionEntry,
        doc: &Document,
    ) -> Result<(Vec<Entry>, bool), MongoError> {
        if !self.materialized() || !covers(self.spec, self.pattern, doc) {
            return Ok((Vec::new(), false));
        }
        let mut per_field = Vec::with_capacity(self.fields().len());
        let mut array_fields = Vec::new();
        for (field, dir) in self.fields() {
            let mut values = Vec::new();
            let is_array = path_values(doc, field, &mut values);
            if is_array {
                if *dir == Direction::Hashed {
                    return Err(MongoError::new(
                        ErrorCode {
                            code: 16766,
                            name: "Location16766",
                        },
                        "Error: hashed indexes do not currently support array values",
                    ));
                }
                array_fields.push(*field);
            }
            per_field.push(values);
        }
        if array_fields.len() > 1 {
            return Err(MongoError::new(
                ErrorCode {
                    code: 171,
                    name: "CannotIndexParallelArrays",
                },
                format!(
                    "cannot index parallel arrays [{}] [{}]",
                    array_fields[1], array_fields[0]
                ),
            ));
        }
        if let Some(c) = self.collation() {
            for values in &mut per_field {
                for v in values.iter_mut() {
                    *v = c.fold(v);
                }
            }
        }
        let prefix = self.prefix(coll);
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        // At most one field has several values (parallel arrays are refused above).
        let mut tuples: Vec<Vec<Bson>> = vec![Vec::new()];
        for values in per_field {
            tuples = tuples
                .into_iter()
                .flat_map(|t| {
                    values.iter().map(move |v| {
                        let mut t = t.clone();
                        t.push(v.clone());
                        t
                    })
                })
                .collect();
        }
        for tuple in tuples {
            let mut key = prefix.clone();
            for ((_, dir), v) in self.fields().iter().zip(&tuple) {
                append_key(&mut key, *dir, v);
            }
            if !self.unique {
                key.extend_from_slice(&resume::keystring::key_bytes(&id));
            }
            if seen.insert(key.clone()) {
                out.push((key, tuple));
            }
        }
        Ok((out, !array_fields.is_empty()))
    }
}

/// Appends one key field's bytes for `value`.
pub fn append_key(key: &mut Vec<u8>, dir: Direction, value: &Bson) {
    match dir {
        Direction::Ascending => key.extend_from_slice(&resume::keystring::key_bytes(value)),
        Direction::Descending => {
            key.extend(resume::keystring::key_bytes(value).into_iter().map(|b| !b))
        }
        Direction::Hashed => key.extend_from_slice(&resume::keystring::key_bytes(&Bson::Int64(
            pipeline::value::hash::hash_value(value),
        ))),
    }
}

/// Collects the values an index key field takes in `doc` (one per array element along the
/// path; `undefined` for an empty array; `null` when the path is missing); returns whether
/// an array was expanded.
fn path_values(doc: &Document, path: &str, out: &mut Vec<Bson>) -> bool {
    let mut is_array = false;
    collect(doc, path, out, &mut is_array);
    if out.is_empty() {
        out.push(Bson::Null);
    }
    is_array
}

fn collect(doc: &Document, path: &str, out: &mut Vec<Bson>, is_array: &mut bool) {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let Some(v) = doc.get(head) else {
        out.push(Bson::Null);
        return;
    };
    match (v, rest) {
        (Bson::Array(items), None) => {
            *is_array = true;
            if items.is_empty() {
                out.push(Bson::Undefined);
            }
            for item in items {
                if !out
                    .iter()
                    .any(|o| pipeline::value::equal(o, item) && same_type(o, item))
                {
                    out.push(item.clone());
                }
            }
        }
        (other, None) => out.push(other.clone()),
        (Bson::Document(d), Some(rest)) => collect(d, rest, out, is_array),
        (Bson::Array(items), Some(rest)) => {
            if rest
                .split('.')
                .next()
                .is_some_and(|p| p.parse::<usize>().is_ok())
            {
                // "a.0.b": a numeric component addresses one element.
                out.push(get_dotted(doc, path).cloned().unwrap_or(Bson::Null));
                return;
            }
            *is_array = true;
            let before = out.len();
            for item in items {
                if let Bson::Document(d) = item {
                    collect(d, rest, out, is_array);
                }
            }
            if out.len() == before {
                out.push(Bson::Null);
            }
        }
        (_, Some(_)) => out.push(Bson::Null),
    }
}

fn same_type(a: &Bson, b: &Bson) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The collection's secondary indexes (every index but `_id_`), materialized or not.
pub fn all(coll: &CollectionEntry) -> Vec<Index<'_>> {
    coll.indexes
        .iter()
        .filter_map(Index::new)
        .filter(|i| i.name != "_id_")
        .collect()
}

fn materialized(coll: &CollectionEntry) -> impl Iterator<Item = Index<'_>> {
    all(coll).into_iter().filter(Index::materialized)
}

/// The unique secondary indexes of a collection: `(spec, key pattern, name)`.
pub fn unique_indexes(coll: &CollectionEntry) -> Vec<(&Document, &Document, &str)> {
    materialized(coll)
        .filter(|i| i.unique)
        .map(|i| (i.spec, i.pattern, i.name))
        .collect()
}

/// Whether an index has an entry for `doc`: sparse indexes skip documents missing every key
/// field, partial indexes those not matching `partialFilterExpression`.
pub fn covers(spec: &Document, pattern: &Document, doc: &Document) -> bool {
    if flag(spec, "sparse") && pattern.keys().all(|f| get_dotted(doc, f).is_none()) {
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

/// The storage keys of `doc`'s entries in its collection's unique indexes (the keys another
/// writer must not hold while this one writes `doc`).
pub fn entry_keys(coll: &CollectionEntry, doc: &Document) -> Vec<Vec<u8>> {
    materialized(coll)
        .filter(|i| i.unique)
        .flat_map(|i| i.entries(coll, doc).map(|(e, _)| e).unwrap_or_default())
        .map(|(key, _)| key)
        .collect()
}

/// Every entry key of `doc` in every materialized index, with the index's name.
pub fn named_entry_keys<'a>(coll: &'a CollectionEntry, doc: &Document) -> Vec<(&'a str, Vec<u8>)> {
    materialized(coll)
        .flat_map(|i| {
            let name = i.name;
            i.entries(coll, doc)
                .map(|(e, _)| e)
                .unwrap_or_default()
                .into_iter()
                .map(move |(key, _)| (name, key))
        })
        .collect()
}

/// The index name an entry's storage key belongs to (of a collection's entries); `None` for
/// a multikey marker.
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

/// The first unique index on which another document already holds one of `doc`'s keys.
/// Fails when `doc` cannot be indexed at all (parallel arrays, an array under a hashed key).
pub fn find_conflict(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    doc: &Document,
) -> Result<Option<Conflict>, crate::write::OpError> {
    let id = id_of(doc);
    for index in materialized(coll) {
        let (entries, _) = index.entries(coll, doc)?;
        if !index.unique {
            continue;
        }
        for (key, values) in entries {
            let Some(holder) = txn.get(Table::Indexes, &key)? else {
                continue;
            };
            let holder_id = Document::from_reader(holder.as_slice())
                .ok()
                .and_then(|d| d.get("_id").cloned())
                .unwrap_or(Bson::Null);
            if !pipeline::value::equal(&holder_id, &id) {
                let shown = index
                    .pattern
                    .keys()
                    .cloned()
                    .zip(values)
                    .collect::<Document>();
                return Ok(Some((index.name.to_string(), index.pattern.clone(), shown)));
            }
        }
    }
    Ok(None)
}

fn entry_value(id: &Bson, values: Vec<Bson>) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = doc! {"_id": id.clone(), "k": values}.to_writer(&mut buf);
    buf
}

/// Every entry `doc` has, per index: `(index, entries, multikey)`.
type DocEntries<'a> = Vec<(Index<'a>, Vec<Entry>, bool)>;

fn doc_entries<'a>(
    coll: &'a CollectionEntry,
    doc: &Document,
) -> Result<DocEntries<'a>, MongoError> {
    materialized(coll)
        .map(|i| {
            let (e, multi) = i.entries(coll, doc)?;
            Ok((i, e, multi))
        })
        .collect()
}

fn mark_multikey(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    index: &Index<'_>,
) -> StorageResult<()> {
    if !index.is_multikey(&*txn, coll)? {
        txn.put(Table::Indexes, &index.multikey_marker(coll), &[])?;
    }
    Ok(())
}

/// Adds `doc`'s entries (after [`find_conflict`] found none).
pub fn add(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    doc: &Document,
) -> Result<(), crate::write::OpError> {
    let id = id_of(doc);
    for (index, entries, multi) in doc_entries(coll, doc)? {
        if multi {
            mark_multikey(txn, coll, &index)?;
        }
        for (key, values) in entries {
            txn.put(Table::Indexes, &key, &entry_value(&id, values))?;
        }
    }
    Ok(())
}

/// Removes `doc`'s entries.
pub fn remove(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    doc: &Document,
) -> Result<(), crate::write::OpError> {
    for (_, entries, _) in doc_entries(coll, doc)? {
        for (key, _) in entries {
            txn.delete(Table::Indexes, &key)?;
        }
    }
    Ok(())
}

/// Replaces `old`'s entries with `new`'s, touching only the keys that change.
pub fn update(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    old: &Document,
    new: &Document,
) -> Result<(), crate::write::OpError> {
    let id = id_of(new);
    let before = doc_entries(coll, old)?;
    for ((index, after, multi), (_, before, _)) in doc_entries(coll, new)?.into_iter().zip(before) {
        if multi {
            mark_multikey(txn, coll, &index)?;
        }
        let kept: BTreeSet<&Vec<u8>> = after.iter().map(|(k, _)| k).collect();
        for (key, _) in &before {
            if !kept.contains(key) {
                txn.delete(Table::Indexes, key)?;
            }
        }
        let had: BTreeSet<&Vec<u8>> = before.iter().map(|(k, _)| k).collect();
        for (key, values) in after {
            // A unique entry's holder stays the same document; a non-unique key holds `_id`.
            // Key values of equal keys can differ in type (1 vs 1.0): rewrite those too.
            if !had.contains(&key) || !index.unique {
                txn.put(Table::Indexes, &key, &entry_value(&id, values))?;
            }
        }
    }
    Ok(())
}

fn delete_range(txn: &mut dyn WriteTxn, range: &KeyRange) -> StorageResult<()> {
    let mut doomed = Vec::new();
    txn.scan(Table::Indexes, range, false, &mut |k, _| {
        doomed.push(k.to_vec());
        Scan::Continue
    })?;
    for k in doomed {
        txn.delete(Table::Indexes, &k)?;
    }
    Ok(())
}

/// Removes every entry (and the multikey marker) of one index.
pub fn drop_index(txn: &mut dyn WriteTxn, coll: &CollectionEntry, name: &str) -> StorageResult<()> {
    let mut prefix = keys::collection_prefix(&coll.uuid);
    prefix.extend_from_slice(name.as_bytes());
    delete_range(txn, &KeyRange::prefix(&[prefix.as_slice(), &[0]].concat()))?;
    txn.delete(Table::Indexes, &[prefix.as_slice(), &[1]].concat())?;
    Ok(())
}

/// Removes every entry of every index of a collection.
pub fn drop_all(txn: &mut dyn WriteTxn, coll: &CollectionEntry) -> StorageResult<()> {
    delete_range(txn, &KeyRange::prefix(&keys::collection_prefix(&coll.uuid)))
}

/// Why an index could not be built.
pub enum BuildError {
    /// A unique index over documents sharing a key: that key, as `{field: value}`.
    Duplicate(Document),
    Op(crate::write::OpError),
}

impl From<crate::write::OpError> for BuildError {
    fn from(e: crate::write::OpError) -> Self {
        BuildError::Op(e)
    }
}

impl From<MongoError> for BuildError {
    fn from(e: MongoError) -> Self {
        BuildError::Op(e.into())
    }
}

impl From<crate::storage::StorageError> for BuildError {
    fn from(e: crate::storage::StorageError) -> Self {
        BuildError::Op(e.into())
    }
}

/// Builds a new index over the existing documents. Fails (and the caller fails the whole
/// DDL, so nothing it wrote is kept) on a duplicate key of a unique index or a document the
/// index cannot hold.
pub fn build(
    txn: &mut dyn WriteTxn,
    coll: &CollectionEntry,
    spec: &Document,
) -> Result<(), BuildError> {
    let Some(index) = Index::new(spec).filter(Index::materialized) else {
        return Ok(());
    };
    let mut docs = Vec::new();
    crate::documents::scan_collection(&*txn, coll, &mut |d| {
        if covers(spec, index.pattern, &d) {
            docs.push(d);
        }
        Scan::Continue
    })?;
    let mut seen = BTreeSet::new();
    let mut multikey = false;
    let mut all = Vec::with_capacity(docs.len());
    for d in &docs {
        let (entries, multi) = index.entries(coll, d)?;
        multikey |= multi;
        for (key, values) in entries {
            if index.unique && !seen.insert(key.clone()) {
                return Err(BuildError::Duplicate(
                    index.pattern.keys().cloned().zip(values).collect(),
                ));
            }
            all.push((key, entry_value(&id_of(d), values)));
        }
    }
    if multikey {
        mark_multikey(txn, coll, &index)?;
    }
    for (key, value) in all {
        txn.put(Table::Indexes, &key, &value)?;
    }
    Ok(())
}
