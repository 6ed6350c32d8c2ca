//! Set operators: `$setUnion`, `$setIntersection`, `$setDifference`, `$setEquals`,
//! `$setIsSubset`, `$anyElementTrue`, `$allElementsTrue`.
//!
//! Invariants: an array is read as a set (duplicates dropped, elements equal as the
//! environment's collation says); `$setUnion` and `$setIntersection` sort their result in
//! MongoDB's order, `$setDifference` keeps its first operand's; a null or missing operand makes
//! `null` for those three, and is an error for the others, which take arrays only.

use bson::Bson;

use super::{Env, Op, arg, array_arg, err, missing_name};
use crate::Result;
use crate::value::{truthy, type_name};

/// `$setUnion` and `$setIntersection`.
pub(super) fn union_or_intersection(
    op: Op,
    a: Vec<Option<Bson>>,
    env: &Env,
) -> Result<Option<Bson>> {
    let name = if op == Op::SetUnion {
        "$setUnion"
    } else {
        "$setIntersection"
    };
    let code = if op == Op::SetUnion { 17043 } else { 17047 };
    let mut acc: Option<Vec<Bson>> = None;
    for v in a {
        let Some(s) = set_of(name, v, code, env)? else {
            return Ok(Some(Bson::Null));
        };
        acc = Some(match acc {
            None => s,
            Some(mut cur) => {
                if op == Op::SetUnion {
                    for e in s {
                        if !cur.iter().any(|x| env.equal(x, &e)) {
                            cur.push(e);
                        }
                    }
                    cur
                } else {
                    cur.retain(|x| s.iter().any(|e| env.equal(x, e)));
                    cur
                }
            }
        });
    }
    let mut out = acc.unwrap_or_default();
    out.sort_by(|x, y| env.compare(x, y));
    Ok(Some(Bson::Array(out)))
}

/// `$setDifference`.
pub(super) fn difference(a: Vec<Option<Bson>>, env: &Env) -> Result<Option<Bson>> {
    let mut it = a.into_iter();
    let x = set_of("$setDifference", it.next().flatten(), 17048, env)?;
    let y = set_of("$setDifference", it.next().flatten(), 17049, env)?;
    Ok(match (x, y) {
        (Some(x), Some(y)) => Some(Bson::Array(
            x.into_iter()
                .filter(|e| !y.iter().any(|f| env.equal(e, f)))
                .collect(),
        )),
        _ => Some(Bson::Null),
    })
}

/// `$setEquals` and `$setIsSubset`.
pub(super) fn equals_or_subset(op: Op, a: Vec<Option<Bson>>, env: &Env) -> Result<Option<Bson>> {
    let name = if op == Op::SetEquals {
        "$setEquals"
    } else {
        "$setIsSubset"
    };
    let mut sets = Vec::new();
    for v in a {
        match set_of(name, v.clone(), 17044, env)? {
            Some(s) => sets.push(s),
            None => {
                return Err(err(
                    17044,
                    format!(
                        "All operands of {name} must be arrays. One argument is of type: {}",
                        missing_name(&v)
                    ),
                ));
            }
        }
    }
    let subset = |x: &Vec<Bson>, y: &Vec<Bson>| x.iter().all(|e| y.iter().any(|f| env.equal(e, f)));
    let r = match sets.as_slice() {
        [first, rest @ ..] if op == Op::SetEquals => {
            rest.iter().all(|s| subset(first, s) && subset(s, first))
        }
        [x, y] => subset(x, y),
        _ => false,
    };
    Ok(Some(Bson::Boolean(r)))
}

/// `$anyElementTrue` and `$allElementsTrue`.
pub(super) fn any_or_all_elements_true(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = if op == Op::AnyElementTrue {
        "$anyElementTrue"
    } else {
        "$allElementsTrue"
    };
    let arr = array_arg(
        name,
        arg(a, 0),
        if op == Op::AnyElementTrue {
            17041
        } else {
            17040
        },
        "'s argument must be an array, but is ",
    )?;
    Ok(Some(Bson::Boolean(if op == Op::AnyElementTrue {
        arr.iter().any(truthy)
    } else {
        arr.iter().all(truthy)
    })))
}

fn set_of(op: &str, v: Option<Bson>, code: i32, env: &Env) -> Result<Option<Vec<Bson>>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(Bson::Array(a)) => {
            let mut out: Vec<Bson> = Vec::new();
            for e in a {
                if !out.iter().any(|x| env.equal(x, &e)) {
                    out.push(e);
                }
            }
            Ok(Some(out))
        }
        Some(other) => Err(err(
            code,
            format!(
                "All operands of {op} must be arrays. One argument is of type: {}",
                type_name(&other)
            ),
        )),
    }
}
