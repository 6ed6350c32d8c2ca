use bson::{Bson, doc};

use super::*;
use crate::changestream::spec::{RequestContext, StartPoint, parse_pipeline};
use crate::changestream::test_util::*;

fn stages(user: Vec<bson::Document>) -> Vec<UserStage> {
    let mut p = vec![Bson::Document(doc! {"$changeStream": {}})];
    p.extend(user.into_iter().map(Bson::Document));
    let ctx = RequestContext {
        db: "db",
        coll: Some("c"),
        through_router: true,
        standalone: false,
    };
    parse_pipeline(&p, &ctx).unwrap().user_stages
}

fn ins(secs: u32, id: i32) -> ChangeEvent {
    event(
        insert_token(secs, 0, id),
        doc! {"operationType": "insert", "fullDocument": {"_id": id, "a": id}},
    )
}

#[test]
fn user_stages_filter_and_reshape_one_event_at_a_time() {
    let p = UserPipeline::new(stages(vec![
        doc! {"$match": {"fullDocument.a": {"$gt": 1}}},
        doc! {"$project": {"fullDocument": 0}},
        doc! {"$addFields": {"seen": true}},
    ]));
    assert!(p.apply_event(ins(5, 1)).unwrap().is_none());
    let out = p.apply_event(ins(5, 2)).unwrap().unwrap();
    assert_eq!(
        out.token,
        ins(5, 2).token,
        "the sort key survives the stages"
    );
    assert_eq!(
        out.doc,
        doc! {"_id": out.token.to_document(), "operationType": "insert", "seen": true}
    );
}

#[test]
fn id_check_table() {
    let cases: Vec<(&str, Vec<bson::Document>, bool)> = vec![
        ("no stages", vec![], true),
        (
            "projection keeping _id",
            vec![doc! {"$project": {"operationType": 1}}],
            true,
        ),
        ("_id removed", vec![doc! {"$project": {"_id": 0}}], false),
        ("_id replaced", vec![doc! {"$set": {"_id": "x"}}], false),
        (
            "_id altered inside",
            vec![doc! {"$set": {"_id.extra": 1}}],
            false,
        ),
        (
            "_data changed",
            vec![doc! {"$set": {"_id._data": "00"}}],
            false,
        ),
        (
            "root replaced",
            vec![doc! {"$replaceRoot": {"newRoot": "$fullDocument"}}],
            false,
        ),
    ];
    for (name, user, ok) in cases {
        let mut r = RouterStream::new(&coll_spec("db", "c"), stages(user));
        let got = r.process(ins(5, 2));
        match got {
            Ok(Some(_)) => assert!(ok, "{name}: expected 280"),
            Ok(None) => panic!("{name}: event dropped"),
            Err(e) => {
                assert!(!ok, "{name}: unexpected {e}");
                assert_eq!(e.code, 280, "{name}");
                assert!(e.has_label("NonResumableChangeStreamError"), "{name}");
            }
        }
    }
}

#[test]
fn id_check_accepts_type_bits() {
    // A token with type bits (an int64 document key) keeps its `_typeBits`.
    let data = resume::token::ResumeTokenData::event(
        ct(5, 1),
        resume::token::TokenVersion::V2,
        0,
        Some(buuid(1)),
        Some(doc! {"operationType": "insert", "documentKey": {"_id": 1_i64}}),
    )
    .unwrap();
    let e = event(data, doc! {"operationType": "insert"});
    assert!(e.token.type_bits().is_some());
    assert!(check_id(&e).is_ok());
    let mut stripped = e.clone();
    stripped
        .doc
        .insert("_id", doc! {"_data": e.token.data_hex()});
    assert_eq!(check_id(&stripped).unwrap_err().code, 280);
}

#[test]
fn id_check_wants_the_exact_uppercase_hex() {
    let e = ins(5, 2);
    let mut lower = e.clone();
    lower
        .doc
        .insert("_id", doc! {"_data": e.token.data_hex().to_lowercase()});
    assert_eq!(check_id(&lower).unwrap_err().code, 280);
    let mut extra = e.clone();
    extra
        .doc
        .insert("_id", doc! {"_data": e.token.data_hex(), "x": 1});
    assert_eq!(check_id(&extra).unwrap_err().code, 280);
    assert!(check_id(&e).is_ok());
}

#[test]
fn router_stream_runs_the_resume_proof_before_the_id_check() {
    let mut s = coll_spec("db", "c");
    s.start = StartPoint::ResumeAfter(insert_token(5, 0, 2));
    let mut r = RouterStream::new(&s, vec![]);
    assert!(!r.resume_point_passed());
    assert!(r.process(ins(5, 2)).unwrap().is_none());
    assert!(r.process(ins(6, 3)).unwrap().is_some());
    assert!(r.resume_point_passed());
}
