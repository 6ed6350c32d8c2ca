use bson::{Bson, Document, doc};
use resume::token::ResumeTokenData;

use super::*;
use crate::changestream::merge::Merger;
use crate::changestream::post_merge::RouterStream;
use crate::changestream::spec::{RequestContext, StartPoint, parse_pipeline};
use crate::changestream::test_util::*;

fn no_chain(_: OpTime) -> Option<Document> {
    None
}

fn run(stream: &mut ShardStream, oplog: &[Document]) -> Vec<ChangeEvent> {
    oplog
        .iter()
        .flat_map(|e| stream.process_entry(e, &mut no_chain).unwrap())
        .collect()
}

fn types(events: &[ChangeEvent]) -> Vec<&str> {
    events.iter().map(|e| e.operation_type()).collect()
}

fn oplog() -> Vec<Document> {
    let mut txn = cmd(
        "admin",
        7,
        doc! {"applyOps": [
            {"op": "i", "ns": "db.c", "ui": uuid(1), "o": {"_id": 10}, "o2": {"_id": 10}},
            {"op": "d", "ns": "db.other", "ui": uuid(2), "o": {"_id": 11}},
            {"op": "u", "ns": "db.c", "ui": uuid(1), "o": {"$v": 2, "diff": {"u": {"a": 1}}}, "o2": {"_id": 10}},
        ]},
    );
    txn.remove("ui");
    txn.insert("lsid", doc! {"id": uuid(9)});
    txn.insert("txnNumber", 1_i64);
    vec![
        cmd("db", 3, doc! {"create": "c"}),
        insert("db.c", 4, doc! {"_id": 1}),
        insert("db.other", 5, doc! {"_id": 2}),
        update("db.c", 6, 1, doc! {"u": {"a": 2}}),
        txn,
        delete("db.c", 8, 1),
        cmd("db", 9, doc! {"drop": "c"}),
        insert("db.c", 10, doc! {"_id": 3}),
    ]
}

#[test]
fn collection_stream_end_to_end() {
    let mut s = ShardStream::new(coll_spec("db", "c"), vec![]);
    let events = run(&mut s, &oplog());
    assert_eq!(
        types(&events),
        [
            "insert",
            "update",
            "insert",
            "update",
            "delete",
            "drop",
            "invalidate"
        ],
        "create is hidden without showExpandedEvents; nothing after the invalidate"
    );
    let tokens: Vec<_> = events.iter().map(|e| e.token.clone()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens strictly increase"
    );
    // The transaction's ops share clusterTime 7 and count the filtered op in txnOpIndex.
    let txn: Vec<u32> = events
        .iter()
        .filter(|e| e.data.cluster_time() == ct(7, 1))
        .map(|e| e.data.txn_op_index())
        .collect();
    assert_eq!(txn, [0, 2]);
    assert_eq!(s.invalidated(), events.last().map(|e| &e.token));
}

#[test]
fn database_and_expanded_streams() {
    let mut s = ShardStream::new(expanded(db_spec("db")), vec![]);
    let events = run(&mut s, &oplog());
    assert_eq!(
        types(&events),
        [
            "create", "insert", "insert", "update", "insert", "delete", "update", "delete", "drop",
            "insert"
        ],
    );
    assert!(s.invalidated().is_none());
}

#[test]
fn resuming_skips_to_the_token_and_the_router_swallows_it() {
    let full = run(
        &mut ShardStream::new(coll_spec("db", "c"), vec![]),
        &oplog(),
    );
    let resume_at = full.get(2).unwrap().data.clone(); // the first op of the transaction
    let mut spec = coll_spec("db", "c");
    spec.start = StartPoint::ResumeAfter(resume_at.clone());
    let mut shard = ShardStream::new(spec.clone(), vec![]);
    let events = run(&mut shard, &oplog());
    assert_eq!(
        types(&events),
        ["insert", "update", "delete", "drop", "invalidate"]
    );
    assert_eq!(
        events.first().unwrap().data,
        resume_at,
        "the shard passes the token on"
    );
    let mut router = RouterStream::new(&spec, vec![]);
    let out: Vec<Document> = events
        .into_iter()
        .filter_map(|e| router.process(e).unwrap())
        .collect();
    let out_types: Vec<&str> = out
        .iter()
        .map(|d| d.get_str("operationType").unwrap())
        .collect();
    assert_eq!(out_types, ["update", "delete", "drop", "invalidate"]);
}

#[test]
fn resuming_from_an_expanded_event_token_without_the_flag_still_finds_it() {
    let full = run(
        &mut ShardStream::new(expanded(coll_spec("db", "c")), vec![]),
        &oplog(),
    );
    let create = full.first().unwrap();
    assert_eq!(create.operation_type(), "create");
    let mut spec = coll_spec("db", "c");
    spec.start = StartPoint::ResumeAfter(create.data.clone());
    let events = run(&mut ShardStream::new(spec.clone(), vec![]), &oplog());
    assert_eq!(events.first().unwrap().operation_type(), "create");
    let mut router = RouterStream::new(&spec, vec![]);
    let first = events
        .into_iter()
        .find_map(|e| router.process(e).unwrap())
        .unwrap();
    assert_eq!(first.get_str("operationType").unwrap(), "insert");
}

#[test]
fn start_after_the_invalidate_continues_past_the_drop() {
    let full = run(
        &mut ShardStream::new(coll_spec("db", "c"), vec![]),
        &oplog(),
    );
    let inv = full.last().unwrap();
    assert_eq!(inv.operation_type(), "invalidate");
    let mut spec = coll_spec("db", "c");
    spec.start = StartPoint::StartAfter(inv.data.clone());
    let mut shard = ShardStream::new(spec.clone(), vec![]);
    let entries = oplog();
    let from_drop = entries.get(6..).unwrap();
    let events = run(&mut shard, from_drop);
    assert_eq!(types(&events), ["invalidate", "insert"]);
    assert!(shard.invalidated().is_none());
    let mut router = RouterStream::new(&spec, vec![]);
    let out: Vec<Document> = events
        .into_iter()
        .filter_map(|e| router.process(e).unwrap())
        .collect();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].get_document("documentKey").unwrap(),
        &doc! {"_id": 3}
    );
}

#[test]
fn start_after_an_invalidate_works_under_a_filter_that_hides_invalidates() {
    let full = run(
        &mut ShardStream::new(coll_spec("db", "c"), vec![]),
        &oplog(),
    );
    let inv = full.last().unwrap();
    let ctx = RequestContext {
        db: "db",
        coll: Some("c"),
        through_router: true,
        standalone: false,
    };
    let p = parse_pipeline(
        &[
            Bson::Document(doc! {"$changeStream": {"startAfter": inv.token.to_document()}}),
            Bson::Document(doc! {"$match": {"operationType": "insert"}}),
        ],
        &ctx,
    )
    .unwrap();
    let mut shard = ShardStream::new(p.spec.clone(), p.user_stages);
    let events = run(&mut shard, oplog().get(6..).unwrap());
    assert_eq!(types(&events), ["invalidate", "insert"]);
    let mut router = RouterStream::new(&p.spec, vec![]);
    let out: Vec<Document> = events
        .into_iter()
        .filter_map(|e| router.process(e).unwrap())
        .collect();
    assert_eq!(
        out.len(),
        1,
        "the router found the token and delivered the insert"
    );
}

#[test]
fn post_batch_resume_token_covers_what_was_processed() {
    let entries = oplog();
    let mut spec = coll_spec("db", "c");
    let client = insert_token(4, 0, 1);
    spec.start = StartPoint::ResumeAfter(client.clone());
    let mut s = ShardStream::new(spec.clone(), vec![]);
    let initial = spec.initial_post_batch_resume_token(ct(1, 0));
    // Behind the resume point: the client's token.
    assert_eq!(
        s.post_batch_resume_token(&initial, ct(3, 1)),
        client.encode()
    );
    let mut produced = Vec::new();
    for e in entries.get(..6).unwrap() {
        produced.extend(s.process_entry(e, &mut no_chain).unwrap());
    }
    let pbrt = s.post_batch_resume_token(&initial, ct(8, 1));
    assert!(produced.iter().all(|e| e.token < pbrt));
    assert!(pbrt < insert_token(9, 0, 0).encode());
    // After the invalidate: the invalidate token.
    for e in entries.get(6..).unwrap() {
        produced.extend(s.process_entry(e, &mut no_chain).unwrap());
    }
    assert_eq!(
        s.post_batch_resume_token(&initial, ct(20, 1)),
        produced.last().unwrap().token
    );
}

#[test]
fn user_stages_run_on_the_shard() {
    let ctx = RequestContext {
        db: "db",
        coll: Some("c"),
        through_router: true,
        standalone: false,
    };
    let p = parse_pipeline(
        &[
            Bson::Document(doc! {"$changeStream": {}}),
            Bson::Document(doc! {"$match": {"operationType": {"$in": ["delete", "invalidate"]}}}),
        ],
        &ctx,
    )
    .unwrap();
    let mut s = ShardStream::new(p.spec, p.user_stages);
    assert_eq!(types(&run(&mut s, &oplog())), ["delete", "invalidate"]);
}

#[test]
fn two_shards_merge_into_one_ordered_stream() {
    let spec = db_spec("db");
    let entries = oplog();
    // Shard A holds db.c, shard B db.other (the transaction's ops split accordingly).
    let mut a = ShardStream::new(spec.clone(), vec![]);
    let mut b = ShardStream::new(spec.clone(), vec![]);
    let a_ev: Vec<ChangeEvent> = run(&mut a, &entries)
        .into_iter()
        .filter(|e| {
            e.doc
                .get_document("ns")
                .is_ok_and(|n| n.get_str("coll").ok() != Some("other"))
        })
        .collect();
    let b_ev: Vec<ChangeEvent> = run(&mut b, &entries)
        .into_iter()
        .filter(|e| {
            e.doc
                .get_document("ns")
                .is_ok_and(|n| n.get_str("coll").ok() == Some("other"))
        })
        .collect();
    let hwm = |secs| {
        ResumeTokenData::high_water_mark(ct(secs, 0), resume::token::TokenVersion::V2).encode()
    };
    let mut m = Merger::new(2, None);
    m.push_batch(0, a_ev, hwm(20)).unwrap();
    m.push_batch(1, b_ev, hwm(20)).unwrap();
    let merged: Vec<ChangeEvent> = std::iter::from_fn(|| m.pop_ready()).collect();
    let all = run(&mut ShardStream::new(spec, vec![]), &entries);
    let want: Vec<_> = all.iter().map(|e| e.token.clone()).collect();
    let got: Vec<_> = merged.iter().map(|e| e.token.clone()).collect();
    assert_eq!(
        got, want,
        "the merge of the parts equals the single-shard stream"
    );
}

mod no_panics {
    use bson::{Bson, Document, doc};
    use proptest::prelude::*;

    use super::super::*;
    use crate::changestream::test_util::*;

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
            "[a-z.$]{0,6}".prop_map(Bson::String),
            (0u32..3, 0u32..3).prop_map(|(s, i)| ts(s, i)),
            Just(uuid(1)),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("u".to_string()),
            Just("i".to_string()),
            Just("d".to_string()),
            Just("b".to_string()),
            Just("a".to_string()),
            Just("l".to_string()),
            Just("$v".to_string()),
            Just("diff".to_string()),
            Just("_id".to_string()),
            Just("applyOps".to_string()),
            Just("drop".to_string()),
            Just("renameCollection".to_string()),
            Just("to".to_string()),
            Just("create".to_string()),
            Just("collMod".to_string()),
            Just("dropIndexes".to_string()),
            Just("commitTransaction".to_string()),
            Just("shardCollection".to_string()),
            Just("op".to_string()),
            Just("ns".to_string()),
            Just("o".to_string()),
            Just("o2".to_string()),
            "[su][a-z0-9]{0,2}",
        ]
    }

    fn value() -> impl Strategy<Value = Bson> {
        leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                prop::collection::vec((key(), inner), 0..5)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
            ]
        })
    }

    fn entry() -> impl Strategy<Value = Document> {
        (
            prop_oneof![
                Just("i"),
                Just("u"),
                Just("d"),
                Just("c"),
                Just("n"),
                Just("xi")
            ],
            prop_oneof![
                Just("db.c"),
                Just("db.$cmd"),
                Just("admin.$cmd"),
                Just(""),
                Just("db.system.views"),
                Just("nodot")
            ],
            value(),
            value(),
            prop::option::of(0u32..5),
            any::<bool>(),
        )
            .prop_map(|(op, ns, o, o2, ts_secs, from_migrate)| {
                let mut e =
                    doc! {"op": op, "ns": ns, "ui": uuid(1), "o": o, "o2": o2, "wall": wall(1)};
                if let Some(s) = ts_secs {
                    e.insert("ts", ts(s + 1, 1));
                    e.insert("prevOpTime", doc! {"ts": ts(s, 1), "t": 1_i64});
                }
                if from_migrate {
                    e.insert("fromMigrate", true);
                }
                e
            })
    }

    proptest! {
        /// Arbitrary (malformed) oplog entries produce events or errors, never a panic.
        #[test]
        fn arbitrary_entries_never_panic(entries in prop::collection::vec(entry(), 1..8)) {
            let specs = [
                coll_spec("db", "c"),
                expanded(db_spec("db")),
                expanded(cluster_spec()),
            ];
            for spec in specs {
                let mut s = ShardStream::new(spec, vec![]);
                for e in &entries {
                    let mut lookup = |_: OpTime| entries.first().cloned();
                    let _ = s.process_entry(e, &mut lookup);
                }
            }
        }
    }
}

/// A stream read through the encoded path where it applies, and the general one elsewhere;
/// also how many events came through the encoded path.
fn run_encoded(
    stream: &mut ShardStream,
    oplog: &[Document],
) -> (Vec<(ResumeToken, Document)>, usize) {
    let mut out = Vec::new();
    let mut encoded = 0;
    for e in oplog {
        let raw = bson::RawDocumentBuf::try_from(e).unwrap();
        if let Some(events) = stream.process_encoded(&raw).unwrap() {
            encoded += events.len();
            for ev in events {
                let doc = Document::try_from(bson::RawDocument::from_bytes(&ev.bytes).unwrap());
                out.push((ev.token, doc.unwrap()));
            }
        } else {
            let events = stream.process_entry(e, &mut no_chain).unwrap();
            out.extend(events.into_iter().map(|ev| (ev.token, ev.doc)));
        }
    }
    (out, encoded)
}

#[test]
fn the_encoded_path_yields_what_the_general_path_does() {
    let mut specs = vec![coll_spec("db", "c"), coll_spec("db", "other")];
    let mut expanded = coll_spec("db", "c");
    expanded.options.show_expanded_events = true;
    specs.push(expanded);
    specs.push(db_spec("db"));
    specs.push(cluster_spec());
    for spec in specs {
        let general: Vec<(ResumeToken, Document)> =
            run(&mut ShardStream::new(spec.clone(), vec![]), &oplog())
                .into_iter()
                .map(|e| (e.token, e.doc))
                .collect();
        let (events, encoded) = run_encoded(&mut ShardStream::new(spec.clone(), vec![]), &oplog());
        assert_eq!(events, general, "{spec:?}");
        assert!(encoded > 0, "{spec:?}: some events take the encoded path");
    }
}

#[test]
fn the_encoded_path_steps_aside_for_stages_and_resume_points() {
    let insert = bson::RawDocumentBuf::try_from(&insert("db.c", 4, doc! {"_id": 1})).unwrap();
    let staged = parse_pipeline(
        &[
            Bson::Document(doc! {"$changeStream": {}}),
            Bson::Document(doc! {"$match": {"operationType": "insert"}}),
        ],
        &RequestContext {
            db: "db",
            coll: Some("c"),
            through_router: false,
            standalone: false,
        },
    )
    .unwrap();
    let mut s = ShardStream::from_pipeline(staged);
    assert!(s.process_encoded(&insert).unwrap().is_none(), "user stages");
    let mut spec = coll_spec("db", "c");
    let token = ResumeTokenData::high_water_mark(ClusterTime::new(1, 0), TokenVersion::V2);
    spec.start = StartPoint::ResumeAfter(token);
    let mut s = ShardStream::new(spec, vec![]);
    assert!(
        s.process_encoded(&insert).unwrap().is_none(),
        "before its resume point"
    );
}

#[test]
fn a_reference_to_recorded_commit_metadata_reads_as_the_document() {
    let meta = doc! {"appName": "importer", "comment": "nightly"};
    let mut first = insert("db.c", 4, doc! {"_id": 1});
    first.insert("commitMetadata", meta.clone());
    let mut second = insert("db.c", 5, doc! {"_id": 2});
    second.insert("commitMetadata", ts(4, 1));
    let mut spec = coll_spec("db", "c");
    spec.options.show_commit_metadata = true;
    let app_of = |e: &ChangeEvent| {
        e.doc
            .get_document("commitMetadata")
            .unwrap()
            .get("appName")
            .cloned()
    };
    // Read in order: the reference is the document just read.
    let mut s = ShardStream::new(spec.clone(), vec![]);
    let events = run(&mut s, &[first.clone(), second.clone()]);
    let apps: Vec<_> = events.iter().map(app_of).collect();
    assert_eq!(apps, [Some("importer".into()), Some("importer".into())]);
    // Started past the entry holding it: the lookup reads it.
    let mut s = ShardStream::new(spec.clone(), vec![]);
    let mut lookup = |at: OpTime| (at.ts == ct(4, 1)).then(|| first.clone());
    let events = s.process_entry(&second, &mut lookup).unwrap();
    assert_eq!(app_of(&events[0]), Some("importer".into()));
    // Gone (never, while the reference is kept): the fields read null.
    let mut s = ShardStream::new(spec, vec![]);
    let events = s.process_entry(&second, &mut no_chain).unwrap();
    assert_eq!(app_of(&events[0]), Some(Bson::Null));
}
