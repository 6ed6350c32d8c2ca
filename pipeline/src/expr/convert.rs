//! Types and conversions: `$type`, `$isNumber`, `$convert` and its shorthands (`$toString`,
//! `$toInt`, `$toLong`, `$toDouble`, `$toDecimal`, `$toBool`, `$toDate`, `$toObjectId`).
//!
//! Invariants: a null or missing input converts to `null` (or `$convert`'s `onNull`); a
//! conversion MongoDB does not define, or one whose target cannot hold the value (out of range,
//! NaN or infinity to an integer, a string that does not parse), is ConversionFailure (241),
//! which `$convert`'s `onError` replaces; the shorthands are `$convert` without `onError`.

use bson::Bson;

use super::dates::{ISO_DATE_FORMAT, format_date};
use super::strings::coerce_string;
use super::{Cx, Node, Op, arg, eval, is_nullish, missing_name};
use crate::value::{self, truthy, type_name};
use crate::{MongoError, Result};

/// `$type`: the type's alias, `"missing"` for a missing value.
pub(super) fn type_of(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::String(missing_name(&arg(a, 0)).to_string())))
}

/// `$isNumber`.
pub(super) fn is_number(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::Boolean(
        arg(a, 0).is_some_and(|v| value::is_number(&v)),
    )))
}

/// `$toString`, `$toInt`, `$toLong`, `$toDouble`, `$toDecimal` and `$toBool`.
pub(super) fn to_type(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = arg(a, 0);
    if is_nullish(&v) {
        return Ok(Some(Bson::Null));
    }
    let target = match op {
        Op::ToString => 2,
        Op::ToInt => 16,
        Op::ToLong => 18,
        Op::ToDouble => 1,
        Op::ToDecimal => 19,
        _ => 8,
    };
    Ok(Some(convert(&v.unwrap_or(Bson::Null), target)?))
}

/// `$toDate` and `$toObjectId`.
pub(super) fn to_date_or_object_id(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = arg(a, 0);
    if is_nullish(&v) {
        return Ok(Some(Bson::Null));
    }
    let target = if op == Op::ToDate { 9 } else { 7 };
    Ok(Some(convert(&v.unwrap_or(Bson::Null), target)?))
}

/// `$convert`: `to` is a type's alias or code.
pub(super) fn eval_convert(
    input: &Node,
    to: &Node,
    on_error: Option<&Node>,
    on_null: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let v = eval(input, cx)?;
    if is_nullish(&v) {
        return match on_null {
            Some(n) => eval(n, cx),
            None => Ok(Some(Bson::Null)),
        };
    }
    let to = eval(to, cx)?;
    let target = match &to {
        Some(Bson::String(s)) => value::type_code_of_name(s),
        Some(n) if value::is_number(n) => value::as_i64_exact(n)
            .and_then(|c| i32::try_from(c).ok())
            .filter(|c| value::type_name_of_code(*c).is_some()),
        None | Some(Bson::Null) => return Ok(Some(Bson::Null)),
        _ => None,
    };
    let Some(target) = target else {
        return Err(MongoError::bad_value(format!(
            "Unknown type name: {}",
            to.map(|t| t.to_string()).unwrap_or_default()
        )));
    };
    let v = v.unwrap_or(Bson::Null);
    Ok(match convert(&v, target) {
        Ok(r) => Some(r),
        Err(e) => match on_error {
            Some(n) => eval(n, cx)?,
            None => return Err(e),
        },
    })
}

fn convert(v: &Bson, target: i32) -> Result<Bson> {
    let fail = |what: &str| {
        MongoError::with_code(
            241,
            format!(
                "Unsupported conversion from {} to {what} in $convert with no onError value",
                type_name(v)
            ),
        )
    };
    let parse_fail = |what: &str, s: &str| {
        MongoError::with_code(
            241,
            format!("Failed to parse number '{s}' in $convert with no onError value: {what}"),
        )
    };
    Ok(match target {
        // double
        1 => match v {
            Bson::Boolean(b) => Bson::Double(if *b { 1.0 } else { 0.0 }),
            Bson::DateTime(d) => Bson::Double(d.timestamp_millis() as f64),
            Bson::String(s) => Bson::Double(
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|_| !s.is_empty() && s.trim() == s)
                    .ok_or_else(|| parse_fail("Did not consume whole string.", s))?,
            ),
            n if value::is_number(n) => Bson::Double(value::as_f64(n).unwrap_or(f64::NAN)),
            _ => return Err(fail("double")),
        },
        // string
        2 => match v {
            Bson::String(s) => Bson::String(s.clone()),
            Bson::Boolean(b) => Bson::String(b.to_string()),
            Bson::ObjectId(o) => Bson::String(o.to_hex()),
            Bson::DateTime(d) => Bson::String(format_date(d.timestamp_millis(), ISO_DATE_FORMAT)?),
            n if value::is_number(n) => Bson::String(coerce_string(&Some(n.clone()))?),
            _ => return Err(fail("string")),
        },
        // objectId
        7 => match v {
            Bson::ObjectId(o) => Bson::ObjectId(*o),
            Bson::String(s) => Bson::ObjectId(bson::oid::ObjectId::parse_str(s).map_err(|_| {
                MongoError::with_code(
                    241,
                    format!("Failed to parse objectId '{s}' in $convert with no onError value: Invalid string length for parsing to OID, expected 24 but found {}", s.len()),
                )
            })?),
            _ => return Err(fail("objectId")),
        },
        // bool
        8 => match v {
            Bson::Boolean(b) => Bson::Boolean(*b),
            n if value::is_number(n) => Bson::Boolean(truthy(n)),
            _ => Bson::Boolean(true),
        },
        // date
        9 => match v {
            Bson::DateTime(d) => Bson::DateTime(*d),
            Bson::Int64(i) => Bson::DateTime(bson::DateTime::from_millis(*i)),
            Bson::Double(d) if d.is_finite() => {
                Bson::DateTime(bson::DateTime::from_millis(d.trunc() as i64))
            }
            Bson::Timestamp(t) => {
                Bson::DateTime(bson::DateTime::from_millis(i64::from(t.time) * 1000))
            }
            Bson::ObjectId(o) => Bson::DateTime(o.timestamp()),
            Bson::String(s) => Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).map_err(
                |_| MongoError::with_code(241, format!("Error parsing date string '{s}'")),
            )?),
            _ => return Err(fail("date")),
        },
        // int, long
        16 | 18 => {
            let what = if target == 16 { "int" } else { "long" };
            let n: i64 = match v {
                Bson::Boolean(b) => i64::from(*b),
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                Bson::DateTime(d) if target == 18 => d.timestamp_millis(),
                Bson::Double(_) | Bson::Decimal128(_) => {
                    let d = value::as_f64(v).unwrap_or(f64::NAN);
                    if !d.is_finite() {
                        return Err(MongoError::with_code(
                            241,
                            format!("Attempt to convert NaN or infinity value to integer type in $convert with no onError value: {d}"),
                        ));
                    }
                    let t = d.trunc();
                    value::f64_to_i64_exact(t).ok_or_else(|| {
                        MongoError::with_code(
                            241,
                            format!("Conversion would overflow target type in $convert with no onError value: {d}"),
                        )
                    })?
                }
                Bson::String(s) => s
                    .parse::<i64>()
                    .map_err(|_| parse_fail("Did not consume whole string.", s))?,
                _ => return Err(fail(what)),
            };
            if target == 16 {
                Bson::Int32(i32::try_from(n).map_err(|_| {
                    MongoError::with_code(
                        241,
                        format!("Conversion would overflow target type in $convert with no onError value: {n}"),
                    )
                })?)
            } else {
                Bson::Int64(n)
            }
        }
        // decimal
        19 => match v {
            Bson::Decimal128(d) => Bson::Decimal128(*d),
            Bson::Boolean(b) => Bson::Decimal128(value::f64_to_decimal(if *b { 1.0 } else { 0.0 })),
            Bson::Int32(i) => Bson::Decimal128(i.to_string().parse().map_err(|_| fail("decimal"))?),
            Bson::Int64(i) => Bson::Decimal128(i.to_string().parse().map_err(|_| fail("decimal"))?),
            Bson::Double(d) => Bson::Decimal128(value::f64_to_decimal(*d)),
            Bson::String(s) => Bson::Decimal128(
                s.parse()
                    .map_err(|_| parse_fail("Failed to parse string to decimal", s))?,
            ),
            _ => return Err(fail("decimal")),
        },
        _ => {
            return Err(MongoError::with_code(
                241,
                format!(
                    "Unsupported conversion from {} to {} in $convert with no onError value",
                    type_name(v),
                    value::type_name_of_code(target).unwrap_or("unknown")
                ),
            ));
        }
    })
}
