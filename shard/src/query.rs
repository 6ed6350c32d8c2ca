//! Query evaluation over a collection snapshot: filters, the plan the planner
//! (`indexes::plan`) chooses for them, carried out over the documents table or an index,
//! sorts, skip/limit and projections. Pure apart from reading the given transaction.
//!
//! Invariants: a query over a [`ReadTxn`] sees exactly one consistent state (a snapshot, or the
//! writer's transaction including its own earlier writes); whatever the plan, every document
//! visited matches the whole filter, and each is visited once (a multikey index scan skips the
//! documents it has already produced, across pages too). A covered index scan (see
//! `indexes::plan::cover`) visits, instead of each document, its entry's key values as a
//! document: the caller's filter and projection only name those fields.

use bson::{Bson, Document};
use pipeline::Matcher;
use pipeline::expr::Env;
use wire::MongoError;

use std::collections::HashSet;
use std::ops::Bound;

use crate::catalog::CollectionEntry;
use crate::indexes::plan::{Access, Candidate, Hint, Plan};
use crate::storage::{KeyRange, ReadTxn, Scan, StorageError, Table};
use crate::writer::OpError;

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Filter {
    matcher: Matcher,
    /// The command's `let` variables, for `$expr`.
    env: Env,
    /// `Some(v)` when the filter is exactly `{_id: v}` (or `{_id: {$eq: v}}`) for a scalar `v`.
    id_eq: Option<Bson>,
    /// The filter as given, for the planner.
    doc: Document,
    /// The command's `hint`.
    hint: Option<Hint>,
}

impl Filter {
    pub fn parse(filter: &Document) -> Result<Filter, MongoError> {
        Filter::parse_in(filter, &Env::default())
    }

    /// A filter whose `$expr` may use the command's `let` variables.
    pub fn parse_in(filter: &Document, env: &Env) -> Result<Filter, MongoError> {
        let matcher = Matcher::parse_with_vars(filter, &env.names())?;
        // Under a collation, a string `_id` may match other `_id`s than its own.
        let id_eq = match (filter.len(), filter.get("_id")) {
            (1, Some(v)) => point_value(v)
                .filter(|v| env.collation.is_none() || !pipeline::collation::has_string(v)),
            _ => None,
        };
        Ok(Filter {
            matcher,
            env: env.clone(),
            id_eq,
            doc: filter.clone(),
            hint: None,
        })
    }

    pub fn all() -> Filter {
        Filter {
            matcher: Matcher::all(),
            env: Env::default(),
            id_eq: None,
            doc: Document::new(),
            hint: None,
        }
    }

    /// The filter with the command's `hint` (a name, a key pattern or `{$natural: ±1}`).
    pub fn with_hint(mut self, hint: Option<&Bson>) -> Result<Filter, MongoError> {
        self.hint = Hint::parse(hint)?;
        Ok(self)
    }

    pub fn doc(&self) -> &Document {
        &self.doc
    }

    /// The collation the filter compares strings by (`None`: simple).
    pub fn collation(&self) -> Option<&pipeline::collation::Collation> {
        self.env.collation.as_ref()
    }

    /// Whether the command named an index (or `$natural`) to use.
    pub fn hinted(&self) -> bool {
        self.hint.is_some()
    }

    /// Whether the document matches (a runtime error inside `$expr` is no match).
    pub fn matches(&self, doc: &Document) -> bool {
        self.matcher.try_matches_in(doc, &self.env).unwrap_or(false)
    }

    /// The `_id` of the only document that can match, when the filter pins it.
    pub fn id_eq(&self) -> Option<&Bson> {
        self.id_eq.as_ref()
    }
}

fn point_value(v: &Bson) -> Option<Bson> {
    match v {
        Bson::Document(d) => {
            if d.len() == 1
                && let Some(inner) = d.get("$eq")
            {
                return point_value_scalar(inner);
            }
            if d.keys().any(|k| k.starts_with('$')) {
                None
            } else {
                Some(v.clone())
            }
        }
        other => point_value_scalar(other),
    }
}

fn point_value_scalar(v: &Bson) -> Option<Bson> {
    match v {
        // Arrays, regexes and nested operator documents match more than one key.
        Bson::Array(_) | Bson::RegularExpression(_) | Bson::Null | Bson::Undefined => None,
        Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => None,
        other => Some(other.clone()),
    }
}

/// The plan for `filter` (and `sort`) over `coll` as `txn` sees it.
pub fn plan(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    filter: &Filter,
    sort: Option<&Sort>,
) -> Result<Plan, OpError> {
    let mut candidates = Vec::new();
    // A hidden index is kept up to date (and enforces uniqueness) but never planned with.
    for index in crate::indexes::all(coll)
        .into_iter()
        .filter(|i| !i.spec.get_bool("hidden").unwrap_or(false))
    {
        let multikey = index.is_multikey(txn, coll)?;
        candidates.push(Candidate { index, multikey });
    }
    let prefix = crate::keys::collection_prefix(&coll.uuid);
    let mut plan = crate::indexes::plan::choose(
        &prefix,
        &candidates,
        &filter.doc,
        sort,
        filter.hint.as_ref(),
        filter.env.collation.as_ref(),
        &|i| i.prefix(coll),
    )?;
    // A capped collection's scans run in insertion order, unless a sort asks otherwise.
    if crate::capped::limits(coll).is_some()
        && let Access::Documents {
            bounded: false,
            reverse,
            ..
        } = plan.access
        && sort.is_none_or(|s| s.natural().is_some())
    {
        plan = Plan {
            access: Access::Natural {
                prefix: crate::capped::entries_prefix(coll),
                reverse,
            },
            provides_sort: true,
        };
    }
    Ok(plan)
}

/// What carrying out a plan examined.
#[derive(Debug, Default, Clone, Copy)]
pub struct Examined {
    pub keys: i64,
    pub docs: i64,
}

/// `range` without the keys up to `after` (inclusive) in scan order; `None` when nothing is
/// left of it.
fn clip(range: &KeyRange, after: Option<&[u8]>, reverse: bool) -> Option<KeyRange> {
    let Some(a) = after else {
        return Some(range.clone());
    };
    let mut r = range.clone();
    if reverse {
        let starts_after = match &r.start {
            Bound::Included(s) => s.as_slice() >= a,
            Bound::Excluded(s) => s.as_slice() >= a,
            Bound::Unbounded => false,
        };
        if starts_after {
            return None;
        }
        let cut = match &r.end {
            Bound::Included(e) | Bound::Excluded(e) => e.as_slice() > a,
            Bound::Unbounded => true,
        };
        if cut {
            r.end = Bound::Excluded(a.to_vec());
        }
    } else {
        let ends_before = match &r.end {
            Bound::Included(e) => e.as_slice() <= a,
            Bound::Excluded(e) => e.as_slice() <= a,
            Bound::Unbounded => false,
        };
        if ends_before {
            return None;
        }
        let cut = match &r.start {
            Bound::Included(s) | Bound::Excluded(s) => s.as_slice() <= a,
            Bound::Unbounded => true,
        };
        if cut {
            r.start = Bound::Excluded(a.to_vec());
        }
    }
    Some(r)
}

fn undecodable() -> StorageError {
    StorageError::Engine("undecodable document in storage".into())
}

/// Visits the documents a plan's intervals hold, in the plan's order, after `after` (a key of
/// the plan's key space from an earlier visit), until told to stop: `visit(key, document)`.
/// `seen` holds the documents a multikey index scan has produced (by `_id` key bytes).
pub fn run_plan(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    access: &Access,
    after: Option<&[u8]>,
    seen: &mut HashSet<Vec<u8>>,
    examined: &mut Examined,
    visit: &mut dyn FnMut(&[u8], Document) -> Scan,
) -> Result<(), StorageError> {
    let natural;
    let (table, intervals, reverse, multikey) = match access {
        Access::IdPoint(id) => {
            let key = crate::keys::doc_key(&coll.uuid, id);
            examined.keys += 1;
            if after.is_none()
                && let Some(bytes) = txn.get(Table::Documents, &key)?
            {
                examined.docs += 1;
                let doc = crate::writer::decode_doc(&bytes).ok_or_else(undecodable)?;
                visit(&key, doc);
            }
            return Ok(());
        }
        Access::Documents {
            intervals, reverse, ..
        } => (Table::Documents, intervals, *reverse, false),
        Access::Index(scan) => (Table::Indexes, &scan.intervals, scan.reverse, scan.multikey),
        Access::Natural { prefix, reverse } => {
            natural = vec![KeyRange::prefix(prefix)];
            (Table::Indexes, &natural, *reverse, false)
        }
    };
    let covered: Option<Vec<String>> = match access {
        Access::Index(scan) if scan.covered => {
            Some(scan.directions.iter().map(|(f, _)| f.clone()).collect())
        }
        _ => None,
    };
    let mut failure = None;
    let mut stopped = false;
    let ordered: Vec<&KeyRange> = if reverse {
        intervals.iter().rev().collect()
    } else {
        intervals.iter().collect()
    };
    for interval in ordered {
        let Some(range) = clip(interval, after, reverse) else {
            continue;
        };
        txn.scan(table, &range, reverse, &mut |k, v| {
            examined.keys += 1;
            // A long scan stops when its operation's time runs out or it is killed.
            if let Err(e) = pipeline::interrupt::check() {
                failure = Some(StorageError::Interrupted(e));
                return Scan::Stop;
            }
            let doc = if table == Table::Documents {
                examined.docs += 1;
                crate::writer::decode_doc(v)
            } else if let Some(fields) = &covered {
                // A covered scan: the entry's key values are the answer.
                Document::from_reader(v)
                    .ok()
                    .and_then(|e| e.get_array("k").ok().cloned())
                    .map(|values| fields.iter().cloned().zip(values).collect())
            } else {
                let id = Document::from_reader(v)
                    .ok()
                    .and_then(|e| e.get("_id").cloned());
                let Some(id) = id else {
                    failure = Some(undecodable());
                    return Scan::Stop;
                };
                let key = crate::keys::doc_key(&coll.uuid, &id);
                if multikey && !seen.insert(key.clone()) {
                    return Scan::Continue;
                }
                examined.docs += 1;
                match txn.get(Table::Documents, &key) {
                    Ok(Some(bytes)) => crate::writer::decode_doc(&bytes),
                    Ok(None) => {
                        failure = Some(StorageError::Engine(format!(
                            "index entry without its document (_id {id})"
                        )));
                        return Scan::Stop;
                    }
                    Err(e) => {
                        failure = Some(e);
                        return Scan::Stop;
                    }
                }
            };
            let Some(doc) = doc else {
                failure = Some(undecodable());
                return Scan::Stop;
            };
            let step = visit(k, doc);
            if matches!(step, Scan::Stop) {
                stopped = true;
            }
            step
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if stopped {
            break;
        }
    }
    Ok(())
}

/// Visits the documents of `coll` that match `filter` (in the order of the plan chosen for
/// it, without a sort), until told to stop.
pub fn scan_matching(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    filter: &Filter,
    visit: &mut dyn FnMut(Document) -> Scan,
) -> Result<(), OpError> {
    let plan = plan(txn, coll, filter, None)?;
    run_plan(
        txn,
        coll,
        &plan.access,
        None,
        &mut HashSet::new(),
        &mut Examined::default(),
        &mut |_, d| {
            if filter.matches(&d) {
                visit(d)
            } else {
                Scan::Continue
            }
        },
    )?;
    Ok(())
}

/// One page of a planned scan.
#[derive(Debug, Default)]
pub struct Page {
    pub docs: Vec<Document>,
    /// The key (of the plan's key space) of the last entry examined (matching or not).
    pub last_key: Option<Vec<u8>>,
    /// The scan reached the end of its intervals.
    pub exhausted: bool,
}

/// Carries out `access` after `after` (a key from an earlier page), skipping the first
/// `*skip` matches, until `max_docs` matches or `max_bytes` of them are collected.
#[allow(clippy::too_many_arguments)]
pub fn scan_page(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    access: &Access,
    filter: &Filter,
    after: Option<&[u8]>,
    seen: &mut HashSet<Vec<u8>>,
    skip: &mut usize,
    max_docs: usize,
    max_bytes: usize,
) -> Result<Page, StorageError> {
    let mut page = Page {
        exhausted: true,
        ..Page::default()
    };
    if max_docs == 0 {
        page.exhausted = false;
        return Ok(page);
    }
    let mut bytes = 0;
    run_plan(
        txn,
        coll,
        access,
        after,
        seen,
        &mut Examined::default(),
        &mut |k, d| {
            page.last_key = Some(k.to_vec());
            if !filter.matches(&d) {
                return Scan::Continue;
            }
            if *skip > 0 {
                *skip -= 1;
                return Scan::Continue;
            }
            bytes += pipeline::changestream::split::document_size(&d);
            page.docs.push(d);
            if page.docs.len() >= max_docs || bytes >= max_bytes {
                page.exhausted = false;
                Scan::Stop
            } else {
                Scan::Continue
            }
        },
    )?;
    Ok(page)
}

/// A sort specification (MongoDB's sort-key semantics, from the pipeline crate).
pub type Sort = pipeline::sort::SortSpec;

/// A find projection (from the pipeline crate). Use [`find_projection`] so positional
/// projections (`a.$`) see the query.
pub type Projection = pipeline::projection::Projection;

/// What `find` returns of each document: its projection, or with `returnKey` only the keys of
/// the index the plan scans (`{}` for a collection scan), and with `showRecordId` a
/// `$recordId`.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub projection: Option<Projection>,
    /// `returnKey`: the fields of the scanned index's key (empty for a collection scan).
    pub return_key: Option<Vec<String>>,
    pub record_id: bool,
}

impl Output {
    pub fn apply(&self, doc: &Document) -> Result<Document, MongoError> {
        let mut out = match (&self.return_key, &self.projection) {
            (Some(fields), _) => fields
                .iter()
                .map(|f| {
                    let v = crate::catalog::get_dotted(doc, f)
                        .cloned()
                        .unwrap_or(Bson::Null);
                    (f.clone(), v)
                })
                .collect(),
            (None, Some(p)) => p.apply(doc)?,
            (None, None) => doc.clone(),
        };
        if self.record_id {
            out.insert("$recordId", record_id(doc));
        }
        Ok(out)
    }

    /// Whether it changes anything.
    pub fn is_identity(&self) -> bool {
        self.projection.is_none() && self.return_key.is_none() && !self.record_id
    }
}

/// A document's record id for `showRecordId`: documents are stored by `_id`, so it is a
/// stable, positive 64-bit hash of the `_id` (MongoDB's is an opaque int64 too).
fn record_id(doc: &Document) -> i64 {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    (pipeline::value::hash::hash_value(&id) & i64::MAX).max(1)
}

/// The key fields `returnKey` shows for a plan.
pub fn key_fields(access: &Access) -> Vec<String> {
    match access {
        Access::IdPoint(_) | Access::Documents { bounded: true, .. } => vec!["_id".to_string()],
        Access::Documents { .. } | Access::Natural { .. } => Vec::new(),
        Access::Index(scan) => scan.directions.iter().map(|(f, _)| f.clone()).collect(),
    }
}

/// Parses a `find`/`findAndModify` projection for a query.
pub fn find_projection(spec: &Document, filter: &Document) -> Result<Projection, MongoError> {
    Projection::parse_with_query(spec, Some(filter))
}

/// Runs an aggregation pipeline over `input` (the stages a shard can run alone), with the
/// command's `let` variables.
pub fn run_pipeline(
    stages: &[Document],
    input: Vec<Document>,
    env: &Env,
) -> Result<Vec<Document>, MongoError> {
    pipeline::agg::Pipeline::parse_with_vars(stages, &env.names())?.run_in(input, env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn id_point_lookup_is_detected_only_for_single_scalar_ids() {
        assert_eq!(
            Filter::parse(&doc! {"_id": 5}).unwrap().id_eq(),
            Some(&Bson::Int32(5))
        );
        assert_eq!(
            Filter::parse(&doc! {"_id": {"$eq": "x"}}).unwrap().id_eq(),
            Some(&Bson::String("x".into()))
        );
        assert!(
            Filter::parse(&doc! {"_id": {"$gt": 5}})
                .unwrap()
                .id_eq()
                .is_none()
        );
        assert!(
            Filter::parse(&doc! {"_id": 5, "a": 1})
                .unwrap()
                .id_eq()
                .is_none()
        );
        assert!(Filter::parse(&doc! {"_id": [1]}).unwrap().id_eq().is_none());
    }
}
