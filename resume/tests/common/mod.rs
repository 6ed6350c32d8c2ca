//! Shared generators for the resume crate's property and interop tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::str::FromStr;

use bson::{
    Binary, Bson, DateTime, Decimal128, Document, Regex, Timestamp, Uuid, oid::ObjectId,
    spec::BinarySubtype,
};
use proptest::prelude::*;
use resume::{ClusterTime, ResumeTokenData, TokenVersion, event_identifier};

// --- generators -------------------------------------------------------------------------------

pub fn arb_f64() -> impl Strategy<Value = f64> {
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

pub fn arb_decimal() -> impl Strategy<Value = Decimal128> {
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

pub fn arb_string() -> impl Strategy<Value = String> {
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

pub fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c_]{0,3}", "[^\u{0}]{0,4}"]
}

pub fn arb_leaf() -> impl Strategy<Value = Bson> {
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

pub fn arb_value() -> impl Strategy<Value = Bson> {
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

pub fn arb_document_key() -> impl Strategy<Value = Document> {
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

pub fn arb_uuid() -> impl Strategy<Value = Uuid> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(Uuid::from_bytes),
        prop::sample::select(vec![[0u8; 16], [9u8; 16]]).prop_map(Uuid::from_bytes),
    ]
}

/// Arbitrary valid token data; `small` picks from tiny domains so pairs often share prefixes.
pub fn arb_token(small: bool) -> BoxedStrategy<ResumeTokenData> {
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
pub fn exact(values: &[Bson]) -> Vec<u8> {
    let mut d = Document::new();
    for (i, v) in values.iter().enumerate() {
        d.insert(i.to_string(), v.clone());
    }
    d.to_vec().unwrap()
}
