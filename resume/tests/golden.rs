//! Golden vectors: tokens whose bytes were worked out by hand from the reference's layouts
//! (§5.3–5.5), plus one token produced by a real MongoDB server (quoted in the
//! `mongodb-resumetoken-decoder` README). Each test checks encode → exact bytes and
//! decode → the same logical data.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

use bson::{Bson, Document, Uuid, doc, oid::ObjectId};
use resume::{
    ClusterTime, ResumeToken, ResumeTokenData, TokenType, TokenVersion, event_identifier,
};

const TS: ClusterTime = ClusterTime::new(1_700_000_000, 1);
const TS_HEX: &str = "826553F10000000001";
const UUID_HEX: &str = "00112233445566778899AABBCCDDEEFF";

fn uuid() -> Uuid {
    Uuid::parse_str("00112233-4455-6677-8899-aabbccddeeff").unwrap()
}

fn oid() -> ObjectId {
    ObjectId::parse_str("653f1c2a0000000000000001").unwrap()
}

/// Hex of a C string: bytes then `00`.
fn cstr(s: &str) -> String {
    format!("{}00", hex::encode_upper(s))
}

fn check(data: &ResumeTokenData, expected_hex: &str, expected_type_bits: Option<&[u8]>) {
    let token = data.encode();
    assert_eq!(token.data_hex(), expected_hex, "encoded _data of {data}");
    assert_eq!(token.type_bits(), expected_type_bits, "_typeBits of {data}");
    let doc = token.to_document();
    assert_eq!(doc.get_str("_data").unwrap(), expected_hex);
    match expected_type_bits {
        None => assert!(doc.get("_typeBits").is_none()),
        Some(tb) => assert_eq!(doc.get_binary_generic("_typeBits").unwrap(), tb),
    }
    let back = ResumeTokenData::from_document(&doc).unwrap();
    assert_eq!(&back, data);
    let raw = token.to_raw_document();
    assert_eq!(
        Document::try_from(&raw).unwrap(),
        doc,
        "raw and owned forms agree"
    );
    assert_eq!(
        ResumeToken::from_raw_document(&raw)
            .unwrap()
            .decode()
            .unwrap(),
        *data
    );
}

#[test]
fn timestamp_encodes_as_ctype_82_and_big_endian_secs_inc() {
    let bytes = resume::keystring::key_bytes(&Bson::Timestamp(TS.timestamp()));
    assert_eq!(hex::encode_upper(bytes), TS_HEX);
}

#[test]
fn v2_high_water_mark_matches_reference_layout() {
    let hwm = ResumeTokenData::high_water_mark(TS, TokenVersion::V2);
    assert_eq!(hwm.token_type(), TokenType::HighWaterMark);
    check(&hwm, "826553F100000000012B0429296E1404", None);
}

#[test]
fn v1_high_water_mark_has_no_null_uuid() {
    let hwm = ResumeTokenData::high_water_mark(TS, TokenVersion::V1);
    check(&hwm, &format!("{TS_HEX}2B0229296E04"), None);
}

fn v2_insert_prefix() -> String {
    // ts, version 2, tokenType 128, txnOpIndex 0, false, UUID BinData(4).
    format!("{TS_HEX}2B042C0100296E5A1004{UUID_HEX}")
}

#[test]
fn v2_insert_with_objectid_id_matches_reference_layout() {
    let id = event_identifier("insert", Some(("documentKey", doc! {"_id": oid()})));
    let data =
        ResumeTokenData::event(TS, TokenVersion::V2, 0, Some(uuid()), Some(id.clone())).unwrap();
    let expected = format!(
        "{}463C{}3C{}46{}4664{}64{}000004",
        v2_insert_prefix(),
        cstr("operationType"),
        cstr("insert"),
        cstr("documentKey"),
        cstr("_id"),
        "653F1C2A0000000000000001",
    );
    // Spelled out once more by hand, byte by byte, to guard the format! above.
    let by_hand = format!(
        "{TS_HEX}2B042C0100296E5A1004{UUID_HEX}46\
         3C6F7065726174696F6E54797065003C696E7365727400\
         46646F63756D656E744B65790046645F696400\
         64653F1C2A0000000000000001\
         00\
         00\
         04"
    );
    assert_eq!(expected, by_hand);
    check(&data, &by_hand, None);
    assert_eq!(data.event_identifier(), Some(&id));
}

#[test]
fn v2_insert_with_int64_id_sets_type_bits_82_00_01() {
    let id = event_identifier("insert", Some(("documentKey", doc! {"_id": 1i64})));
    let data = ResumeTokenData::event(TS, TokenVersion::V2, 0, Some(uuid()), Some(id)).unwrap();
    let expected = format!(
        "{}463C{}3C{}46{}461E{}2B020000", /* _id: 1 → 2B 02 */
        v2_insert_prefix(),
        cstr("operationType"),
        cstr("insert"),
        cstr("documentKey"),
        cstr("_id"),
    ) + "04";
    // 9 type bits: 00 (version) 00 (tokenType) 00 (txnOpIndex) 0 (string) 01 (int64).
    check(&data, &expected, Some(&[0x82, 0x00, 0x01]));
}

#[test]
fn int32_and_int64_ids_share_data_and_differ_only_in_type_bits() {
    let mk = |id: Bson| {
        let ident = event_identifier("insert", Some(("documentKey", doc! {"_id": id})));
        ResumeTokenData::event(TS, TokenVersion::V2, 0, Some(uuid()), Some(ident))
            .unwrap()
            .encode()
    };
    let (a, b, c) = (
        mk(Bson::Int32(1)),
        mk(Bson::Int64(1)),
        mk(Bson::Double(1.0)),
    );
    assert_eq!(a.data(), b.data());
    assert_eq!(a.data(), c.data());
    assert_eq!(a, b, "token equality compares _data only");
    assert_eq!(a.type_bits(), None);
    assert_eq!(b.type_bits(), Some(&[0x82, 0x00, 0x01][..]));
    // double: bits "10" at positions 7, 8 → bit 7 set → data [0x80, 0x00].
    assert_eq!(c.type_bits(), Some(&[0x82, 0x80, 0x00][..]));
    assert_eq!(
        b.decode().unwrap().event_identifier().unwrap(),
        &event_identifier("insert", Some(("documentKey", doc! {"_id": 1i64})))
    );
    assert_eq!(
        c.decode().unwrap().event_identifier().unwrap(),
        &event_identifier("insert", Some(("documentKey", doc! {"_id": 1.0})))
    );
}

#[test]
fn v1_token_uses_bare_document_key() {
    let key = doc! {"_id": 128};
    let data =
        ResumeTokenData::event(TS, TokenVersion::V1, 3, Some(uuid()), Some(key.clone())).unwrap();
    // version 2B 02; txnOpIndex 3 → 2B 06; _id: 128 → 2C 01 00.
    let expected = format!(
        "{TS_HEX}2B022C01002B066E5A1004{UUID_HEX}461E{}2C01000004",
        cstr("_id")
    );
    check(&data, &expected, None);
}

#[test]
fn compound_sharded_document_key() {
    let key = doc! {"region": "eu", "_id": 42i64};
    let id = event_identifier("update", Some(("documentKey", key)));
    let data = ResumeTokenData::event(TS, TokenVersion::V2, 0, Some(uuid()), Some(id)).unwrap();
    let expected = format!(
        "{}463C{}3C{}46{}463C{}3C{}1E{}2B540000",
        v2_insert_prefix(),
        cstr("operationType"),
        cstr("update"),
        cstr("documentKey"),
        cstr("region"),
        cstr("eu"),
        cstr("_id"),
    ) + "04";
    // bits: 000000 | 0 (update) | 0 ("eu") | 01 (int64) → bit 9 set → data [0x00, 0x02].
    check(&data, &expected, Some(&[0x82, 0x00, 0x02]));
}

#[test]
fn fractional_double_id_uses_ctype_0x32_minus_fraction_bytes() {
    // 1.5: integer part 1 → 7 fraction bytes → CType 0x2B; 1.5·2^56 + 2·2^56 = 0x0380…
    let bytes = resume::keystring::key_bytes(&Bson::Double(1.5));
    assert_eq!(hex::encode_upper(bytes), "2B0380000000000000");
    let bytes = resume::keystring::key_bytes(&Bson::Double(-1.5));
    assert_eq!(hex::encode_upper(bytes), "27FC7FFFFFFFFFFFFF");
}

#[test]
fn fragment_num_and_invalidate_round_trip() {
    let id = event_identifier("drop", None);
    assert_eq!(id, doc! {"operationType": "drop"});
    let data = ResumeTokenData::event(TS, TokenVersion::V2, 0, Some(uuid()), Some(id))
        .unwrap()
        .with_from_invalidate(true)
        .with_fragment_num(Some(2))
        .unwrap();
    let expected = format!(
        "{TS_HEX}2B042C0100296F5A1004{UUID_HEX}463C{}3C{}002B0404",
        cstr("operationType"),
        cstr("drop"),
    );
    check(&data, &expected, None);
}

#[test]
fn real_mongodb_v1_token_decodes_and_reencodes_identically() {
    // From the mongodb-resumetoken-decoder README (a token issued by a MongoDB server).
    let hex = "82612E8513000000012B022C0100296E5A1004A5093ABB38FE4B9EA67F01BB1A96D812463C5F6964003C5F5F5F78000004";
    let token = ResumeToken::from_document(&doc! {"_data": hex}).unwrap();
    let data = token.decode().unwrap();
    assert_eq!(data.cluster_time(), ClusterTime::new(1_630_438_675, 1));
    assert_eq!(data.version(), TokenVersion::V1);
    assert_eq!(data.token_type(), TokenType::Event);
    assert_eq!(data.txn_op_index(), 0);
    assert!(!data.from_invalidate());
    assert_eq!(
        data.uuid(),
        Some(Uuid::parse_str("a5093abb-38fe-4b9e-a67f-01bb1a96d812").unwrap())
    );
    assert_eq!(data.event_identifier(), Some(&doc! {"_id": "___x"}));
    assert_eq!(data.encode().data_hex(), hex);
}

#[test]
fn lowercase_hex_is_accepted_and_reissued_uppercase() {
    let hex = "826553f100000000012b0429296e1404";
    let data = ResumeTokenData::from_document(&doc! {"_data": hex}).unwrap();
    assert_eq!(data, ResumeTokenData::high_water_mark(TS, TokenVersion::V2));
    assert_eq!(data.encode().data_hex(), hex.to_uppercase());
}

#[test]
fn document_form_omits_type_bits_when_all_zero() {
    let d: Document = ResumeTokenData::high_water_mark(TS, TokenVersion::V2).to_document();
    assert_eq!(d.keys().collect::<Vec<_>>(), ["_data"]);
}

#[test]
fn unknown_wire_fields_are_ignored_like_mongodb() {
    let d = doc! {"_data": "826553F100000000012B0429296E1404", "other": 1};
    let data = ResumeTokenData::from_document(&d).unwrap();
    assert_eq!(data, ResumeTokenData::high_water_mark(TS, TokenVersion::V2));
}

#[test]
fn event_from_parts_matches_event_with_a_built_identifier() {
    let key = doc! {"region": "eu", "_id": 42i64};
    for (op, second) in [
        ("insert", Some(("documentKey", key.clone()))),
        ("drop", None),
        ("create", Some(("operationDescription", doc! {}))),
        (
            "create",
            Some(("operationDescription", doc! {"idIndex": {"v": 2}})),
        ),
    ] {
        let built = ResumeTokenData::event(
            TS,
            TokenVersion::V2,
            1,
            Some(uuid()),
            Some(event_identifier(op, second.clone())),
        )
        .unwrap();
        let parts = ResumeTokenData::event_from_parts(
            TS,
            TokenVersion::V2,
            1,
            Some(uuid()),
            op,
            second.as_ref().map(|(n, d)| (*n, d)),
        )
        .unwrap();
        assert_eq!(parts.encode(), built.encode());
        assert_eq!(parts.encode().type_bits(), built.encode().type_bits());
        assert_eq!(parts, built);
        assert_eq!(parts.event_identifier(), built.event_identifier());
    }
    let v1 = ResumeTokenData::event_from_parts(
        TS,
        TokenVersion::V1,
        0,
        Some(uuid()),
        "insert",
        Some(("documentKey", &key)),
    )
    .unwrap();
    assert_eq!(v1.event_identifier(), Some(&key));
}
