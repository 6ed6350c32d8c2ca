//! Property tests: the BSON order is a total order, and parsing/evaluating arbitrary filters,
//! expressions and pipelines never panics.

use std::cmp::Ordering;

use bson::{Bson, Document};
use pipeline::Matcher;
use pipeline::agg::Pipeline;
use pipeline::expr::Expr;
use pipeline::sort::SortSpec;
use pipeline::value::{add_numbers, compare, equal, mul_numbers};
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Bson> {
    prop_oneof![
        Just(Bson::Null),
        Just(Bson::Undefined),
        Just(Bson::MinKey),
        Just(Bson::MaxKey),
        any::<bool>().prop_map(Bson::Boolean),
        (-3i32..3).prop_map(Bson::Int32),
        any::<i32>().prop_map(Bson::Int32),
        prop_oneof![any::<i64>(), -3i64..3].prop_map(Bson::Int64),
        prop_oneof![
            Just(f64::NAN),
            Just(-0.0),
            Just(f64::INFINITY),
            Just(9_223_372_036_854_775_808.0),
            Just(0.1),
            -3.0f64..3.0,
            (-3i32..3).prop_map(f64::from),
            any::<f64>()
        ]
        .prop_map(Bson::Double),
        prop_oneof![(-3i32..3).prop_map(f64::from), any::<f64>(), -3.0f64..3.0]
            .prop_map(|f| Bson::Decimal128(pipeline::value::f64_to_decimal(f))),
        prop_oneof![
            Just("0.1"),
            Just("-0"),
            Just("1E+400"),
            Just("-1E-400"),
            Just("NaN"),
            Just("-Infinity"),
            Just("9223372036854775807.5"),
            Just("9223372036854775808"),
            Just("1.000000000000000000000000000000001")
        ]
        .prop_map(|t| Bson::Decimal128(t.parse().unwrap_or(pipeline::value::f64_to_decimal(0.0)))),
        "[a-c$.]{0,3}".prop_map(Bson::String),
        "[a-c]{0,2}".prop_map(Bson::Symbol),
        any::<i64>().prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m))),
        (any::<u32>(), 0u32..3)
            .prop_map(|(time, increment)| Bson::Timestamp(bson::Timestamp { time, increment })),
        any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(bson::oid::ObjectId::from_bytes(b))),
        proptest::collection::vec(0u8..3, 0..3).prop_map(|bytes| Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes
        })),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("$eq".to_string()),
        Just("$gt".to_string()),
        Just("$in".to_string()),
        Just("$and".to_string()),
        Just("$or".to_string()),
        Just("$not".to_string()),
        Just("$size".to_string()),
        Just("$elemMatch".to_string()),
        Just("$exists".to_string()),
        Just("$type".to_string()),
        Just("$add".to_string()),
        Just("$concat".to_string()),
        Just("$cond".to_string()),
        Just("a.b".to_string()),
        Just("a.0".to_string()),
        "[a-c]{1,2}",
    ]
}

fn value() -> impl Strategy<Value = Bson> {
    scalar().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            proptest::collection::vec((key(), inner), 0..4).prop_map(|kvs| {
                let mut d = Document::new();
                for (k, v) in kvs {
                    d.insert(k, v);
                }
                Bson::Document(d)
            }),
        ]
    })
}

fn document() -> impl Strategy<Value = Document> {
    proptest::collection::vec((key(), value()), 0..4).prop_map(|kvs| {
        let mut d = Document::new();
        for (k, v) in kvs {
            d.insert(k, v);
        }
        d
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn compare_is_reflexive_and_antisymmetric(a in value(), b in value()) {
        prop_assert_eq!(compare(&a, &a), Ordering::Equal);
        prop_assert_eq!(compare(&a, &b), compare(&b, &a).reverse());
        prop_assert_eq!(equal(&a, &b), compare(&a, &b) == Ordering::Equal);
    }

    #[test]
    fn compare_is_transitive(a in value(), b in value(), c in value()) {
        let mut v = [a, b, c];
        v.sort_by(compare);
        prop_assert_ne!(compare(&v[0], &v[1]), Ordering::Greater);
        prop_assert_ne!(compare(&v[1], &v[2]), Ordering::Greater);
        prop_assert_ne!(compare(&v[0], &v[2]), Ordering::Greater);
    }

    #[test]
    fn arithmetic_is_commutative(a in scalar(), b in scalar()) {
        let ab = add_numbers(&a, &b);
        let ba = add_numbers(&b, &a);
        prop_assert_eq!(ab.is_some(), ba.is_some());
        if let (Some(x), Some(y)) = (ab, ba) {
            prop_assert!(equal(&x, &y), "{:?} vs {:?}", x, y);
        }
        let ab = mul_numbers(&a, &b);
        let ba = mul_numbers(&b, &a);
        if let (Some(x), Some(y)) = (ab, ba) {
            prop_assert!(equal(&x, &y), "{:?} vs {:?}", x, y);
        }
    }

    #[test]
    fn arbitrary_filters_never_panic(filter in document(), doc in document()) {
        if let Ok(m) = Matcher::parse(&filter) {
            let _ = m.try_matches(&doc);
            let _ = m.referenced_paths();
        }
    }

    #[test]
    fn arbitrary_expressions_never_panic(e in value(), doc in document()) {
        if let Ok(x) = Expr::parse(&e) {
            let _ = x.evaluate(&doc);
        }
    }

    #[test]
    fn arbitrary_pipelines_never_panic(stages in proptest::collection::vec(document(), 0..3), docs in proptest::collection::vec(document(), 0..4)) {
        if let Ok(p) = Pipeline::parse(&stages) {
            let _ = p.run(docs);
        }
    }

    #[test]
    fn sort_keys_order_like_documents(a in document(), b in document(), asc in any::<bool>()) {
        let spec = SortSpec::parse(&bson::doc! {"a": if asc { 1 } else { -1 }, "b": 1}).unwrap();
        prop_assert_eq!(spec.compare(&a, &b), spec.compare_keys(&spec.sort_key(&a), &spec.sort_key(&b)));
        prop_assert_eq!(spec.compare(&a, &b), spec.compare(&b, &a).reverse());
    }
}
