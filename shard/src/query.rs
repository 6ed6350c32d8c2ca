//! Query evaluation over a collection snapshot: filters (with an `_id` point-lookup fast path),
//! sorts, skip/limit and projections. Pure apart from reading the given transaction.
//!
//! Invariant: a query over a [`ReadTxn`] sees exactly one consistent state (a snapshot, or the
//! writer's transaction including its own earlier writes).

use bson::{Bson, Document};
use pipeline::Matcher;
use pipeline::expr::Env;
use wire::MongoError;

use crate::catalog::CollectionEntry;
use crate::storage::{ReadTxn, Scan, StorageError};
use crate::writer::scan_collection;

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Filter {
    matcher: Matcher,
    /// The command's `let` variables, for `$expr`.
    env: Env,
    /// `Some(v)` when the filter is exactly `{_id: v}` (or `{_id: {$eq: v}}`) for a scalar `v`.
    id_eq: Option<Bson>,
}

impl Filter {
    pub fn parse(filter: &Document) -> Result<Filter, MongoError> {
        Filter::parse_in(filter, &Env::default())
    }

    /// A filter whose `$expr` may use the command's `let` variables.
    pub fn parse_in(filter: &Document, env: &Env) -> Result<Filter, MongoError> {
        let matcher = Matcher::parse_with_vars(filter, &env.names())?;
        let id_eq = match (filter.len(), filter.get("_id")) {
            (1, Some(v)) => point_value(v),
            _ => None,
        };
        Ok(Filter {
            matcher,
            env: env.clone(),
            id_eq,
        })
    }

    pub fn all() -> Filter {
        Filter {
            matcher: Matcher::all(),
            env: Env::default(),
            id_eq: None,
        }
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

/// Visits the documents of `coll` that match `filter`, in `_id` order, until told to stop.
pub fn scan_matching(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    filter: &Filter,
    visit: &mut dyn FnMut(Document) -> Scan,
) -> Result<(), StorageError> {
    if let Some(id) = filter.id_eq() {
        let key = crate::keys::doc_key(&coll.uuid, id);
        if let Some(bytes) = txn.get(crate::storage::Table::Documents, &key)?
            && let Some(doc) = crate::writer::decode_doc(&bytes)
            && filter.matches(&doc)
        {
            visit(doc);
        }
        return Ok(());
    }
    scan_collection(txn, coll, &mut |d| {
        if filter.matches(&d) {
            visit(d)
        } else {
            Scan::Continue
        }
    })
}

/// One page of a collection scan in `_id` order.
#[derive(Debug, Default)]
pub struct Page {
    pub docs: Vec<Document>,
    /// The storage key of the last document examined (matching or not).
    pub last_key: Option<Vec<u8>>,
    /// The scan reached the end of the collection.
    pub exhausted: bool,
}

/// Scans `coll` after `after` (a key from an earlier page), skipping the first `*skip`
/// matches, until `max_docs` matches or `max_bytes` of them are collected.
pub fn scan_page(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    filter: &Filter,
    after: Option<&[u8]>,
    skip: &mut usize,
    max_docs: usize,
    max_bytes: usize,
) -> Result<Page, StorageError> {
    let prefix = crate::keys::collection_prefix(&coll.uuid);
    let range = match after {
        Some(a) => crate::storage::KeyRange::prefix_after(&prefix, a),
        None => crate::storage::KeyRange::prefix(&prefix),
    };
    let mut page = Page {
        exhausted: true,
        ..Page::default()
    };
    let mut bytes = 0;
    let mut bad = false;
    if max_docs == 0 {
        page.exhausted = false;
        return Ok(page);
    }
    txn.scan(
        crate::storage::Table::Documents,
        &range,
        false,
        &mut |k, v| {
            page.last_key = Some(k.to_vec());
            let Some(d) = crate::writer::decode_doc(v) else {
                bad = true;
                return Scan::Stop;
            };
            if !filter.matches(&d) {
                return Scan::Continue;
            }
            if *skip > 0 {
                *skip -= 1;
                return Scan::Continue;
            }
            bytes += v.len();
            page.docs.push(d);
            if page.docs.len() >= max_docs || bytes >= max_bytes {
                page.exhausted = false;
                Scan::Stop
            } else {
                Scan::Continue
            }
        },
    )?;
    if bad {
        return Err(StorageError::Engine(
            "undecodable document in storage".into(),
        ));
    }
    Ok(page)
}

/// A sort specification (MongoDB's sort-key semantics, from the pipeline crate).
pub type Sort = pipeline::sort::SortSpec;

/// A find projection (from the pipeline crate). Use [`find_projection`] so positional
/// projections (`a.$`) see the query.
pub type Projection = pipeline::projection::Projection;

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
