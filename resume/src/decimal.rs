//! Decimal128 support for the KeyString numeric encoding.
//!
//! Owns the exact-arithmetic side of MongoDB's V1 decimal scheme: a decimal that equals a double
//! is written as that double; otherwise the double rounded toward zero is written with a
//! "decimal continuation marker" (DCM) and, where 15 digits do not suffice, a 64-bit
//! continuation holding the rest of a 34-digit coefficient. Decimals outside the double range
//! are written as raw IEEE 754-2008 BID bits. The exponent's low 6 bits go into the type bits;
//! the decoder picks the one member of the value's cohort whose exponent has those bits.
//!
//! Invariant: all arithmetic is exact (arbitrary-precision integers), rounding is explicit and
//! directional as in MongoDB's `key_string.cpp`, and nothing here panics on any input.

use std::cmp::Ordering;

use bson::{Bson, Decimal128};
use num_bigint::BigUint;

use crate::keystring::{
    self, KeyStringError, Reader, TypeBits, TypeBitsReader, append_double_without_type_bits,
    append_preshifted_integer, ctype, dcm,
};

const EXPONENT_BIAS: i32 = 6176;
const EMIN: i32 = -6176;
const EMAX: i32 = 6111;
const MAX_BIASED_EXPONENT: u32 = 12287;
const PRECISION: u32 = 34;

/// A parsed Decimal128.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dec {
    pub neg: bool,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    NaN,
    Inf,
    /// `coef * 10^exp`, `coef < 10^34`, `EMIN <= exp <= EMAX`.
    Finite {
        coef: u128,
        exp: i32,
    },
}

fn ten_pow_34() -> u128 {
    10u128.pow(PRECISION)
}

impl Dec {
    pub fn from_bson(d: &Decimal128) -> Dec {
        let x = u128::from_le_bytes(d.bytes());
        let neg = x >> 127 == 1;
        let comb = (x >> 122) & 0x1f;
        if comb == 0x1f {
            return Dec {
                neg,
                kind: Kind::NaN,
            };
        }
        if comb == 0x1e {
            return Dec {
                neg,
                kind: Kind::Inf,
            };
        }
        let (biased, coef) = if (x >> 125) & 3 == 3 {
            // Large-coefficient form: always above 10^34 - 1, i.e. non-canonical zero.
            (((x >> 111) & 0x3fff) as i32, 0u128)
        } else {
            (((x >> 113) & 0x3fff) as i32, x & ((1u128 << 113) - 1))
        };
        let coef = if coef >= ten_pow_34() { 0 } else { coef };
        let exp = (biased - EXPONENT_BIAS).clamp(EMIN, EMAX);
        Dec {
            neg,
            kind: Kind::Finite { coef, exp },
        }
    }

    pub fn to_bson(&self) -> Decimal128 {
        let sign = u128::from(self.neg) << 127;
        let x = match self.kind {
            Kind::NaN => sign | (0x7cu128 << 120),
            Kind::Inf => sign | (0x78u128 << 120),
            Kind::Finite { coef, exp } => {
                sign | (((exp + EXPONENT_BIAS) as u128) << 113) | (coef & ((1u128 << 113) - 1))
            }
        };
        Decimal128::from_bytes(x.to_le_bytes())
    }

    pub fn nan() -> Dec {
        Dec {
            neg: false,
            kind: Kind::NaN,
        }
    }

    pub fn infinity(neg: bool) -> Dec {
        Dec {
            neg,
            kind: Kind::Inf,
        }
    }
}

// --- exact magnitudes -------------------------------------------------------------------------

/// A non-negative exact value `c * 10^e`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mag {
    c: BigUint,
    e: i32,
}

fn pow10(n: u32) -> BigUint {
    BigUint::from(10u32).pow(n)
}

fn digits(c: &BigUint) -> u32 {
    if c.bits() == 0 {
        return 0;
    }
    c.to_str_radix(10).len() as u32
}

impl Mag {
    fn new(c: impl Into<BigUint>, e: i32) -> Mag {
        Mag { c: c.into(), e }
    }

    fn is_zero(&self) -> bool {
        self.c.bits() == 0
    }

    /// Rounds to at most `p` significant digits, up (away from zero) or down.
    fn round_digits(self, p: u32, up: bool) -> Mag {
        let d = digits(&self.c);
        if d <= p {
            return self;
        }
        let shift = d - p;
        let q = pow10(shift);
        let mut c = &self.c / &q;
        if up && (&self.c % &q).bits() != 0 {
            c += 1u32;
        }
        let mut e = self.e + shift as i32;
        if digits(&c) > p {
            c /= 10u32;
            e += 1;
        }
        Mag { c, e }
    }

    /// Scales the coefficient up to 34 digits (lowering the exponent, not below EMIN).
    fn normalize(self) -> Mag {
        if self.is_zero() {
            return self;
        }
        let d = digits(&self.c);
        let k = (PRECISION.saturating_sub(d) as i32)
            .min(self.e - EMIN)
            .max(0);
        Mag {
            c: self.c * pow10(k as u32),
            e: self.e - k,
        }
    }

    /// Truncates digits below 10^EMIN (round toward zero).
    fn clamp_rz(self) -> Mag {
        if self.e >= EMIN {
            return self;
        }
        let shift = (EMIN - self.e) as u32;
        Mag {
            c: self.c / pow10(shift),
            e: EMIN,
        }
    }

    fn aligned(a: &Mag, b: &Mag) -> (BigUint, BigUint, i32) {
        let e = a.e.min(b.e);
        let ac = &a.c * pow10((a.e - e) as u32);
        let bc = &b.c * pow10((b.e - e) as u32);
        (ac, bc, e)
    }

    fn cmp_value(&self, other: &Mag) -> Ordering {
        let (a, b, _) = Mag::aligned(self, other);
        a.cmp(&b)
    }

    /// The exact value of a finite non-negative double.
    fn from_f64(x: f64) -> Mag {
        let bits = x.abs().to_bits();
        let exp_field = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1u64 << 52) - 1);
        let (m, k) = if exp_field == 0 {
            (frac, -1074)
        } else {
            (frac | (1u64 << 52), exp_field - 1075)
        };
        if m == 0 {
            return Mag::new(0u32, 0);
        }
        if k >= 0 {
            Mag::new(BigUint::from(m) << (k as u32), 0)
        } else {
            Mag::new(BigUint::from(m) * BigUint::from(5u32).pow((-k) as u32), k)
        }
    }

    /// Converts to a double rounding toward zero; returns `(value, inexact, overflow)`.
    fn to_f64_rz(&self) -> (f64, bool, bool) {
        if self.is_zero() {
            return (0.0, false, false);
        }
        let (num, den) = if self.e >= 0 {
            (&self.c * pow10(self.e as u32), BigUint::from(1u32))
        } else {
            (self.c.clone(), pow10((-self.e) as u32))
        };
        // e2 = floor(log2(num / den)).
        let l = num.bits() as i64 - den.bits() as i64;
        let ge = |shift: i64| -> bool {
            if shift >= 0 {
                num >= (&den << (shift as u64))
            } else {
                (&num << ((-shift) as u64)) >= den
            }
        };
        let e2 = if ge(l) { l } else { l - 1 };
        if e2 > 1023 {
            return (f64::MAX, true, true);
        }
        // Scale so that the integer part holds the significant bits.
        let s: i64 = if e2 < -1022 { 1074 } else { 52 - e2 };
        let (m, rem_zero) = if s >= 0 {
            let n = &num << (s as u64);
            let m = &n / &den;
            let exact = (&n % &den).bits() == 0;
            (m, exact)
        } else {
            let d = &den << ((-s) as u64);
            let m = &num / &d;
            let exact = (&num % &d).bits() == 0;
            (m, exact)
        };
        let m = u64::try_from(m).unwrap_or(0);
        let value = if e2 < -1022 {
            f64::from_bits(m) // subnormal (or zero): m < 2^52
        } else {
            let biased = (e2 + 1023) as u64;
            f64::from_bits((biased << 52) | (m & ((1u64 << 52) - 1)))
        };
        (value, !rem_zero, false)
    }

    fn to_u128(&self) -> Option<(u128, i32)> {
        u128::try_from(&self.c).ok().map(|c| (c, self.e))
    }
}

/// `Decimal128(x, digits, up ? away-from-zero : toward-zero)` on a magnitude.
fn from_f64_rounded(x: f64, p: u32, up: bool) -> Mag {
    Mag::from_f64(x).round_digits(p, up)
}

/// MongoDB's `kTinyDoubleExponentUpshiftFactorAsDecimal`: 2^256 rounded down to 34 digits.
fn upshift_factor() -> Mag {
    Mag::new(BigUint::from(1u32) << 256u32, 0).round_digits(PRECISION, false)
}

/// MongoDB's `kTinyDoubleExponentDownshiftFactorAsDecimal`: 2^-256 rounded down to 34 digits.
fn downshift_factor() -> Mag {
    Mag::from_f64(f64::from_bits(((1023 - 256) as u64) << 52)).round_digits(PRECISION, false)
}

fn mul_rz(a: &Mag, b: &Mag) -> Mag {
    Mag::new(&a.c * &b.c, a.e + b.e)
        .round_digits(PRECISION, false)
        .clamp_rz()
}

fn abs_mag(coef: u128, exp: i32) -> Mag {
    Mag::new(coef, exp)
}

fn f64_min_positive_normal() -> f64 {
    f64::MIN_POSITIVE
}

// --- encoding ---------------------------------------------------------------------------------

fn push_u64(buf: &mut Vec<u8>, v: u64, invert: bool) {
    let v = if invert { !v } else { v };
    buf.extend_from_slice(&v.to_be_bytes());
}

/// Writes raw BID bits of a normalized magnitude as two big-endian words.
fn bid_words(m: &Mag) -> (u64, u64) {
    let (c, e) = m.to_u128().unwrap_or((0, 0));
    let x = (((e + EXPONENT_BIAS) as u128) << 113) | c;
    ((x >> 64) as u64, x as u64)
}

pub(crate) fn append_decimal(buf: &mut Vec<u8>, bits: &mut TypeBits, dec: &Dec) {
    let neg = dec.neg;
    let (coef, exp) = match dec.kind {
        Kind::NaN => {
            buf.push(ctype::NUMERIC_NAN);
            keystring::type_bits_decimal_special(bits);
            return;
        }
        Kind::Inf => {
            buf.push(if neg {
                ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE
            } else {
                ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE
            });
            push_u64(buf, !0u64, neg);
            keystring::type_bits_decimal_special(bits);
            return;
        }
        Kind::Finite { coef, exp } => (coef, exp),
    };
    let biased = (exp + EXPONENT_BIAS) as u32;
    if coef == 0 {
        let which = if neg {
            biased + MAX_BIASED_EXPONENT + 1
        } else {
            biased
        };
        keystring::type_bits_decimal_zero(bits, which);
        buf.push(ctype::NUMERIC_ZERO);
        return;
    }
    keystring::type_bits_decimal(bits, biased);

    let mag = abs_mag(coef, exp);
    let (bin, inexact, overflow) = mag.to_f64_rz();
    let signed = |x: f64| if neg { -x } else { x };

    if !inexact && !overflow {
        append_double_without_type_bits(buf, signed(bin), dcm::EQUAL_TO_DOUBLE);
        return;
    }
    if bin < f64_min_positive_normal() {
        append_tiny(buf, &mag, bin, neg);
        return;
    }
    if bin >= f64::MAX {
        let (hi, lo) = bid_words(&mag.normalize());
        buf.push(if neg {
            ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE
        } else {
            ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE
        });
        push_u64(buf, hi | (1u64 << 63), neg);
        push_u64(buf, lo, neg);
        return;
    }

    let stored: Mag;
    if bin >= 9_223_372_036_854_775_808.0 {
        append_large_double_dcm(buf, signed(bin));
        stored = from_f64_rounded(bin, PRECISION, true);
    } else if bin < f64::from_bits(((1023 - 255) as u64) << 52) {
        append_small_double_dcm(buf, signed(bin));
        stored = from_f64_rounded(bin, PRECISION, true);
    } else if bin >= 9_007_199_254_740_992.0 {
        // Integer part exactly, then a fraction flag.
        let (ic, ie) = (BigUint::from(coef), exp);
        let (int_part, has_fraction) = if ie >= 0 {
            (ic * pow10(ie as u32), false)
        } else {
            let q = pow10((-ie) as u32);
            let frac = (&ic % &q).bits() != 0;
            (ic / q, frac)
        };
        let int_part = u64::try_from(int_part).unwrap_or(u64::MAX >> 1);
        append_preshifted_integer(buf, (int_part << 1) | u64::from(has_fraction), neg);
        if !has_fraction {
            return;
        }
        if int_part < (1u64 << 55) {
            let b = dcm::CONTINUATION_GREATER_THAN_DOUBLE_15 as u8;
            buf.push(if neg { !b } else { b });
        }
        stored = Mag::new(int_part, 0);
    } else if coef < 1_000_000_000_000_000 {
        append_double_without_type_bits(buf, signed(bin), dcm::EQUAL_TO_DOUBLE_15);
        return;
    } else {
        let from_bin = from_f64_rounded(bin, 15, true);
        match mag.cmp_value(&from_bin) {
            Ordering::Equal => {
                append_double_without_type_bits(buf, signed(bin), dcm::EQUAL_TO_DOUBLE_15);
                return;
            }
            Ordering::Less => append_double_without_type_bits(
                buf,
                signed(bin),
                dcm::CONTINUATION_LESS_THAN_DOUBLE_15,
            ),
            Ordering::Greater => append_double_without_type_bits(
                buf,
                signed(bin),
                dcm::CONTINUATION_GREATER_THAN_DOUBLE_15,
            ),
        }
        stored = from_f64_rounded(bin, PRECISION, true);
    }
    let stored = stored.normalize();
    push_u64(buf, continuation(&mag, &stored), neg);
}

/// `(dec - stored) / 10^stored.e`: the 64-bit decimal continuation.
fn continuation(dec: &Mag, stored: &Mag) -> u64 {
    let (a, b, e) = Mag::aligned(dec, stored);
    if a < b {
        return 0;
    }
    let diff = a - b;
    let diff = if e < stored.e {
        diff / pow10((stored.e - e) as u32)
    } else {
        diff
    };
    u64::try_from(diff).unwrap_or(u64::MAX)
}

fn append_large_double_dcm(buf: &mut Vec<u8>, value: f64) {
    buf.push(if value > 0.0 {
        ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE
    } else {
        ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE
    });
    let encoded = ((value.to_bits() << 1) & !(1u64 << 63)) | 1;
    push_u64(buf, encoded, value < 0.0);
}

fn append_small_double_dcm(buf: &mut Vec<u8>, value: f64) {
    let neg = value < 0.0;
    buf.push(if neg {
        ctype::NUMERIC_NEGATIVE_SMALL_MAGNITUDE
    } else {
        ctype::NUMERIC_POSITIVE_SMALL_MAGNITUDE
    });
    let scaled = value.abs() * f64::from_bits(((1023 + 256) as u64) << 52);
    let encoded = ((scaled.to_bits() << 1) | 1).wrapping_add(1u64 << 62);
    push_u64(buf, encoded, neg);
}

fn append_tiny(buf: &mut Vec<u8>, mag: &Mag, bin: f64, neg: bool) {
    buf.push(if neg {
        ctype::NUMERIC_NEGATIVE_SMALL_MAGNITUDE
    } else {
        ctype::NUMERIC_POSITIVE_SMALL_MAGNITUDE
    });
    if bin == 0.0 {
        let (hi, lo) = bid_words(&mag.clone().normalize());
        push_u64(buf, hi, neg);
        push_u64(buf, lo, neg);
        return;
    }
    let scaled_dec = mul_rz(mag, &upshift_factor());
    let (scaled_bin, _, _) = scaled_dec.to_f64_rz();
    let scaled_bin = scaled_bin.max(bin * f64::from_bits(((1023 + 256) as u64) << 52));
    let encoded = ((scaled_bin.to_bits() << 1) | 1).wrapping_add(1u64 << 62);
    push_u64(buf, encoded, neg);
    let stored = mul_rz(
        &from_f64_rounded(scaled_bin, PRECISION, false),
        &downshift_factor(),
    )
    .normalize();
    push_u64(buf, continuation(mag, &stored), neg);
}

// --- decoding ---------------------------------------------------------------------------------

fn bad(msg: &str) -> KeyStringError {
    KeyStringError(msg.to_string())
}

/// Picks the member of `value`'s cohort whose biased exponent has the stored low 6 bits.
fn with_stored_exponent(
    value: Mag,
    neg: bool,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let stored = bits.decimal_exponent_bits()?;
    if value.is_zero() {
        return Err(bad("Expected non-zero number for decimal."));
    }
    // Strip trailing zeros: the largest exponent of the cohort.
    let mut c = value.c;
    let mut e = value.e;
    let ten = BigUint::from(10u32);
    while (&c % &ten).bits() == 0 {
        c /= 10u32;
        e += 1;
    }
    let d = digits(&c);
    if d > PRECISION {
        return Err(bad("Unexpected inexact decimal value."));
    }
    let e_lo = (e - (PRECISION - d) as i32).max(EMIN);
    let e_hi = e.min(EMAX);
    let target = (e_lo..=e_hi).find(|x| ((x + EXPONENT_BIAS) as u32) & 63 == stored);
    let Some(t) = target else {
        return Err(bad("Unexpected biased exponent in decimal."));
    };
    let coef = &c * pow10((e - t) as u32);
    let coef = u128::try_from(coef).map_err(|_| bad("decimal coefficient overflow"))?;
    if coef >= ten_pow_34() {
        return Err(bad("decimal coefficient overflow"));
    }
    Ok(Bson::Decimal128(
        Dec {
            neg,
            kind: Kind::Finite { coef, exp: t },
        }
        .to_bson(),
    ))
}

fn read_continuation(r: &mut Reader<'_>, negative: bool, base: Mag) -> Result<Mag, KeyStringError> {
    let cont = r.u64(negative)?;
    let base = base.normalize();
    let mut c = &base.c + BigUint::from(cont);
    let mut e = base.e;
    // The sum is rounded to 34 digits; only dropping zero digits is exact.
    while digits(&c) > PRECISION {
        if (&c % BigUint::from(10u32)).bits() != 0 {
            return Err(bad("Unexpected inexact flag set after Decimal addition."));
        }
        c /= 10u32;
        e += 1;
    }
    Ok(Mag::new(c, e))
}

pub(crate) fn decimal_zero(which: u32) -> Result<Bson, KeyStringError> {
    let neg = which > MAX_BIASED_EXPONENT;
    let biased = if neg {
        which - (MAX_BIASED_EXPONENT + 1)
    } else {
        which
    };
    if biased > MAX_BIASED_EXPONENT {
        return Err(bad("Invalid numeric zero decimal."));
    }
    Ok(Bson::Decimal128(
        Dec {
            neg,
            kind: Kind::Finite {
                coef: 0,
                exp: biased as i32 - EXPONENT_BIAS,
            },
        }
        .to_bson(),
    ))
}

pub(crate) fn decode_integer(
    signed: i64,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    with_stored_exponent(Mag::new(signed.unsigned_abs(), 0), signed < 0, bits)
}

/// A decimal whose magnitude's 8-byte integer part exceeds 2^53, with a continuation.
pub(crate) fn decode_big_integer_fraction(
    integer_part: u64,
    negative: bool,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let v = read_continuation(r, negative, Mag::new(integer_part, 0))?;
    with_stored_exponent(v, negative, bits)
}

/// A decimal stored as a double magnitude `bin` with decimal continuation marker `d`.
pub(crate) fn decode_with_dcm(
    bin: f64,
    d: u64,
    negative: bool,
    _from_int_form: bool,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let v = match d {
        dcm::EQUAL_TO_DOUBLE_15 => from_f64_rounded(bin, 15, true),
        dcm::EQUAL_TO_DOUBLE => from_f64_rounded(bin, PRECISION, true),
        _ => read_continuation(r, negative, from_f64_rounded(bin, PRECISION, true))?,
    };
    with_stored_exponent(v, negative, bits)
}

pub(crate) fn decode_large(
    bin: f64,
    negative: bool,
    has_continuation: bool,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let mut v = from_f64_rounded(bin.abs(), PRECISION, true);
    if has_continuation {
        v = read_continuation(r, negative, v)?;
    }
    with_stored_exponent(v, negative, bits)
}

fn from_bid_words(hi: u64, lo: u64) -> Result<Mag, KeyStringError> {
    let x = (u128::from(hi) << 64) | u128::from(lo);
    let d = Dec::from_bson(&Decimal128::from_bytes(x.to_le_bytes()));
    match d.kind {
        Kind::Finite { coef, exp } if !d.neg && coef != 0 => Ok(Mag::new(coef, exp)),
        _ => Err(bad("Invalid raw decimal in key.")),
    }
}

pub(crate) fn decode_huge(
    hi: u64,
    lo: u64,
    negative: bool,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let v = from_bid_words(hi, lo)?;
    with_stored_exponent(v, negative, bits)
}

pub(crate) fn decode_teeny(
    hi: u64,
    lo: u64,
    negative: bool,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let v = from_bid_words(hi, lo)?;
    with_stored_exponent(v, negative, bits)
}

pub(crate) fn decode_tiny(
    scaled_bin: f64,
    negative: bool,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    let up = f64::from_bits(((1023 + 256) as u64) << 52);
    let base = if scaled_bin < f64_min_positive_normal() * up {
        let scaled_dec = from_f64_rounded(scaled_bin, PRECISION, false);
        mul_rz(&scaled_dec, &downshift_factor())
    } else {
        let bin = scaled_bin * f64::from_bits(((1023 - 256) as u64) << 52);
        from_f64_rounded(bin, PRECISION, true)
    };
    let v = read_continuation(r, negative, base)?;
    with_stored_exponent(v, negative, bits)
}
