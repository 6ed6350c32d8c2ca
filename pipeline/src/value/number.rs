//! Numbers as MongoDB reads them across int32, int64, double and decimal: the nearest `f64`,
//! the exact `i64` of an integral value, and Decimal128 to and from `f64`.
//!
//! Invariants: nothing here panics or silently rounds into an integer: [`as_i64_exact`] and
//! [`f64_to_i64_exact`] answer `None` for a fraction or a value out of range; a Decimal128 goes
//! through its string form (bson has no decimal arithmetic), NaN and the infinities included.

use bson::{Bson, Decimal128};

/// Whether the value is one of the four numeric types.
pub fn is_number(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_)
    )
}

/// The nearest `f64` of a numeric value; `None` for non-numbers.
pub fn as_f64(v: &Bson) -> Option<f64> {
    match v {
        Bson::Double(d) => Some(*d),
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Decimal128(d) => Some(decimal_to_f64(d)),
        _ => None,
    }
}

/// The value as an `i64` when it is a number with an integral value that fits.
pub fn as_i64_exact(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(_) | Bson::Decimal128(_) => {
            let d = as_f64(v)?;
            f64_to_i64_exact(d)
        }
        _ => None,
    }
}

/// `d` as an `i64` when it is integral and within range.
pub fn f64_to_i64_exact(d: f64) -> Option<i64> {
    // 2^63 is exactly representable; the valid range is [-2^63, 2^63).
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if d.is_finite() && d.fract() == 0.0 && (-TWO_63..TWO_63).contains(&d) {
        Some(d as i64)
    } else {
        None
    }
}

/// A Decimal128's nearest `f64` (through its string form).
pub fn decimal_to_f64(d: &Decimal128) -> f64 {
    let s = d.to_string();
    match s.as_str() {
        "NaN" | "-NaN" | "sNaN" | "-sNaN" => f64::NAN,
        "Infinity" => f64::INFINITY,
        "-Infinity" => f64::NEG_INFINITY,
        _ => s.parse::<f64>().unwrap_or(f64::NAN),
    }
}

/// A Decimal128 holding `d` (shortest round-trip digits).
pub fn f64_to_decimal(d: f64) -> Decimal128 {
    let s = if d.is_nan() {
        "NaN".to_string()
    } else if d.is_infinite() {
        if d > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        format!("{d:e}")
    };
    s.parse::<Decimal128>()
        .or_else(|_| "NaN".parse::<Decimal128>())
        .unwrap_or(Decimal128::from_bytes([0; 16]))
}
