//! The KeyString encoder of BSON bytes (`Builder::append_raw_document` and the tokens built
//! with it, `ResumeTokenData::event_from_raw_parts`) against the encoder of decoded documents.
//!
//! Invariants checked:
//! * where it answers, it writes exactly what encoding the decoded document writes, type bits
//!   included, over documents of every BSON type it accepts (and tokens built from it are
//!   identical, in every version);
//! * it declines, leaving the builder as it was, for a repeated field name at any depth, more
//!   fields than it checks for repeats, a DBPointer, deep nesting and malformed bytes; it
//!   never accepts bytes that do not decode, and never panics.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use bson::raw::{CString, RawDocument, RawDocumentBuf, cstr};
use bson::spec::BinarySubtype;
use bson::{Binary, Bson, Document, JavaScriptCodeWithScope, Regex, Uuid, doc};
use common::*;
use proptest::prelude::*;
use resume::keystring::{Builder, TypeBits};
use resume::{ClusterTime, ResumeTokenData, TokenVersion};

/// What encoding the decoded form of `raw` writes (`None` when it does not decode).
fn via_decoding(raw: &RawDocument) -> Option<(Vec<u8>, TypeBits)> {
    let d = Document::try_from(raw).ok()?;
    let mut b = Builder::new();
    b.append_i32(7); // something before, so type bits do not start at bit 0
    b.append_document(&d);
    Some(b.finish())
}

fn via_bytes(raw: &RawDocument) -> Option<(Vec<u8>, TypeBits)> {
    let mut b = Builder::new();
    b.append_i32(7);
    let before = (b.bytes().to_vec(), b.type_bits().clone());
    if b.append_raw_document(raw) {
        return Some(b.finish());
    }
    assert_eq!(
        (b.bytes().to_vec(), b.type_bits().clone()),
        before,
        "a declined document leaves the builder as it was"
    );
    None
}

fn same(a: &(Vec<u8>, TypeBits), b: &(Vec<u8>, TypeBits)) -> bool {
    a.0 == b.0 && a.1.to_bytes() == b.1.to_bytes() && a.1.len() == b.1.len()
}

fn arb_document() -> impl Strategy<Value = Document> {
    prop_oneof![
        arb_document_key(),
        prop::collection::vec((arb_name(), arb_value()), 0..6).prop_map(|kv| {
            let mut d = Document::new();
            for (k, v) in kv {
                d.insert(k, v);
            }
            d
        }),
    ]
}

/// Every BSON type the encoder accepts, including those the generators do not make.
fn every_type() -> Document {
    doc! {
        "_id": 1,
        "dbl": -0.0, "str": "a\0b", "doc": {"x": {"y": [1, 2_i64]}}, "arr": [[], {}, "s"],
        "bin": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
        "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![4, 5] },
        "uuid": Binary { subtype: BinarySubtype::Uuid, bytes: vec![9; 16] },
        "long": Binary { subtype: BinarySubtype::UserDefined(0x80), bytes: vec![1; 300] },
        "undef": Bson::Undefined, "oid": bson::oid::ObjectId::from_bytes([3; 12]), "t": true,
        "f": false, "dt": bson::DateTime::from_millis(-5), "null": Bson::Null,
        "re": Bson::RegularExpression(Regex {
            pattern: CString::try_from("a.c").unwrap(),
            options: CString::try_from("xmi").unwrap(),
        }),
        "code": Bson::JavaScriptCode("f()".into()),
        "sym": Bson::Symbol("sym".into()),
        "cws": Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
            code: "g()".into(),
            scope: doc! {"x": 1, "y": {"z": "w"}},
        }),
        "i": -7, "ts": bson::Timestamp { time: 1, increment: 2 }, "l": i64::MIN,
        "dec": Bson::Decimal128("1.50".parse().unwrap()),
        "min": Bson::MinKey, "max": Bson::MaxKey,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn raw_documents_encode_as_their_decoded_form(d in arb_document()) {
        let raw = RawDocumentBuf::try_from(&d).unwrap();
        let want = via_decoding(&raw).unwrap();
        let got = via_bytes(&raw);
        prop_assert!(got.as_ref().is_some_and(|g| same(g, &want)), "{:?}", d);
    }

    #[test]
    fn tokens_from_raw_parts_equal_tokens_from_decoded_parts(
        key in arb_document_key(),
        v in prop::sample::select(vec![TokenVersion::V1, TokenVersion::V2]),
        op in prop::sample::select(vec!["insert", "update", "delete"]),
        uuid in prop::option::of(arb_uuid()),
        with_key in any::<bool>(),
    ) {
        let raw = RawDocumentBuf::try_from(&key).unwrap();
        let decoded = Document::try_from(raw.as_ref()).unwrap();
        let ts = ClusterTime::new(5, 6);
        let second = with_key.then_some("documentKey");
        let want = ResumeTokenData::event_from_parts(
            ts, v, 3, uuid, op, second.map(|n| (n, &decoded)),
        );
        let got = ResumeTokenData::event_from_raw_parts(
            ts, v, 3, uuid, op, second.map(|n| (n, raw.as_ref())),
        );
        match (want, got) {
            (Ok(want), Ok(Some(got))) => {
                let (g, w) = (got.encode(), want.encode());
                prop_assert_eq!(g.type_bits(), w.type_bits());
                prop_assert_eq!(g, w);
                // By their debug form: a NaN inside makes documents unequal to themselves.
                prop_assert_eq!(
                    format!("{:?}", got.event_identifier()),
                    format!("{:?}", want.event_identifier())
                );
                prop_assert_eq!(got, want);
            }
            (Err(want), Err(got)) => prop_assert_eq!(got, want),
            (want, got) => prop_assert!(false, "{:?} vs {:?}", want, got),
        }
    }

    /// Damaged bytes: declined, or encoded exactly as they decode; never a panic, and never
    /// accepted when they do not decode.
    #[test]
    fn damaged_documents_are_declined_or_encoded_as_decoded(
        d in arb_document(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = RawDocumentBuf::try_from(&d).unwrap().into_bytes();
        let at = at.index(bytes.len());
        bytes[at] = byte;
        if let Ok(raw) = RawDocument::from_bytes(&bytes)
            && let Some(got) = via_bytes(raw)
        {
            let want = via_decoding(raw);
            prop_assert!(want.is_some_and(|w| same(&got, &w)), "{:?}", bytes);
        }
    }
}

#[test]
fn every_accepted_type_encodes_as_decoded() {
    let d = every_type();
    let raw = RawDocumentBuf::try_from(&d).unwrap();
    let want = via_decoding(&raw).unwrap();
    assert!(same(&via_bytes(&raw).unwrap(), &want));
    // Inside an object, as the v2 identifier holds the document key.
    let mut a = Builder::new();
    a.begin_object();
    a.field_str("operationType", "update");
    a.field_document("documentKey", &Document::try_from(raw.as_ref()).unwrap());
    a.end_object();
    let mut b = Builder::new();
    b.begin_object();
    b.field_str("operationType", "update");
    assert!(b.field_raw_document("documentKey", &raw));
    b.end_object();
    assert!(same(&b.finish(), &a.finish()));
}

#[test]
fn unsorted_regex_options_are_sorted_as_decoding_does() {
    let mut raw = RawDocumentBuf::new();
    raw.append(
        cstr!("re"),
        bson::RawRegexRef {
            pattern: cstr!("p"),
            options: cstr!("xsmi"),
        },
    );
    let want = via_decoding(&raw).unwrap();
    assert!(same(&via_bytes(&raw).unwrap(), &want));
}

#[test]
fn repeated_field_names_are_declined_at_any_depth() {
    let mut top = RawDocumentBuf::new();
    top.append(cstr!("_id"), 1);
    top.append(cstr!("_id"), 2);
    assert!(via_bytes(&top).is_none());
    let mut nested = RawDocumentBuf::new();
    nested.append(cstr!("_id"), top.clone());
    assert!(via_bytes(&nested).is_none());
    let mut in_array = bson::RawArrayBuf::new();
    in_array.push(top);
    let mut outer = RawDocumentBuf::new();
    outer.append(cstr!("a"), in_array);
    assert!(via_bytes(&outer).is_none());
    // The same name at different levels is fine.
    let d = doc! {"a": {"a": {"a": 1}}};
    let raw = RawDocumentBuf::try_from(&d).unwrap();
    assert!(same(
        &via_bytes(&raw).unwrap(),
        &via_decoding(&raw).unwrap()
    ));
}

#[test]
fn wide_documents_dbpointers_and_deep_nesting_are_declined() {
    let mut wide = Document::new();
    for i in 0..32 {
        wide.insert(format!("f{i}"), i);
    }
    let raw = RawDocumentBuf::try_from(&wide).unwrap();
    assert!(via_bytes(&raw).is_some(), "32 fields are checked");
    wide.insert("f32", 32);
    assert!(via_bytes(&RawDocumentBuf::try_from(&wide).unwrap()).is_none());

    let ptr = dbpointer_document();
    let ptr = RawDocument::from_bytes(&ptr).unwrap();
    assert!(matches!(
        Document::try_from(ptr).unwrap().get("p"),
        Some(Bson::DbPointer(_))
    ));
    assert!(via_bytes(ptr).is_none());

    let mut deep = doc! {"x": 1};
    for _ in 0..150 {
        deep = doc! {"a": [deep]};
    }
    assert!(via_bytes(&RawDocumentBuf::try_from(&deep).unwrap()).is_none());
}

#[test]
fn raw_tokens_decline_where_the_encoder_does() {
    let mut dup = RawDocumentBuf::new();
    dup.append(cstr!("_id"), 1);
    dup.append(cstr!("_id"), 2);
    for v in [TokenVersion::V1, TokenVersion::V2] {
        let t = ResumeTokenData::event_from_raw_parts(
            ClusterTime::new(1, 1),
            v,
            0,
            Some(Uuid::from_bytes([1; 16])),
            "delete",
            Some(("documentKey", dup.as_ref())),
        );
        assert!(matches!(t, Ok(None)), "{v:?}: {t:?}");
    }
}

/// `{p: DBPointer("db.c", 0102..0c)}`, written by hand (`bson` builds one only by parsing).
fn dbpointer_document() -> Vec<u8> {
    let mut b = Vec::new();
    b.push(0x0C);
    b.extend_from_slice(b"p\0");
    b.extend_from_slice(&5_i32.to_le_bytes());
    b.extend_from_slice(b"db.c\0");
    b.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    let mut d = ((b.len() + 5) as i32).to_le_bytes().to_vec();
    d.extend_from_slice(&b);
    d.push(0);
    d
}
