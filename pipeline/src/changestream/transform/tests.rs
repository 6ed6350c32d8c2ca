use bson::{Document, doc};
use resume::token::{ResumeTokenData, TokenVersion, event_identifier};

use super::*;
use crate::changestream::spec::StartPoint;
use crate::changestream::test_util::*;

fn token(secs: u32, txn: u32, ui: Option<u8>, id: Document) -> Document {
    ResumeTokenData::event(ct(secs, 1), TokenVersion::V2, txn, ui.map(buuid), Some(id))
        .unwrap()
        .to_document()
}

fn run(spec: &ChangeStreamSpec, entry: &Document) -> Option<Document> {
    Transformer::new(spec).transform(entry).unwrap().map(|e| {
        assert_eq!(e.doc.get_document("_id").unwrap(), &e.token.to_document());
        assert_eq!(e.token, e.data.encode());
        e.doc
    })
}

fn ns(db: &str, coll: &str) -> Document {
    doc! {"db": db, "coll": coll}
}

#[test]
fn classic_events_have_mongodbs_layout() {
    let s = coll_spec("db", "c");
    let cases: Vec<(&str, Document, Document)> = vec![
        (
            "insert",
            insert("db.c", 5, doc! {"_id": 1, "a": 2}),
            doc! {
                "_id": token(5, 0, Some(1), event_identifier("insert", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "insert", "clusterTime": ts(5, 1), "wallTime": wall(5000),
                "fullDocument": {"_id": 1, "a": 2}, "ns": ns("db", "c"), "documentKey": {"_id": 1},
            },
        ),
        (
            "update",
            update("db.c", 6, 1, doc! {"u": {"a": 3}, "d": {"b": false}}),
            doc! {
                "_id": token(6, 0, Some(1), event_identifier("update", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "update", "clusterTime": ts(6, 1), "wallTime": wall(6000),
                "ns": ns("db", "c"), "documentKey": {"_id": 1},
                "updateDescription": {"updatedFields": {"a": 3}, "removedFields": ["b"], "truncatedArrays": []},
            },
        ),
        (
            "replace",
            doc! {"ts": ts(7, 1), "t": 1_i64, "op": "u", "ns": "db.c", "ui": uuid(1), "o": {"_id": 1, "z": 1}, "o2": {"_id": 1}, "wall": wall(7000)},
            doc! {
                "_id": token(7, 0, Some(1), event_identifier("replace", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "replace", "clusterTime": ts(7, 1), "wallTime": wall(7000),
                "fullDocument": {"_id": 1, "z": 1}, "ns": ns("db", "c"), "documentKey": {"_id": 1},
            },
        ),
        (
            "delete",
            delete("db.c", 8, 1),
            doc! {
                "_id": token(8, 0, Some(1), event_identifier("delete", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "delete", "clusterTime": ts(8, 1), "wallTime": wall(8000),
                "ns": ns("db", "c"), "documentKey": {"_id": 1},
            },
        ),
        (
            "drop",
            cmd("db", 9, doc! {"drop": "c"}),
            doc! {
                "_id": token(9, 0, Some(1), doc! {"operationType": "drop"}),
                "operationType": "drop", "clusterTime": ts(9, 1), "wallTime": wall(9000),
                "ns": ns("db", "c"),
            },
        ),
        (
            "rename",
            cmd(
                "db",
                10,
                doc! {"renameCollection": "db.c", "to": "db.d", "stayTemp": false},
            ),
            doc! {
                "to": ns("db", "d"),
                "_id": token(10, 0, Some(1), doc! {"operationType": "rename", "operationDescription": {"to": ns("db", "d")}}),
                "operationType": "rename", "clusterTime": ts(10, 1), "wallTime": wall(10000),
                "ns": ns("db", "c"),
            },
        ),
        (
            "dropDatabase",
            {
                let mut e = cmd("db", 11, doc! {"dropDatabase": 1});
                e.remove("ui");
                e
            },
            doc! {
                "_id": token(11, 0, None, doc! {"operationType": "dropDatabase"}),
                "operationType": "dropDatabase", "clusterTime": ts(11, 1), "wallTime": wall(11000),
                "ns": {"db": "db"},
            },
        ),
    ];
    for (name, entry, want) in cases {
        assert_eq!(run(&s, &entry).as_ref(), Some(&want), "{name}");
    }
}

#[test]
fn expanded_events_have_mongodbs_layout() {
    let s = expanded(db_spec("db"));
    let cases: Vec<(&str, Document, Document)> = vec![
        (
            "insert gets collectionUUID",
            insert("db.c", 5, doc! {"_id": 1}),
            doc! {
                "_id": token(5, 0, Some(1), event_identifier("insert", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "insert", "clusterTime": ts(5, 1), "collectionUUID": uuid(1),
                "wallTime": wall(5000), "fullDocument": {"_id": 1}, "ns": ns("db", "c"),
                "documentKey": {"_id": 1},
            },
        ),
        (
            "update gets disambiguatedPaths",
            update("db.c", 6, 1, doc! {"u": {"a.b": 3}}),
            doc! {
                "_id": token(6, 0, Some(1), event_identifier("update", Some(("documentKey", doc! {"_id": 1})))),
                "operationType": "update", "clusterTime": ts(6, 1), "collectionUUID": uuid(1),
                "wallTime": wall(6000), "ns": ns("db", "c"), "documentKey": {"_id": 1},
                "updateDescription": {"updatedFields": {"a.b": 3}, "removedFields": [], "truncatedArrays": [],
                                      "disambiguatedPaths": {"a.b": ["a.b"]}},
            },
        ),
        (
            "create",
            cmd(
                "db",
                7,
                doc! {"create": "c", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            ),
            doc! {
                "_id": token(7, 0, Some(1), doc! {"operationType": "create", "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}}),
                "operationType": "create", "clusterTime": ts(7, 1), "collectionUUID": uuid(1),
                "wallTime": wall(7000), "ns": ns("db", "c"),
                "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
                "nsType": "collection",
            },
        ),
        (
            "create view",
            cmd("db", 7, doc! {"create": "v", "viewOn": "c", "pipeline": []}),
            doc! {
                "_id": token(7, 0, Some(1), doc! {"operationType": "create", "operationDescription": {"viewOn": "c", "pipeline": []}}),
                "operationType": "create", "clusterTime": ts(7, 1), "collectionUUID": uuid(1),
                "wallTime": wall(7000), "ns": ns("db", "v"),
                "operationDescription": {"viewOn": "c", "pipeline": []},
                "nsType": "view",
            },
        ),
        (
            "createIndexes",
            cmd(
                "db",
                8,
                doc! {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"},
            ),
            doc! {
                "_id": token(8, 0, Some(1), doc! {"operationType": "createIndexes", "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}}),
                "operationType": "createIndexes", "clusterTime": ts(8, 1), "collectionUUID": uuid(1),
                "wallTime": wall(8000), "ns": ns("db", "c"),
                "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]},
            },
        ),
        (
            "commitIndexBuild",
            cmd(
                "db",
                8,
                doc! {"commitIndexBuild": "c", "indexBuildUUID": uuid(3), "indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]},
            ),
            doc! {
                "_id": token(8, 0, Some(1), doc! {"operationType": "createIndexes", "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}}),
                "operationType": "createIndexes", "clusterTime": ts(8, 1), "collectionUUID": uuid(1),
                "wallTime": wall(8000), "ns": ns("db", "c"),
                "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]},
            },
        ),
        (
            "dropIndexes",
            {
                let mut e = cmd("db", 9, doc! {"dropIndexes": "c", "index": "a_1"});
                e.insert("o2", doc! {"v": 2, "key": {"a": 1}, "name": "a_1"});
                e
            },
            doc! {
                "_id": token(9, 0, Some(1), doc! {"operationType": "dropIndexes", "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}}),
                "operationType": "dropIndexes", "clusterTime": ts(9, 1), "collectionUUID": uuid(1),
                "wallTime": wall(9000), "ns": ns("db", "c"),
                "operationDescription": {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]},
            },
        ),
        (
            "modify",
            {
                let mut e = cmd("db", 10, doc! {"collMod": "c", "validationLevel": "off"});
                e.insert(
                    "o2",
                    doc! {"collectionOptions_old": {"uuid": uuid(1), "validationLevel": "strict"}},
                );
                e
            },
            doc! {
                "_id": token(10, 0, Some(1), doc! {"operationType": "modify", "operationDescription": {"validationLevel": "off"}}),
                "operationType": "modify", "clusterTime": ts(10, 1), "collectionUUID": uuid(1),
                "wallTime": wall(10000), "ns": ns("db", "c"),
                "operationDescription": {"validationLevel": "off"},
                "stateBeforeChange": {"collectionOptions": {"uuid": uuid(1), "validationLevel": "strict"}},
            },
        ),
        (
            "rename with dropTarget",
            cmd(
                "db",
                11,
                doc! {"renameCollection": "db.c", "to": "db.d", "stayTemp": false, "dropTarget": uuid(2)},
            ),
            doc! {
                "to": ns("db", "d"),
                "_id": token(11, 0, Some(1), doc! {"operationType": "rename", "operationDescription": {"to": ns("db", "d"), "dropTarget": uuid(2)}}),
                "operationType": "rename", "clusterTime": ts(11, 1), "collectionUUID": uuid(1),
                "wallTime": wall(11000), "ns": ns("db", "c"),
                "operationDescription": {"to": ns("db", "d"), "dropTarget": uuid(2)},
            },
        ),
        (
            "shardCollection",
            doc! {"ts": ts(12, 1), "t": 1_i64, "op": "n", "ns": "db.c", "ui": uuid(1), "o": {"msg": {"shardCollection": "db.c"}},
            "o2": {"shardCollection": "db.c", "key": {"a": 1}, "unique": false}, "wall": wall(12000)},
            doc! {
                "_id": token(12, 0, Some(1), doc! {"operationType": "shardCollection", "operationDescription": {"key": {"a": 1}, "unique": false}}),
                "operationType": "shardCollection", "clusterTime": ts(12, 1), "collectionUUID": uuid(1),
                "wallTime": wall(12000), "ns": ns("db", "c"),
                "operationDescription": {"key": {"a": 1}, "unique": false},
            },
        ),
    ];
    for (name, entry, want) in cases {
        assert_eq!(run(&s, &entry).as_ref(), Some(&want), "{name}");
    }
}

#[test]
fn view_definition_crud_becomes_view_ddl() {
    let s = expanded(db_spec("db"));
    let view = doc! {"_id": "db.v", "viewOn": "c", "pipeline": [{"$match": {"a": 1}}]};
    let desc = doc! {"viewOn": "c", "pipeline": [{"$match": {"a": 1}}]};
    let cases: Vec<(&str, Document, Document)> = vec![
        (
            "create",
            insert("db.system.views", 5, view.clone()),
            doc! {
                "_id": token(5, 0, Some(1), doc! {"operationType": "create", "operationDescription": desc.clone()}),
                "operationType": "create", "clusterTime": ts(5, 1), "wallTime": wall(5000),
                "ns": ns("db", "v"), "operationDescription": desc.clone(), "nsType": "view",
            },
        ),
        (
            "modify",
            doc! {"ts": ts(6, 1), "op": "u", "ns": "db.system.views", "ui": uuid(1), "o": view.clone(),
            "o2": {"_id": "db.v"}, "wall": wall(6000)},
            doc! {
                "_id": token(6, 0, Some(1), doc! {"operationType": "modify", "operationDescription": desc.clone()}),
                "operationType": "modify", "clusterTime": ts(6, 1), "wallTime": wall(6000),
                "ns": ns("db", "v"), "operationDescription": desc.clone(),
            },
        ),
        (
            "drop",
            doc! {"ts": ts(7, 1), "op": "d", "ns": "db.system.views", "ui": uuid(1), "o": {"_id": "db.v"},
            "wall": wall(7000)},
            doc! {
                "_id": token(7, 0, Some(1), doc! {"operationType": "drop"}),
                "operationType": "drop", "clusterTime": ts(7, 1), "wallTime": wall(7000),
                "ns": ns("db", "v"),
            },
        ),
        (
            "timeseries",
            insert(
                "db.system.views",
                8,
                doc! {"_id": "db.m", "viewOn": "system.buckets.m"},
            ),
            doc! {
                "_id": token(8, 0, Some(1), doc! {"operationType": "create", "operationDescription": {"viewOn": "system.buckets.m"}}),
                "operationType": "create", "clusterTime": ts(8, 1), "wallTime": wall(8000),
                "ns": ns("db", "m"), "operationDescription": {"viewOn": "system.buckets.m"},
                "nsType": "timeseries",
            },
        ),
    ];
    for (name, entry, want) in cases {
        assert_eq!(run(&s, &entry).as_ref(), Some(&want), "{name}");
    }
}

#[test]
fn operation_description_is_in_the_token_even_when_hidden() {
    let e = cmd("db", 10, doc! {"renameCollection": "db.c", "to": "db.d"});
    let plain = Transformer::new(&coll_spec("db", "c"))
        .transform(&e)
        .unwrap()
        .unwrap();
    let shown = Transformer::new(&expanded(coll_spec("db", "c")))
        .transform(&e)
        .unwrap()
        .unwrap();
    assert_eq!(plain.token, shown.token);
    assert!(!plain.doc.contains_key("operationDescription"));
    assert!(shown.doc.contains_key("operationDescription"));
}

#[test]
fn transaction_ops_carry_lsid_and_txn_number_first() {
    let mut e = insert("db.c", 5, doc! {"_id": 1});
    e.insert("lsid", doc! {"id": uuid(9)});
    e.insert("txnNumber", 4_i64);
    // A retryable write (not unwound): no lsid in the event.
    let d = run(&coll_spec("db", "c"), &e).unwrap();
    assert!(!d.contains_key("lsid") && !d.contains_key("txnNumber"));
    // Unwound from a transaction: txnNumber, lsid, then _id; txnOpIndex in the token.
    e.insert("txnOpIndex", 3_i64);
    let d = run(&coll_spec("db", "c"), &e).unwrap();
    let keys: Vec<&str> = d.keys().map(String::as_str).take(3).collect();
    assert_eq!(keys, ["txnNumber", "lsid", "_id"]);
    let t = ResumeTokenData::from_document(d.get_document("_id").unwrap()).unwrap();
    assert_eq!(t.txn_op_index(), 3);
}

#[test]
fn bad_update_entries_fail_with_6741200() {
    let s = coll_spec("db", "c");
    for o in [
        doc! {"$v": 1, "$set": {"a": 1}},
        doc! {"$set": {"a": 1}},
        doc! {"$v": "2", "diff": {}},
    ] {
        let e =
            doc! {"ts": ts(5, 1), "op": "u", "ns": "db.c", "ui": uuid(1), "o": o, "o2": {"_id": 1}};
        let err = Transformer::new(&s).transform(&e).unwrap_err();
        assert_eq!(err.code, 6741200);
    }
}

#[test]
fn raw_update_description_replaces_the_parsed_one() {
    let mut s = coll_spec("db", "c");
    s.options.show_raw_update_description = true;
    let d = run(&s, &update("db.c", 6, 1, doc! {"u": {"a": 3}})).unwrap();
    assert_eq!(
        d.get_document("rawUpdateDescription").unwrap(),
        &doc! {"$v": 2, "diff": {"u": {"a": 3}}}
    );
    assert!(!d.contains_key("updateDescription"));
}

#[test]
fn entries_that_make_no_event() {
    let s = db_spec("db");
    let hb = doc! {"ts": ts(5, 1), "op": "n", "ns": "", "o": {"msg": "periodic noop"}};
    assert_eq!(run(&s, &hb), None);
    assert_eq!(run(&s, &cmd("db", 5, doc! {"startIndexBuild": "c"})), None);
}

#[test]
fn classic_types_filter() {
    for t in CLASSIC_TYPES {
        assert!(is_classic_type(t));
    }
    for t in [
        "create",
        "createIndexes",
        "dropIndexes",
        "modify",
        "shardCollection",
    ] {
        assert!(!is_classic_type(t), "{t}");
    }
}

#[test]
fn token_version_sticks_to_a_v1_client_token_until_past_it() {
    // A v1 client token for insert {_id: 2} at ts 5.
    let client = ResumeTokenData::event(
        ct(5, 1),
        TokenVersion::V1,
        0,
        Some(buuid(1)),
        Some(doc! {"_id": 2}),
    )
    .unwrap();
    let mut s = coll_spec("db", "c");
    s.start = StartPoint::ResumeAfter(client.clone());
    let mut t = Transformer::new(&s);
    let v = |t: &mut Transformer, e: &Document| t.transform(e).unwrap().unwrap().data.version();
    // At and before the resume point: v1 (so the resume check can find the token)...
    let at = t
        .transform(&insert("db.c", 5, doc! {"_id": 2}))
        .unwrap()
        .unwrap();
    assert_eq!(at.data, client);
    // ...after it: the default version, for good.
    assert_eq!(
        v(&mut t, &insert("db.c", 6, doc! {"_id": 3})),
        TokenVersion::V2
    );
    assert_eq!(
        v(&mut t, &insert("db.c", 7, doc! {"_id": 0})),
        TokenVersion::V2
    );
    // Without a client token: v2 from the start.
    let mut fresh = Transformer::new(&coll_spec("db", "c"));
    assert_eq!(
        v(&mut fresh, &insert("db.c", 5, doc! {"_id": 2})),
        TokenVersion::V2
    );
}
