//! Query evaluation over a collection snapshot: filters (with an `_id` point-lookup fast path),
//! sorts, skip/limit and projections. Pure apart from reading the given transaction.
//!
//! Invariant: a query over a [`ReadTxn`] sees exactly one consistent state (a snapshot, or the
//! writer's transaction including its own earlier writes).

use std::cmp::Ordering;

use bson::{Bson, Document};
use pipeline::Matcher;
use wire::MongoError;

use crate::catalog::CollectionEntry;
use crate::storage::{ReadTxn, Scan, StorageError};
use crate::writer::scan_collection;

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Filter {
    matcher: Matcher,
    /// `Some(v)` when the filter is exactly `{_id: v}` (or `{_id: {$eq: v}}`) for a scalar `v`.
    id_eq: Option<Bson>,
}

impl Filter {
    pub fn parse(filter: &Document) -> Result<Filter, MongoError> {
        let matcher = Matcher::parse(filter)?;
        let id_eq = match (filter.len(), filter.get("_id")) {
            (1, Some(v)) => point_value(v),
            _ => None,
        };
        Ok(Filter { matcher, id_eq })
    }

    pub fn all() -> Filter {
        Filter {
            matcher: Matcher::all(),
            id_eq: None,
        }
    }

    pub fn matches(&self, doc: &Document) -> bool {
        self.matcher.matches(doc)
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

/// A sort specification `{field: 1 | -1, ...}`.
#[derive(Debug, Clone)]
pub struct Sort {
    keys: Vec<(String, bool)>,
}

impl Sort {
    pub fn parse(spec: &Document) -> Result<Sort, MongoError> {
        let mut keys = Vec::new();
        for (k, v) in spec {
            let asc = match v {
                Bson::Int32(1) | Bson::Int64(1) => true,
                Bson::Int32(-1) | Bson::Int64(-1) => false,
                Bson::Double(d) if *d == 1.0 => true,
                Bson::Double(d) if *d == -1.0 => false,
                Bson::Document(d) if d.contains_key("$meta") => true,
                _ => {
                    return Err(MongoError::bad_value(
                        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
                    ));
                }
            };
            keys.push((k.clone(), asc));
        }
        Ok(Sort { keys })
    }

    pub fn compare(&self, a: &Document, b: &Document) -> Ordering {
        for (path, asc) in &self.keys {
            let ka = sort_key(a, path, *asc);
            let kb = sort_key(b, path, *asc);
            let ord = pipeline::value::compare(&ka, &kb);
            let ord = if *asc { ord } else { ord.reverse() };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }

    pub fn sort(&self, docs: &mut [Document]) {
        docs.sort_by(|a, b| self.compare(a, b));
    }
}

/// MongoDB's sort key of a path: missing is null; an array sorts by its smallest element
/// ascending and its largest descending.
fn sort_key(doc: &Document, path: &str, asc: bool) -> Bson {
    let vals = pipeline::value::path_values(doc, path);
    let mut flat: Vec<&Bson> = Vec::new();
    for v in vals {
        match v {
            Bson::Array(a) if !a.is_empty() => flat.extend(a.iter()),
            Bson::Array(_) => flat.push(v),
            other => flat.push(other),
        }
    }
    let pick = if asc {
        flat.into_iter()
            .min_by(|x, y| pipeline::value::compare(x, y))
    } else {
        flat.into_iter()
            .max_by(|x, y| pipeline::value::compare(x, y))
    };
    pick.cloned().unwrap_or(Bson::Null)
}

/// A find projection (inclusion or exclusion of dotted paths, `_id` included by default).
#[derive(Debug, Clone)]
pub struct Projection {
    inner: ProjectionImpl,
}

#[derive(Debug, Clone)]
enum ProjectionImpl {
    Include { paths: Vec<String>, id: bool },
    Exclude { paths: Vec<String> },
}

impl Projection {
    pub fn parse(spec: &Document) -> Result<Projection, MongoError> {
        let mut include = Vec::new();
        let mut exclude = Vec::new();
        let mut id = true;
        for (k, v) in spec {
            let on = match v {
                Bson::Boolean(b) => *b,
                Bson::Int32(i) => *i != 0,
                Bson::Int64(i) => *i != 0,
                Bson::Double(d) => *d != 0.0,
                _ => {
                    return Err(MongoError::bad_value(format!(
                        "Unsupported projection option: {k}: {v}"
                    )));
                }
            };
            if k == "_id" {
                id = on;
                continue;
            }
            if on {
                include.push(k.clone());
            } else {
                exclude.push(k.clone());
            }
        }
        if !include.is_empty() && !exclude.is_empty() {
            return Err(MongoError::with_code(
                31254,
                format!(
                    "Cannot do exclusion on field {} in inclusion projection",
                    exclude.first().map(String::as_str).unwrap_or("")
                ),
            ));
        }
        let inner = if !include.is_empty() || (id && exclude.is_empty() && !spec.is_empty()) {
            ProjectionImpl::Include { paths: include, id }
        } else {
            if !id {
                exclude.push("_id".into());
            }
            ProjectionImpl::Exclude { paths: exclude }
        };
        Ok(Projection { inner })
    }

    pub fn apply(&self, doc: &Document) -> Result<Document, MongoError> {
        Ok(match &self.inner {
            ProjectionImpl::Include { paths, id } => {
                let mut out = Document::new();
                if *id && let Some(v) = doc.get("_id") {
                    out.insert("_id", v.clone());
                }
                include_paths(doc, paths, &mut out);
                out
            }
            ProjectionImpl::Exclude { paths } => {
                let mut out = doc.clone();
                for p in paths {
                    pipeline::value::remove_path(&mut out, p);
                }
                out
            }
        })
    }
}

fn include_paths(src: &Document, paths: &[String], out: &mut Document) {
    for (k, v) in src {
        let here: Vec<&str> = paths
            .iter()
            .filter_map(|p| {
                if p == k {
                    Some("")
                } else {
                    p.strip_prefix(k.as_str()).and_then(|r| r.strip_prefix('.'))
                }
            })
            .collect();
        if here.is_empty() {
            continue;
        }
        if here.contains(&"") {
            out.insert(k.clone(), v.clone());
            continue;
        }
        let sub: Vec<String> = here.iter().map(|s| s.to_string()).collect();
        match v {
            Bson::Document(d) => {
                let mut o = Document::new();
                include_paths(d, &sub, &mut o);
                out.insert(k.clone(), o);
            }
            Bson::Array(a) => {
                let mut arr = Vec::new();
                for e in a {
                    if let Bson::Document(d) = e {
                        let mut o = Document::new();
                        include_paths(d, &sub, &mut o);
                        arr.push(Bson::Document(o));
                    }
                }
                out.insert(k.clone(), arr);
            }
            _ => {}
        }
    }
}

/// Runs an aggregation pipeline over `input`.
///
/// Interim: the stages a shard needs before `pipeline::agg` is available (`$match`, `$sort`,
/// `$skip`, `$limit`, `$project` with inclusion/exclusion, `$count`).
pub fn run_pipeline(
    stages: &[Document],
    input: Vec<Document>,
) -> Result<Vec<Document>, MongoError> {
    let mut docs = input;
    for stage in stages {
        let Some((name, arg)) = stage.iter().next() else {
            return Err(MongoError::with_code(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        if stage.len() != 1 {
            return Err(MongoError::with_code(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        let as_doc = || match arg {
            Bson::Document(d) => Ok(d.clone()),
            _ => Err(MongoError::failed_to_parse(format!(
                "the {name} stage specification must be an object"
            ))),
        };
        let as_n = || {
            crate::commands::as_i64(arg)
                .filter(|n| *n >= 0)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    MongoError::failed_to_parse(format!("invalid argument to {name} stage"))
                })
        };
        match name.as_str() {
            "$match" => {
                let f = Filter::parse(&as_doc()?)?;
                docs.retain(|d| f.matches(d));
            }
            "$sort" => Sort::parse(&as_doc()?)?.sort(&mut docs),
            "$skip" => {
                let n = as_n()?;
                docs = docs.into_iter().skip(n).collect();
            }
            "$limit" => {
                let n = as_n()?;
                docs.truncate(n);
            }
            "$project" => {
                let p = Projection::parse(&as_doc()?)?;
                docs = docs.iter().map(|d| p.apply(d)).collect::<Result<_, _>>()?;
            }
            "$count" => {
                let Bson::String(field) = arg else {
                    return Err(MongoError::with_code(
                        40156,
                        "the count field must be a non-empty string",
                    ));
                };
                let n = docs.len() as i32;
                docs = if n == 0 {
                    Vec::new()
                } else {
                    vec![bson::doc! {field.clone(): n}]
                };
            }
            other => {
                return Err(MongoError::with_code(
                    40324,
                    format!("Unrecognized pipeline stage name: '{other}'"),
                ));
            }
        }
    }
    Ok(docs)
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

    #[test]
    fn projection_includes_and_excludes_dotted_paths() {
        let d = doc! {"_id": 1, "a": {"b": 1, "c": 2}, "x": 3};
        let p = Projection::parse(&doc! {"a.b": 1}).unwrap();
        assert_eq!(p.apply(&d).unwrap(), doc! {"_id": 1, "a": {"b": 1}});
        let p = Projection::parse(&doc! {"a": 0, "_id": 0}).unwrap();
        assert_eq!(p.apply(&d).unwrap(), doc! {"x": 3});
    }

    #[test]
    fn sort_orders_by_keys_with_direction() {
        let mut v = vec![doc! {"a": 2}, doc! {"a": 1}, doc! {"b": 1}];
        Sort::parse(&doc! {"a": -1}).unwrap().sort(&mut v);
        assert_eq!(v, vec![doc! {"a": 2}, doc! {"a": 1}, doc! {"b": 1}]);
    }
}
