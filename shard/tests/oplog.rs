//! The oplog's format per operation type, DDL entries, and tailing `local.oplog.rs`.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::time::Duration;

use bson::{Bson, Document, doc};
use common::*;

fn ops(entries: &[Document]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|e| {
            (
                e.get_str("op").unwrap().to_string(),
                e.get_str("ns").unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn crud_entries_have_mongodb_format() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "a": 1, "b": [1, 2]}]},
    )
    .await;
    ok(&s, "db", doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 2}, "$unset": {"b": 1}}}]}).await;
    // A no-op update writes no entry.
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 2}}}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    assert_eq!(r.get_i32("nModified").unwrap(), 0);
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"x": 9}}]},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"_id": 1}, "limit": 1}]},
    )
    .await;

    let log = oplog_for(&s, "db").await;
    assert_eq!(
        ops(&log),
        vec![
            ("c".into(), "db.$cmd".into()),
            ("i".into(), "db.c".into()),
            ("u".into(), "db.c".into()),
            ("u".into(), "db.c".into()),
            ("d".into(), "db.c".into()),
        ]
    );
    let create = &log[0];
    assert_eq!(
        create.get_document("o").unwrap(),
        &doc! {"create": "c", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    );
    let uuid = create.get("ui").unwrap().clone();
    let ins = &log[1];
    assert_eq!(
        ins.get_document("o").unwrap(),
        &doc! {"_id": 1, "a": 1, "b": [1, 2]}
    );
    assert_eq!(ins.get_document("o2").unwrap(), &doc! {"_id": 1});
    assert_eq!(ins.get("ui"), Some(&uuid));
    assert_eq!(ins.get_i64("t").unwrap(), 1);
    assert_eq!(ins.get_i64("v").unwrap(), 2);
    assert!(ins.get_datetime("wall").is_ok());
    let upd = &log[2];
    assert_eq!(
        upd.get_document("o").unwrap(),
        &doc! {"$v": 2, "diff": {"d": {"b": false}, "u": {"a": 2}}}
    );
    assert_eq!(upd.get_document("o2").unwrap(), &doc! {"_id": 1});
    let rep = &log[3];
    assert_eq!(rep.get_document("o").unwrap(), &doc! {"_id": 1, "x": 9});
    let del = &log[4];
    assert_eq!(del.get_document("o").unwrap(), &doc! {"_id": 1});
    assert!(!del.contains_key("o2"));
    // ts strictly increases.
    let all = oplog(&s).await;
    for w in all.windows(2) {
        assert!(w[0].get_timestamp("ts").unwrap() < w[1].get_timestamp("ts").unwrap());
    }
    s.shutdown().await;
}

#[tokio::test]
async fn ddl_commands_write_command_entries() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"create": "a", "validator": {"x": {"$exists": true}}},
    )
    .await;
    // create again with the same options is fine (7.0), different options is NamespaceExists.
    ok(
        &s,
        "db",
        doc! {"create": "a", "validator": {"x": {"$exists": true}}},
    )
    .await;
    assert_eq!(err_code(&s, "db", doc! {"create": "a"}).await, 48);
    ok(
        &s,
        "db",
        doc! {"createIndexes": "a", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"createIndexes": "a", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
    )
    .await;
    assert_eq!(r.get_str("note").unwrap(), "all indexes already exist");
    assert_eq!(
        err_code(
            &s,
            "db",
            doc! {"createIndexes": "a", "indexes": [{"key": {"y": 1}, "name": "x_1"}]}
        )
        .await,
        86
    );
    let r = ok(&s, "db", doc! {"listIndexes": "a"}).await;
    let names: Vec<String> = first_batch(&r)
        .iter()
        .map(|i| i.get_str("name").unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["_id_", "x_1"]);
    ok(&s, "db", doc! {"collMod": "a", "validator": {}}).await;
    ok(&s, "db", doc! {"dropIndexes": "a", "index": "x_1"}).await;
    assert_eq!(
        err_code(&s, "db", doc! {"dropIndexes": "a", "index": "_id_"}).await,
        72
    );
    assert_eq!(
        err_code(&s, "db", doc! {"dropIndexes": "a", "index": "zz"}).await,
        27
    );
    ok(&s, "db", doc! {"insert": "b", "documents": [{"_id": 1}]}).await;
    ok(
        &s,
        "admin",
        doc! {"renameCollection": "db.a", "to": "db.b", "dropTarget": true},
    )
    .await;
    assert_eq!(
        err_code(&s, "admin", doc! {"renameCollection": "db.a", "to": "db.z"}).await,
        26
    );
    ok(&s, "db", doc! {"drop": "b"}).await;
    // 7.0: dropping a missing collection succeeds and writes nothing.
    let r = ok(&s, "db", doc! {"drop": "b"}).await;
    assert!(!r.contains_key("ns"));
    ok(&s, "db", doc! {"insert": "c", "documents": [{}]}).await;
    ok(&s, "db", doc! {"dropDatabase": 1}).await;

    let log: Vec<Document> = oplog_for(&s, "db")
        .await
        .into_iter()
        .filter(|e| e.get_str("op").ok() == Some("c"))
        .collect();
    let firsts: Vec<String> = log
        .iter()
        .map(|e| e.get_document("o").unwrap().keys().next().unwrap().clone())
        .collect();
    assert_eq!(
        firsts,
        vec![
            "create",
            "createIndexes",
            "collMod",
            "dropIndexes",
            "create",
            "renameCollection",
            "drop",
            "create",
            "drop",
            "dropDatabase"
        ]
    );
    let ci = log[1].get_document("o").unwrap();
    assert_eq!(
        ci,
        &doc! {"createIndexes": "a", "v": 2, "key": {"x": 1}, "name": "x_1"}
    );
    let cm = &log[2];
    assert_eq!(
        cm.get_document("o2")
            .unwrap()
            .get_document("collectionOptions_old")
            .unwrap()
            .get_document("validator")
            .unwrap(),
        &doc! {"x": {"$exists": true}}
    );
    let di = &log[3];
    assert_eq!(
        di.get_document("o").unwrap(),
        &doc! {"dropIndexes": "a", "index": "x_1"}
    );
    assert_eq!(
        di.get_document("o2").unwrap(),
        &doc! {"v": 2, "key": {"x": 1}, "name": "x_1"}
    );
    let rn = log[5].get_document("o").unwrap();
    assert_eq!(rn.get_str("renameCollection").unwrap(), "db.a");
    assert_eq!(rn.get_str("to").unwrap(), "db.b");
    assert!(!rn.get_bool("stayTemp").unwrap());
    assert_eq!(rn.get("dropTarget"), log[4].get("ui"));
    let dd = &log[9];
    assert_eq!(dd.get_document("o").unwrap(), &doc! {"dropDatabase": 1});
    assert!(!dd.contains_key("ui"));
    let r = ok(&s, "db", doc! {"listCollections": 1}).await;
    assert!(first_batch(&r).is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn list_collections_and_databases() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"create": "x", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    ok(&s, "db", doc! {"insert": "y", "documents": [{}]}).await;
    ok(&s, "other", doc! {"insert": "z", "documents": [{}]}).await;
    let r = ok(
        &s,
        "db",
        doc! {"listCollections": 1, "filter": {"name": "x"}},
    )
    .await;
    let b = first_batch(&r);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].get_str("type").unwrap(), "collection");
    assert_eq!(
        b[0].get_document("options").unwrap(),
        &doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    );
    assert!(b[0].get_document("info").unwrap().contains_key("uuid"));
    assert_eq!(
        b[0].get_document("idIndex")
            .unwrap()
            .get_str("name")
            .unwrap(),
        "_id_"
    );
    let r = ok(&s, "db", doc! {"listCollections": 1, "nameOnly": true}).await;
    assert_eq!(first_batch(&r).len(), 2);
    let r = ok(&s, "admin", doc! {"listDatabases": 1}).await;
    let names: Vec<&str> = r
        .get_array("databases")
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().get_str("name").unwrap())
        .collect();
    assert_eq!(names, vec!["db", "other"]);
    s.shutdown().await;
}

#[tokio::test]
async fn sharded_collection_has_shard_key_document_keys_and_marker() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let uuid = bson::Uuid::new();
    ok(
        &s,
        "admin",
        doc! {"_shardsvrShardCollection": "db.s", "key": {"region": 1, "n": 1}, "unique": false, "collectionUUID": uuid, "isPrimary": true},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"insert": "s", "documents": [{"_id": 1, "n": 5, "region": "eu"}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"update": "s", "updates": [{"q": {"_id": 1}, "u": {"$set": {"region": "us"}}}]},
    )
    .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 66, "shard key is immutable");
    let log = oplog_for(&s, "db").await;
    let marker = log
        .iter()
        .find(|e| e.get_str("op").ok() == Some("n"))
        .unwrap();
    assert_eq!(marker.get_str("ns").unwrap(), "db.s");
    assert_eq!(marker.get("ui"), Some(&Bson::from(uuid)));
    let o2 = marker.get_document("o2").unwrap();
    assert_eq!(o2.get_str("shardCollection").unwrap(), "db.s");
    assert_eq!(
        o2.get_document("shardKey").unwrap(),
        &doc! {"region": 1, "n": 1}
    );
    let ins = log
        .iter()
        .find(|e| e.get_str("op").ok() == Some("i"))
        .unwrap();
    assert_eq!(
        ins.get_document("o2").unwrap(),
        &doc! {"region": "eu", "n": 5, "_id": 1}
    );
    let r = ok(&s, "db", doc! {"listCollections": 1}).await;
    let info = first_batch(&r)[0].get_document("info").unwrap().clone();
    assert_eq!(info.get("uuid"), Some(&Bson::from(uuid)));
    s.shutdown().await;
}

#[tokio::test]
async fn oplog_find_filters_by_ts_and_tailable_await_data_waits_for_new_entries() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    let all = oplog(&s).await;
    let last_ts = all.last().unwrap().get_timestamp("ts").unwrap();
    let r = ok(
        &s,
        "local",
        doc! {"find": "oplog.rs", "filter": {"ts": {"$gt": last_ts}}, "tailable": true, "awaitData": true},
    )
    .await;
    assert!(first_batch(&r).is_empty());
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    // An empty awaitData getMore waits about maxTimeMS and returns nothing.
    let t0 = std::time::Instant::now();
    let r = ok(
        &s,
        "local",
        doc! {"getMore": id, "collection": "oplog.rs", "maxTimeMS": 200_i64},
    )
    .await;
    assert!(
        r.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .is_empty()
    );
    assert!(t0.elapsed() >= Duration::from_millis(150));
    // A write while the getMore waits wakes it.
    let s2 = s.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        ok(&s2, "db", doc! {"insert": "c", "documents": [{"_id": 2}]}).await;
    });
    let r = ok(
        &s,
        "local",
        doc! {"getMore": id, "collection": "oplog.rs", "maxTimeMS": 5000_i64},
    )
    .await;
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("nextBatch")
        .unwrap()
        .clone();
    assert_eq!(batch.len(), 1);
    let e = batch[0].as_document().unwrap();
    assert_eq!(e.get_document("o").unwrap(), &doc! {"_id": 2});
    assert!(e.get_timestamp("ts").unwrap() > last_ts);
    writer.await.unwrap();
    // Filters apply to tailing.
    let r = ok(
        &s,
        "local",
        doc! {"find": "oplog.rs", "filter": {"op": "d"}, "tailable": true, "awaitData": true},
    )
    .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 3}]}).await;
    ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"_id": 3}, "limit": 1}]},
    )
    .await;
    let r = ok(&s, "local", doc! {"getMore": id, "collection": "oplog.rs"}).await;
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("nextBatch")
        .unwrap()
        .clone();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].as_document().unwrap().get_str("op").unwrap(), "d");
    // Tailable on a normal collection is refused.
    assert_eq!(
        err_code(&s, "db", doc! {"find": "c", "tailable": true}).await,
        2
    );
    s.shutdown().await;
}

#[tokio::test]
async fn high_water_mark_is_below_later_entries() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..20 {
        let h = s.high_water_mark();
        ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": i}]}).await;
        let e = oplog(&s).await.pop().unwrap();
        let ts = resume::ClusterTime::from(e.get_timestamp("ts").unwrap());
        assert!(
            ts > h,
            "entry {ts} must be above the earlier high-water mark {h}"
        );
        assert!(s.high_water_mark() >= ts);
    }
    s.shutdown().await;
}

#[tokio::test]
async fn create_with_collection_uuid_and_views() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let uuid = bson::Uuid::new();
    ok(&s, "db", doc! {"create": "c", "collectionUUID": uuid}).await;
    let create = oplog_for(&s, "db").await.pop().unwrap();
    assert_eq!(create.get("ui"), Some(&Bson::from(uuid)));
    // The internal field is not a collection option.
    assert!(
        !create
            .get_document("o")
            .unwrap()
            .contains_key("collectionUUID")
    );
    // Same name, other UUID: NamespaceExists.
    assert_eq!(
        err_code(
            &s,
            "db",
            doc! {"create": "c", "collectionUUID": bson::Uuid::new()}
        )
        .await,
        48
    );
    // A view is a document in system.views, listed with type "view"; writes to it are refused.
    ok(
        &s,
        "db",
        doc! {"create": "v", "viewOn": "c", "pipeline": [{"$match": {"a": 1}}]},
    )
    .await;
    let e = oplog_for(&s, "db").await.pop().unwrap();
    assert_eq!(e.get_str("op").unwrap(), "i");
    assert_eq!(e.get_str("ns").unwrap(), "db.system.views");
    assert_eq!(
        e.get_document("o").unwrap(),
        &doc! {"_id": "db.v", "viewOn": "c", "pipeline": [{"$match": {"a": 1}}]}
    );
    let r = ok(
        &s,
        "db",
        doc! {"listCollections": 1, "filter": {"name": "v"}},
    )
    .await;
    assert_eq!(first_batch(&r)[0].get_str("type").unwrap(), "view");
    let r = ok(&s, "db", doc! {"insert": "v", "documents": [{}]}).await;
    let code = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .get_i32("code")
        .unwrap();
    assert_eq!(code, 166);
    // Dropping the view removes its definition.
    ok(&s, "db", doc! {"drop": "v"}).await;
    let e = oplog_for(&s, "db").await.pop().unwrap();
    assert_eq!(e.get_str("op").unwrap(), "d");
    assert_eq!(e.get_document("o").unwrap(), &doc! {"_id": "db.v"});
    s.shutdown().await;
}

#[tokio::test]
async fn a_tail_cursor_overtaken_by_truncation_gets_capped_position_lost() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 0}]}).await;
    let r = ok(
        &s,
        "local",
        doc! {"find": "oplog.rs", "filter": {"op": "i"}, "tailable": true, "awaitData": true, "batchSize": 0},
    )
    .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    s.set_oplog_retention(shard::retention::Retention::bytes(300));
    insert_padded(&s, 1..20, 40).await;
    assert_eq!(
        err_code(&s, "local", doc! {"getMore": id, "collection": "oplog.rs"}).await,
        136
    );
    s.shutdown().await;
}

/// Retention pins (`_shardsvrRetentionPins`): the trim keeps every entry from the oldest live
/// pin on; a pin that lags past its `maxLagBytes` expires in the trim's own transaction and
/// trimming goes on; a pin set at or below the truncation point is expired at once; dropped,
/// a pin holds nothing.
#[tokio::test]
async fn the_trim_keeps_what_live_pins_need_and_expires_a_lagging_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 0}]}).await;
    let from = s.cluster_time().timestamp();
    let pin = |id: &str, lag: Option<i64>| {
        let mut p = doc! {"id": id, "from": from};
        if let Some(l) = lag {
            p.insert("maxLagBytes", l);
        }
        p
    };
    let r = ok(
        &s,
        "admin",
        doc! {"_shardsvrRetentionPins": 1, "set": [pin("holds", None), pin("lags", Some(2_000))]},
    )
    .await;
    assert_eq!(r.get_array("pins").unwrap().len(), 2);
    s.set_oplog_retention(shard::retention::Retention::bytes(300));
    insert_padded(&s, 1..40, 100).await;
    let truncated = s.state().oplog_truncated_through();
    assert!(truncated < from.into(), "the live pin holds the oplog");
    assert_eq!(
        pin_states(&s, vec!["holds", "lags"]).await,
        vec![("holds".into(), false), ("lags".into(), true)],
        "the pin past its 2,000 bytes expired; the other holds"
    );
    ok(
        &s,
        "admin",
        doc! {"_shardsvrRetentionPins": 1, "drop": ["holds"]},
    )
    .await;
    insert_padded(&s, 40..45, 100).await;
    let after = s.state().oplog_truncated_through();
    assert!(after >= from.into(), "without pins the trim goes on");
    let r = ok(
        &s,
        "admin",
        doc! {"_shardsvrRetentionPins": 1, "set": [pin("late", None)]},
    )
    .await;
    let late = r.get_array("pins").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert!(
        late.get_bool("expired").unwrap(),
        "a pin below the truncation point: {late}"
    );
    s.shutdown().await;
}

/// `_shardsvrOplogBytesSince`: for each time, the bytes of the oplog's entries from it on (in
/// the order asked, repeats and times before the oldest entry included).
#[tokio::test]
async fn the_oplog_bytes_since_a_time_are_what_was_logged_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let start = s.cluster_time().timestamp();
    insert_padded(&s, 0..10, 100).await;
    let middle = s.cluster_time().timestamp();
    insert_padded(&s, 10..30, 100).await;
    let end = s.cluster_time().timestamp();
    let r = ok(
        &s,
        "admin",
        doc! {"_shardsvrOplogBytesSince": [middle, start, end, middle, bson::Timestamp {time: 0, increment: 1}]},
    )
    .await;
    let bytes: Vec<i64> = r
        .get_array("bytes")
        .unwrap()
        .iter()
        .map(|b| b.as_i64().unwrap())
        .collect();
    let (from_middle, from_start, from_end, again, all) =
        (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]);
    assert_eq!(from_middle, again);
    assert!(from_end < 400, "at most the last write's entry: {bytes:?}");
    assert!(
        from_middle > 20 * 100 && from_middle < 20 * 400,
        "twenty padded inserts: {bytes:?}"
    );
    assert!(
        from_start > from_middle + 10 * 100 && from_start < from_middle + 10 * 400,
        "{bytes:?}"
    );
    assert!(all >= from_start, "{bytes:?}");
    s.shutdown().await;
}

/// `(id, expired)` of the pins named.
async fn pin_states(s: &shard::Shard, ids: Vec<&str>) -> Vec<(String, bool)> {
    let r = ok(s, "admin", doc! {"_shardsvrRetentionPins": 1, "get": ids}).await;
    r.get_array("pins")
        .unwrap()
        .iter()
        .map(|p| {
            let p = p.as_document().unwrap();
            (
                p.get_str("id").unwrap().to_string(),
                p.get_bool("expired").unwrap(),
            )
        })
        .collect()
}
