//! Property tests for the KeyString codec and resume tokens.
//!
//! Invariants checked:
//! * `decode(encode(x)) == x` exactly (types, -0.0, decimal exponents) for arbitrary token data
//!   with arbitrary document keys of every document-key BSON type;
//! * KeyString byte order equals BSON comparison order, checked against the small reference
//!   comparator below (canonical type order, then exact numeric / byte-wise comparison);
//! * token `_data` byte order equals the logical order of §5.7;
//! * numerically equal values of different numeric types share their key bytes;
//! * arbitrary bytes never panic the decoders.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

use std::cmp::Ordering;
use std::str::FromStr;

mod common;

use bson::{Bson, Decimal128, Document};
use common::*;
use num_bigint::{BigInt, BigUint, Sign};
use proptest::prelude::*;
use resume::keystring::{self, TypeBitsReader, key_bytes};
use resume::{ResumeToken, ResumeTokenData};

// --- reference comparator ---------------------------------------------------------------------

/// MongoDB's canonical type order (`canonicalizeBSONType`).
fn canonical_rank(v: &Bson) -> i32 {
    match v {
        Bson::MinKey => -1,
        Bson::Undefined => 0,
        Bson::Null => 5,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => 15,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

/// An exact number: NaN sorts below everything, then -inf, finite rationals, +inf.
#[derive(Debug, Clone)]
enum Num {
    NaN,
    NegInf,
    Finite(BigInt, BigUint),
    PosInf,
}

fn f64_num(d: f64) -> Num {
    if d.is_nan() {
        return Num::NaN;
    }
    if d.is_infinite() {
        return if d > 0.0 { Num::PosInf } else { Num::NegInf };
    }
    let bits = d.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let frac = bits & ((1u64 << 52) - 1);
    let (m, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp - 1075)
    };
    let sign = if d < 0.0 { Sign::Minus } else { Sign::Plus };
    let m = BigUint::from(m);
    if e >= 0 {
        Num::Finite(
            BigInt::from_biguint(sign, m << e as u64),
            BigUint::from(1u32),
        )
    } else {
        Num::Finite(
            BigInt::from_biguint(sign, m),
            BigUint::from(1u32) << (-e) as u64,
        )
    }
}

/// Parses the decimal's string form (as printed by the `bson` crate) into an exact rational.
fn decimal_num(d: &Decimal128) -> Num {
    let s = d.to_string();
    match s.as_str() {
        "NaN" => return Num::NaN,
        "Infinity" => return Num::PosInf,
        "-Infinity" => return Num::NegInf,
        _ => {}
    }
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.as_str()),
    };
    let (mant, exp) = match s.split_once('E') {
        Some((m, e)) => (m, e.parse::<i64>().unwrap()),
        None => (s, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let digits = format!("{int}{frac}");
    let exp = exp - frac.len() as i64;
    let c = BigUint::from_str(&digits).unwrap();
    let sign = if neg { Sign::Minus } else { Sign::Plus };
    let ten = BigUint::from(10u32);
    if exp >= 0 {
        Num::Finite(
            BigInt::from_biguint(sign, c * ten.pow(exp as u32)),
            BigUint::from(1u32),
        )
    } else {
        Num::Finite(BigInt::from_biguint(sign, c), ten.pow((-exp) as u32))
    }
}

fn num_of(v: &Bson) -> Num {
    match v {
        Bson::Int32(i) => Num::Finite(BigInt::from(*i), BigUint::from(1u32)),
        Bson::Int64(i) => Num::Finite(BigInt::from(*i), BigUint::from(1u32)),
        Bson::Double(d) => f64_num(*d),
        Bson::Decimal128(d) => decimal_num(d),
        _ => unreachable!(),
    }
}

fn num_cmp(a: &Num, b: &Num) -> Ordering {
    let rank = |n: &Num| match n {
        Num::NaN => 0,
        Num::NegInf => 1,
        Num::Finite(..) => 2,
        Num::PosInf => 3,
    };
    match (a, b) {
        (Num::Finite(an, ad), Num::Finite(bn, bd)) => {
            let l = an * BigInt::from(bd.clone());
            let r = bn * BigInt::from(ad.clone());
            l.cmp(&r)
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

fn doc_cmp(a: &Document, b: &Document) -> Ordering {
    let mut ai = a.iter();
    let mut bi = b.iter();
    loop {
        match (ai.next(), bi.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ak, av)), Some((bk, bv))) => {
                let o = canonical_rank(av)
                    .cmp(&canonical_rank(bv))
                    .then_with(|| ak.as_bytes().cmp(bk.as_bytes()))
                    .then_with(|| ref_cmp(av, bv));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

/// Reference BSON comparison (no collation).
fn ref_cmp(a: &Bson, b: &Bson) -> Ordering {
    let r = canonical_rank(a).cmp(&canonical_rank(b));
    if r != Ordering::Equal {
        return r;
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => doc_cmp(x, y),
        (Bson::Array(x), Bson::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                let o = canonical_rank(p)
                    .cmp(&canonical_rank(q))
                    .then_with(|| ref_cmp(p, q));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then(u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .as_str()
            .as_bytes()
            .cmp(y.pattern.as_str().as_bytes())
            .then_with(|| {
                x.options
                    .as_str()
                    .as_bytes()
                    .cmp(y.options.as_str().as_bytes())
            }),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ if canonical_rank(a) == 10 => num_cmp(&num_of(a), &num_of(b)),
        // MinKey, MaxKey, Null, Undefined: all members of the type are equal.
        _ => Ordering::Equal,
    }
}

/// Reference logical order of §5.7 with the reference BSON comparator for identifiers.
fn ref_token_cmp(a: &ResumeTokenData, b: &ResumeTokenData) -> Ordering {
    a.cluster_time()
        .cmp(&b.cluster_time())
        .then(a.version().cmp(&b.version()))
        .then(a.token_type().cmp(&b.token_type()))
        .then(a.txn_op_index().cmp(&b.txn_op_index()))
        .then(a.from_invalidate().cmp(&b.from_invalidate()))
        .then_with(|| {
            a.uuid()
                .map(|u| u.bytes())
                .cmp(&b.uuid().map(|u| u.bytes()))
        })
        .then_with(|| match (a.event_identifier(), b.event_identifier()) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(x), Some(y)) => doc_cmp(x, y),
        })
        .then(a.fragment_num().cmp(&b.fragment_num()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn keystring_value_round_trips_exactly(v in arb_value()) {
        let mut b = keystring::Builder::new();
        b.append(&v);
        let (bytes, bits) = b.finish();
        prop_assert_eq!(&bytes, &key_bytes(&v), "key_bytes is the builder's byte string");
        let tb = bits.to_bytes();
        let mut reader = TypeBitsReader::new(&tb).unwrap();
        let back = keystring::decode_key(&bytes, &mut reader).unwrap();
        prop_assert_eq!(exact(&[back]), exact(&[v]));
    }

    #[test]
    fn keystring_byte_order_equals_bson_order(a in arb_value(), b in arb_value()) {
        let expected = ref_cmp(&a, &b);
        let actual = key_bytes(&a).cmp(&key_bytes(&b));
        prop_assert_eq!(actual, expected, "{:?} vs {:?}", a, b);
    }

    #[test]
    fn keystring_byte_order_equals_bson_order_for_numbers(
        a in prop_oneof![arb_f64().prop_map(Bson::Double), arb_decimal().prop_map(Bson::Decimal128), any::<i64>().prop_map(Bson::Int64)],
        b in prop_oneof![arb_f64().prop_map(Bson::Double), arb_decimal().prop_map(Bson::Decimal128), any::<i64>().prop_map(Bson::Int64)],
    ) {
        prop_assert_eq!(key_bytes(&a).cmp(&key_bytes(&b)), ref_cmp(&a, &b), "{:?} vs {:?}", a, b);
    }

    #[test]
    fn keystring_orders_decimals_that_share_a_double(
        c in 10u128.pow(33)..10u128.pow(34) - 100,
        k in 0u128..100,
        e in prop_oneof![-45i32..-20, -6176i32..=6111, -340i32..-300, 280i32..300],
        neg in any::<bool>(),
    ) {
        let sign = if neg { "-" } else { "" };
        let a = Decimal128::from_str(&format!("{sign}{c}E{e}")).unwrap();
        let b = Decimal128::from_str(&format!("{sign}{}E{e}", c + k)).unwrap();
        // A 15-digit neighbour: the leading digits of c, rounded down and up.
        let c15 = c / 10u128.pow(19);
        let d = Decimal128::from_str(&format!("{sign}{c15}E{}", e + 19)).unwrap();
        let u = Decimal128::from_str(&format!("{sign}{}E{}", c15 + 1, e + 19)).unwrap();
        let vals = [a, b, d, u].map(Bson::Decimal128);
        for x in &vals {
            for y in &vals {
                prop_assert_eq!(key_bytes(x).cmp(&key_bytes(y)), ref_cmp(x, y), "{:?} vs {:?}", x, y);
            }
            let mut bld = keystring::Builder::new();
            bld.append(x);
            let (bytes, bits) = bld.finish();
            let tb = bits.to_bytes();
            let back = keystring::decode_key(&bytes, &mut TypeBitsReader::new(&tb).unwrap()).unwrap();
            prop_assert_eq!(exact(&[back]), exact(std::slice::from_ref(x)));
        }
    }

    #[test]
    fn equal_numbers_of_different_types_share_key_bytes(n in any::<i32>(), m in any::<i64>(), e in 0u32..5) {
        let k = key_bytes(&Bson::Int32(n));
        prop_assert_eq!(&key_bytes(&Bson::Int64(i64::from(n))), &k);
        prop_assert_eq!(&key_bytes(&Bson::Double(f64::from(n))), &k);
        let dec = Decimal128::from_str(&format!("{n}{}E-{e}", "0".repeat(e as usize))).unwrap();
        prop_assert_eq!(&key_bytes(&Bson::Decimal128(dec)), &k);
        if (m as f64) as i128 == i128::from(m) {
            prop_assert_eq!(key_bytes(&Bson::Double(m as f64)), key_bytes(&Bson::Int64(m)));
        }
    }

    #[test]
    fn token_round_trips_exactly(t in arb_token(false)) {
        let token = t.encode();
        let doc = token.to_document();
        let back = ResumeTokenData::from_document(&doc).unwrap();
        prop_assert_eq!(exact(&back.to_values()), exact(&t.to_values()));
        let raw = token.to_raw_document();
        prop_assert_eq!(Document::try_from(&raw).unwrap(), doc.clone());
        prop_assert_eq!(ResumeToken::from_raw_document(&raw).unwrap(), token.clone());
        let again = back.encode();
        prop_assert_eq!(again.type_bits(), token.type_bits());
        prop_assert_eq!(again, token);
    }

    #[test]
    fn token_byte_order_equals_logical_order(a in arb_token(true), b in arb_token(true)) {
        let expected = ref_token_cmp(&a, &b);
        prop_assert_eq!(a.encode().data().cmp(b.encode().data()), expected, "{} vs {}", a, b);
        prop_assert_eq!(a.encode().data_hex().cmp(&b.encode().data_hex()), expected);
        prop_assert_eq!(a.logical_cmp(&b), expected);
    }

    #[test]
    fn token_byte_order_equals_logical_order_wide(a in arb_token(false), b in arb_token(false)) {
        prop_assert_eq!(a.encode().data().cmp(b.encode().data()), ref_token_cmp(&a, &b));
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..64), bits in prop::collection::vec(any::<u8>(), 0..8)) {
        let _ = ResumeToken::from_parts(data.clone(), bits.clone()).decode();
        if let Ok(mut r) = TypeBitsReader::new(&bits) {
            let _ = keystring::decode_key(&data, &mut r);
        }
        let _ = keystring::decode_all(&data, &mut TypeBitsReader::zeros());
        // The validating skipper (used to decode tokens lazily) accepts exactly what the
        // decoder accepts, and consumes the same bytes and type bits.
        if let (Some(&ct), Ok(r0)) = (data.first(), TypeBitsReader::new(&bits)) {
            let rest = &data[1..];
            let (mut ra, mut rb) = (keystring::Reader::new(rest), keystring::Reader::new(rest));
            let (mut ba, mut bb) = (r0.clone(), r0);
            let decoded = keystring::decode_value(ct, &mut ra, &mut ba, 1);
            let skipped = keystring::skip_value(ct, &mut rb, &mut bb, 1);
            prop_assert_eq!(decoded.is_ok(), skipped.is_ok());
            // The fast scalar path agrees with the decoder wherever it answers.
            let (mut rc, mut bc) = (keystring::Reader::new(rest), TypeBitsReader::new(&bits).unwrap());
            if let Some(fast) = keystring::fast_scalar(ct, &mut rc, &mut bc).to_bson() {
                prop_assert_eq!(Some(exact(&[fast])), decoded.as_ref().ok().map(|d| exact(std::slice::from_ref(d))));
                prop_assert_eq!(rc.position(), ra.position());
                prop_assert_eq!(bc.position(), ba.position());
            }
            if decoded.is_ok() {
                prop_assert_eq!(ra.position(), rb.position());
                prop_assert_eq!(ba.position(), bb.position());
            }
        }
    }

    #[test]
    fn mutated_tokens_never_panic(t in arb_token(false), pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let token = t.encode();
        let mut data = token.data().to_vec();
        let i = pos.index(data.len());
        data[i] = byte;
        let tb = token.type_bits().unwrap_or(&[]).to_vec();
        if let Ok(d) = ResumeToken::from_parts(data.clone(), tb.clone()).decode() {
            // A lazily decoded identifier materializes to what an eager decode yields.
            if let Some(doc) = d.event_identifier() {
                let mut bits = TypeBitsReader::new(&tb).unwrap();
                let values = keystring::decode_all(&data, &mut bits).unwrap();
                let eager = values.iter().find(|v| matches!(v, Bson::Document(_))).unwrap();
                prop_assert_eq!(exact(&[Bson::Document(doc.clone())]), exact(std::slice::from_ref(eager)));
            }
        }
        let n = cut.index(data.len() + 1);
        let _ = ResumeToken::from_parts(data[..n].to_vec(), tb).decode();
    }

    #[test]
    fn arbitrary_hex_never_panics(s in "[0-9A-Fa-fxz]{0,40}") {
        let mut d = Document::new();
        d.insert("_data", s);
        let _ = ResumeTokenData::from_document(&d);
    }
}

#[test]
fn deep_nesting_is_rejected_without_overflowing_the_stack() {
    let mut data = vec![0x50u8; 100_000];
    data.push(0x04);
    let err = ResumeToken::from_parts(data, Vec::new())
        .decode()
        .unwrap_err();
    assert_eq!(err.code(), 260);
}
