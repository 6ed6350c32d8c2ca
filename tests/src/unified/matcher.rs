//! The unified test format's "evaluating matches" rules: an expected value against an actual
//! one.
//!
//! Rules: extra keys in the actual document are allowed only at the root (an operation's
//! result, each document of a root array such as a `find`'s result, a command of a
//! command-started event, a reply of a command-succeeded event); nested documents and arrays
//! must match exactly; numbers (int32, int64, double) compare by value; the special operators
//! `$$exists`, `$$type`, `$$unsetOrMatches`, `$$lte`, `$$matchAsDocument`, `$$matchAsRoot`
//! and `$$sessionLsid` apply where the spec puts them. An unknown `$$` operator is an error,
//! never a silent match; so is `$$sessionLsid` naming a session the test never created.

use std::collections::HashMap;

use mongodb::bson::{Bson, Document};

/// What the matcher needs from the test's entities: the lsid of each session entity, by id
/// (kept after `endSession`, as the spec requires for `$$sessionLsid`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cx<'a> {
    pub lsids: Option<&'a HashMap<String, Document>>,
}

/// Checks `actual` against `expected`; `root` allows extra keys at this level. The error says
/// where and why they differ.
pub fn matches(expected: &Bson, actual: Option<&Bson>, root: bool) -> Result<(), String> {
    matches_in(Cx::default(), expected, actual, root)
}

/// [`matches`] with the test's entities, for `$$sessionLsid`.
pub fn matches_in(
    cx: Cx<'_>,
    expected: &Bson,
    actual: Option<&Bson>,
    root: bool,
) -> Result<(), String> {
    at(cx, expected, actual, root, "")
}

/// [`matches`] for two documents at the root.
pub fn matches_root(expected: &Document, actual: &Document) -> Result<(), String> {
    at(
        Cx::default(),
        &Bson::Document(expected.clone()),
        Some(&Bson::Document(actual.clone())),
        true,
        "",
    )
}

fn operator(doc: &Document) -> Option<(&str, &Bson)> {
    if doc.len() != 1 {
        return None;
    }
    let (k, v) = doc.iter().next()?;
    k.starts_with("$$").then_some((k.as_str(), v))
}

fn at(
    cx: Cx<'_>,
    expected: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
) -> Result<(), String> {
    if let Bson::Document(e) = expected
        && let Some((op, arg)) = operator(e)
    {
        return special(cx, op, arg, actual, root, path);
    }
    let Some(actual) = actual else {
        return Err(format!(
            "{}: expected {expected}, found nothing",
            show(path)
        ));
    };
    match (expected, actual) {
        (Bson::Document(e), Bson::Document(a)) => {
            for (k, ev) in e {
                let sub = format!("{path}.{k}");
                at(cx, ev, a.get(k), false, &sub)?;
            }
            if !root && let Some(extra) = a.keys().find(|k| !e.contains_key(k.as_str())) {
                return Err(format!(
                    "{}: unexpected field {extra:?} in nested document {a}",
                    show(path)
                ));
            }
            Ok(())
        }
        (Bson::Array(e), Bson::Array(a)) => {
            if e.len() != a.len() {
                return Err(format!(
                    "{}: expected {} elements {expected}, found {} {actual}",
                    show(path),
                    e.len(),
                    a.len()
                ));
            }
            // The documents of a root array (a `find`'s result) are root documents too.
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                at(cx, ev, Some(av), root, &format!("{path}.{i}"))?;
            }
            Ok(())
        }
        _ => {
            if let (Some(x), Some(y)) = (number(expected), number(actual)) {
                return if x == y {
                    Ok(())
                } else {
                    Err(format!(
                        "{}: expected {expected}, found {actual}",
                        show(path)
                    ))
                };
            }
            if expected == actual {
                Ok(())
            } else {
                Err(format!(
                    "{}: expected {expected}, found {actual}",
                    show(path)
                ))
            }
        }
    }
}

fn special(
    cx: Cx<'_>,
    op: &str,
    arg: &Bson,
    actual: Option<&Bson>,
    root: bool,
    path: &str,
) -> Result<(), String> {
    match op {
        "$$exists" => {
            let want = match arg {
                Bson::Boolean(b) => *b,
                other => return Err(format!("$$exists takes a boolean, got {other}")),
            };
            match (want, actual.is_some()) {
                (true, true) | (false, false) => Ok(()),
                (true, false) => Err(format!("{}: expected the field to exist", show(path))),
                (false, true) => Err(format!(
                    "{}: expected no field, found {}",
                    show(path),
                    actual.map(ToString::to_string).unwrap_or_default()
                )),
            }
        }
        "$$unsetOrMatches" => match actual {
            None => Ok(()),
            Some(_) => at(cx, arg, actual, root, path),
        },
        "$$type" => {
            let Some(actual) = actual else {
                return Err(format!("{}: expected a value of type {arg}", show(path)));
            };
            let names: Vec<&str> = match arg {
                Bson::String(s) => vec![s.as_str()],
                Bson::Array(a) => a.iter().filter_map(Bson::as_str).collect(),
                other => return Err(format!("$$type takes a string or an array, got {other}")),
            };
            let have = type_name(actual);
            if names
                .iter()
                .any(|n| *n == have || (*n == "number" && number(actual).is_some()))
            {
                Ok(())
            } else {
                Err(format!(
                    "{}: expected type {arg}, found {have} ({actual})",
                    show(path)
                ))
            }
        }
        "$$lte" => match (number(arg), actual.and_then(number)) {
            (Some(max), Some(v)) if v <= max => Ok(()),
            _ => Err(format!(
                "{}: expected a number <= {arg}, found {actual:?}",
                show(path)
            )),
        },
        "$$matchAsDocument" => match actual {
            Some(Bson::String(s)) => {
                let doc: Bson = serde_json::from_str(s)
                    .map_err(|e| format!("{}: not JSON: {e}", show(path)))?;
                at(cx, arg, Some(&doc), false, path)
            }
            other => Err(format!(
                "{}: expected a JSON string, found {other:?}",
                show(path)
            )),
        },
        "$$matchAsRoot" => at(cx, arg, actual, true, path),
        "$$sessionLsid" => {
            let Bson::String(id) = arg else {
                return Err(format!("$$sessionLsid takes a session id, got {arg}"));
            };
            let Some(lsid) = cx.lsids.and_then(|l| l.get(id)) else {
                return Err(format!(
                    "{}: $$sessionLsid names no session entity {id:?}",
                    show(path)
                ));
            };
            at(cx, &Bson::Document(lsid.clone()), actual, false, path)
        }
        other => Err(format!(
            "{}: unsupported special operator {other}",
            show(path)
        )),
    }
}

fn show(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

fn number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

/// The unified format's name of a BSON type.
pub fn type_name(v: &Bson) -> &'static str {
    match v {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{Bson, Timestamp, doc};

    use super::*;

    fn root(e: Document, a: Document) -> Result<(), String> {
        matches_root(&e, &a)
    }

    #[test]
    fn extra_keys_are_allowed_only_at_the_root() {
        assert!(root(doc! {"a": 1}, doc! {"a": 1, "b": 2}).is_ok());
        assert!(
            root(
                doc! {"ns": {"db": "d"}},
                doc! {"ns": {"db": "d", "coll": "c"}}
            )
            .is_err()
        );
        assert!(root(doc! {"x": [{"a": 1}]}, doc! {"x": [{"a": 1, "b": 1}]}).is_err());
        // A root array's documents (a find's result) are root documents.
        let expected = Bson::Array(vec![doc! {"_id": 1}.into()]);
        let actual = Bson::Array(vec![doc! {"_id": 1, "x": 11}.into()]);
        assert!(matches(&expected, Some(&actual), true).is_ok());
        assert!(matches(&expected, Some(&actual), false).is_err());
        let nested = Bson::Array(vec![doc! {"_id": 1, "d": {"a": 1}}.into()]);
        let nested_extra = Bson::Array(vec![doc! {"_id": 1, "d": {"a": 1, "b": 2}}.into()]);
        assert!(matches(&nested, Some(&nested_extra), true).is_err());
    }

    #[test]
    fn numbers_compare_by_value_but_not_with_other_types() {
        assert!(root(doc! {"n": 1}, doc! {"n": 1_i64}).is_ok());
        assert!(root(doc! {"n": 1}, doc! {"n": 1.0}).is_ok());
        assert!(root(doc! {"n": 1}, doc! {"n": 2}).is_err());
        assert!(root(doc! {"n": 1}, doc! {"n": "1"}).is_err());
        assert!(root(doc! {"n": 1}, doc! {"n": true}).is_err());
    }

    #[test]
    fn exists_checks_presence_both_ways() {
        assert!(root(doc! {"a": {"$$exists": true}}, doc! {"a": Bson::Null}).is_ok());
        assert!(root(doc! {"a": {"$$exists": true}}, doc! {}).is_err());
        assert!(root(doc! {"a": {"$$exists": false}}, doc! {}).is_ok());
        assert!(root(doc! {"a": {"$$exists": false}}, doc! {"a": 1}).is_err());
    }

    #[test]
    fn type_checks_the_bson_type() {
        let e = doc! {"t": {"$$type": "timestamp"}, "n": {"$$type": ["int", "long"]}};
        let ok = doc! {"t": Timestamp {time: 1, increment: 1}, "n": 3_i64};
        assert!(root(e.clone(), ok).is_ok());
        assert!(root(e.clone(), doc! {"t": 1, "n": 3}).is_err());
        assert!(root(e, doc! {"n": 3}).is_err());
        assert!(root(doc! {"o": {"$$type": "object"}}, doc! {"o": [1]}).is_err());
    }

    #[test]
    fn unset_or_matches_accepts_absence_or_a_match_only() {
        let e = doc! {"a": {"$$unsetOrMatches": {"x": 1}}};
        assert!(root(e.clone(), doc! {}).is_ok());
        assert!(root(e.clone(), doc! {"a": {"x": 1}}).is_ok());
        assert!(root(e.clone(), doc! {"a": {"x": 2}}).is_err());
        // The wrapped document is still nested: no extra keys.
        assert!(root(e, doc! {"a": {"x": 1, "y": 1}}).is_err());
    }

    #[test]
    fn arrays_must_have_the_same_length() {
        assert!(root(doc! {"a": [1, 2]}, doc! {"a": [1, 2, 3]}).is_err());
        assert!(root(doc! {"a": [1, 2]}, doc! {"a": [1]}).is_err());
        assert!(root(doc! {"a": [1, 2]}, doc! {"a": [1, 2]}).is_ok());
    }

    #[test]
    fn session_lsid_matches_only_that_sessions_lsid() {
        let lsid = |b: u8| {
            doc! {"id": mongodb::bson::Binary {
            subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![b; 16]}}
        };
        let lsids = HashMap::from([("s0".to_string(), lsid(1)), ("s1".to_string(), lsid(2))]);
        let cx = Cx {
            lsids: Some(&lsids),
        };
        let cmd = Bson::Document(doc! {"insert": "c", "lsid": lsid(1)});
        let want = |id: &str| Bson::Document(doc! {"lsid": {"$$sessionLsid": id}});
        assert!(matches_in(cx, &want("s0"), Some(&cmd), true).is_ok());
        assert!(matches_in(cx, &want("s1"), Some(&cmd), true).is_err());
        assert!(matches_in(cx, &want("s9"), Some(&cmd), true).is_err());
        assert!(
            matches(&want("s0"), Some(&cmd), true).is_err(),
            "no sessions known"
        );
        let missing = Bson::Document(doc! {"insert": "c"});
        assert!(matches_in(cx, &want("s0"), Some(&missing), true).is_err());
    }

    #[test]
    fn unknown_operators_fail() {
        assert!(root(doc! {"a": {"$$bogus": 1}}, doc! {"a": 1}).is_err());
    }
}
