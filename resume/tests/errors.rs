//! Bad tokens fail with MongoDB's codes (§3.4, `resume_token.cpp`), as typed errors that
//! convert into `wire::MongoError`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

use bson::{Binary, Bson, Document, doc, spec::BinarySubtype};
use resume::keystring::Builder;
use resume::{ClusterTime, ResumeToken, ResumeTokenData, TokenError, TokenVersion};
use wire::MongoError;

const TS: ClusterTime = ClusterTime::new(1_700_000_000, 1);

fn uuid_bson() -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![7; 16],
    })
}

/// A token document whose KeyString holds exactly `values` (then the end byte).
fn token_of(values: &[Bson]) -> Document {
    let mut b = Builder::new();
    for v in values {
        b.append(v);
    }
    b.append_end();
    let (data, bits) = b.finish();
    ResumeToken::from_parts(data, bits.to_bytes()).to_document()
}

fn code_of(doc: &Document) -> i32 {
    let err = ResumeTokenData::from_document(doc).expect_err("token must be rejected");
    let mongo: MongoError = err.clone().into();
    assert_eq!(mongo.code, err.code());
    mongo.code
}

fn ts() -> Bson {
    Bson::Timestamp(TS.timestamp())
}

#[test]
fn missing_or_non_string_data_is_40647() {
    assert_eq!(code_of(&doc! {}), 40647);
    assert_eq!(code_of(&doc! {"_data": 5}), 40647);
}

#[test]
fn non_hex_data_is_failed_to_parse() {
    assert_eq!(code_of(&doc! {"_data": "XYZ"}), 9);
    assert_eq!(code_of(&doc! {"_data": "826"}), 9, "odd length");
    let mongo: MongoError = ResumeTokenData::from_document(&doc! {"_data": "zz"})
        .unwrap_err()
        .into();
    assert_eq!(mongo.code_name, "FailedToParse");
}

#[test]
fn empty_token_is_40649() {
    assert_eq!(code_of(&doc! {"_data": ""}), 40649);
    assert_eq!(code_of(&doc! {"_data": "04"}), 40649);
}

#[test]
fn bad_type_bits_are_40648() {
    let hwm = ResumeTokenData::high_water_mark(TS, TokenVersion::V2).to_document();
    let mut d = hwm.clone();
    d.insert("_typeBits", "not bindata");
    assert_eq!(code_of(&d), 40648);
    let mut d = hwm.clone();
    d.insert(
        "_typeBits",
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0x85, 1, 2],
        }),
    );
    assert_eq!(code_of(&d), 40648, "size byte says 5, only 2 data bytes");
    let mut d = hwm;
    d.insert(
        "_typeBits",
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0x80, 3, 0, 0, 0, 1, 2, 3],
        }),
    );
    assert_eq!(code_of(&d), 40648, "overlong encoding");
}

#[test]
fn type_bits_that_run_out_are_invalid_resume_token() {
    // A double needs type bits "10"; a one-byte stream cannot describe the 9th bit.
    let id = doc! {"operationType": "insert", "documentKey": {"_id": 1.0}};
    let mut d = token_of(&[
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        uuid_bson(),
        id.into(),
    ]);
    assert!(d.get("_typeBits").is_some());
    d.insert(
        "_typeBits",
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0x01],
        }),
    );
    assert_eq!(code_of(&d), 260);
}

#[test]
fn trailing_bytes_and_values_are_rejected() {
    let mut hwm = ResumeTokenData::high_water_mark(TS, TokenVersion::V2)
        .encode()
        .data_hex();
    hwm.push_str("29");
    assert_eq!(
        code_of(&doc! {"_data": &hwm}),
        260,
        "bytes after the end byte"
    );
    let id = doc! {"operationType": "insert", "documentKey": {"_id": 1}};
    let d = token_of(&[
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        uuid_bson(),
        id.into(),
        1.into(),
        2.into(),
    ]);
    assert_eq!(code_of(&d), 40646);
}

#[test]
fn truncated_keystring_is_invalid_resume_token() {
    let full = ResumeTokenData::high_water_mark(TS, TokenVersion::V2)
        .encode()
        .data_hex();
    assert_eq!(code_of(&doc! {"_data": &full[..6]}), 260);
    assert_eq!(code_of(&doc! {"_data": "FF04"}), 260, "unknown CType");
}

#[test]
fn version_errors() {
    assert_eq!(code_of(&token_of(&[ts()])), 50796);
    assert_eq!(code_of(&token_of(&[ts(), 2i64.into()])), 50854);
    assert_eq!(code_of(&token_of(&[ts(), "2".into()])), 50854);
    assert_eq!(
        code_of(&token_of(&[
            ts(),
            3.into(),
            0.into(),
            0.into(),
            false.into()
        ])),
        50795
    );
    assert_eq!(code_of(&token_of(&[ts(), (-1).into()])), 50795);
}

#[test]
fn token_type_errors() {
    assert_eq!(code_of(&token_of(&[ts(), 2.into()])), 51055);
    assert_eq!(code_of(&token_of(&[ts(), 2.into(), 1.5.into()])), 51056);
    assert_eq!(code_of(&token_of(&[ts(), 2.into(), 64.into()])), 51057);
}

#[test]
fn txn_op_index_errors() {
    assert_eq!(code_of(&token_of(&[ts(), 2.into(), 0.into()])), 50793);
    assert_eq!(
        code_of(&token_of(&[ts(), 2.into(), 0.into(), 0i64.into()])),
        50855
    );
    assert_eq!(
        code_of(&token_of(&[ts(), 2.into(), 128.into(), (-1).into()])),
        50794
    );
    // v0: no tokenType, so txnOpIndex comes right after the version.
    assert_eq!(code_of(&token_of(&[ts(), 0.into(), (-3).into()])), 50794);
}

#[test]
fn from_invalidate_errors() {
    assert_eq!(
        code_of(&token_of(&[ts(), 2.into(), 0.into(), 0.into()])),
        50872
    );
    assert_eq!(
        code_of(&token_of(&[ts(), 2.into(), 0.into(), 0.into(), 0.into()])),
        50870
    );
}

#[test]
fn v2_uuid_must_be_uuid_or_null() {
    let d = token_of(&[
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        "x".into(),
    ]);
    assert_eq!(code_of(&d), 6189500);
}

#[test]
fn v2_event_without_identifier_is_6189501() {
    let d = token_of(&[
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        uuid_bson(),
    ]);
    assert_eq!(code_of(&d), 6189501);
    assert_eq!(
        ResumeTokenData::event(TS, TokenVersion::V2, 0, None, None).unwrap_err(),
        TokenError::EventWithoutIdentifier
    );
}

#[test]
fn high_water_mark_with_identifier_is_6189504() {
    let d = token_of(&[
        ts(),
        2.into(),
        0.into(),
        0.into(),
        false.into(),
        Bson::Null,
        doc! {"operationType": "insert"}.into(),
    ]);
    assert_eq!(code_of(&d), 6189504);
}

#[test]
fn identifier_must_be_an_object() {
    let d = token_of(&[
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        Bson::Null,
        5.into(),
    ]);
    assert_eq!(code_of(&d), 6189503);
}

#[test]
fn fragment_num_must_be_a_non_negative_int() {
    let id: Bson = doc! {"operationType": "insert", "documentKey": {"_id": 1}}.into();
    let base = [
        ts(),
        2.into(),
        128.into(),
        0.into(),
        false.into(),
        uuid_bson(),
        id,
    ];
    let mut v = base.to_vec();
    v.push("1".into());
    assert_eq!(code_of(&token_of(&v)), 7182501);
    let mut v = base.to_vec();
    v.push((-1).into());
    assert_eq!(code_of(&token_of(&v)), 7182501);
}

#[test]
fn pre_v2_identifier_requires_uuid() {
    let err = ResumeTokenData::event(TS, TokenVersion::V1, 0, None, Some(doc! {"_id": 1}));
    assert_eq!(err.unwrap_err().code(), 260);
}

#[test]
fn v0_tokens_decode() {
    let d = token_of(&[
        ts(),
        0.into(),
        2.into(),
        uuid_bson(),
        doc! {"_id": 1}.into(),
    ]);
    let data = ResumeTokenData::from_document(&d).unwrap();
    assert_eq!(data.version(), TokenVersion::V0);
    assert_eq!(data.txn_op_index(), 2);
    assert_eq!(data.event_identifier(), Some(&doc! {"_id": 1}));
    assert_eq!(data.to_document(), d);
}
