//! Sort specifications (`{a: 1, b: -1}`) and the comparator they define.
//!
//! Semantics (MongoDB 7.0):
//! * Each key's value is found with implicit array traversal (`a.b` over an array of documents
//!   reaches every `b`); a missing value sorts as `null`.
//! * When a key reaches an array (or several values), an ascending sort uses the smallest
//!   element and a descending sort the largest; an empty array sorts as `undefined`, just
//!   below `null`.
//! * Values compare with [`crate::value::compare_in`] under the sort's collation (none: simple);
//!   keys compare left to right.
//!
//! Invariant: `compare(a, b) == compare_keys(sort_key(a), sort_key(b))`, so the router can
//! merge shard results by their extracted sort keys.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::collation::Collation;
use crate::value::{self, compare_in};
use crate::{MongoError, Result};

/// A parsed sort specification.
#[derive(Debug, Clone, PartialEq)]
pub struct SortSpec {
    keys: Vec<SortKeyPart>,
    /// `{$natural: 1 | -1}`: storage order (`Some(true)`) or its reverse; no key comparisons.
    natural: Option<bool>,
    /// The collation strings compare by (`None`: simple).
    collation: Option<Collation>,
}

#[derive(Debug, Clone, PartialEq)]
struct SortKeyPart {
    path: String,
    ascending: bool,
}

impl SortSpec {
    /// Parses `{field: 1 | -1, ...}`. `$meta` sorts are rejected (no text search here); an
    /// empty specification is allowed (no ordering) — `$sort` checks non-emptiness itself.
    pub fn parse(spec: &Document) -> Result<SortSpec> {
        let mut keys = Vec::with_capacity(spec.len());
        for (k, v) in spec {
            crate::value::check_path_length(k)?;
            if k.is_empty() || k.split('.').any(str::is_empty) {
                return Err(MongoError::with_code(
                    40352,
                    "FieldPath cannot be constructed with empty string",
                ));
            }
            if k == "$natural" {
                if spec.len() != 1 {
                    return Err(MongoError::bad_value(
                        "$natural sort cannot be set in combination with other sort keys",
                    ));
                }
                let natural = match value::as_f64(v) {
                    Some(1.0) => true,
                    Some(-1.0) => false,
                    _ => return Err(bad_order()),
                };
                return Ok(SortSpec {
                    keys: Vec::new(),
                    natural: Some(natural),
                    collation: None,
                });
            }
            if k.starts_with('$') {
                return Err(MongoError::with_code(
                    16410,
                    format!("FieldPath field names may not start with '$'. Given: {k}"),
                ));
            }
            let ascending = match v {
                Bson::Document(d) if d.contains_key("$meta") => {
                    return Err(MongoError::bad_value(format!(
                        "$meta sort by {} is not supported",
                        d.get("$meta").map(|m| m.to_string()).unwrap_or_default()
                    )));
                }
                n if value::is_number(n) => match value::as_f64(n) {
                    Some(1.0) => true,
                    Some(-1.0) => false,
                    _ => return Err(bad_order()),
                },
                _ => return Err(bad_order()),
            };
            keys.push(SortKeyPart {
                path: k.clone(),
                ascending,
            });
        }
        Ok(SortSpec {
            keys,
            natural: None,
            collation: None,
        })
    }

    /// Whether there are no keys (no ordering, or `$natural`).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// `Some(ascending)` for `{$natural: ±1}`: the caller returns documents in storage order
    /// (or reversed); [`SortSpec::compare`] treats all documents as equal.
    pub fn natural(&self) -> Option<bool> {
        self.natural
    }

    /// The sorted paths with their direction (`true` = ascending).
    pub fn fields(&self) -> impl Iterator<Item = (&str, bool)> {
        self.keys.iter().map(|k| (k.path.as_str(), k.ascending))
    }

    /// The specification comparing strings by `collation` (`None`: simple).
    pub fn with_collation(mut self, collation: Option<Collation>) -> SortSpec {
        self.collation = collation;
        self
    }

    /// The collation strings compare by.
    pub fn collation(&self) -> Option<&Collation> {
        self.collation.as_ref()
    }

    /// Compares two documents under this specification.
    pub fn compare(&self, a: &Document, b: &Document) -> Ordering {
        let collation = self.collation.as_ref();
        for k in &self.keys {
            let (x, y) = (key_value(a, k, collation), key_value(b, k, collation));
            let o = compare_in(&x, &y, collation);
            let o = if k.ascending { o } else { o.reverse() };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }

    /// The document's sort key: one value per key, chosen as the comparator chooses it.
    pub fn sort_key(&self, doc: &Document) -> Vec<Bson> {
        let collation = self.collation.as_ref();
        self.keys
            .iter()
            .map(|k| key_value(doc, k, collation))
            .collect()
    }

    /// Compares two sort keys produced by [`SortSpec::sort_key`].
    pub fn compare_keys(&self, a: &[Bson], b: &[Bson]) -> Ordering {
        self.compare_keys_under(a, b, self.collation.as_ref())
    }

    /// [`SortSpec::compare_keys`] with strings compared under `collation`.
    fn compare_keys_under(
        &self,
        a: &[Bson],
        b: &[Bson],
        collation: Option<&Collation>,
    ) -> Ordering {
        for ((k, x), y) in self.keys.iter().zip(a).zip(b) {
            let o = compare_in(x, y, collation);
            let o = if k.ascending { o } else { o.reverse() };
            if o != Ordering::Equal {
                return o;
            }
        }
        a.len().cmp(&b.len())
    }

    /// Sorts documents in place under `collation` rather than the specification's own (an
    /// aggregation's `$sort` takes the command's).
    pub fn sort_in(&self, docs: &mut [Document], collation: Option<&Collation>) {
        if self.collation.as_ref() == collation {
            self.sort(docs);
        } else {
            self.clone().with_collation(collation.cloned()).sort(docs);
        }
    }

    /// Sorts documents in place (stable: equal documents keep their input order).
    pub fn sort(&self, docs: &mut [Document]) {
        if self.keys.is_empty() {
            return;
        }
        // Under a collation each key is folded once into collation keys, which then compare
        // as bytes: n key computations instead of n log n collator comparisons.
        let fold = self.collation.as_ref();
        let mut keyed: Vec<(Vec<Bson>, usize)> = docs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let key = self.sort_key(d);
                let key = match fold {
                    Some(c) => key.iter().map(|v| c.fold(v)).collect(),
                    None => key,
                };
                (key, i)
            })
            .collect();
        keyed.sort_by(|(a, ia), (b, ib)| self.compare_keys_under(a, b, None).then(ia.cmp(ib)));
        let order: Vec<usize> = keyed.into_iter().map(|(_, i)| i).collect();
        let mut taken: Vec<Option<Document>> =
            docs.iter_mut().map(|d| Some(std::mem::take(d))).collect();
        for (slot, i) in docs.iter_mut().zip(order) {
            if let Some(d) = taken.get_mut(i).and_then(Option::take) {
                *slot = d;
            }
        }
    }
}

fn bad_order() -> MongoError {
    MongoError::with_code(
        15975,
        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
    )
}

/// The value a key sorts a document by.
fn key_value(doc: &Document, k: &SortKeyPart, collation: Option<&Collation>) -> Bson {
    let parts: Vec<&str> = k.path.split('.').collect();
    let mut reached = Vec::new();
    if let Some((first, rest)) = parts.split_first() {
        reach(doc.get(*first), rest, &mut reached);
    }
    let mut candidates: Vec<&Bson> = Vec::new();
    for v in &reached {
        match v {
            Bson::Array(a) => candidates.extend(a.iter()),
            other => candidates.push(other),
        }
    }
    if candidates.is_empty() {
        // Only empty arrays were reached: they sort as `undefined`, below null.
        return Bson::Undefined;
    }
    let pick = if k.ascending {
        candidates
            .into_iter()
            .min_by(|a, b| compare_in(a, b, collation))
    } else {
        candidates
            .into_iter()
            .max_by(|a, b| compare_in(a, b, collation))
    };
    pick.cloned().unwrap_or(Bson::Null)
}

/// Every value `rest` reaches from `v`, with `null` for a missing one (including a document
/// element of a traversed array that lacks the field).
fn reach<'a>(v: Option<&'a Bson>, rest: &[&str], out: &mut Vec<&'a Bson>) {
    const NULL: &Bson = &Bson::Null;
    let Some(v) = v else {
        out.push(NULL);
        return;
    };
    let Some((part, tail)) = rest.split_first() else {
        out.push(v);
        return;
    };
    match v {
        Bson::Document(d) => reach(d.get(*part), tail, out),
        Bson::Array(a) => {
            if let Some(i) = value::array_index(part)
                && let Some(e) = a.get(i)
            {
                reach(Some(e), tail, out);
                return;
            }
            for e in a {
                if let Bson::Document(d) = e {
                    reach(d.get(*part), tail, out);
                }
            }
        }
        _ => out.push(NULL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn sorted(spec: Document, docs: Vec<Document>) -> Vec<Bson> {
        let s = SortSpec::parse(&spec).unwrap();
        let mut docs = docs;
        s.sort(&mut docs);
        docs.into_iter()
            .map(|d| d.get("_id").cloned().unwrap_or(Bson::Null))
            .collect()
    }

    fn ids(v: &[i32]) -> Vec<Bson> {
        v.iter().map(|i| Bson::Int32(*i)).collect()
    }

    #[test]
    fn a_collated_sort_orders_as_its_comparator() {
        let c = crate::collation::Collation::parse_doc(&doc! {"locale": "en", "strength": 2})
            .unwrap()
            .unwrap();
        let words = ["b", "B", "a", "Ä", "ä", "z", "10", "9", "é", "e", "E"];
        for spec in [doc! {"w": 1}, doc! {"w": -1, "_id": 1}] {
            let s = SortSpec::parse(&spec)
                .unwrap()
                .with_collation(Some(c.clone()));
            let mut docs: Vec<Document> = words
                .iter()
                .enumerate()
                .map(|(i, w)| doc! {"_id": i as i32, "w": [*w, "zzz"]})
                .collect();
            s.sort(&mut docs);
            for pair in docs.windows(2) {
                let o = s.compare(&pair[0], &pair[1]);
                assert!(
                    o.is_lt()
                        || (o.is_eq()
                            && pair[0].get_i32("_id").unwrap() < pair[1].get_i32("_id").unwrap()),
                    "{:?} before {:?}",
                    pair[0],
                    pair[1]
                );
            }
        }
    }

    #[test]
    fn ascending_uses_smallest_array_element_descending_the_largest() {
        let docs = vec![
            doc! {"_id": 1, "a": [1, 10]},
            doc! {"_id": 2, "a": 5},
            doc! {"_id": 3, "a": [0, 3]},
        ];
        assert_eq!(sorted(doc! {"a": 1}, docs.clone()), ids(&[3, 1, 2]));
        assert_eq!(sorted(doc! {"a": -1}, docs), ids(&[1, 2, 3]));
    }

    #[test]
    fn missing_sorts_as_null_and_types_sort_canonically() {
        let docs = vec![
            doc! {"_id": 1, "a": "s"},
            doc! {"_id": 2},
            doc! {"_id": 3, "a": 2},
            doc! {"_id": 4, "a": null},
            doc! {"_id": 5, "a": []},
        ];
        // The stable sort keeps 2 before 4 (both null).
        assert_eq!(sorted(doc! {"a": 1}, docs), ids(&[5, 2, 4, 3, 1]));
    }

    #[test]
    fn compound_keys_and_dotted_paths() {
        let docs = vec![
            doc! {"_id": 1, "a": 1, "b": {"c": 2}},
            doc! {"_id": 2, "a": 1, "b": {"c": 1}},
            doc! {"_id": 3, "a": 0, "b": {"c": 9}},
        ];
        assert_eq!(sorted(doc! {"a": -1, "b.c": 1}, docs), ids(&[2, 1, 3]));
        let docs = vec![
            doc! {"_id": 1, "x": [{"y": 5}, {"y": 1}]},
            doc! {"_id": 2, "x": [{"y": 3}]},
        ];
        assert_eq!(sorted(doc! {"x.y": 1}, docs.clone()), ids(&[1, 2]));
        assert_eq!(sorted(doc! {"x.y": -1}, docs), ids(&[1, 2]));
    }

    #[test]
    fn sort_key_order_equals_document_order() {
        let s = SortSpec::parse(&doc! {"a": 1, "b": -1}).unwrap();
        let docs = [
            doc! {"a": 1, "b": 2},
            doc! {"a": 1, "b": [3, 0]},
            doc! {"a": [0, 9]},
            doc! {"b": 1},
        ];
        for x in &docs {
            for y in &docs {
                assert_eq!(
                    s.compare(x, y),
                    s.compare_keys(&s.sort_key(x), &s.sort_key(y)),
                    "{x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn invalid_specs_are_rejected() {
        assert_eq!(SortSpec::parse(&doc! {"a": 2}).unwrap_err().code, 15975);
        assert_eq!(SortSpec::parse(&doc! {"a": "x"}).unwrap_err().code, 15975);
        assert_eq!(
            SortSpec::parse(&doc! {"a": {"$meta": "textScore"}})
                .unwrap_err()
                .code,
            2
        );
        assert!(SortSpec::parse(&doc! {}).unwrap().is_empty());
        assert_eq!(
            SortSpec::parse(&doc! {"$natural": -1}).unwrap().natural(),
            Some(false)
        );
        assert_eq!(
            SortSpec::parse(&doc! {"$natural": 1, "a": 1})
                .unwrap_err()
                .code,
            2
        );
        assert_eq!(SortSpec::parse(&doc! {"$a": 1}).unwrap_err().code, 16410);
    }
}
