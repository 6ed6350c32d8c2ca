use bson::{Bson, Document, doc};
use resume::token::{ResumeTokenData, TokenVersion};

use super::*;
use crate::changestream::test_util::{ct, insert_token, ts};

fn ctx<'a>(db: &'a str, coll: Option<&'a str>) -> RequestContext<'a> {
    RequestContext {
        db,
        coll,
        through_router: true,
        standalone: false,
    }
}

fn cs(arg: Bson) -> Vec<Bson> {
    vec![Bson::Document(doc! {"$changeStream": arg})]
}

fn code(r: Result<ChangeStreamPipeline>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.code,
    }
}

fn token_doc(t: &ResumeTokenData) -> Bson {
    Bson::Document(t.to_document())
}

#[test]
fn every_stage_argument_error_has_mongodbs_code() {
    let tok = token_doc(&insert_token(10, 0, 1));
    let inv = token_doc(&insert_token(10, 0, 1).with_from_invalidate(true));
    let cases: Vec<(&str, Bson, &str, Option<&str>, i32)> = vec![
        ("not an object", Bson::Int32(1), "db", Some("c"), 50808),
        ("array", Bson::Array(vec![]), "db", Some("c"), 50808),
        (
            "unknown field",
            Bson::Document(doc! {"foo": 1}),
            "db",
            Some("c"),
            40415,
        ),
        (
            "fullDocument wrong type",
            Bson::Document(doc! {"fullDocument": 1}),
            "db",
            Some("c"),
            14,
        ),
        (
            "fullDocument bad value",
            Bson::Document(doc! {"fullDocument": "x"}),
            "db",
            Some("c"),
            2,
        ),
        (
            "fdbc bad value",
            Bson::Document(doc! {"fullDocumentBeforeChange": "default"}),
            "db",
            Some("c"),
            2,
        ),
        (
            "bool wrong type",
            Bson::Document(doc! {"showExpandedEvents": 1}),
            "db",
            Some("c"),
            14,
        ),
        (
            "startAt wrong type",
            Bson::Document(doc! {"startAtOperationTime": 5}),
            "db",
            Some("c"),
            14,
        ),
        (
            "resumeAfter wrong type",
            Bson::Document(doc! {"resumeAfter": "x"}),
            "db",
            Some("c"),
            14,
        ),
        (
            "resumeAfter without _data",
            Bson::Document(doc! {"resumeAfter": {}}),
            "db",
            Some("c"),
            40647,
        ),
        (
            "allChanges on a collection",
            Bson::Document(doc! {"allChangesForCluster": true}),
            "admin",
            Some("c"),
            72,
        ),
        (
            "allChanges on a db",
            Bson::Document(doc! {"allChangesForCluster": true}),
            "db",
            None,
            72,
        ),
        ("local", Bson::Document(doc! {}), "local", Some("c"), 73),
        ("config", Bson::Document(doc! {}), "config", Some("c"), 73),
        (
            "admin without allChanges",
            Bson::Document(doc! {}),
            "admin",
            None,
            73,
        ),
        (
            "admin collection",
            Bson::Document(doc! {}),
            "admin",
            Some("c"),
            73,
        ),
        (
            "system collection",
            Bson::Document(doc! {}),
            "db",
            Some("system.js"),
            73,
        ),
        (
            "system collection allowed only off-router",
            Bson::Document(doc! {"allowToRunOnSystemNS": true}),
            "db",
            Some("system.js"),
            73,
        ),
        (
            "migration events via router",
            Bson::Document(doc! {"showMigrationEvents": true}),
            "db",
            Some("c"),
            31123,
        ),
        (
            "resumeAfter and startAfter",
            Bson::Document(doc! {"resumeAfter": tok.clone(), "startAfter": tok.clone()}),
            "db",
            Some("c"),
            50865,
        ),
        (
            "token and startAt",
            Bson::Document(doc! {"resumeAfter": tok.clone(), "startAtOperationTime": ts(1, 1)}),
            "db",
            Some("c"),
            40674,
        ),
        (
            "startAfter and startAt",
            Bson::Document(doc! {"startAfter": tok.clone(), "startAtOperationTime": ts(1, 1)}),
            "db",
            Some("c"),
            40674,
        ),
        (
            "resumeAfter an invalidate",
            Bson::Document(doc! {"resumeAfter": inv.clone()}),
            "db",
            Some("c"),
            260,
        ),
        (
            "startAfter an invalidate",
            Bson::Document(doc! {"startAfter": inv}),
            "db",
            Some("c"),
            0,
        ),
        (
            "config with allowToRunOnConfigDB",
            Bson::Document(doc! {"allowToRunOnConfigDB": true}),
            "config",
            Some("shards"),
            0,
        ),
        (
            "plain collection",
            Bson::Document(doc! {}),
            "db",
            Some("c"),
            0,
        ),
    ];
    for (name, arg, db, coll, want) in cases {
        assert_eq!(
            code(parse_pipeline(&cs(arg), &ctx(db, coll))),
            want,
            "{name}"
        );
    }
}

#[test]
fn validation_runs_in_mongodb_order() {
    // allChangesForCluster on a collection of `local`: 72 comes before 73.
    let r = parse_pipeline(
        &cs(Bson::Document(doc! {"allChangesForCluster": true})),
        &ctx("local", Some("c")),
    );
    assert_eq!(code(r), 72);
    // Type errors come before namespace errors.
    let r = parse_pipeline(
        &cs(Bson::Document(doc! {"fullDocument": 1})),
        &ctx("local", Some("c")),
    );
    assert_eq!(code(r), 14);
    // Standalone (40573) comes before 72.
    let mut c = ctx("db", Some("c"));
    c.standalone = true;
    let r = parse_pipeline(&cs(Bson::Document(doc! {"allChangesForCluster": true})), &c);
    assert_eq!(code(r), 40573);
    // Off the router, showMigrationEvents and allowToRunOnSystemNS are allowed.
    let mut c = ctx("db", Some("system.js"));
    c.through_router = false;
    let r = parse_pipeline(
        &cs(Bson::Document(
            doc! {"allowToRunOnSystemNS": true, "showMigrationEvents": true},
        )),
        &c,
    );
    assert_eq!(code(r), 0);
}

#[test]
fn collection_stream_resumed_from_a_token_without_uuid_is_260() {
    let t = ResumeTokenData::event(
        ct(5, 1),
        TokenVersion::V2,
        0,
        None,
        Some(doc! {"operationType": "dropDatabase"}),
    )
    .unwrap();
    let r = parse_pipeline(
        &cs(Bson::Document(doc! {"resumeAfter": token_doc(&t)})),
        &ctx("db", Some("c")),
    );
    assert_eq!(code(r), 260);
    // Database streams accept it, and high-water marks never need a uuid.
    let r = parse_pipeline(
        &cs(Bson::Document(doc! {"resumeAfter": token_doc(&t)})),
        &ctx("db", None),
    );
    assert_eq!(code(r), 0);
    let hwm = ResumeTokenData::high_water_mark(ct(5, 1), TokenVersion::V2);
    let r = parse_pipeline(
        &cs(Bson::Document(doc! {"resumeAfter": token_doc(&hwm)})),
        &ctx("db", Some("c")),
    );
    assert_eq!(code(r), 0);
}

#[test]
fn stream_level_follows_the_namespace() {
    let p = parse_pipeline(&cs(Bson::Document(doc! {})), &ctx("db", Some("c"))).unwrap();
    assert_eq!(
        (p.spec.level, p.spec.coll.as_deref()),
        (StreamLevel::Collection, Some("c"))
    );
    let p = parse_pipeline(&cs(Bson::Document(doc! {})), &ctx("db", None)).unwrap();
    assert_eq!(p.spec.level, StreamLevel::Database);
    let p = parse_pipeline(
        &cs(Bson::Document(doc! {"allChangesForCluster": true})),
        &ctx("admin", None),
    )
    .unwrap();
    assert_eq!(p.spec.level, StreamLevel::Cluster);
    let p = parse_pipeline(
        &cs(Bson::Document(doc! {"allChangesForCluster": false})),
        &ctx("db", None),
    )
    .unwrap();
    assert_eq!(p.spec.level, StreamLevel::Database);
}

#[test]
fn options_and_start_points_are_parsed() {
    let tok = insert_token(10, 2, 7);
    let arg = doc! {
        "fullDocument": "updateLookup",
        "fullDocumentBeforeChange": "whenAvailable",
        "showExpandedEvents": true,
        "showRawUpdateDescription": true,
        "matchCollectionUUIDForUpdateLookup": true,
        "startAfter": tok.to_document(),
    };
    let p = parse_pipeline(&cs(Bson::Document(arg)), &ctx("db", Some("c"))).unwrap();
    let o = &p.spec.options;
    assert_eq!(o.full_document, FullDocument::UpdateLookup);
    assert_eq!(
        o.full_document_before_change,
        FullDocumentBeforeChange::WhenAvailable
    );
    assert!(o.show_expanded_events && o.show_raw_update_description);
    assert!(o.match_collection_uuid_for_update_lookup);
    assert_eq!(p.spec.start, StartPoint::StartAfter(tok.clone()));
    assert_eq!(p.spec.scan_start(ct(99, 0)), ct(10, 1));
    assert_eq!(
        p.spec.initial_post_batch_resume_token(ct(99, 0)),
        tok.encode()
    );

    let p = parse_pipeline(
        &cs(Bson::Document(doc! {"startAtOperationTime": ts(3, 4)})),
        &ctx("db", None),
    )
    .unwrap();
    assert_eq!(p.spec.start, StartPoint::StartAtOperationTime(ct(3, 4)));
    let hwm = ResumeTokenData::high_water_mark(ct(3, 4), TokenVersion::V2).encode();
    assert_eq!(p.spec.initial_post_batch_resume_token(ct(99, 0)), hwm);

    let p = parse_pipeline(&cs(Bson::Document(doc! {})), &ctx("db", None)).unwrap();
    assert_eq!(p.spec.start, StartPoint::None);
    assert_eq!(p.spec.scan_start(ct(99, 0)), ct(99, 0));
}

fn pipeline(stages: Vec<Document>) -> Vec<Bson> {
    stages.into_iter().map(Bson::Document).collect()
}

#[test]
fn every_pipeline_error_has_mongodbs_code() {
    let cs = doc! {"$changeStream": {}};
    let cases: Vec<(&str, Vec<Document>, i32)> = vec![
        ("not first", vec![doc! {"$match": {}}, cs.clone()], 40602),
        ("twice", vec![cs.clone(), cs.clone()], 40602),
        (
            "unknown stage",
            vec![cs.clone(), doc! {"$unsupported": "foo"}],
            40324,
        ),
        (
            "unknown stage before a bad spec",
            vec![doc! {"$changeStream": 1}, doc! {"$nope": 1}],
            40324,
        ),
        (
            "two fields",
            vec![cs.clone(), doc! {"$match": {}, "$project": {}}],
            40323,
        ),
        (
            "group",
            vec![cs.clone(), doc! {"$group": {"_id": null}}],
            20,
        ),
        ("sort", vec![cs.clone(), doc! {"$sort": {"a": 1}}], 20),
        ("limit", vec![cs.clone(), doc! {"$limit": 1}], 20),
        (
            "split not empty",
            vec![cs.clone(), doc! {"$changeStreamSplitLargeEvent": {"a": 1}}],
            7182800,
        ),
        (
            "split not last",
            vec![
                cs.clone(),
                doc! {"$changeStreamSplitLargeEvent": {}},
                doc! {"$match": {}},
            ],
            7182802,
        ),
        (
            "split twice",
            vec![
                cs.clone(),
                doc! {"$changeStreamSplitLargeEvent": {}},
                doc! {"$changeStreamSplitLargeEvent": {}},
            ],
            7182802,
        ),
        (
            "bad match",
            vec![cs.clone(), doc! {"$match": {"a": {"$bogus": 1}}}],
            2,
        ),
        (
            "allowed stages",
            vec![
                cs.clone(),
                doc! {"$match": {"operationType": "insert"}},
                doc! {"$project": {"fullDocument": 1}},
                doc! {"$addFields": {"x": 1}},
                doc! {"$set": {"y": 1}},
                doc! {"$unset": "y"},
                doc! {"$replaceWith": "$$ROOT"},
                doc! {"$redact": "$$KEEP"},
                doc! {"$changeStreamSplitLargeEvent": {}},
            ],
            0,
        ),
    ];
    for (name, stages, want) in cases {
        assert_eq!(
            code(parse_pipeline(&pipeline(stages), &ctx("db", Some("c")))),
            want,
            "{name}"
        );
    }
}

#[test]
fn disallowed_stage_message_names_the_stage() {
    let e = parse_pipeline(
        &pipeline(vec![
            doc! {"$changeStream": {}},
            doc! {"$group": {"_id": null}},
        ]),
        &ctx("db", Some("c")),
    )
    .unwrap_err();
    assert_eq!(e.code_name, "IllegalOperation");
    assert_eq!(
        e.errmsg,
        "$group is not permitted in a $changeStream pipeline"
    );
}

#[test]
fn user_stages_and_split_flag_are_kept() {
    let p = parse_pipeline(
        &pipeline(vec![
            doc! {"$changeStream": {}},
            doc! {"$match": {"operationType": "insert"}},
            doc! {"$project": {"fullDocument": 1}},
            doc! {"$changeStreamSplitLargeEvent": {}},
        ]),
        &ctx("db", Some("c")),
    )
    .unwrap();
    assert_eq!(p.user_stages.len(), 2);
    assert!(matches!(p.user_stages.first(), Some(UserStage::Match(_))));
    assert!(matches!(
        p.user_stages.get(1),
        Some(UserStage::Transform(_))
    ));
    assert!(p.split_large_event);
    assert!(is_change_stream(&pipeline(vec![
        doc! {"$match": {}},
        doc! {"$changeStream": {}}
    ])));
    assert!(!is_change_stream(&pipeline(vec![doc! {"$match": {}}])));
}

#[test]
fn only_majority_read_concern_is_accepted() {
    let cmd = |rc: Option<Document>| {
        let mut c = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}};
        if let Some(rc) = rc {
            c.insert("readConcern", rc);
        }
        c
    };
    for ok in [None, Some(doc! {}), Some(doc! {"level": "majority"})] {
        assert!(
            parse_command("db", &cmd(ok.clone()), true).is_ok(),
            "{ok:?}"
        );
    }
    for level in ["local", "available", "snapshot", "linearizable"] {
        let e = parse_command("db", &cmd(Some(doc! {"level": level})), true).unwrap_err();
        assert_eq!(e.code, 72, "{level}");
    }
}
