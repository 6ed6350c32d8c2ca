//! Commands against a real shard on disk: CRUD, cursors, errors, handshake.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bson::{Bson, doc};
use common::*;

#[tokio::test]
async fn insert_generates_id_first_and_find_returns_documents() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"a": 1}, {"b": 2, "_id": 7}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 2);
    let docs = find(&s, "db", "c", doc! {}).await;
    assert_eq!(docs.len(), 2);
    for d in &docs {
        assert_eq!(
            d.keys().next().unwrap(),
            "_id",
            "_id must be the first field: {d:?}"
        );
    }
    assert!(docs.iter().any(|d| d.get("_id") == Some(&Bson::Int32(7))));
    assert!(
        docs.iter()
            .any(|d| matches!(d.get("_id"), Some(Bson::ObjectId(_))))
    );
    s.shutdown().await;
}

#[tokio::test]
async fn duplicate_id_is_a_write_error_like_mongodb_and_ordered_stops() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 2}, {"_id": 1.0}, {"_id": 3}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let we = r.get_array("writeErrors").unwrap();
    assert_eq!(we.len(), 1);
    let e = we[0].as_document().unwrap();
    assert_eq!(e.get_i32("index").unwrap(), 1);
    assert_eq!(e.get_i32("code").unwrap(), 11000);
    assert_eq!(
        e.get_str("errmsg").unwrap(),
        "E11000 duplicate key error collection: db.c index: _id_ dup key: { _id: 1.0 }"
    );
    assert_eq!(e.get_document("keyPattern").unwrap(), &doc! {"_id": 1});
    // Unordered continues past the error.
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "ordered": false, "documents": [{"_id": 1}, {"_id": 4}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 3);
    s.shutdown().await;
}

#[tokio::test]
async fn insert_stores_dollar_fields_outside_id_and_rejects_oversized_docs_and_bad_types() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    // As MongoDB 5.0+: `$`-prefixed and dotted names are stored, but not inside `_id` (53).
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "$x": 1, "a.b": 2}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": {"k": {"$x": 1}}}]},
    )
    .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 53);
    let big = "x".repeat(17 * 1024 * 1024);
    let r = ok(&s, "db", doc! {"insert": "c", "documents": [{"big": big}]}).await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 10334);
    assert_eq!(
        err_code(&s, "db", doc! {"insert": "c", "documents": [1]}).await,
        14
    );
    assert_eq!(err_code(&s, "db", doc! {"insert": "c"}).await, 40414);
    assert_eq!(
        err_code(&s, "db", doc! {"insert": 5, "documents": []}).await,
        73
    );
    assert_eq!(err_code(&s, "db", doc! {"frobnicate": 1}).await, 59);
    assert_eq!(
        find(&s, "db", "c", doc! {}).await,
        vec![doc! {"_id": 1, "$x": 1, "a.b": 2}]
    );
    s.shutdown().await;
}

#[tokio::test]
async fn every_reply_carries_cluster_time_and_operation_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let r = ok(&s, "admin", doc! {"ping": 1}).await;
    let ct = r.get_document("$clusterTime").unwrap();
    assert!(ct.get_timestamp("clusterTime").is_ok());
    let sig = ct.get_document("signature").unwrap();
    assert_eq!(sig.get_binary_generic("hash").unwrap().len(), 20);
    assert_eq!(sig.get_i64("keyId").unwrap(), 0);
    assert!(r.get_timestamp("operationTime").is_ok());
    // operationTime of a write is its oplog entry's ts.
    let r = ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    let op = r.get_timestamp("operationTime").unwrap();
    let last = oplog(&s).await.pop().unwrap();
    assert_eq!(last.get_timestamp("ts").unwrap(), op);
    // Errors carry them too.
    let r = run(&s, "db", doc! {"nope": 1}).await;
    assert!(r.contains_key("$clusterTime") && r.contains_key("operationTime"));
    s.shutdown().await;
}

#[tokio::test]
async fn incoming_cluster_time_advances_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let far = bson::Timestamp {
        time: 4_000_000_000,
        increment: 5,
    };
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1}], "$clusterTime": {"clusterTime": far, "signature": {"hash": bson::Binary{subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0;20]}, "keyId": 0_i64}}},
    )
    .await;
    let op = r.get_timestamp("operationTime").unwrap();
    assert!(op > far, "write after gossip must be above it: {op:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn find_supports_filter_projection_sort_skip_limit_and_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let docs: Vec<Bson> = (0..250)
        .map(|i| Bson::Document(doc! {"_id": i, "v": i % 10, "name": format!("n{i}")}))
        .collect();
    ok(&s, "db", doc! {"insert": "c", "documents": docs}).await;
    let r = ok(
        &s,
        "db",
        doc! {"find": "c", "filter": {"v": 3}, "projection": {"name": 1, "_id": 0}, "sort": {"_id": -1}, "skip": 1, "limit": 3},
    )
    .await;
    let b = first_batch(&r);
    assert_eq!(
        b,
        vec![
            doc! {"name": "n233"},
            doc! {"name": "n223"},
            doc! {"name": "n213"}
        ]
    );
    assert_eq!(r.get_document("cursor").unwrap().get_i64("id").unwrap(), 0);
    // Default first batch is 101; getMore pages the rest; the cursor closes at the end.
    let r = ok(&s, "db", doc! {"find": "c"}).await;
    assert_eq!(first_batch(&r).len(), 101);
    let cur = r.get_document("cursor").unwrap();
    assert_eq!(cur.get_str("ns").unwrap(), "db.c");
    let id = cur.get_i64("id").unwrap();
    assert_ne!(id, 0);
    let r = ok(
        &s,
        "db",
        doc! {"getMore": id, "collection": "c", "batchSize": 100},
    )
    .await;
    assert_eq!(
        r.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len(),
        100
    );
    let r = ok(&s, "db", doc! {"getMore": id, "collection": "c"}).await;
    let c = r.get_document("cursor").unwrap();
    assert_eq!(c.get_array("nextBatch").unwrap().len(), 49);
    assert_eq!(c.get_i64("id").unwrap(), 0);
    assert_eq!(
        err_code(&s, "db", doc! {"getMore": id, "collection": "c"}).await,
        43
    );
    // killCursors
    let r = ok(&s, "db", doc! {"find": "c", "batchSize": 2}).await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let r = ok(
        &s,
        "db",
        doc! {"killCursors": "c", "cursors": [id, 12345_i64]},
    )
    .await;
    assert_eq!(
        r.get_array("cursorsKilled").unwrap(),
        &vec![Bson::Int64(id)]
    );
    assert_eq!(
        r.get_array("cursorsNotFound").unwrap(),
        &vec![Bson::Int64(12345)]
    );
    // singleBatch closes the cursor.
    let r = ok(
        &s,
        "db",
        doc! {"find": "c", "batchSize": 2, "singleBatch": true},
    )
    .await;
    assert_eq!(r.get_document("cursor").unwrap().get_i64("id").unwrap(), 0);
    // Missing collection: empty result.
    assert!(find(&s, "db", "nope", doc! {}).await.is_empty());
    assert_eq!(
        err_code(&s, "db", doc! {"find": "c", "filter": 1}).await,
        14
    );
    assert_eq!(
        err_code(&s, "db", doc! {"find": "c", "skip": -1}).await,
        51024
    );
    s.shutdown().await;
}

#[tokio::test]
async fn count_and_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"a": 1}, {"a": [1, 2]}, {"a": 3}, {"b": 1}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"count": "c", "query": {"a": {"$exists": true}}},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 3);
    let r = ok(&s, "db", doc! {"count": "c", "skip": 1, "limit": 2}).await;
    assert_eq!(r.get_i32("n").unwrap(), 2);
    let r = ok(&s, "db", doc! {"distinct": "c", "key": "a"}).await;
    assert_eq!(
        r.get_array("values").unwrap(),
        &vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)]
    );
    let r = ok(&s, "db", doc! {"distinct": "none", "key": "a"}).await;
    assert!(r.get_array("values").unwrap().is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn update_counts_matches_modifications_and_upserts() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1, "a": 1}, {"_id": 2, "a": 1}, {"_id": 3, "a": 2}]}).await;
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [
            {"q": {"a": 1}, "u": {"$set": {"b": 1}}, "multi": true},
            {"q": {"_id": 3}, "u": {"$set": {"a": 2}}},
            {"q": {"_id": 9}, "u": {"$set": {"x": 1}}, "upsert": true},
        ]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 4);
    assert_eq!(r.get_i32("nModified").unwrap(), 2);
    let up = r.get_array("upserted").unwrap();
    assert_eq!(up[0].as_document().unwrap(), &doc! {"index": 2, "_id": 9});
    assert_eq!(
        find(&s, "db", "c", doc! {"_id": 9}).await,
        vec![doc! {"_id": 9, "x": 1}]
    );
    assert_eq!(find(&s, "db", "c", doc! {"b": 1}).await.len(), 2);
    // Replacement keeps _id; changing _id is ImmutableField.
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"z": 5}}]},
    )
    .await;
    assert_eq!(
        find(&s, "db", "c", doc! {"_id": 1}).await,
        vec![doc! {"_id": 1, "z": 5}]
    );
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"_id": 5}}}]},
    )
    .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 66);
    // arrayFilters
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 10, "arr": [1, 5, 9]}]},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 10}, "u": {"$set": {"arr.$[x]": 0}}, "arrayFilters": [{"x": {"$gt": 4}}]}]},
    )
    .await;
    assert_eq!(
        find(&s, "db", "c", doc! {"_id": 10}).await,
        vec![doc! {"_id": 10, "arr": [1, 0, 0]}]
    );
    // Upsert into a new collection creates it.
    ok(&s, "db", doc! {"update": "fresh", "updates": [{"q": {"k": "v"}, "u": {"$inc": {"n": 1}}, "upsert": true}]}).await;
    let d = find(&s, "db", "fresh", doc! {}).await;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].get_str("k").unwrap(), "v");
    assert_eq!(d[0].get_i32("n").unwrap(), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn delete_with_limit_zero_and_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"a": 1}, {"a": 1}, {"a": 1}, {"a": 2}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"a": 1}, "limit": 1}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let r = ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"a": 1}, "limit": 0}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 2);
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 1);
    assert_eq!(
        err_code(
            &s,
            "db",
            doc! {"delete": "c", "deletes": [{"q": {}, "limit": 5}]}
        )
        .await,
        9
    );
    s.shutdown().await;
}

#[tokio::test]
async fn find_and_modify_update_remove_upsert() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "n": 1}, {"_id": 2, "n": 5}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"findAndModify": "c", "query": {}, "sort": {"n": -1}, "update": {"$inc": {"n": 1}}, "new": true},
    )
    .await;
    assert_eq!(r.get_document("value").unwrap(), &doc! {"_id": 2, "n": 6});
    assert_eq!(
        r.get_document("lastErrorObject").unwrap(),
        &doc! {"n": 1, "updatedExisting": true}
    );
    let r = ok(&s, "db", doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "fields": {"_id": 0}}).await;
    assert_eq!(r.get_document("value").unwrap(), &doc! {"n": 1});
    let r = ok(&s, "db", doc! {"findAndModify": "c", "query": {"_id": 3}, "update": {"$set": {"n": 0}}, "upsert": true}).await;
    assert_eq!(r.get("value"), Some(&Bson::Null));
    assert_eq!(
        r.get_document("lastErrorObject").unwrap(),
        &doc! {"n": 1, "updatedExisting": false, "upserted": 3}
    );
    let r = ok(
        &s,
        "db",
        doc! {"findAndModify": "c", "query": {"_id": 3}, "remove": true},
    )
    .await;
    assert_eq!(r.get_document("value").unwrap(), &doc! {"_id": 3, "n": 0});
    assert_eq!(r.get_document("lastErrorObject").unwrap(), &doc! {"n": 1});
    let r = ok(
        &s,
        "db",
        doc! {"findAndModify": "c", "query": {"_id": 3}, "remove": true},
    )
    .await;
    assert_eq!(r.get("value"), Some(&Bson::Null));
    assert_eq!(
        err_code(&s, "db", doc! {"findAndModify": "c", "query": {}}).await,
        9
    );
    assert_eq!(
        err_code(
            &s,
            "db",
            doc! {"findAndModify": "c", "remove": true, "update": {"$set": {"a": 1}}}
        )
        .await,
        9
    );
    s.shutdown().await;
}

#[tokio::test]
async fn aggregate_returns_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"a": 1}, {"a": 2}, {"a": 3}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"aggregate": "c", "pipeline": [{"$match": {"a": {"$gte": 2}}}, {"$count": "n"}], "cursor": {}},
    )
    .await;
    assert_eq!(first_batch(&r), vec![doc! {"n": 2}]);
    assert_eq!(
        err_code(&s, "db", doc! {"aggregate": "c", "pipeline": []}).await,
        9
    );
    s.shutdown().await;
}

#[tokio::test]
async fn hello_presents_a_standalone_with_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let r = ok(&s, "admin", doc! {"hello": 1, "helloOk": true}).await;
    assert!(r.get_bool("isWritablePrimary").unwrap());
    assert_eq!(r.get_i32("maxWireVersion").unwrap(), 21);
    assert_eq!(r.get_i32("logicalSessionTimeoutMinutes").unwrap(), 30);
    assert!(!r.contains_key("setName") && !r.contains_key("msg"));
    let r = ok(&s, "admin", doc! {"isMaster": 1}).await;
    assert!(r.get_bool("ismaster").unwrap());
    let r = ok(&s, "admin", doc! {"buildInfo": 1}).await;
    assert_eq!(r.get_str("version").unwrap(), "7.0.0");
    s.shutdown().await;
}

#[tokio::test]
async fn misc_commands_answer_like_mongod() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "admin",
        doc! {"endSessions": [{"id": bson::Uuid::new()}]},
    )
    .await;
    let r = ok(&s, "admin", doc! {"getParameter": "*"}).await;
    assert!(r.get_bool("enableTestCommands").unwrap());
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "a": 1}, {"_id": 2, "a": 1}]},
    )
    .await;
    // A unique index cannot be built over duplicates.
    let r = run(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1", "unique": true}]},
    )
    .await;
    assert_eq!(r.get_i32("code").unwrap(), 11000);
    // Unique secondary indexes are enforced on insert and update.
    ok(&s, "db", doc! {"createIndexes": "c", "indexes": [{"key": {"b": 1}, "name": "b_1", "unique": true, "sparse": true}, {"key": {"z": 1}, "name": "z_1"}]}).await;
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"b": 5}}}]},
    )
    .await;
    assert_eq!(r.get_i32("nModified").unwrap(), 1);
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 2}, "u": {"$set": {"b": 5}}}]},
    )
    .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 11000);
    assert_eq!(e.get_document("keyValue").unwrap(), &doc! {"b": 5});
    let r = ok(&s, "db", doc! {"dropIndexes": "c", "index": "*"}).await;
    assert_eq!(r.get_i32("nIndexesWas").unwrap(), 3);
    let r = ok(&s, "db", doc! {"listIndexes": "c"}).await;
    assert_eq!(first_batch(&r).len(), 1);
    assert_eq!(err_code(&s, "db", doc! {"listIndexes": "nope"}).await, 26);
    // collMod stores options; collMod on a missing collection is NamespaceNotFound.
    ok(
        &s,
        "db",
        doc! {"collMod": "c", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    let r = ok(&s, "db", doc! {"listCollections": 1}).await;
    assert_eq!(
        first_batch(&r)[0].get_document("options").unwrap(),
        &doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    );
    assert_eq!(err_code(&s, "db", doc! {"collMod": "nope"}).await, 26);
    assert_eq!(
        err_code(&s, "db", doc! {"collMod": "c", "bogus": 1}).await,
        72
    );
    // Cross-database rename keeps the documents.
    ok(
        &s,
        "admin",
        doc! {"renameCollection": "db.c", "to": "other.d"},
    )
    .await;
    assert_eq!(find(&s, "other", "d", doc! {}).await.len(), 2);
    assert!(find(&s, "db", "c", doc! {}).await.is_empty());
    assert_eq!(
        err_code(&s, "db", doc! {"renameCollection": "other.d", "to": "db.c"}).await,
        13
    );
    let r = ok(&s, "admin", doc! {"listDatabases": 1, "nameOnly": true}).await;
    assert_eq!(
        r.get_array("databases").unwrap(),
        &vec![Bson::Document(doc! {"name": "other"})]
    );
    s.shutdown().await;
}

#[tokio::test]
async fn unique_index_entries_follow_inserts_updates_deletes_and_drops() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [{"key": {"u": 1}, "name": "u_1", "unique": true}]},
    )
    .await;
    let dup = |r: &bson::Document| {
        r.get_array("writeErrors")
            .map(|e| e[0].as_document().unwrap().get_i32("code").unwrap() == 11000)
            .unwrap_or(false)
    };
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "u": "a"}]},
    )
    .await;
    assert!(dup(&ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 2, "u": "a"}]}
    )
    .await));
    // Changing the key frees the old value.
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"u": "b"}}}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 2, "u": "a"}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    // A document may keep its own key on update.
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 2}, "u": {"$set": {"u": "a", "x": 1}}}]},
    )
    .await;
    assert_eq!(r.get_i32("nModified").unwrap(), 1);
    // Deleting frees the key.
    ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"_id": 1}, "limit": 1}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 3, "u": "b"}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    // Dropping the index removes its entries; a new non-unique index allows duplicates.
    ok(&s, "db", doc! {"dropIndexes": "c", "index": "u_1"}).await;
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 4, "u": "b"}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    // Rebuilding over duplicates fails and leaves the collection as it was.
    let r = run(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [{"key": {"u": 1}, "name": "u_1", "unique": true}]},
    )
    .await;
    assert_eq!(r.get_i32("code").unwrap(), 11000);
    assert_eq!(
        first_batch(&ok(&s, "db", doc! {"listIndexes": "c"}).await).len(),
        1
    );
    s.shutdown().await;
}

#[tokio::test]
async fn unsorted_cursors_stream_pages_and_honour_skip_limit_and_drops() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let docs: Vec<Bson> = (0..50)
        .map(|i| Bson::Document(doc! {"_id": i, "even": i % 2 == 0}))
        .collect();
    ok(&s, "db", doc! {"insert": "c", "documents": docs}).await;
    let ids = |batch: &[bson::Document]| -> Vec<i32> {
        batch.iter().map(|d| d.get_i32("_id").unwrap()).collect()
    };
    // skip 3 evens, limit 7, batches of 3.
    let r = ok(&s, "db", doc! {"find": "c", "filter": {"even": true}, "skip": 3, "limit": 7, "batchSize": 3, "projection": {"even": 0}}).await;
    assert_eq!(ids(&first_batch(&r)), vec![6, 8, 10]);
    assert_eq!(first_batch(&r)[0], doc! {"_id": 6});
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let next = |r: &bson::Document| -> (Vec<bson::Document>, i64) {
        let c = r.get_document("cursor").unwrap();
        (
            c.get_array("nextBatch")
                .unwrap()
                .iter()
                .map(|d| d.as_document().unwrap().clone())
                .collect(),
            c.get_i64("id").unwrap(),
        )
    };
    // A change ahead of the cursor's position is seen (no snapshot across batches).
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 13}, "u": {"$set": {"even": true}}}]},
    )
    .await;
    let (b, cid) = next(
        &ok(
            &s,
            "db",
            doc! {"getMore": id, "collection": "c", "batchSize": 3},
        )
        .await,
    );
    assert_eq!(ids(&b), vec![12, 13, 14]);
    assert_eq!(cid, id);
    let (b, cid) = next(
        &ok(
            &s,
            "db",
            doc! {"getMore": id, "collection": "c", "batchSize": 3},
        )
        .await,
    );
    assert_eq!(ids(&b), vec![16], "the limit of 7 ends the cursor");
    assert_eq!(cid, 0);
    // Dropping the collection kills an open cursor with QueryPlanKilled.
    let r = ok(&s, "db", doc! {"find": "c", "batchSize": 2}).await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    ok(&s, "db", doc! {"drop": "c"}).await;
    assert_eq!(
        err_code(&s, "db", doc! {"getMore": id, "collection": "c"}).await,
        175
    );
    s.shutdown().await;
}

#[tokio::test]
async fn batch_size_zero_opens_a_cursor_with_an_empty_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}, {"_id": 3}]},
    )
    .await;
    let r = ok(&s, "db", doc! {"find": "c", "batchSize": 0, "skip": 1}).await;
    assert!(first_batch(&r).is_empty());
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let r = ok(&s, "db", doc! {"getMore": id, "collection": "c"}).await;
    let c = r.get_document("cursor").unwrap();
    assert_eq!(
        c.get_array("nextBatch").unwrap(),
        &vec![
            Bson::Document(doc! {"_id": 2}),
            Bson::Document(doc! {"_id": 3})
        ]
    );
    assert_eq!(c.get_i64("id").unwrap(), 0);
    s.shutdown().await;
}

/// A scan is interrupted as it goes: a `find` whose filter matches nothing in a large
/// collection stops at its `maxTimeMS` (50) instead of reading the collection to its end.
#[tokio::test]
async fn a_long_scan_stops_at_its_max_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    for chunk in 0..10 {
        let docs: Vec<bson::Document> = (0..10_000)
            .map(|i| doc! {"_id": chunk * 10_000 + i, "a": 1})
            .collect();
        ok(&s, "db", doc! {"insert": "big", "documents": docs}).await;
    }
    let started = std::time::Instant::now();
    let r = run(
        &s,
        "db",
        doc! {"find": "big", "filter": {"a": 2}, "maxTimeMS": 20},
    )
    .await;
    assert_eq!(r.get_i32("code").ok(), Some(50), "{r}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    s.shutdown().await;
}
