//! Applying a `$v: 2` update diff to a document, as MongoDB's oplog application does
//! (`document_diff_applier`): the post-image of an update event is its pre-image with the
//! entry's diff applied (reference §7), and the shard's own diff producer is checked against it
//! (`shard::update::diff`).
//!
//! Semantics (oplog-application mode): fields of the old document are visited in order; `d`
//! fields are dropped, `u` fields replaced in place, `s` fields patched in place (a sub-diff
//! meeting a value of another type, or no value, yields null: a later entry rewrites it), and
//! `i` fields (plus `u` fields the old document lacked) are appended at the end in diff order,
//! so an `i` for an existing field moves it to the end. An array diff truncates or pads (with
//! nulls) to `l`, and `u<i>` past the end pads with nulls. Binary deltas (`b`) are refused.
//!
//! Invariants: pure and total (any diff against any document returns a document or a
//! `FailedToParse`-family error, never panics); the fields a diff does not name keep their
//! values and relative order; no diff nests past [`MAX_DEPTH`] or grows an array past what a
//! 16 MiB document can hold.

use std::collections::{BTreeMap, HashMap, HashSet};

use bson::{Bson, Document};
use wire::{MongoError, Result};

use crate::value::array_index;

/// Arrays are never grown past this length by a diff: a 16 MiB document cannot hold more
/// elements (each takes at least a type byte, its decimal index and a NUL: past two million
/// elements that alone is over 16 MiB).
const MAX_ARRAY_LEN: usize = 2_000_000;

/// Sub-diffs nest at most this deep (BSON documents nest at most 100 levels in MongoDB).
pub const MAX_DEPTH: usize = 200;

fn invalid(msg: impl Into<String>) -> MongoError {
    MongoError::failed_to_parse(msg)
}

fn duplicate(f: &str) -> MongoError {
    MongoError::with_code(4728000, format!("duplicate field name in diff: {f}"))
}

enum DocMod<'a> {
    Delete,
    Update(&'a Bson),
    Insert,
    Sub(&'a Document),
}

/// Applies a `$v: 2` diff to `doc` with oplog-application semantics.
pub fn apply_diff(doc: &Document, diff: &Document) -> Result<Document> {
    apply_doc(doc, diff, 0)
}

fn apply_doc(pre: &Document, diff: &Document, depth: usize) -> Result<Document> {
    if depth > MAX_DEPTH {
        return Err(invalid("diff nested too deeply"));
    }
    let mut table: HashMap<&str, DocMod<'_>> = HashMap::new();
    // Updates and inserts are appended (when not applied in place) in this order.
    let mut updates: Vec<(&str, &Bson)> = Vec::new();
    let mut inserts: Vec<(&str, &Bson)> = Vec::new();
    for (key, value) in diff {
        match key.as_str() {
            "d" | "u" | "i" => {
                let Bson::Document(fields) = value else {
                    return Err(invalid(format!("diff section '{key}' must be an object")));
                };
                for (f, v) in fields {
                    let m = match key.as_str() {
                        "d" => DocMod::Delete,
                        "u" => {
                            updates.push((f, v));
                            DocMod::Update(v)
                        }
                        _ => {
                            inserts.push((f, v));
                            DocMod::Insert
                        }
                    };
                    if table.insert(f.as_str(), m).is_some() {
                        return Err(duplicate(f));
                    }
                }
            }
            "b" => return Err(invalid("binary diffs ('b') are not supported")),
            k => {
                let Some(f) = k.strip_prefix('s') else {
                    return Err(invalid(format!("unexpected field in document diff: {k}")));
                };
                let Bson::Document(sub) = value else {
                    return Err(invalid(format!("sub-diff '{k}' must be an object")));
                };
                if table.insert(f, DocMod::Sub(sub)).is_some() {
                    return Err(duplicate(f));
                }
            }
        }
    }
    let to_append = updates.into_iter().chain(inserts);

    let mut out = Document::new();
    let mut applied_in_place: HashSet<&str> = HashSet::new();
    for (k, v) in pre {
        match table.get(k.as_str()) {
            None => {
                out.insert(k.clone(), v.clone());
            }
            Some(DocMod::Delete) | Some(DocMod::Insert) => {}
            Some(DocMod::Update(nv)) => {
                out.insert(k.clone(), (*nv).clone());
                applied_in_place.insert(k.as_str());
            }
            Some(DocMod::Sub(sub)) => {
                out.insert(k.clone(), apply_sub(v, sub, depth + 1)?);
            }
        }
    }
    for (k, v) in to_append {
        if !applied_in_place.contains(k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Ok(out)
}

fn is_array_diff(sub: &Document) -> bool {
    matches!(sub.get("a"), Some(Bson::Boolean(true)))
}

/// Applies a sub-diff to a value; a type mismatch yields null (a later entry rewrites it).
fn apply_sub(v: &Bson, sub: &Document, depth: usize) -> Result<Bson> {
    Ok(match (v, is_array_diff(sub)) {
        (Bson::Document(d), false) => Bson::Document(apply_doc(d, sub, depth)?),
        (Bson::Array(a), true) => Bson::Array(apply_array(a, sub, depth)?),
        _ => Bson::Null,
    })
}

enum ArrMod<'a> {
    Update(&'a Bson),
    Sub(&'a Document),
}

/// `u12` → (`u`, `12`), by characters (a key may start with any character).
fn split_kind(key: &str) -> (&str, &str) {
    let first = key.chars().next().map_or(0, char::len_utf8);
    key.split_at(first)
}

fn apply_array(pre: &[Bson], diff: &Document, depth: usize) -> Result<Vec<Bson>> {
    if depth > MAX_DEPTH {
        return Err(invalid("diff nested too deeply"));
    }
    let mut resize: Option<usize> = None;
    let mut mods: BTreeMap<usize, ArrMod<'_>> = BTreeMap::new();
    for (key, value) in diff {
        if key == "a" {
            continue;
        }
        if key == "l" {
            let n = crate::value::as_i64_exact(value)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| invalid("array diff 'l' must be a non-negative integer"))?;
            resize = Some(n);
            continue;
        }
        let (kind, index) = split_kind(key);
        let index = array_index(index)
            .ok_or_else(|| invalid(format!("unexpected field in array diff: {key}")))?;
        let m = match (kind, value) {
            ("u", v) => ArrMod::Update(v),
            ("s", Bson::Document(sub)) => ArrMod::Sub(sub),
            _ => return Err(invalid(format!("unexpected field in array diff: {key}"))),
        };
        if mods.insert(index, m).is_some() {
            return Err(invalid(format!("duplicate index in array diff: {index}")));
        }
    }
    let last_mod = mods.keys().next_back().map(|i| i + 1).unwrap_or(0);
    let target = match resize {
        Some(r) => {
            if last_mod > r {
                return Err(invalid("array diff modifies an index past its new length"));
            }
            r
        }
        None => pre.len().max(last_mod),
    };
    if target > MAX_ARRAY_LEN {
        return Err(invalid("array diff grows an array past the maximum size"));
    }
    let mut out = Vec::with_capacity(target);
    for i in 0..target {
        let old = pre.get(i);
        let v = match (mods.get(&i), old) {
            (Some(ArrMod::Update(v)), _) => (*v).clone(),
            (Some(ArrMod::Sub(sub)), Some(old)) => apply_sub(old, sub, depth + 1)?,
            (Some(ArrMod::Sub(_)), None) => Bson::Null,
            (None, Some(old)) => old.clone(),
            (None, None) => Bson::Null,
        };
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use bson::doc;
    use proptest::prelude::*;

    use super::*;

    fn bytes(d: &Document) -> Vec<u8> {
        d.to_vec().unwrap()
    }

    #[test]
    fn sections_apply_in_place_or_append_in_diff_order() {
        let pre = doc! {"_id": 1, "a": 1, "b": "two", "c": {"x": 1, "y": 2}, "d": [1, 2, 3]};
        let diff = doc! {
            "d": {"b": false},
            "u": {"a": 5, "new": true},
            "i": {"_id": 1},
            "sc": {"u": {"x": 9}},
            "sd": {"a": true, "l": 2, "u1": "z"},
        };
        let want = doc! {"a": 5, "c": {"x": 9, "y": 2}, "d": [1, "z"], "new": true, "_id": 1};
        assert_eq!(bytes(&apply_diff(&pre, &diff).unwrap()), bytes(&want));
    }

    #[test]
    fn arrays_pad_with_nulls_and_mismatched_sub_diffs_yield_null() {
        let pre = doc! {"a": [1], "b": 5, "c": [{"x": 1}]};
        let diff = doc! {
            "sa": {"a": true, "u3": 4},
            "sb": {"u": {"x": 1}},
            "sc": {"a": true, "s0": {"i": {"y": 2}}},
        };
        let want =
            doc! {"a": [1, Bson::Null, Bson::Null, 4], "b": Bson::Null, "c": [{"x": 1, "y": 2}]};
        assert_eq!(bytes(&apply_diff(&pre, &diff).unwrap()), bytes(&want));
    }

    #[test]
    fn bad_diffs_are_errors_not_panics() {
        let pre = doc! {"a": [1, 2], "é": 1};
        for diff in [
            doc! {"u": 1},
            doc! {"b": {"a": 1}},
            doc! {"x": 1},
            doc! {"u": {"a": 1}, "d": {"a": false}},
            doc! {"sa": {"a": true, "l": -1}},
            doc! {"sa": {"a": true, "é1": 1}},
            doc! {"sa": {"a": true, "u5": 1, "l": 2}},
            doc! {"sa": {"a": true, "u999999999": 1}},
        ] {
            assert!(apply_diff(&pre, &diff).is_err(), "{diff}");
        }
        let mut deep = doc! {"u": {"x": 1}};
        for _ in 0..(MAX_DEPTH + 5) {
            deep = doc! {"sa": deep};
        }
        let mut pre_deep = doc! {"x": 0};
        for _ in 0..(MAX_DEPTH + 5) {
            pre_deep = doc! {"a": pre_deep};
        }
        assert!(apply_diff(&pre_deep, &deep).is_err());
    }

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            (-2..8i32).prop_map(Bson::Int32),
            (-2..8i64).prop_map(Bson::Int64),
            Just(Bson::Double(1.5)),
            Just(Bson::String("x".into())),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
        ]
    }

    /// Keys that are meaningful in documents and diffs, so random diffs often half-apply.
    const KEYS: &[&str] = &[
        "a", "b", "0", "1", "d", "u", "i", "l", "sa", "sb", "s0", "s1", "u0", "u3", "",
    ];

    fn value() -> impl Strategy<Value = Bson> {
        leaf().prop_recursive(4, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..5).prop_map(
                    |fields| {
                        let mut d = Document::new();
                        for (k, v) in fields {
                            d.insert(k, v);
                        }
                        Bson::Document(d)
                    }
                ),
            ]
        })
    }

    fn document() -> impl Strategy<Value = Document> {
        prop::collection::vec((prop::sample::select(KEYS), value()), 0..6).prop_map(|fields| {
            let mut d = Document::new();
            for (k, v) in fields {
                d.insert(k, v);
            }
            d
        })
    }

    proptest! {
        /// Invariant: pure and total: any diff against any document returns, never panics.
        #[test]
        fn arbitrary_diffs_never_panic(pre in document(), diff in document()) {
            let _ = apply_diff(&pre, &diff);
        }

        /// Invariant: the fields the diff does not name keep their values and relative order.
        #[test]
        fn untouched_fields_keep_their_order(pre in document(), diff in document()) {
            if let Ok(post) = apply_diff(&pre, &diff) {
                let named = |f: &str| {
                    ["d", "u", "i"].iter().any(|s| {
                        diff.get_document(*s).is_ok_and(|d| d.contains_key(f))
                    }) || diff.contains_key(format!("s{f}"))
                };
                let kept: Vec<(&String, &Bson)> =
                    pre.iter().filter(|(k, _)| !named(k)).collect();
                let still: Vec<(&String, &Bson)> =
                    post.iter().filter(|(k, _)| !named(k)).collect();
                prop_assert_eq!(kept, still);
            }
        }
    }
}
