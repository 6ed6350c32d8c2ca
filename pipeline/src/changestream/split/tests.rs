use bson::{Binary, Bson, Document, Regex, doc, oid::ObjectId, spec::BinarySubtype};

use super::*;
use crate::changestream::resumability::EnsureResumeTokenPresent;
use crate::changestream::spec::StartPoint;
use crate::changestream::test_util::*;

fn big_event() -> ChangeEvent {
    event(
        insert_token(5, 0, 1),
        doc! {
            "operationType": "insert",
            "fullDocument": {"_id": 1, "blob": "x".repeat(300)},
            "ns": {"db": "db", "coll": "c"},
            "documentKey": {"_id": 1},
            "fullDocumentBeforeChange": {"_id": 1, "blob": "y".repeat(200)},
            "updateDescription": {"updatedFields": {"blob": "w".repeat(210)}},
        },
    )
}

#[test]
fn computed_size_equals_serialized_size() {
    let d = doc! {
        "d": 1.5, "s": "héllo", "o": {"a": [1, "two", {"three": 3_i64}]}, "b": true, "n": null,
        "i": 7, "l": 8_i64, "t": ts(1, 2), "dt": wall(5), "oid": ObjectId::new(),
        "bin": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
        "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![1, 2] },
        "re": Regex { pattern: "a+".to_string().try_into().unwrap(), options: "i".to_string().try_into().unwrap() },
        "dec": Bson::Decimal128(bson::Decimal128::from_bytes([0; 16])),
        "arr": (0..12).map(Bson::Int32).collect::<Vec<_>>(),
        "min": Bson::MinKey, "code": Bson::JavaScriptCode("f()".into()),
    };
    assert_eq!(document_size(&d), d.to_vec().unwrap().len());
}

#[test]
fn small_events_are_not_split() {
    let e = big_event();
    let out = split_event(e.clone()).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].token, e.token);
    assert!(check_size(&e).is_ok());
}

#[test]
fn large_events_split_into_ordered_fragments() {
    let e = big_event();
    let parts = split_event_at(e.clone(), 800).unwrap();
    assert_eq!(parts.len(), 3);
    let n = parts.len() as i32;
    let mut seen: Vec<String> = Vec::new();
    for (k, p) in parts.iter().enumerate() {
        assert_eq!(p.data.fragment_num(), Some(k as u32));
        assert_eq!(p.doc.get_document("_id").unwrap(), &p.token.to_document());
        assert_eq!(
            p.doc.get_document("splitEvent").unwrap(),
            &doc! {"fragment": k as i32 + 1, "of": n}
        );
        assert!(document_size(&p.doc) <= 800, "fragment {k} fits");
        seen.extend(
            p.doc
                .keys()
                .filter(|k| *k != "_id" && *k != "splitEvent")
                .cloned(),
        );
    }
    // Every field exactly once, smallest first.
    let mut want: Vec<String> = e.doc.keys().filter(|k| *k != "_id").cloned().collect();
    want.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(seen.first().map(String::as_str), Some("operationType"));
    // Fragment tokens sort after the event and in fragment order.
    assert!(parts.windows(2).all(|w| w[0].token < w[1].token));
    assert!(parts[0].token > e.token);
    assert!(parts.last().unwrap().token < insert_token(5, 1, 0).encode());
}

#[test]
fn a_field_too_large_for_any_fragment_fails_with_7182500() {
    assert_eq!(split_event_at(big_event(), 250).unwrap_err().code, 7182500);
}

#[test]
fn events_over_16mib_fail_without_the_split_stage() {
    let e = event(
        insert_token(5, 0, 1),
        doc! {"operationType": "insert", "fullDocument": {"s": "z".repeat(BSON_OBJ_MAX_USER_SIZE)}},
    );
    let err = check_size(&e).unwrap_err();
    assert_eq!(err.code, 10334);
    assert_eq!(err.code_name, "BSONObjectTooLarge");
    // Over the user limit but within the split threshold: one event, unsplit.
    assert_eq!(split_event(e).unwrap().len(), 1);
    let half = "h".repeat(9 * 1024 * 1024);
    let e = event(
        insert_token(5, 0, 1),
        doc! {"operationType": "update", "fullDocument": {"s": &half}, "fullDocumentBeforeChange": {"s": &half}},
    );
    let parts = split_event(e).unwrap();
    assert_eq!(parts.len(), 2);
    assert!(
        parts
            .iter()
            .all(|p| document_size(&p.doc) <= SPLIT_THRESHOLD)
    );
}

#[test]
fn resuming_from_a_fragment_skips_the_earlier_ones() {
    let parts = split_event_at(big_event(), 800).unwrap();
    let client = parts[1].data.clone();
    let mut ensure = EnsureResumeTokenPresent::new(&StartPoint::ResumeAfter(client));
    let out: Vec<Document> = parts
        .iter()
        .filter_map(|p| ensure.process(p.clone()).unwrap())
        .map(|p| p.doc)
        .collect();
    assert_eq!(out.len(), parts.len() - 2);
    // An event that no longer splits: the resume point cannot be found.
    let mut ensure = EnsureResumeTokenPresent::new(&StartPoint::ResumeAfter(parts[1].data.clone()));
    assert_eq!(ensure.process(big_event()).unwrap_err().code, 280);
}
