//! Arithmetic on evaluated arguments: `$add`, `$subtract`, `$multiply`, `$divide`, `$mod`,
//! `$abs`, `$ceil`, `$floor`, `$round`, `$trunc`, `$sqrt`, `$exp`, `$ln`, `$log10`, `$log`, `$pow`,
//! and
//! `$sum`, `$avg`, `$min`, `$max` over their arguments (or over one array argument).
//!
//! Invariants: a null or missing operand makes `null` (`$sum` and `$avg` count only numbers,
//! `$min` and `$max` skip nulls); a decimal operand makes a decimal result; integer arithmetic
//! never panics: it widens (int32 → int64 → double, [`value::add_numbers`]'s promotion) or
//! fails with MongoDB's code (`$abs` of the smallest long, 28680).

use bson::Bson;

use super::{Env, Op, arg, err, int_result, is_nullish, missing_name};
use crate::Result;
use crate::value::{self, type_name};

/// `$add`: numbers, or one date and numbers (milliseconds added to it).
pub(super) fn add(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let mut acc = Bson::Int32(0);
    let mut date: Option<i64> = None;
    for v in a {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(Bson::DateTime(d)) => {
                if date.is_some() {
                    return Err(err(16612, "only one date allowed in an $add expression"));
                }
                date = Some(d.timestamp_millis());
            }
            Some(n) if value::is_number(n) => {
                acc = value::add_numbers(&acc, n).unwrap_or(Bson::Null);
            }
            Some(other) => {
                return Err(err(
                    16554,
                    format!(
                        "$add only supports numeric or date types, not {}",
                        type_name(other)
                    ),
                ));
            }
        }
    }
    Ok(match date {
        Some(ms) => {
            let delta = match &acc {
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                other => value::as_f64(other).unwrap_or(0.0).round() as i64,
            };
            Some(Bson::DateTime(bson::DateTime::from_millis(
                ms.wrapping_add(delta),
            )))
        }
        None => Some(acc),
    })
}

/// `$subtract`: numbers, a date minus a date (milliseconds), or a date minus milliseconds.
pub(super) fn subtract(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (x, y) = (arg(a, 0), arg(a, 1));
    if is_nullish(&x) || is_nullish(&y) {
        return Ok(Some(Bson::Null));
    }
    Ok(match (&x, &y) {
        (Some(Bson::DateTime(p)), Some(Bson::DateTime(q))) => Some(Bson::Int64(
            p.timestamp_millis().wrapping_sub(q.timestamp_millis()),
        )),
        (Some(Bson::DateTime(p)), Some(n)) if value::is_number(n) => {
            let delta = value::as_f64(n).unwrap_or(0.0).round() as i64;
            Some(Bson::DateTime(bson::DateTime::from_millis(
                p.timestamp_millis().wrapping_sub(delta),
            )))
        }
        (Some(p), Some(q)) if value::is_number(p) && value::is_number(q) => {
            value::sub_numbers(p, q)
        }
        _ => {
            return Err(err(
                16556,
                format!(
                    "can't $subtract {} from {}",
                    missing_name(&y),
                    missing_name(&x)
                ),
            ));
        }
    })
}

/// `$multiply`.
pub(super) fn multiply(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let mut acc = Bson::Int32(1);
    for v in a {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(n) if value::is_number(n) => {
                acc = value::mul_numbers(&acc, n).unwrap_or(Bson::Null);
            }
            Some(other) => {
                return Err(err(
                    16555,
                    format!(
                        "$multiply only supports numeric types, not {}",
                        type_name(other)
                    ),
                ));
            }
        }
    }
    Ok(Some(acc))
}

/// `$divide` and `$mod`.
pub(super) fn divide_or_mod(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (x, y) = (arg(a, 0), arg(a, 1));
    if is_nullish(&x) || is_nullish(&y) {
        return Ok(Some(Bson::Null));
    }
    let (Some(p), Some(q)) = (&x, &y) else {
        return Ok(Some(Bson::Null));
    };
    let name = if op == Op::Divide { "$divide" } else { "$mod" };
    if !value::is_number(p) || !value::is_number(q) {
        return Err(err(
            if op == Op::Divide { 16609 } else { 16611 },
            format!(
                "{name} only supports numeric types, not {} and {}",
                type_name(p),
                type_name(q)
            ),
        ));
    }
    let qf = value::as_f64(q).unwrap_or(f64::NAN);
    let decimal = matches!(p, Bson::Decimal128(_)) || matches!(q, Bson::Decimal128(_));
    Ok(if op == Op::Divide {
        if qf == 0.0 {
            return Err(err(16608, "can't $divide by zero"));
        }
        let r = value::as_f64(p).unwrap_or(f64::NAN) / qf;
        Some(if decimal {
            Bson::Decimal128(value::f64_to_decimal(r))
        } else {
            Bson::Double(r)
        })
    } else {
        if qf == 0.0 {
            return Err(err(16610, "can't $mod by 0"));
        }
        match (p, q) {
            (Bson::Int32(x), Bson::Int32(y)) => Some(Bson::Int32(x.wrapping_rem(*y))),
            (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
                let (x, y) = (
                    value::as_i64_exact(p).unwrap_or(0),
                    value::as_i64_exact(q).unwrap_or(1),
                );
                Some(Bson::Int64(x.wrapping_rem(y)))
            }
            _ => {
                let r = value::as_f64(p).unwrap_or(f64::NAN) % qf;
                Some(if decimal {
                    Bson::Decimal128(value::f64_to_decimal(r))
                } else {
                    Bson::Double(r)
                })
            }
        }
    })
}

/// `$abs`.
pub(super) fn abs(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = arg(a, 0);
    Ok(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Some(Bson::Null),
        Some(Bson::Int32(i)) => Some(match i.checked_abs() {
            Some(x) => Bson::Int32(x),
            None => Bson::Int64(i64::from(i).abs()),
        }),
        Some(Bson::Int64(i)) => {
            Some(Bson::Int64(i.checked_abs().ok_or_else(|| {
                err(28680, "can't take $abs of long long min")
            })?))
        }
        Some(ref n) if value::is_number(n) => {
            Some(float_like(n, value::as_f64(n).unwrap_or(f64::NAN).abs()))
        }
        Some(other) => {
            return Err(err(
                28765,
                format!(
                    "$abs only supports numeric types, not {}",
                    type_name(&other)
                ),
            ));
        }
    })
}

/// `$ceil` and `$floor`: integers are their own result.
pub(super) fn ceil_or_floor(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = if op == Op::Ceil { "$ceil" } else { "$floor" };
    let v = arg(a, 0);
    Ok(match numeric_unary(name, &v)? {
        None => Some(Bson::Null),
        Some(x) => match v {
            Some(Bson::Int32(_)) | Some(Bson::Int64(_)) => v,
            Some(ref n) => Some(float_like(
                n,
                if op == Op::Ceil { x.ceil() } else { x.floor() },
            )),
            None => Some(Bson::Null),
        },
    })
}

/// `$round` (half to even) and `$trunc`, to a `place` in [-20, 100].
pub(super) fn round_or_trunc(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = if op == Op::Round { "$round" } else { "$trunc" };
    let v = arg(a, 0);
    if numeric_unary(name, &v)?.is_none() {
        return Ok(Some(Bson::Null));
    }
    let place = match a.get(1).cloned().flatten() {
        None => 0,
        Some(Bson::Null) => return Ok(Some(Bson::Null)),
        Some(p) => {
            let n = value::as_i64_exact(&p).ok_or_else(|| {
                err(
                    51082,
                    format!("{name}: argument \"place\" must be an integral value, got: {p}"),
                )
            })?;
            if !(-20..=100).contains(&n) {
                return Err(err(
                    51083,
                    format!(
                        "Cannot apply {name} with precision value {n} value must be in [-20, 100]"
                    ),
                ));
            }
            n
        }
    };
    Ok(match v {
        Some(n) => Some(round_to(&n, place, op == Op::Trunc)?),
        None => Some(Bson::Null),
    })
}

/// `$sqrt`, `$exp`, `$ln` and `$log10`: a double, or a decimal for a decimal.
pub(super) fn sqrt_exp_or_log(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = match op {
        Op::Sqrt => "$sqrt",
        Op::Exp => "$exp",
        Op::Ln => "$ln",
        _ => "$log10",
    };
    let v = arg(a, 0);
    let Some(x) = numeric_unary(name, &v)? else {
        return Ok(Some(Bson::Null));
    };
    let r = match op {
        Op::Sqrt => {
            if x < 0.0 {
                return Err(err(
                    28714,
                    "$sqrt's argument must be greater than or equal to 0",
                ));
            }
            x.sqrt()
        }
        Op::Exp => x.exp(),
        Op::Ln => {
            if x <= 0.0 {
                return Err(err(
                    28766,
                    format!("$ln's argument must be a positive number, but is {x}"),
                ));
            }
            x.ln()
        }
        _ => {
            if x <= 0.0 {
                return Err(err(
                    28761,
                    format!("$log10's argument must be a positive number, but is {x}"),
                ));
            }
            x.log10()
        }
    };
    Ok(match v {
        Some(n @ Bson::Decimal128(_)) => Some(float_like(&n, r)),
        _ => Some(Bson::Double(r)),
    })
}

/// `$pow`: exact for integers while the result fits, a double otherwise.
/// `$log: [number, base]`.
pub(super) fn log(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (v, base) = (arg(a, 0), arg(a, 1));
    if is_nullish(&v) || is_nullish(&base) {
        return Ok(Some(Bson::Null));
    }
    let numeric = |b: &Option<Bson>, code: i32, what: &str| match b {
        Some(n) if value::is_number(n) => Ok(value::as_f64(n).unwrap_or(f64::NAN)),
        _ => Err(err(
            code,
            format!("$log's {what} must be numeric, not {}", missing_name(b)),
        )),
    };
    let x = numeric(&v, 28756, "argument")?;
    let b = numeric(&base, 28757, "base")?;
    if x <= 0.0 {
        return Err(err(
            28758,
            format!("$log's argument must be a positive number, but is {x}"),
        ));
    }
    if b <= 0.0 || b == 1.0 {
        return Err(err(
            28759,
            format!("$log's base must be a positive number not equal to 1, but is {b}"),
        ));
    }
    let decimal =
        matches!(v, Some(Bson::Decimal128(_))) || matches!(base, Some(Bson::Decimal128(_)));
    let r = x.ln() / b.ln();
    Ok(Some(if decimal {
        Bson::Decimal128(value::f64_to_decimal(r))
    } else {
        Bson::Double(r)
    }))
}

pub(super) fn pow(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (x, y) = (arg(a, 0), arg(a, 1));
    if is_nullish(&x) || is_nullish(&y) {
        return Ok(Some(Bson::Null));
    }
    let (Some(p), Some(q)) = (x, y) else {
        return Ok(Some(Bson::Null));
    };
    if !value::is_number(&p) {
        return Err(err(
            28762,
            format!("$pow's base must be numeric, not {}", type_name(&p)),
        ));
    }
    if !value::is_number(&q) {
        return Err(err(
            28763,
            format!("$pow's exponent must be numeric, not {}", type_name(&q)),
        ));
    }
    let (bf, ef) = (
        value::as_f64(&p).unwrap_or(f64::NAN),
        value::as_f64(&q).unwrap_or(f64::NAN),
    );
    if bf == 0.0 && ef < 0.0 {
        return Err(err(
            28764,
            "$pow cannot take a base of 0 and a negative exponent",
        ));
    }
    let ints = matches!(p, Bson::Int32(_) | Bson::Int64(_))
        && matches!(q, Bson::Int32(_) | Bson::Int64(_));
    Ok(if ints && ef >= 0.0 {
        let (b, e) = (
            value::as_i64_exact(&p).unwrap_or(0),
            value::as_i64_exact(&q).unwrap_or(0),
        );
        let exact = u32::try_from(e).ok().and_then(|e| b.checked_pow(e));
        match exact {
            Some(r) if matches!(p, Bson::Int32(_)) && matches!(q, Bson::Int32(_)) => {
                Some(int_result(r))
            }
            Some(r) => Some(Bson::Int64(r)),
            None => Some(Bson::Double(bf.powf(ef))),
        }
    } else if matches!(p, Bson::Decimal128(_)) || matches!(q, Bson::Decimal128(_)) {
        Some(Bson::Decimal128(value::f64_to_decimal(bf.powf(ef))))
    } else {
        Some(Bson::Double(bf.powf(ef)))
    })
}

/// `$sum`, `$avg`, `$min` and `$max` in expressions: over the arguments, or over the elements
/// of a single array argument.
pub(super) fn sum_avg_min_max(op: Op, a: Vec<Option<Bson>>, env: &Env) -> Result<Option<Bson>> {
    let items: Vec<Bson> = if a.len() == 1 {
        match arg(&a, 0) {
            Some(Bson::Array(x)) => x,
            Some(v) => vec![v],
            None => vec![],
        }
    } else {
        a.into_iter().flatten().collect()
    };
    Ok(match op {
        Op::Sum | Op::Avg => {
            let mut acc = Bson::Int32(0);
            let mut n = 0u64;
            for v in &items {
                if value::is_number(v) {
                    acc = value::add_numbers(&acc, v).unwrap_or(Bson::Null);
                    n += 1;
                }
            }
            if op == Op::Sum {
                Some(acc)
            } else if n == 0 {
                Some(Bson::Null)
            } else if matches!(acc, Bson::Decimal128(_)) {
                Some(Bson::Decimal128(value::f64_to_decimal(
                    value::as_f64(&acc).unwrap_or(f64::NAN) / n as f64,
                )))
            } else {
                Some(Bson::Double(
                    value::as_f64(&acc).unwrap_or(f64::NAN) / n as f64,
                ))
            }
        }
        _ => {
            let mut best: Option<Bson> = None;
            for v in items {
                if matches!(v, Bson::Null | Bson::Undefined) {
                    continue;
                }
                let replace = match &best {
                    None => true,
                    Some(b) => {
                        let o = env.compare(&v, b);
                        if op == Op::Min { o.is_lt() } else { o.is_gt() }
                    }
                };
                if replace {
                    best = Some(v);
                }
            }
            Some(best.unwrap_or(Bson::Null))
        }
    })
}

fn numeric_unary(op: &str, v: &Option<Bson>) -> Result<Option<f64>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(b) if value::is_number(b) => Ok(value::as_f64(b)),
        _ => Err(err(
            28765,
            format!("{op} only supports numeric types, not {}", missing_name(v)),
        )),
    }
}

/// A double result, or a decimal one when the input was decimal.
fn float_like(input: &Bson, r: f64) -> Bson {
    if matches!(input, Bson::Decimal128(_)) {
        Bson::Decimal128(value::f64_to_decimal(r))
    } else {
        Bson::Double(r)
    }
}

fn round_to(v: &Bson, place: i64, trunc: bool) -> Result<Bson> {
    let roundf = |x: f64| {
        if trunc {
            x.trunc()
        } else {
            x.round_ties_even()
        }
    };
    Ok(match v {
        Bson::Int32(_) | Bson::Int64(_) => {
            if place >= 0 {
                v.clone()
            } else {
                let n = match v {
                    Bson::Int32(i) => i64::from(*i),
                    Bson::Int64(i) => *i,
                    _ => 0,
                };
                let p = 10i128.pow(u32::try_from(-place).unwrap_or(0).min(30));
                let n128 = i128::from(n);
                let q = n128 / p;
                let r = n128 % p;
                let mut q = q;
                if !trunc {
                    let twice = r.abs() * 2;
                    if twice > p || (twice == p && q % 2 != 0) {
                        q += if n128 < 0 { -1 } else { 1 };
                    }
                }
                let out = q * p;
                match (v, i64::try_from(out)) {
                    (Bson::Int32(_), Ok(o)) => match i32::try_from(o) {
                        Ok(i) => Bson::Int32(i),
                        Err(_) => Bson::Int64(o),
                    },
                    (_, Ok(o)) => Bson::Int64(o),
                    (_, Err(_)) => Bson::Double(out as f64),
                }
            }
        }
        other => {
            let x = value::as_f64(other).unwrap_or(f64::NAN);
            if !x.is_finite() {
                return Ok(other.clone());
            }
            let scale = 10f64.powi(i32::try_from(place).unwrap_or(0));
            let r = if place == 0 {
                roundf(x)
            } else {
                roundf(x * scale) / scale
            };
            float_like(other, r)
        }
    })
}
