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

use bson::{
    Binary, Bson, DateTime, Decimal128, Document, Regex, Timestamp, Uuid, oid::ObjectId,
    spec::BinarySubtype,
};
use num_bigint::{BigInt, BigUint, Sign};
use proptest::prelude::*;
use resume::keystring::{self, TypeBitsReader, key_bytes};
use resume::{ClusterTime, ResumeToken, ResumeTokenData, TokenVersion, event_identifier};

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

// --- generators -------------------------------------------------------------------------------

fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_map(|d| if d.is_nan() { f64::NAN } else { d }),
        (-1000i64..1000).prop_map(|i| i as f64),
        (-1000i64..1000, 1u32..8).prop_map(|(i, s)| i as f64 / f64::from(1u32 << s)),
        prop::sample::select(vec![
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::MIN,
            9_223_372_036_854_775_808.0,
            -9_223_372_036_854_775_808.0,
            9_007_199_254_740_993.0,
            0.1,
            1e-300,
            1e300,
            1.5,
        ]),
    ]
}

fn arb_decimal() -> impl Strategy<Value = Decimal128> {
    let coef = prop_oneof![
        0u128..1000,
        0u128..10u128.pow(15),
        0u128..10u128.pow(34),
        (0u32..35).prop_map(|k| 10u128.pow(k.min(33))),
    ];
    let exp = prop_oneof![-40i32..40, -6176i32..=6111, -400i32..-300, 290i32..320];
    prop_oneof![
        9 => (any::<bool>(), coef, exp).prop_map(|(neg, c, e)| {
            let s = format!("{}{c}E{e}", if neg { "-" } else { "" });
            Decimal128::from_str(&s).unwrap()
        }),
        1 => prop::sample::select(vec!["NaN", "Infinity", "-Infinity", "-0", "0E-6176", "-0E+6111"])
            .prop_map(|s| Decimal128::from_str(s).unwrap()),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{0,3}",
        "\\PC{0,6}",
        prop::collection::vec(
            prop::sample::select(vec!['\0', 'a', '\u{7f}', 'é', '\u{ffff}']),
            0..4
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c_]{0,3}", "[^\u{0}]{0,4}"]
}

fn arb_leaf() -> impl Strategy<Value = Bson> {
    prop_oneof![
        Just(Bson::MinKey),
        Just(Bson::MaxKey),
        Just(Bson::Null),
        Just(Bson::Undefined),
        any::<bool>().prop_map(Bson::Boolean),
        any::<i32>().prop_map(Bson::Int32),
        (-300i32..300).prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        (-300i64..300).prop_map(Bson::Int64),
        arb_f64().prop_map(Bson::Double),
        arb_decimal().prop_map(Bson::Decimal128),
        arb_string().prop_map(Bson::String),
        "[a-b]{0,2}".prop_map(Bson::Symbol),
        any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
        prop::sample::select(vec![[0u8; 12], [1u8; 12]])
            .prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
        any::<i64>().prop_map(|m| Bson::DateTime(DateTime::from_millis(m))),
        (any::<u32>(), any::<u32>()).prop_map(|(t, i)| Bson::Timestamp(Timestamp {
            time: t,
            increment: i
        })),
        (
            prop::sample::select(vec![0u8, 3, 4, 5, 0x80]),
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..20),
                prop::collection::vec(any::<u8>(), 250..300)
            ]
        )
            .prop_map(|(s, bytes)| Bson::Binary(Binary {
                subtype: BinarySubtype::from(s),
                bytes
            })),
        ("[a-c.*]{0,3}", "[imsx]{0,2}").prop_map(|(p, o)| Bson::RegularExpression(Regex {
            pattern: p.try_into().unwrap(),
            options: o.try_into().unwrap()
        })),
        "[a-b]{0,2}".prop_map(Bson::JavaScriptCode),
    ]
}

fn arb_value() -> impl Strategy<Value = Bson> {
    arb_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            prop::collection::vec((arb_name(), inner), 0..4).prop_map(|kv| {
                let mut d = Document::new();
                for (k, v) in kv {
                    d.insert(k, v);
                }
                Bson::Document(d)
            }),
        ]
    })
}

fn arb_document_key() -> impl Strategy<Value = Document> {
    prop_oneof![
        arb_value().prop_map(|v| {
            let mut d = Document::new();
            d.insert("_id", v);
            d
        }),
        (arb_value(), arb_value()).prop_map(|(s, v)| {
            let mut d = Document::new();
            d.insert("shard", s);
            d.insert("_id", v);
            d
        }),
    ]
}

fn arb_uuid() -> impl Strategy<Value = Uuid> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(Uuid::from_bytes),
        prop::sample::select(vec![[0u8; 16], [9u8; 16]]).prop_map(Uuid::from_bytes),
    ]
}

/// Arbitrary valid token data; `small` picks from tiny domains so pairs often share prefixes.
fn arb_token(small: bool) -> BoxedStrategy<ResumeTokenData> {
    let ts = if small {
        (0u32..2, 0u32..2)
            .prop_map(|(s, i)| ClusterTime::new(s, i))
            .boxed()
    } else {
        (any::<u32>(), any::<u32>())
            .prop_map(|(s, i)| ClusterTime::new(s, i))
            .boxed()
    };
    let txn = if small {
        (0u32..3).boxed()
    } else {
        prop_oneof![0u32..3, 0u32..=resume::MAX_TXN_OP_INDEX].boxed()
    };
    let key = if small {
        prop_oneof![
            (0i32..3).prop_map(|i| {
                let mut d = Document::new();
                d.insert("_id", i);
                d
            }),
            arb_document_key()
        ]
        .boxed()
    } else {
        arb_document_key().boxed()
    };
    let op = prop::sample::select(vec!["insert", "update", "delete", "drop", "create"]);
    (
        ts,
        prop::sample::select(vec![TokenVersion::V0, TokenVersion::V1, TokenVersion::V2]),
        any::<bool>(),
        txn,
        any::<bool>(),
        prop::option::of(arb_uuid()),
        prop::option::of(key),
        op,
        prop::option::of(0u32..4),
    )
        .prop_map(|(ts, version, hwm, txn, inval, uuid, key, op, frag)| {
            if hwm && version != TokenVersion::V0 {
                return ResumeTokenData::high_water_mark(ts, version);
            }
            let ident = match (version, key) {
                (TokenVersion::V2, key) => Some(match (op, key) {
                    ("drop", _) => event_identifier(op, None),
                    ("create", Some(k)) => event_identifier(op, Some(("operationDescription", k))),
                    (_, Some(k)) => event_identifier(op, Some(("documentKey", k))),
                    (_, None) => event_identifier(op, None),
                }),
                (_, key) if uuid.is_some() => key,
                _ => None,
            };
            let t = ResumeTokenData::event(ts, version, txn, uuid, ident)
                .unwrap()
                .with_from_invalidate(inval);
            if version == TokenVersion::V2 {
                t.with_fragment_num(frag).unwrap()
            } else {
                t
            }
        })
        .boxed()
}

/// Bit-exact image of a value (distinguishes -0.0, NaN payloads, decimal exponents, types).
fn exact(values: &[Bson]) -> Vec<u8> {
    let mut d = Document::new();
    for (i, v) in values.iter().enumerate() {
        d.insert(i.to_string(), v.clone());
    }
    d.to_vec().unwrap()
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
    }

    #[test]
    fn mutated_tokens_never_panic(t in arb_token(false), pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let token = t.encode();
        let mut data = token.data().to_vec();
        let i = pos.index(data.len());
        data[i] = byte;
        let tb = token.type_bits().unwrap_or(&[]).to_vec();
        let _ = ResumeToken::from_parts(data.clone(), tb.clone()).decode();
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
