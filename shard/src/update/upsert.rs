//! The base document of an upsert that inserts: the query's equality fields.
//!
//! Semantics (MongoDB's `extractFullEqualityMatches` / `addEqualitiesToDoc`):
//! * `{f: v}` with `v` not an operator document, `{f: {$eq: v}}` and `{f: {$in: [v]}}` are
//!   equalities; a regex value is a match, not an equality, and is skipped.
//! * `$and` clauses contribute their equalities; a one-clause `$or`/`$nor`-free `$or` is its
//!   clause (MongoDB simplifies it away); other `$`-operators (`$or`, `$expr`, `$where`, ...)
//!   contribute nothing.
//! * Dotted paths become nested documents (`{"a.b": 1}` → `{a: {b: 1}}`); numeric components are
//!   field names there.
//! * `_id` comes first when present; other fields keep the order of the query.
//!
//! Invariant: one path set twice, or one path a prefix of another, is NotSingleValueField (54)
//! "cannot infer query fields to set, ...", as in MongoDB.

use bson::{Bson, Document};
use wire::{ErrorCode, MongoError, Result};

/// The document an upsert starts from when no document matched `filter`.
pub fn upsert_seed(filter: &Document) -> Result<Document> {
    let mut equalities: Vec<(String, Bson)> = Vec::new();
    collect(filter, &mut equalities);
    for (i, (a, _)) in equalities.iter().enumerate() {
        for (b, _) in equalities.iter().skip(i + 1) {
            if a == b {
                return Err(not_single(format!(
                    "cannot infer query fields to set, path '{a}' is matched twice"
                )));
            }
            if is_prefix(a, b) || is_prefix(b, a) {
                let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
                return Err(not_single(format!(
                    "cannot infer query fields to set, both paths '{long}' and '{short}' are matched"
                )));
            }
        }
    }
    let mut seed = Document::new();
    if let Some(pos) = equalities.iter().position(|(p, _)| p == "_id") {
        let (p, v) = equalities.remove(pos);
        seed.insert(p, v);
    }
    for (path, value) in equalities {
        insert_path(&mut seed, &path, value);
    }
    Ok(seed)
}

fn not_single(msg: String) -> MongoError {
    MongoError::new(ErrorCode::NOT_SINGLE_VALUE_FIELD, msg)
}

fn is_prefix(short: &str, long: &str) -> bool {
    long.strip_prefix(short).is_some_and(|r| r.starts_with('.'))
}

fn collect(filter: &Document, out: &mut Vec<(String, Bson)>) {
    for (k, v) in filter {
        match k.as_str() {
            "$and" => {
                if let Bson::Array(clauses) = v {
                    for c in clauses {
                        if let Bson::Document(d) = c {
                            collect(d, out);
                        }
                    }
                }
            }
            "$or" => {
                if let Bson::Array(clauses) = v
                    && let [Bson::Document(only)] = clauses.as_slice()
                {
                    collect(only, out);
                }
            }
            k if k.starts_with('$') => {}
            _ => {
                if let Some(value) = equality_value(v) {
                    out.push((k.clone(), value));
                }
            }
        }
    }
}

/// The value a path predicate pins the field to, if it is an equality.
fn equality_value(v: &Bson) -> Option<Bson> {
    match v {
        Bson::RegularExpression(_) => None,
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if let Some(eq) = d.get("$eq") {
                return Some(eq.clone());
            }
            match d.get("$in") {
                Some(Bson::Array(vals)) if vals.len() == 1 => match vals.first() {
                    Some(Bson::RegularExpression(_)) | None => None,
                    Some(only) => Some(only.clone()),
                },
                _ => None,
            }
        }
        other => Some(other.clone()),
    }
}

fn insert_path(doc: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
        }
        Some((head, rest)) => {
            if !matches!(doc.get(head), Some(Bson::Document(_))) {
                doc.insert(head, Document::new());
            }
            if let Some(Bson::Document(sub)) = doc.get_mut(head) {
                insert_path(sub, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn equality_fields_become_the_seed_with_id_first_and_dotted_paths_nested() {
        let seed = upsert_seed(&doc! {
            "x": {"$gt": 1}, "a.b": 1, "c": {"$eq": [1, 2]}, "_id": 7,
            "$and": [{"a.c": "s"}, {"d": {"$in": [true]}}], "$or": [{"e": 1}, {"f": 2}],
            "r": {"$regex": "x"}, "$expr": {"$eq": ["$a", 1]},
        })
        .unwrap();
        let expected = doc! {"_id": 7, "a": {"b": 1, "c": "s"}, "c": [1, 2], "d": true};
        assert_eq!(
            seed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            vec!["_id", "a", "c", "d"]
        );
        assert_eq!(seed, expected);
    }

    #[test]
    fn single_clause_or_is_an_equality() {
        assert_eq!(
            upsert_seed(&doc! {"$or": [{"a": 1}]}).unwrap(),
            doc! {"a": 1}
        );
    }

    #[test]
    fn a_path_matched_twice_is_not_single_value_field() {
        let e = upsert_seed(&doc! {"a": 1, "$and": [{"a": 2}]}).unwrap_err();
        assert_eq!(e.code, 54);
        let e = upsert_seed(&doc! {"a": {"b": 1}, "a.b": 2}).unwrap_err();
        assert_eq!(e.code, 54);
    }

    #[test]
    fn operator_documents_other_than_eq_contribute_nothing() {
        assert_eq!(
            upsert_seed(&doc! {"a": {"$ne": 1}, "b": {"$in": [1, 2]}}).unwrap(),
            doc! {}
        );
    }
}
