//! Capped collections: insertion ("natural") order, and the oldest documents deleted once the
//! collection outgrows its `size` in bytes or `max` documents.
//!
//! Documents are stored by `_id`, so natural order is kept beside them, in the `Indexes` table
//! under the reserved name `$natural`: UUID ++ `$natural` ++ 0 ++ a big-endian insertion
//! number → BSON `{_id}`, and UUID ++ `$natural` ++ 1 → `{next, bytes, count}`. Scans in natural
//! order (the default for a capped collection, and its tailable cursors) read those entries.
//!
//! Invariants (kept by the write primitives in the document's own commit): every document of a
//! capped collection has exactly one natural entry, numbers only grow, and `bytes` / `count`
//! are the documents' current sizes and their number (an update that resizes a document
//! adjusts `bytes`; the next insert evicts what no longer fits). After an insert commits, the
//! collection is within `size` and `max` (the document just inserted is never the one
//! evicted). Evictions are ordinary deletes, logged after the insert that caused them, so
//! change streams see them as `delete` events.

use bson::{Bson, Document, doc};

use crate::catalog::CollectionEntry;
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageResult, Table};
use crate::writer::{OpResult, WriteCtx};

/// The reserved index name natural-order entries live under.
pub const NATURAL: &str = "$natural";

/// `(size, max)` of a capped collection.
pub fn limits(coll: &CollectionEntry) -> Option<(i64, Option<i64>)> {
    let capped = coll
        .options
        .get("capped")
        .and_then(crate::args::as_bool)
        .unwrap_or(false);
    if !capped {
        return None;
    }
    let num = |f: &str| {
        coll.options
            .get(f)
            .and_then(pipeline::value::as_f64)
            .map(|n| n as i64)
    };
    Some((
        num("size").unwrap_or(i64::MAX),
        num("max").filter(|m| *m > 0),
    ))
}

/// The key prefix of a capped collection's natural entries.
pub fn entries_prefix(coll: &CollectionEntry) -> Vec<u8> {
    let mut k = keys::collection_prefix(&coll.uuid);
    k.extend_from_slice(NATURAL.as_bytes());
    k.push(0);
    k
}

fn stats_key(coll: &CollectionEntry) -> Vec<u8> {
    let mut k = keys::collection_prefix(&coll.uuid);
    k.extend_from_slice(NATURAL.as_bytes());
    k.push(1);
    k
}

#[derive(Default)]
struct Stats {
    next: i64,
    bytes: i64,
    count: i64,
}

fn stats(txn: &dyn ReadTxn, coll: &CollectionEntry) -> StorageResult<Stats> {
    let Some(raw) = txn.get(Table::Indexes, &stats_key(coll))? else {
        return Ok(Stats::default());
    };
    let d = Document::from_reader(raw.as_slice()).unwrap_or_default();
    let get = |f: &str| d.get_i64(f).unwrap_or(0);
    Ok(Stats {
        next: get("next"),
        bytes: get("bytes"),
        count: get("count"),
    })
}

fn save(w: &mut WriteCtx<'_>, coll: &CollectionEntry, s: &Stats) -> StorageResult<()> {
    let mut buf = Vec::new();
    let _ = doc! {"next": s.next, "bytes": s.bytes, "count": s.count}.to_writer(&mut buf);
    w.txn_mut().put(Table::Indexes, &stats_key(coll), &buf)
}

/// The first natural entry: `(key, _id)`.
pub fn oldest(txn: &dyn ReadTxn, coll: &CollectionEntry) -> StorageResult<Option<(Vec<u8>, Bson)>> {
    let mut found = None;
    txn.scan(
        Table::Indexes,
        &KeyRange::prefix(&entries_prefix(coll)),
        false,
        &mut |k, v| {
            let id = Document::from_reader(v)
                .ok()
                .and_then(|d| d.get("_id").cloned())
                .unwrap_or(Bson::Null);
            found = Some((k.to_vec(), id));
            Scan::Stop
        },
    )?;
    Ok(found)
}

/// Refuses a document larger than the capped collection's `size`, as MongoDB's record store
/// does (`BadValue`): it could only stay by evicting every other document and still be over.
pub fn check_fits(coll: &CollectionEntry, doc: &Document) -> Result<(), wire::MongoError> {
    match limits(coll) {
        Some((size, _)) if pipeline::changestream::split::document_size(doc) as i64 > size => Err(
            wire::MongoError::bad_value("object to insert exceeds cappedMaxSize"),
        ),
        _ => Ok(()),
    }
}

/// Records an inserted document in natural order. The caller then deletes the documents
/// [`next_eviction`] names until the collection is within its limits.
pub fn inserted(w: &mut WriteCtx<'_>, coll: &CollectionEntry, doc: &Document) -> OpResult<()> {
    if limits(coll).is_none() {
        return Ok(());
    }
    let mut s = stats(w.txn(), coll)?;
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let mut key = entries_prefix(coll);
    key.extend_from_slice(&(s.next as u64).to_be_bytes());
    let mut buf = Vec::new();
    let _ = doc! {"_id": id.clone()}.to_writer(&mut buf);
    w.txn_mut().put(Table::Indexes, &key, &buf)?;
    s.next += 1;
    s.bytes += pipeline::changestream::split::document_size(doc) as i64;
    s.count += 1;
    save(w, coll, &s)?;
    Ok(())
}

/// The oldest document, while the collection is over its limits after inserting `inserted`
/// (the `_id` just inserted, which is never evicted); `None` once it is within them.
pub fn next_eviction(
    w: &WriteCtx<'_>,
    coll: &CollectionEntry,
    inserted: &Bson,
) -> OpResult<Option<Document>> {
    let Some((size, max)) = limits(coll) else {
        return Ok(None);
    };
    let s = stats(w.txn(), coll)?;
    if s.bytes <= size && max.is_none_or(|m| s.count <= m) {
        return Ok(None);
    }
    let Some((_, oldest_id)) = oldest(w.txn(), coll)? else {
        return Ok(None);
    };
    if pipeline::value::equal(&oldest_id, inserted) {
        return Ok(None);
    }
    Ok(w.get_doc(coll, &oldest_id)?)
}

/// Accounts for an updated document's new size (MongoDB 6.0+ lets updates resize documents
/// of a capped collection; the next insert evicts what no longer fits).
pub fn updated(
    w: &mut WriteCtx<'_>,
    coll: &CollectionEntry,
    old: &Document,
    new: &Document,
) -> OpResult<()> {
    if limits(coll).is_none() {
        return Ok(());
    }
    let size = |d: &Document| pipeline::changestream::split::document_size(d) as i64;
    let grown = size(new) - size(old);
    if grown != 0 {
        let mut s = stats(w.txn(), coll)?;
        s.bytes += grown;
        save(w, coll, &s)?;
    }
    Ok(())
}

/// Forgets a deleted document's natural entry (a scan from the oldest: evictions find it
/// first, other deletes of a capped collection pay for the walk).
pub fn deleted(w: &mut WriteCtx<'_>, coll: &CollectionEntry, doc: &Document) -> OpResult<()> {
    if limits(coll).is_none() {
        return Ok(());
    }
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let mut doomed = None;
    w.txn().scan(
        Table::Indexes,
        &KeyRange::prefix(&entries_prefix(coll)),
        false,
        &mut |k, v| {
            let entry_id = Document::from_reader(v)
                .ok()
                .and_then(|d| d.get("_id").cloned());
            if entry_id.is_some_and(|e| pipeline::value::equal(&e, &id)) {
                doomed = Some(k.to_vec());
                Scan::Stop
            } else {
                Scan::Continue
            }
        },
    )?;
    if let Some(k) = doomed {
        w.txn_mut().delete(Table::Indexes, &k)?;
        let mut s = stats(w.txn(), coll)?;
        s.bytes -= pipeline::changestream::split::document_size(doc) as i64;
        s.count -= 1;
        save(w, coll, &s)?;
    }
    Ok(())
}
