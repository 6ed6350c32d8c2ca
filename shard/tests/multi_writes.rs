//! Multi-document updates and deletes run in bounded batches (`write::batches`): every
//! match is written exactly once, and other writes go in between the batches.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bson::{Bson, Document, doc};
use common::*;

/// More than two batches' worth.
const DOCS: i32 = 1_200;

async fn numbers(s: &shard::Shard) {
    let docs: Vec<Document> = (0..DOCS).map(|i| doc! {"_id": i, "a": i}).collect();
    ok(s, "db", doc! {"insert": "c", "documents": docs}).await;
}

/// An update that moves every document ahead of the index scan it runs on (the Halloween
/// problem) still updates each exactly once.
#[tokio::test]
async fn a_multi_update_that_moves_documents_along_its_index_updates_each_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    numbers(&s).await;
    ok(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]},
    )
    .await;
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [
            {"q": {"a": {"$gte": 0}}, "u": {"$inc": {"a": 100_000}}, "multi": true, "hint": "a_1"},
        ]},
    )
    .await;
    assert_eq!(r.get_i32("n").ok(), Some(DOCS), "{r}");
    assert_eq!(r.get_i32("nModified").ok(), Some(DOCS), "{r}");
    let docs = find(&s, "db", "c", doc! {}).await;
    assert_eq!(docs.len(), DOCS as usize);
    for d in docs {
        let id = d.get_i32("_id").expect("_id");
        assert_eq!(d.get_i32("a").ok(), Some(id + 100_000), "{d}");
    }
}

#[tokio::test]
async fn a_multi_delete_larger_than_a_batch_deletes_every_match_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    numbers(&s).await;
    let r = ok(
        &s,
        "db",
        doc! {"delete": "c", "deletes": [{"q": {"a": {"$mod": [3, 0]}}, "limit": 0}]},
    )
    .await;
    assert_eq!(r.get_i32("n").ok(), Some(DOCS / 3), "{r}");
    let left = find(&s, "db", "c", doc! {}).await;
    assert_eq!(left.len(), (DOCS - DOCS / 3) as usize);
    assert!(left.iter().all(|d| d.get_i32("a").expect("a") % 3 != 0));
}

/// The writer is not held for a whole multi statement: single inserts sent while it runs are
/// committed between its batches.
#[tokio::test]
async fn other_writes_are_committed_between_the_batches_of_a_multi_update() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    numbers(&s).await;
    let done = Arc::new(AtomicBool::new(false));
    let inserter = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                ok(
                    &s,
                    "db",
                    doc! {"insert": "other", "documents": [{"_id": i}]},
                )
                .await;
                i += 1;
            }
        })
    };
    // Let the inserter start.
    while find(&s, "db", "other", doc! {}).await.is_empty() {
        tokio::task::yield_now().await;
    }
    let r = ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"b": 1}}, "multi": true}]},
    )
    .await;
    done.store(true, Ordering::Relaxed);
    inserter.await.expect("inserter");
    assert_eq!(r.get_i32("nModified").ok(), Some(DOCS), "{r}");

    let ts = |e: &Document| {
        let t = e.get_timestamp("ts").expect("ts");
        (t.time, t.increment)
    };
    let entries = oplog(&s).await;
    let updates: Vec<_> = entries
        .iter()
        .filter(|e| e.get_str("op").ok() == Some("u"))
        .map(ts)
        .collect();
    let (first, last) = (updates[0], updates[updates.len() - 1]);
    let between = entries
        .iter()
        .filter(|e| e.get_str("op").ok() == Some("i") && e.get_str("ns").ok() == Some("db.other"))
        .map(ts)
        .filter(|t| (first..last).contains(t))
        .count();
    assert!(
        between > 0,
        "an insert is committed between the update's first and last batch"
    );
}

/// A multi update whose later batch meets a document held by a prepared transaction keeps
/// what its earlier batches wrote, waits for the decision and goes on from that document:
/// every document is updated exactly once.
#[tokio::test]
async fn a_multi_update_meeting_a_prepared_document_after_its_first_batch_waits_and_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    numbers(&s).await;
    let session = doc! {
        "lsid": {"id": Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Uuid,
            bytes: vec![9; 16],
        })},
        "txnNumber": 1_i64,
        "autocommit": false,
    };
    let held = DOCS - 10;
    let mut update = doc! {
        "update": "c",
        "updates": [{"q": {"_id": held}, "u": {"$set": {"t": 1}}}],
        "startTransaction": true,
    };
    update.extend(session.clone());
    ok(&s, "db", update).await;
    let mut prepare = doc! {"prepareTransaction": 1};
    prepare.extend(session.clone());
    let p = ok(&s, "admin", prepare).await;
    let prepared = p.get_timestamp("prepareTimestamp").expect("ts");

    let many = {
        let s = s.clone();
        tokio::spawn(async move {
            run(
                &s,
                "db",
                doc! {"update": "c", "updates": [{"q": {}, "u": {"$inc": {"a": 1}}, "multi": true}]},
            )
            .await
        })
    };
    // The documents before the held one are committed while the statement waits there
    // (the collection's reads wait for the decision; the oplog's do not).
    let mut written = 0;
    for _ in 0..200 {
        written = oplog(&s)
            .await
            .iter()
            .filter(|e| e.get_str("op").ok() == Some("u") && e.get_str("ns").ok() == Some("db.c"))
            .count();
        if written >= held as usize {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        written, held as usize,
        "every document before the held one is committed before the decision"
    );
    assert!(!many.is_finished(), "the statement waits for the decision");

    let mut commit = doc! {"commitTransaction": 1, "commitTimestamp": prepared};
    commit.extend(session);
    ok(&s, "admin", commit).await;
    let r = many.await.expect("the multi update");
    assert!(is_ok(&r), "{r}");
    assert_eq!(r.get_i32("nModified").ok(), Some(DOCS), "{r}");
    assert!(!r.contains_key("writeErrors"), "{r}");
    for d in find(&s, "db", "c", doc! {}).await {
        let id = d.get_i32("_id").expect("_id");
        assert_eq!(d.get_i32("a").ok(), Some(id + 1), "once each: {d}");
        assert_eq!(d.contains_key("t"), id == held, "{d}");
    }
}
