//! Trigonometry on evaluated arguments: `$sin`, `$cos`, `$tan`, `$asin`, `$acos`, `$atan`,
//! `$atan2`, the hyperbolic `$sinh`, `$cosh`, `$tanh`, `$asinh`, `$acosh`, `$atanh`, and
//! `$degreesToRadians`, `$radiansToDegrees`.
//!
//! Invariants: a null or missing operand makes `null`; a decimal operand makes a decimal
//! result, any other number a double; NaN goes through; an operand outside the function's
//! domain fails with MongoDB's 50989, naming the domain, a non-number with 28765.

use bson::Bson;

use super::{Op, arg, err, missing_name};
use crate::Result;
use crate::value;

/// The operator's name and the interval it is defined on (`None`: every number).
fn domain(op: Op) -> (&'static str, Option<(f64, f64, &'static str)>) {
    const ALL: f64 = f64::INFINITY;
    match op {
        Op::Sin => ("$sin", Some((-ALL, ALL, "(-inf,inf)"))),
        Op::Cos => ("$cos", Some((-ALL, ALL, "(-inf,inf)"))),
        Op::Tan => ("$tan", Some((-ALL, ALL, "(-inf,inf)"))),
        Op::Asin => ("$asin", Some((-1.0, 1.0, "[-1,1]"))),
        Op::Acos => ("$acos", Some((-1.0, 1.0, "[-1,1]"))),
        Op::Atan => ("$atan", None),
        Op::Sinh => ("$sinh", None),
        Op::Cosh => ("$cosh", None),
        Op::Tanh => ("$tanh", None),
        Op::Asinh => ("$asinh", None),
        Op::Acosh => ("$acosh", Some((1.0, ALL, "[1,inf]"))),
        Op::Atanh => ("$atanh", Some((-1.0, 1.0, "[-1,1]"))),
        Op::DegreesToRadians => ("$degreesToRadians", None),
        _ => ("$radiansToDegrees", None),
    }
}

/// A one-argument function of the family.
pub(super) fn unary(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (name, defined_on) = domain(op);
    let v = arg(a, 0);
    let Some(x) = number(name, &v)? else {
        return Ok(Some(Bson::Null));
    };
    if let Some((low, high, shown)) = defined_on {
        // The sine, cosine and tangent are defined on the open interval: not at infinity.
        let open = high == f64::INFINITY && low == -f64::INFINITY;
        let outside = if open {
            x.is_infinite()
        } else {
            x < low || x > high
        };
        if outside {
            return Err(err(
                50989,
                format!("cannot apply {name} to {x}, value must be in {shown}"),
            ));
        }
    }
    let r = match op {
        Op::Sin => x.sin(),
        Op::Cos => x.cos(),
        Op::Tan => x.tan(),
        Op::Asin => x.asin(),
        Op::Acos => x.acos(),
        Op::Atan => x.atan(),
        Op::Sinh => x.sinh(),
        Op::Cosh => x.cosh(),
        Op::Tanh => x.tanh(),
        Op::Asinh => x.asinh(),
        Op::Acosh => x.acosh(),
        Op::Atanh => x.atanh(),
        Op::DegreesToRadians => x.to_radians(),
        _ => x.to_degrees(),
    };
    Ok(Some(like(v.as_ref(), r)))
}

/// `$atan2: [y, x]`: the angle of the point `(x, y)`.
pub(super) fn atan2(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (y, x) = (arg(a, 0), arg(a, 1));
    let (Some(fy), Some(fx)) = (number("$atan2", &y)?, number("$atan2", &x)?) else {
        return Ok(Some(Bson::Null));
    };
    let decimal = matches!(y, Some(Bson::Decimal128(_))) || matches!(x, Some(Bson::Decimal128(_)));
    let r = fy.atan2(fx);
    Ok(Some(if decimal {
        Bson::Decimal128(value::f64_to_decimal(r))
    } else {
        Bson::Double(r)
    }))
}

/// A numeric operand as a double; `None` for null or missing.
fn number(name: &str, v: &Option<Bson>) -> Result<Option<f64>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(b) if value::is_number(b) => Ok(value::as_f64(b)),
        _ => Err(err(
            28765,
            format!(
                "{name} only supports numeric types, not {}",
                missing_name(v)
            ),
        )),
    }
}

/// A double, or a decimal when the operand was one.
fn like(input: Option<&Bson>, r: f64) -> Bson {
    if matches!(input, Some(Bson::Decimal128(_))) {
        Bson::Decimal128(value::f64_to_decimal(r))
    } else {
        Bson::Double(r)
    }
}
