//! `validate: <collection>` on one shard: reads every stored document and index entry of the
//! collection and checks the storage invariants, as mongod's `validate` does.
//!
//! Checks: each document decodes, has an `_id`, and is stored under the key of that `_id`;
//! each materialized index holds exactly the entries of the documents it covers, pointing back
//! at them, and nothing else (`indexes`'s invariant). Indexes that are recorded but not
//! materialized (text, geospatial) have no entries to check and are named in `warnings`.
//!
//! Invariants: reads only, from one snapshot; a broken record is reported, never a panic or
//! an `ok: 0` (an invalid collection is `valid: false` with its `errors`).

use std::collections::BTreeMap;

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply};
use crate::catalog::CollectionEntry;
use crate::indexes;
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, Table};

/// Past this many, errors are counted but not listed.
const MAX_LISTED: usize = 20;

#[derive(Default)]
struct Report {
    records: i64,
    invalid_documents: i64,
    /// Entries found per materialized index.
    entries: BTreeMap<String, i64>,
    /// Entries expected per materialized index (the covered documents' keys).
    expected: BTreeMap<String, i64>,
    errors: Vec<String>,
    error_count: usize,
}

impl Report {
    fn error(&mut self, e: String) {
        self.error_count += 1;
        if self.errors.len() < MAX_LISTED {
            self.errors.push(e);
        }
    }
}

fn storage(e: crate::storage::StorageError) -> MongoError {
    MongoError::internal(format!("storage: {e}"))
}

fn check(txn: &dyn ReadTxn, coll: &CollectionEntry) -> Result<Report, MongoError> {
    let mut report = Report::default();
    for index in indexes::all(coll).iter().filter(|i| i.materialized()) {
        let name = index.name;
        report.entries.insert(name.to_string(), 0);
        report.expected.insert(name.to_string(), 0);
    }
    let prefix = keys::collection_prefix(&coll.uuid);
    let mut expected_entries = Vec::new();
    txn.scan(
        Table::Documents,
        &KeyRange::prefix(&prefix),
        false,
        &mut |k, v| {
            report.records += 1;
            let Ok(d) = Document::from_reader(v) else {
                report.invalid_documents += 1;
                report.error(format!("a record is not valid BSON (key {})", hex(k)));
                return Scan::Continue;
            };
            let Some(id) = d.get("_id") else {
                report.invalid_documents += 1;
                report.error(format!("a document has no _id (key {})", hex(k)));
                return Scan::Continue;
            };
            if keys::doc_key(&coll.uuid, id) != k {
                report.invalid_documents += 1;
                report.error(format!(
                    "the document with _id {id} is stored under another key"
                ));
            }
            for (name, key) in indexes::named_entry_keys(coll, &d) {
                *report.expected.entry(name.to_string()).or_default() += 1;
                expected_entries.push((name.to_string(), key, id.clone()));
            }
            Scan::Continue
        },
    )
    .map_err(storage)?;
    for (name, key, id) in expected_entries {
        let holder = txn.get(Table::Indexes, &key).map_err(storage)?;
        let points_back = holder
            .and_then(|h| Document::from_reader(h.as_slice()).ok())
            .and_then(|h| h.get("_id").cloned())
            .is_some_and(|h| pipeline::value::equal(&h, &id));
        if !points_back {
            report.error(format!(
                "index {name} has no entry for the document with _id {id}"
            ));
        }
    }
    let mut found: Vec<String> = Vec::new();
    txn.scan(
        Table::Indexes,
        &KeyRange::prefix(&prefix),
        false,
        &mut |k, _| {
            // Multikey markers are not entries.
            if let Some(name) = indexes::index_of_entry(coll, k)
                && name != crate::capped::NATURAL
            {
                found.push(name.to_string());
            }
            Scan::Continue
        },
    )
    .map_err(storage)?;
    for name in found {
        match report.entries.get_mut(&name) {
            Some(n) => *n += 1,
            None => report.error(format!("an index entry belongs to no index ({name:?})")),
        }
    }
    let extra: Vec<String> = report
        .entries
        .iter()
        .filter_map(|(name, n)| {
            let expected = report.expected.get(name).copied().unwrap_or(0);
            (*n > expected).then(|| format!("index {name} has {} extra entries", n - expected))
        })
        .collect();
    for e in extra {
        report.error(e);
    }
    Ok(report)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `validate: <collection>` (`full` and `background` are accepted; every check is full).
pub fn validate(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let ns = ctx.ns(&coll);
    ctx.read(|txn, catalog| {
        let Some(entry) = catalog.lookup(&ctx.db, &coll) else {
            return Err(MongoError::new(
                ErrorCode::NAMESPACE_NOT_FOUND,
                format!("Collection '{ns}' does not exist to validate."),
            ));
        };
        let report = check(txn, entry)?;
        let mut keys_per_index = doc! {"_id_": report.records};
        let mut details = doc! {"_id_": {"valid": report.invalid_documents == 0}};
        let mut warnings = Vec::new();
        for spec in &entry.indexes {
            let name = spec.get_str("name").unwrap_or_default();
            match report.entries.get(name) {
                Some(n) => {
                    keys_per_index.insert(name, *n);
                    let ok = report.expected.get(name) == Some(n)
                        && !report
                            .errors
                            .iter()
                            .any(|e| e.contains(&format!("index {name} ")));
                    details.insert(name, doc! {"valid": ok});
                }
                None => warnings.push(Bson::String(format!(
                    "index {name} is not materialized (text and geospatial indexes are not): it has no entries to check"
                ))),
            }
        }
        let valid = report.error_count == 0;
        if report.error_count > report.errors.len() {
            warnings.push(Bson::String(format!(
                "{} more errors not listed",
                report.error_count - report.errors.len()
            )));
        }
        Ok(Reply::read(doc! {
            "ns": &ns,
            "uuid": entry.uuid,
            "nInvalidDocuments": report.invalid_documents,
            "nNonCompliantDocuments": 0_i64,
            "nrecords": report.records,
            "nIndexes": (entry.indexes.len() + 1) as i64,
            "keysPerIndex": keys_per_index,
            "indexDetails": details,
            "valid": valid,
            "repaired": false,
            "warnings": warnings,
            "errors": report.errors,
            "extraIndexEntries": [],
            "missingIndexEntries": [],
            "corruptRecords": [],
            "ok": 1.0,
        }))
    })
}
