//! An ordered batch's two phases on one shard, driven by hand: what its validation answers,
//! what the keys it holds do to other writes, and what its commit writes.

mod common;

use std::time::Duration;

use bson::{Bson, Document, doc};
use common::*;

fn reserve(docs: Vec<Document>) -> Document {
    doc! {"_shardsvrReserveInsert": "c", "documents": docs}
}

fn commit(id: i64, up_to: i64) -> Document {
    doc! {"_shardsvrCommitReservation": id, "upTo": up_to}
}

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect()
}

async fn created(s: &shard::Shard) {
    ok(s, "db", doc! {"create": "c"}).await;
}

#[tokio::test]
async fn validation_stops_at_the_first_failure_and_the_commit_writes_only_what_it_is_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    created(&s).await;
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 3}]}).await;
    let before = s.state().commit_count();
    let r = ok(
        &s,
        "db",
        reserve((1..=5).map(|i| doc! {"_id": i}).collect()),
    )
    .await;
    assert_eq!(
        r.get_i32("n").ok(),
        Some(2),
        "documents 1 and 2 validate: {r}"
    );
    let errors = r.get_array("writeErrors").expect("the failure");
    let e = errors[0].as_document().expect("a write error");
    assert_eq!(e.get_i32("index").ok(), Some(2));
    assert_eq!(e.get_i32("code").ok(), Some(11000));
    assert_eq!(
        s.state().commit_count(),
        before,
        "a validation commits nothing"
    );
    assert!(
        find(&s, "db", "c", doc! {"_id": 1}).await.is_empty(),
        "a validation writes nothing"
    );
    // The router found an earlier failure on another shard: only document 1 goes in.
    let id = r.get_i64("reservation").expect("reservation");
    let done = ok(&s, "db", commit(id, 1)).await;
    assert_eq!(done.get_i32("n").ok(), Some(1));
    assert_eq!(ids(&find(&s, "db", "c", doc! {}).await), vec![1, 3]);
    assert_eq!(s.state().commit_count(), before + 1, "one commit");
    assert_eq!(s.state().reservations.open(), 0, "the commit ends it");
    assert_eq!(
        err_code(&s, "db", commit(id, 1)).await,
        11601,
        "a reservation commits once"
    );
}

#[tokio::test]
async fn a_plain_write_of_a_held_key_waits_for_the_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    created(&s).await;
    let r = ok(&s, "db", reserve(vec![doc! {"_id": 1}, doc! {"_id": 2}])).await;
    let id = r.get_i64("reservation").expect("reservation");
    let racer = {
        let s = s.clone();
        tokio::spawn(async move {
            run(
                &s,
                "db",
                doc! {"insert": "c", "documents": [{"_id": 0, "by": "racer"}, {"_id": 2, "by": "racer"}, {"_id": 9}]},
            )
            .await
        })
    };
    let upsert = {
        let s = s.clone();
        tokio::spawn(async move {
            run(
                &s,
                "db",
                doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"by": "upsert"}}, "upsert": true}]},
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!racer.is_finished(), "an insert of a held key waits");
    assert!(!upsert.is_finished(), "an upsert of a held key waits");
    ok(&s, "db", commit(id, 2)).await;
    let racer = racer.await.expect("racer");
    assert_eq!(
        racer.get_i32("n").ok(),
        Some(1),
        "only _id 0 went in: {racer}"
    );
    let errors = racer.get_array("writeErrors").expect("errors");
    assert_eq!(errors.len(), 1, "ordered: it stops at _id 2: {racer}");
    let e = errors[0].as_document().expect("error");
    assert_eq!(e.get_i32("index").ok(), Some(1));
    assert_eq!(
        e.get_i32("code").ok(),
        Some(11000),
        "the batch's document is there"
    );
    assert!(
        !e.keys().any(|k| k.starts_with('$')),
        "no internal marker: {e}"
    );
    let upsert = upsert.await.expect("upsert");
    assert_eq!(
        upsert.get_i32("nModified").ok(),
        Some(1),
        "it updated the batch's document: {upsert}"
    );
    let docs = find(&s, "db", "c", doc! {}).await;
    assert_eq!(ids(&docs), vec![0, 1, 2]);
    assert_eq!(docs[1].get_str("by").ok(), Some("upsert"));
    assert!(docs[2].get("by").is_none(), "the batch's _id 2 stays");
}

#[tokio::test]
async fn an_unordered_write_reruns_only_its_held_statements_with_their_statement_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    created(&s).await;
    let r = ok(&s, "db", reserve(vec![doc! {"_id": 2}])).await;
    let id = r.get_i64("reservation").expect("reservation");
    let lsid = doc! {"id": Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: vec![9; 16],
    })};
    let cmd = doc! {
        "insert": "c",
        "documents": [{"_id": 1}, {"_id": 2}, {"_id": 3}],
        "ordered": false,
        "lsid": lsid.clone(),
        "txnNumber": 1_i64,
        "stmtIds": [10, 11, 12],
    };
    let racer = {
        let (s, cmd) = (s.clone(), cmd.clone());
        tokio::spawn(async move { run(&s, "db", cmd).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    ok(&s, "db", commit(id, 0)).await; // released: the batch failed elsewhere
    let reply = racer.await.expect("racer");
    assert_eq!(reply.get_i32("n").ok(), Some(3), "{reply}");
    assert!(!reply.contains_key("writeErrors"), "{reply}");
    // The retry of the same statements is answered from the session's record.
    let retried = ok(&s, "db", cmd).await;
    assert_eq!(retried.get_i32("n").ok(), Some(3));
    let ids: Vec<i32> = retried
        .get_array("retriedStmtIds")
        .expect("retried")
        .iter()
        .filter_map(Bson::as_i32)
        .collect();
    assert_eq!(
        ids.len(),
        3,
        "every statement ran once, under its own id: {retried}"
    );
}

#[tokio::test]
async fn a_reservation_never_waits_and_a_transaction_does_not_take_a_held_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    created(&s).await;
    let first = ok(&s, "db", reserve(vec![doc! {"_id": 1}, doc! {"_id": 2}])).await;
    let second = ok(&s, "db", reserve(vec![doc! {"_id": 5}, doc! {"_id": 2}])).await;
    assert_eq!(second.get_i32("n").ok(), Some(1));
    assert_eq!(second.get_i32("heldAt").ok(), Some(1), "{second}");
    let session = doc! {
        "lsid": {"id": Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Uuid,
            bytes: vec![3; 16],
        })},
        "txnNumber": 1_i64,
        "autocommit": false,
    };
    let mut insert = doc! {"insert": "c", "documents": [{"_id": 1}], "startTransaction": true};
    insert.extend(session.clone());
    ok(&s, "db", insert).await;
    let mut commit_txn = doc! {"commitTransaction": 1};
    commit_txn.extend(session);
    assert_eq!(err_code(&s, "admin", commit_txn).await, 112);
    for r in [first, second] {
        let id = r.get_i64("reservation").expect("reservation");
        ok(&s, "db", commit(id, 0)).await;
    }
    assert!(find(&s, "db", "c", doc! {}).await.is_empty());
    assert!(!s.state().reservations.any());
}
