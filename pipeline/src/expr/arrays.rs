//! Array operators: `$size`, `$arrayElemAt`, `$first`, `$last`, `$in`, `$isArray`,
//! `$concatArrays`, `$slice`, `$reverseArray`, `$range`, `$indexOfArray`, and those that bind a
//! variable to each element in turn: `$map`, `$filter`, `$reduce`.
//!
//! Invariants: a negative index or position counts from the end, and an element past either
//! end is missing (`$arrayElemAt`, `$first`, `$last`) or left out (`$slice`), not an error;
//! elements are equal as the environment's collation says; `$map`, `$reduce` and
//! `$concatArrays` bound what they build as every value an expression makes is bounded (200
//! levels, 16 MiB), `$range` at a million elements; loops over elements check for an
//! interruption at each one ([`crate::interrupt::check`]).

use bson::Bson;
use wire::ErrorCode;

use super::{
    Cx, Env, MAX_VALUE_BYTES, Node, Op, arg, array_arg, bounded, err, eval, int_arg, int_result,
    is_nullish, missing_name, too_large,
};
use crate::value::{self, truthy, type_name};
use crate::{MongoError, Result};

/// `$size`.
pub(super) fn size(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = arg(a, 0);
    Ok(match v {
        Some(Bson::Array(x)) => Some(int_result(i64::try_from(x.len()).unwrap_or(i64::MAX))),
        other => {
            return Err(err(
                17124,
                format!(
                    "The argument to $size must be an array. Type of the argument was: {}",
                    missing_name(&other)
                ),
            ));
        }
    })
}

/// `$arrayElemAt`.
pub(super) fn array_elem_at(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (x, y) = (arg(a, 0), arg(a, 1));
    if is_nullish(&x) || is_nullish(&y) {
        return Ok(Some(Bson::Null));
    }
    let arr = array_arg(
        "$arrayElemAt",
        x,
        28689,
        "'s first argument must be an array, but is ",
    )?;
    let idx = match &y {
        Some(n) if value::is_number(n) => value::as_i64_exact(n).ok_or_else(|| {
            err(
                28691,
                format!(
                    "$arrayElemAt's second argument must be representable as a 32-bit integer: {n}"
                ),
            )
        })?,
        _ => {
            return Err(err(
                28690,
                format!(
                    "$arrayElemAt's second argument must be a numeric value, but is {}",
                    missing_name(&y)
                ),
            ));
        }
    };
    Ok(element_at(arr, idx))
}

/// `$first` and `$last`.
pub(super) fn first_or_last(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = if op == Op::First { "$first" } else { "$last" };
    let x = arg(a, 0);
    if is_nullish(&x) {
        return Ok(Some(Bson::Null));
    }
    let arr = array_arg(name, x, 28689, "'s argument must be an array, but is ")?;
    Ok(element_at(arr, if op == Op::First { 0 } else { -1 }))
}

/// `$in`.
pub(super) fn in_array(a: &[Option<Bson>], env: &Env) -> Result<Option<Bson>> {
    let x = arg(a, 0).unwrap_or(Bson::Undefined);
    let arr = array_arg(
        "$in",
        arg(a, 1),
        40081,
        " requires an array as a second argument, found: ",
    )?;
    Ok(Some(Bson::Boolean(arr.iter().any(|e| env.equal(e, &x)))))
}

/// `$isArray`.
pub(super) fn is_array(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::Boolean(matches!(
        arg(a, 0),
        Some(Bson::Array(_))
    ))))
}

/// `$concatArrays`.
pub(super) fn concat_arrays(mut a: Vec<Option<Bson>>) -> Result<Option<Bson>> {
    let mut out = Vec::new();
    for v in a.drain(..) {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(Bson::Array(x)) => out.extend(x),
            Some(other) => {
                return Err(err(
                    28664,
                    format!(
                        "$concatArrays only supports arrays, not {}",
                        type_name(&other)
                    ),
                ));
            }
        }
    }
    Ok(Some(bounded(Bson::Array(out))?))
}

/// `$slice`: `[array, n]` (the first or last `n`) or `[array, position, n]`.
pub(super) fn slice(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let x = arg(a, 0);
    if a.iter().any(is_nullish) {
        return Ok(Some(Bson::Null));
    }
    let arr = array_arg(
        "$slice",
        x,
        28724,
        ": First argument to $slice must be an array, but is of type: ",
    )?;
    let len = i64::try_from(arr.len()).unwrap_or(i64::MAX);
    let (start, count) = if a.len() == 2 {
        let n = int_arg("$slice", &arg(a, 1), 28725)?;
        if n >= 0 {
            (0, n)
        } else {
            ((len + n).max(0), -n)
        }
    } else {
        let p = int_arg("$slice", &arg(a, 1), 28725)?;
        let n = int_arg("$slice", &arg(a, 2), 28726)?;
        if n <= 0 {
            return Err(err(
                28729,
                format!("Third argument to $slice must be positive: {n}"),
            ));
        }
        let start = if p >= 0 { p.min(len) } else { (len + p).max(0) };
        (start, n)
    };
    let start = usize::try_from(start).unwrap_or(0);
    let count = usize::try_from(count).unwrap_or(0);
    Ok(Some(Bson::Array(
        arr.into_iter().skip(start).take(count).collect(),
    )))
}

/// `$reverseArray`.
pub(super) fn reverse_array(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let x = arg(a, 0);
    if is_nullish(&x) {
        return Ok(Some(Bson::Null));
    }
    let mut arr = array_arg("$reverseArray", x, 34435, " must be an array, found: ")?;
    arr.reverse();
    Ok(Some(Bson::Array(arr)))
}

/// `$range`.
pub(super) fn range(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let start = int_arg("$range", &arg(a, 0), 34443)?;
    let end = int_arg("$range", &arg(a, 1), 34445)?;
    let step = match a.get(2) {
        Some(v) => int_arg("$range", v, 34447)?,
        None => 1,
    };
    if step == 0 {
        return Err(err(34449, "$range requires a non-zero step value"));
    }
    let mut out = Vec::new();
    let mut i = start;
    while (step > 0 && i < end) || (step < 0 && i > end) {
        crate::interrupt::check()?;
        if out.len() >= RANGE_MAX_ELEMENTS {
            return Err(MongoError::new(
                ErrorCode {
                    code: 146,
                    name: "ExceededMemoryLimit",
                },
                "$range would use too much memory",
            ));
        }
        out.push(int_result(i));
        match i.checked_add(step) {
            Some(n) => i = n,
            None => break,
        }
    }
    Ok(Some(Bson::Array(out)))
}

/// `$indexOfArray`: -1 when not found.
pub(super) fn index_of_array(a: &[Option<Bson>], env: &Env) -> Result<Option<Bson>> {
    let x = arg(a, 0);
    if is_nullish(&x) {
        return Ok(Some(Bson::Null));
    }
    let arr = array_arg(
        "$indexOfArray",
        x,
        40090,
        " requires an array as a first argument, found: ",
    )?;
    let needle = arg(a, 1).unwrap_or(Bson::Undefined);
    let start = match a.get(2) {
        Some(v) => usize::try_from(int_arg("$indexOfArray", v, 40097)?.max(0)).unwrap_or(0),
        None => 0,
    };
    let end = match a.get(3) {
        Some(v) => usize::try_from(int_arg("$indexOfArray", v, 40097)?.max(0)).unwrap_or(0),
        None => arr.len(),
    }
    .min(arr.len());
    let found = (start..end).find(|i| arr.get(*i).is_some_and(|e| env.equal(e, &needle)));
    Ok(Some(int_result(
        found.and_then(|i| i64::try_from(i).ok()).unwrap_or(-1),
    )))
}

/// The input array of `$map`, `$filter` or `$reduce`: `None` when it is missing or null (the
/// operator's value is then null), else the operator's error `code`, its message naming the
/// type found.
fn array_input(
    v: Option<Bson>,
    code: i32,
    message: impl FnOnce(&str) -> String,
) -> Result<Option<Vec<Bson>>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(Bson::Array(a)) => Ok(Some(a)),
        Some(other) => Err(err(code, message(type_name(&other)))),
    }
}

/// `$map`.
pub(super) fn eval_map(
    input: &Node,
    name: &str,
    body: &Node,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let Some(arr) = array_input(eval(input, cx)?, 16883, |t| {
        format!("input to $map must be an array not {t}")
    })?
    else {
        return Ok(Some(Bson::Null));
    };
    let mut out = Vec::with_capacity(arr.len());
    let mut size = 0_usize;
    for e in arr {
        crate::interrupt::check()?;
        cx.vars.push((name.to_owned(), Some(e)));
        let r = eval(body, cx);
        cx.vars.pop();
        let v = r?.unwrap_or(Bson::Null);
        size = size.saturating_add(crate::changestream::split::value_size(&v));
        if size > MAX_VALUE_BYTES {
            return Err(too_large(size));
        }
        out.push(v);
    }
    Ok(Some(bounded(Bson::Array(out))?))
}

/// `$filter`, up to `limit` elements.
pub(super) fn eval_filter(
    input: &Node,
    name: &str,
    cond: &Node,
    limit: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let Some(arr) = array_input(eval(input, cx)?, 28651, |t| {
        format!("input to $filter must be an array not {t}")
    })?
    else {
        return Ok(Some(Bson::Null));
    };
    let limit = match limit {
        None => None,
        Some(l) => match eval(l, cx)? {
            None | Some(Bson::Null) => None,
            Some(v) => match value::as_i64_exact(&v) {
                Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                Some(_) => {
                    return Err(err(
                        327391,
                        format!("$filter: limit must be greater than 0: {v}"),
                    ));
                }
                None => {
                    return Err(err(
                        327392,
                        "$filter: limit must be represented as a 32-bit integral value",
                    ));
                }
            },
        },
    };
    let mut out = Vec::new();
    for e in arr {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        crate::interrupt::check()?;
        cx.vars.push((name.to_owned(), Some(e.clone())));
        let r = eval(cond, cx);
        cx.vars.pop();
        if truthy(&r?.unwrap_or(Bson::Null)) {
            out.push(e);
        }
    }
    Ok(Some(Bson::Array(out)))
}

/// `$reduce`: `$$value` is the accumulator, `$$this` the element.
pub(super) fn eval_reduce(
    input: &Node,
    initial: &Node,
    body: &Node,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let Some(arr) = array_input(eval(input, cx)?, 40080, |t| {
        format!("$reduce requires that 'input' be an array, found: {t}")
    })?
    else {
        return Ok(Some(Bson::Null));
    };
    let mut acc = eval(initial, cx)?;
    for e in arr {
        crate::interrupt::check()?;
        cx.vars.push(("value".into(), acc));
        cx.vars.push(("this".into(), Some(e)));
        let r = eval(body, cx);
        cx.vars.pop();
        cx.vars.pop();
        acc = r?.map(bounded).transpose()?;
    }
    Ok(acc)
}

/// The most elements `$range` may produce (MongoDB bounds it by a 64MB memory limit).
const RANGE_MAX_ELEMENTS: usize = 1_000_000;

fn element_at(arr: Vec<Bson>, idx: i64) -> Option<Bson> {
    let len = i64::try_from(arr.len()).unwrap_or(i64::MAX);
    let i = if idx < 0 { len + idx } else { idx };
    if i < 0 || i >= len {
        return None;
    }
    arr.into_iter().nth(usize::try_from(i).ok()?)
}
