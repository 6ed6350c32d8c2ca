//! Exact Decimal128 comparison and (where it fits) exact addition and multiplication.
//!
//! bson 3.1 only stores a Decimal128's bytes and converts it to and from strings, so values are
//! read through their string form into [`Dec`]: a sign, a coefficient of at most 34 digits and
//! a power-of-ten exponent. Invariants:
//! * [`compare`] is exact between decimals and integers; a double is first rounded to 34
//!   significant digits (as MongoDB does), so `NumberDecimal("0.1") != 0.1`.
//! * NaN equals NaN and sorts below every number; zeros are equal whatever their sign or
//!   exponent; `1.0 == 1.00 == 1`.
//! * [`add`]/[`mul`] are exact when the aligned coefficients fit in 128 bits, and round to 34
//!   digits like IEEE decimal128 otherwise through the bson parser; `None` means "fall back to
//!   binary floating point" (infinities, NaN, or coefficients too wide to align).

use std::cmp::Ordering;

use bson::{Bson, Decimal128};

/// A decoded decimal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dec {
    NaN,
    Inf { neg: bool },
    Finite { neg: bool, coef: u128, exp: i32 },
}

impl Dec {
    /// Reads a Decimal128 through its canonical string (`"-1.05E+3"`, `"0.001"`, `"NaN"`).
    pub fn of_decimal(d: &Decimal128) -> Dec {
        parse(&d.to_string()).unwrap_or(Dec::NaN)
    }

    /// An integer, exactly.
    pub fn of_i64(i: i64) -> Dec {
        Dec::Finite {
            neg: i < 0,
            coef: u128::from(i.unsigned_abs()),
            exp: 0,
        }
    }

    /// A double rounded to 34 significant digits.
    pub fn of_f64(d: f64) -> Dec {
        if d.is_nan() {
            Dec::NaN
        } else if d.is_infinite() {
            Dec::Inf { neg: d < 0.0 }
        } else {
            parse(&format!("{d:.33e}")).unwrap_or(Dec::NaN)
        }
    }

    /// The numeric value of any BSON number; `None` for non-numbers.
    pub fn of_bson(v: &Bson) -> Option<Dec> {
        Some(match v {
            Bson::Int32(i) => Dec::of_i64(i64::from(*i)),
            Bson::Int64(i) => Dec::of_i64(*i),
            Bson::Double(d) => Dec::of_f64(*d),
            Bson::Decimal128(d) => Dec::of_decimal(d),
            _ => return None,
        })
    }

    /// Encodes as a Decimal128 (rounding to 34 digits); `None` if the exponent is out of range.
    pub fn to_decimal(self) -> Option<Decimal128> {
        let s = match self {
            Dec::NaN => "NaN".to_string(),
            Dec::Inf { neg } => if neg { "-Infinity" } else { "Infinity" }.to_string(),
            Dec::Finite { neg, coef, exp } => {
                format!("{}{coef}E{exp}", if neg { "-" } else { "" })
            }
        };
        s.parse().ok()
    }
}

/// Parses `[-+]digits[.digits][(e|E)[+-]digits]`, `NaN`, `Infinity`.
fn parse(s: &str) -> Option<Dec> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    match body {
        "NaN" | "nan" | "sNaN" => return Some(Dec::NaN),
        "Infinity" | "inf" | "infinity" => return Some(Dec::Inf { neg }),
        _ => {}
    }
    let (mantissa, exp) = match body.find(['e', 'E']) {
        Some(i) => (body.get(..i)?, body.get(i + 1..)?.parse::<i32>().ok()?),
        None => (body, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let frac_len = i32::try_from(frac_part.len()).ok()?;
    // Drop trailing zeros so the coefficient fits comfortably (the value is unchanged).
    let trimmed = digits.trim_end_matches('0');
    let dropped = i32::try_from(digits.len() - trimmed.len()).ok()?;
    let coef = if trimmed.is_empty() {
        0
    } else {
        trimmed.parse::<u128>().ok()?
    };
    Some(Dec::Finite {
        neg,
        coef,
        exp: exp.checked_sub(frac_len)?.checked_add(dropped)?,
    })
}

fn digit_count(mut c: u128) -> i32 {
    let mut n = 0;
    while c > 0 {
        c /= 10;
        n += 1;
    }
    n
}

/// Compares magnitudes `c1 * 10^e1` and `c2 * 10^e2` (both non-zero).
fn compare_magnitude(c1: u128, e1: i32, c2: u128, e2: i32) -> Ordering {
    let (d1, d2) = (digit_count(c1), digit_count(c2));
    // The position of the leading digit decides unless equal.
    match (e1 + d1).cmp(&(e2 + d2)) {
        Ordering::Equal => {}
        o => return o,
    }
    // Same leading position: pad the shorter coefficient with zeros (fits: <= 39 digits).
    let scale = |c: u128, by: i32| -> Option<u128> {
        10u128
            .checked_pow(u32::try_from(by).ok()?)
            .and_then(|p| c.checked_mul(p))
    };
    let (a, b) = if d1 >= d2 {
        (Some(c1), scale(c2, d1 - d2))
    } else {
        (scale(c1, d2 - d1), Some(c2))
    };
    match (a, b) {
        (Some(a), Some(b)) => a.cmp(&b),
        // Unreachable for coefficients of <= 38 digits; fall back to the digit strings.
        _ => {
            let (s1, s2) = (c1.to_string(), c2.to_string());
            let width = s1.len().max(s2.len());
            format!("{s1:0<width$}").cmp(&format!("{s2:0<width$}"))
        }
    }
}

/// Total order over decimal values: NaN < -inf < finite < +inf; zeros equal.
pub fn compare(a: Dec, b: Dec) -> Ordering {
    let rank = |d: &Dec| match d {
        Dec::NaN => 0,
        Dec::Inf { neg: true } => 1,
        Dec::Finite { .. } => 2,
        Dec::Inf { neg: false } => 3,
    };
    match (a, b) {
        (
            Dec::Finite {
                neg: n1,
                coef: c1,
                exp: e1,
            },
            Dec::Finite {
                neg: n2,
                coef: c2,
                exp: e2,
            },
        ) => {
            let sign = |neg: bool, c: u128| -> i8 {
                if c == 0 {
                    0
                } else if neg {
                    -1
                } else {
                    1
                }
            };
            let (s1, s2) = (sign(n1, c1), sign(n2, c2));
            if s1 != s2 || s1 == 0 {
                return s1.cmp(&s2);
            }
            let m = compare_magnitude(c1, e1, c2, e2);
            if s1 < 0 { m.reverse() } else { m }
        }
        _ => rank(&a).cmp(&rank(&b)),
    }
}

/// Aligns two finite values to the smaller exponent; `None` when that overflows 128 bits.
fn align(c1: u128, e1: i32, c2: u128, e2: i32) -> Option<(u128, u128, i32)> {
    let e = e1.min(e2);
    let up = |c: u128, by: i32| -> Option<u128> {
        if c == 0 {
            return Some(0);
        }
        c.checked_mul(10u128.checked_pow(u32::try_from(by).ok()?)?)
    };
    Some((up(c1, e1 - e)?, up(c2, e2 - e)?, e))
}

/// `a + b` exactly (then rounded to 34 digits on encoding); `None` to fall back.
pub fn add(a: Dec, b: Dec) -> Option<Dec> {
    let (
        Dec::Finite {
            neg: n1,
            coef: c1,
            exp: e1,
        },
        Dec::Finite {
            neg: n2,
            coef: c2,
            exp: e2,
        },
    ) = (a, b)
    else {
        return None;
    };
    let (x, y, e) = align(c1, e1, c2, e2)?;
    Some(if n1 == n2 {
        Dec::Finite {
            neg: n1,
            coef: x.checked_add(y)?,
            exp: e,
        }
    } else if x >= y {
        Dec::Finite {
            neg: n1 && x != y,
            coef: x - y,
            exp: e,
        }
    } else {
        Dec::Finite {
            neg: n2,
            coef: y - x,
            exp: e,
        }
    })
}

/// `a - b`.
pub fn sub(a: Dec, b: Dec) -> Option<Dec> {
    let neg_b = match b {
        Dec::Finite { neg, coef, exp } => Dec::Finite {
            neg: !neg,
            coef,
            exp,
        },
        other => other,
    };
    add(a, neg_b)
}

/// `a * b` exactly when the coefficient product fits; `None` to fall back.
pub fn mul(a: Dec, b: Dec) -> Option<Dec> {
    let (
        Dec::Finite {
            neg: n1,
            coef: c1,
            exp: e1,
        },
        Dec::Finite {
            neg: n2,
            coef: c2,
            exp: e2,
        },
    ) = (a, b)
    else {
        return None;
    };
    Some(Dec::Finite {
        neg: n1 != n2,
        coef: c1.checked_mul(c2)?,
        exp: e1.checked_add(e2)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Dec {
        Dec::of_decimal(&s.parse().unwrap())
    }

    #[test]
    fn decimals_compare_exactly_against_integers_and_rounded_doubles() {
        assert_eq!(compare(d("1.0"), Dec::of_i64(1)), Ordering::Equal);
        assert_eq!(compare(d("1.00"), d("1")), Ordering::Equal);
        assert_eq!(compare(d("-0"), d("0E+5")), Ordering::Equal);
        assert_eq!(compare(d("0.1"), Dec::of_f64(0.1)), Ordering::Less);
        assert_eq!(compare(d("0.5"), Dec::of_f64(0.5)), Ordering::Equal);
        assert_eq!(
            compare(d("9223372036854775807.5"), Dec::of_i64(i64::MAX)),
            Ordering::Greater
        );
        assert_eq!(compare(d("-2"), d("-10")), Ordering::Greater);
        assert_eq!(compare(d("1E+2"), d("99.99")), Ordering::Greater);
        assert_eq!(compare(d("NaN"), d("-Infinity")), Ordering::Less);
        assert_eq!(compare(d("NaN"), d("NaN")), Ordering::Equal);
        assert_eq!(compare(d("Infinity"), d("1E+6000")), Ordering::Greater);
    }

    #[test]
    fn arithmetic_is_exact_where_it_fits() {
        let r = add(d("0.1"), d("0.2")).unwrap().to_decimal().unwrap();
        assert_eq!(compare(Dec::of_decimal(&r), d("0.3")), Ordering::Equal);
        let r = sub(d("1"), d("1.5")).unwrap();
        assert_eq!(compare(r, d("-0.5")), Ordering::Equal);
        let r = mul(d("1.5"), Dec::of_i64(-3)).unwrap();
        assert_eq!(compare(r, d("-4.5")), Ordering::Equal);
        assert!(add(d("NaN"), d("1")).is_none());
    }
}
