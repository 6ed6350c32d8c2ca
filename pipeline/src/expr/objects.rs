//! Object operators: `$mergeObjects`, `$objectToArray`, `$arrayToObject`, `$setField` and
//! `$unsetField` (`$getField` is a plain lookup, the evaluator's own).
//!
//! Invariants: a field set again keeps its place and takes the new value (`$mergeObjects`,
//! `$arrayToObject`, `$setField`); null and missing inputs to `$mergeObjects` are skipped, and
//! what it builds is bounded as every value an expression makes is (200 levels, 16 MiB);
//! `$arrayToObject`'s keys are strings without NUL bytes (40394, 4940400).

use bson::{Bson, Document};

use super::{Cx, Node, arg, array_arg, bounded, err, eval, is_nullish};
use crate::Result;
use crate::value::type_name;

/// `$mergeObjects`.
pub(super) fn merge_objects(a: Vec<Option<Bson>>) -> Result<Option<Bson>> {
    let mut out = Document::new();
    for (i, v) in a.into_iter().enumerate() {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => {}
            Some(Bson::Document(d)) => {
                for (k, v) in d {
                    out.insert(k, v);
                }
            }
            Some(other) => {
                return Err(err(
                    40400,
                    format!(
                        "$mergeObjects requires object inputs, but input {} is of type {}",
                        i,
                        type_name(&other)
                    ),
                ));
            }
        }
    }
    Ok(Some(bounded(Bson::Document(out))?))
}

/// `$objectToArray`: `{k, v}` documents in field order.
pub(super) fn object_to_array(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(match arg(a, 0) {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Some(Bson::Null),
        Some(Bson::Document(d)) => Some(Bson::Array(
            d.into_iter()
                .map(|(k, v)| Bson::Document(bson::doc! {"k": k, "v": v}))
                .collect(),
        )),
        Some(other) => {
            return Err(err(
                40390,
                format!(
                    "$objectToArray requires a document input, found: {}",
                    type_name(&other)
                ),
            ));
        }
    })
}

/// `$arrayToObject`: from `[k, v]` pairs or `{k, v}` documents.
pub(super) fn array_to_object(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let x = arg(a, 0);
    if is_nullish(&x) {
        return Ok(Some(Bson::Null));
    }
    let arr = array_arg(
        "$arrayToObject",
        x,
        40386,
        " requires an array input, found: ",
    )?;
    let mut out = Document::new();
    for e in arr {
        let (k, v) = match e {
            Bson::Array(kv) => {
                let [k, v] = <[Bson; 2]>::try_from(kv).map_err(|kv| {
                    err(40397, format!("$arrayToObject requires an array of size 2 arrays,found array of size: {}", kv.len()))
                })?;
                (k, v)
            }
            Bson::Document(mut d) => {
                if d.len() != 2 {
                    return Err(err(
                        40392,
                        format!(
                            "$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{}",
                            d.len()
                        ),
                    ));
                }
                match (d.remove("k"), d.remove("v")) {
                    (Some(k), Some(v)) => (k, v),
                    _ => {
                        return Err(err(
                            40393,
                            "$arrayToObject requires an object with keys 'k' and 'v'.",
                        ));
                    }
                }
            }
            other => {
                return Err(err(
                    40398,
                    format!(
                        "Unrecognised input type format for $arrayToObject: {}",
                        type_name(&other)
                    ),
                ));
            }
        };
        let Bson::String(k) = k else {
            return Err(err(
                40394,
                format!(
                    "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string. Found type: {}",
                    type_name(&k)
                ),
            ));
        };
        if k.contains('\0') {
            return Err(err(
                4940400,
                "Key field cannot contain an embedded null byte",
            ));
        }
        out.insert(k, v);
    }
    Ok(Some(Bson::Document(out)))
}

/// `$setField`, and `$unsetField` (no `value`): a copy of `input` with `field` set or removed.
pub(super) fn eval_set_field(
    field: &str,
    input: &Node,
    value: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let mut d = match eval(input, cx)? {
        None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
        Some(Bson::Document(d)) => d,
        Some(other) => {
            return Err(err(
                4161105,
                format!(
                    "$setField requires 'input' to evaluate to type Object, got {}",
                    type_name(&other)
                ),
            ));
        }
    };
    match value {
        Some(n) => match eval(n, cx)? {
            Some(v) => {
                d.insert(field, v);
            }
            None => {
                d.remove(field);
            }
        },
        None => {
            d.remove(field);
        }
    }
    Ok(Some(Bson::Document(d)))
}
