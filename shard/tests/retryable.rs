//! Retryable writes: a retried statement returns its first result and is never applied twice,
//! records survive restarts, old txnNumbers are refused, entries chain through prevOpTime.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bson::{Bson, Document, Uuid, doc};
use common::*;

fn session(lsid: Uuid, txn: i64) -> Document {
    doc! {"lsid": {"id": lsid}, "txnNumber": txn}
}

fn with(mut cmd: Document, extra: Document) -> Document {
    cmd.extend(extra);
    cmd
}

#[tokio::test]
async fn a_retried_insert_is_not_applied_twice_and_entries_chain() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let lsid = Uuid::new();
    let cmd = with(
        doc! {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}]},
        session(lsid, 1),
    );
    let first = ok(&s, "db", cmd.clone()).await;
    assert_eq!(first.get_i32("n").unwrap(), 2);
    let entries_before = oplog(&s).await.len();
    let retry = ok(&s, "db", cmd).await;
    assert_eq!(retry.get_i32("n").unwrap(), 2);
    assert_eq!(
        retry.get_array("retriedStmtIds").unwrap(),
        &vec![Bson::Int32(0), Bson::Int32(1)]
    );
    assert!(!retry.contains_key("writeErrors"));
    assert_eq!(oplog(&s).await.len(), entries_before);
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 2);

    let inserts: Vec<Document> = oplog_for(&s, "db")
        .await
        .into_iter()
        .filter(|e| e.get_str("op").ok() == Some("i"))
        .collect();
    assert_eq!(inserts[0].get_document("lsid").unwrap(), &doc! {"id": lsid});
    assert_eq!(inserts[0].get_i64("txnNumber").unwrap(), 1);
    assert_eq!(inserts[0].get_i32("stmtId").unwrap(), 0);
    assert_eq!(
        inserts[0].get_document("prevOpTime").unwrap(),
        &doc! {"ts": bson::Timestamp{time: 0, increment: 0}, "t": -1_i64}
    );
    assert_eq!(inserts[1].get_i32("stmtId").unwrap(), 1);
    assert_eq!(
        inserts[1]
            .get_document("prevOpTime")
            .unwrap()
            .get_timestamp("ts")
            .unwrap(),
        inserts[0].get_timestamp("ts").unwrap()
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_retried_update_survives_restart_and_old_txn_numbers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let lsid = Uuid::new();
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "n": 0}]},
    )
    .await;
    let cmd = with(
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]},
        session(lsid, 5),
    );
    let first = ok(&s, "db", cmd.clone()).await;
    assert_eq!(first.get_i32("nModified").unwrap(), 1);
    s.shutdown().await;
    drop(s);
    let s = open(dir.path()).await;
    let retry = ok(&s, "db", cmd).await;
    assert_eq!(retry.get_i32("n").unwrap(), 1);
    assert_eq!(retry.get_i32("nModified").unwrap(), 1);
    assert_eq!(
        find(&s, "db", "c", doc! {}).await,
        vec![doc! {"_id": 1, "n": 1}]
    );
    // An older txnNumber on the same session is too old.
    let old = with(
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]},
        session(lsid, 4),
    );
    let r = run(&s, "db", old).await;
    assert_eq!(r.get_i32("code").unwrap(), 225);
    assert_eq!(r.get_str("codeName").unwrap(), "TransactionTooOld");
    // A newer one executes.
    let newer = with(
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]},
        session(lsid, 6),
    );
    ok(&s, "db", newer).await;
    assert_eq!(
        find(&s, "db", "c", doc! {}).await,
        vec![doc! {"_id": 1, "n": 2}]
    );
    // Retryable multi-updates are refused.
    let multi = with(
        doc! {"update": "c", "updates": [{"q": {}, "u": {"$inc": {"n": 1}}, "multi": true}]},
        session(lsid, 7),
    );
    assert_eq!(err_code(&s, "db", multi).await, 72);
    s.shutdown().await;
}

#[tokio::test]
async fn retried_find_and_modify_and_delete_return_the_first_result() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let lsid = Uuid::new();
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "n": 0}, {"_id": 2}]},
    )
    .await;
    let fam = with(
        doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "new": true},
        session(lsid, 1),
    );
    let a = ok(&s, "db", fam.clone()).await;
    let b = ok(&s, "db", fam).await;
    assert_eq!(a.get_document("value").unwrap(), &doc! {"_id": 1, "n": 1});
    assert_eq!(b.get_document("value").unwrap(), &doc! {"_id": 1, "n": 1});
    assert_eq!(
        find(&s, "db", "c", doc! {"_id": 1}).await,
        vec![doc! {"_id": 1, "n": 1}]
    );
    let del = with(
        doc! {"delete": "c", "deletes": [{"q": {"_id": 2}, "limit": 1}]},
        session(lsid, 2),
    );
    let a = ok(&s, "db", del.clone()).await;
    let b = ok(&s, "db", del).await;
    assert_eq!(a.get_i32("n").unwrap(), 1);
    assert_eq!(b.get_i32("n").unwrap(), 1);
    // The explicit stmtIds are honoured.
    let cmd = with(
        doc! {"insert": "c", "documents": [{"_id": 10}], "stmtIds": [42]},
        session(lsid, 3),
    );
    ok(&s, "db", cmd.clone()).await;
    let r = ok(&s, "db", cmd).await;
    assert_eq!(
        r.get_array("retriedStmtIds").unwrap(),
        &vec![Bson::Int32(42)]
    );
    let e = oplog_for(&s, "db").await.pop().unwrap();
    assert_eq!(e.get_i32("stmtId").unwrap(), 42);
    s.shutdown().await;
}

#[tokio::test]
async fn a_session_moves_from_a_retried_insert_to_a_retried_update() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let lsid = Uuid::new();
    let insert = with(
        doc! {"insert": "r", "documents": [{"_id": 1}, {"_id": 2}]},
        session(lsid, 1),
    );
    ok(&s, "db", insert.clone()).await;
    ok(&s, "db", insert).await;
    let update = with(
        doc! {"update": "r", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"x": 1}}}]},
        session(lsid, 2),
    );
    let first = ok(&s, "db", update.clone()).await;
    assert_eq!(first.get_i32("nModified").unwrap(), 1, "{first:?}");
    let again = ok(&s, "db", update).await;
    assert_eq!(again.get_i32("nModified").unwrap(), 1, "{again:?}");
    assert_eq!(
        find(&s, "db", "r", doc! {"_id": 1}).await,
        vec![doc! {"_id": 1, "x": 1}]
    );
    s.shutdown().await;
}

/// A session's record expires with the session (`logicalSessionTimeoutMinutes`, 30 after its
/// last write): a purge deletes it, so a statement sent again after that is a new write, and
/// a record written since stays. Finished transactions are forgotten on the same schedule.
#[tokio::test]
async fn session_records_and_finished_transactions_expire_with_their_session() {
    let (_dir, clock, s) = on_manual_clock().await;
    let (old, recent, txn) = (Uuid::new(), Uuid::new(), Uuid::new());
    let insert = |id: i32, lsid: Uuid| {
        with(
            doc! {"insert": "c", "documents": [{"_id": id}]},
            session(lsid, 1),
        )
    };
    ok(&s, "db", insert(1, old)).await;
    let mut start = with(
        doc! {"insert": "t", "documents": [{"_id": 1}], "startTransaction": true, "autocommit": false},
        session(txn, 1),
    );
    ok(&s, "db", std::mem::take(&mut start)).await;
    ok(
        &s,
        "admin",
        with(
            doc! {"commitTransaction": 1, "autocommit": false},
            session(txn, 1),
        ),
    )
    .await;
    assert_eq!(s.transactions().sessions(), 1);

    clock.advance(20 * 60 * 1000);
    ok(&s, "db", insert(2, recent)).await;
    assert_eq!(
        shard::retryable::purge(s.state(), s.writer())
            .await
            .unwrap(),
        0,
        "nothing is old yet"
    );
    let retried = ok(&s, "db", insert(1, old)).await;
    assert!(retried.contains_key("retriedStmtIds"), "{retried}");

    clock.advance(11 * 60 * 1000);
    // The old session's record and the transaction's, not the recent one's.
    assert_eq!(
        shard::retryable::purge(s.state(), s.writer())
            .await
            .unwrap(),
        2
    );
    let again = run(&s, "db", insert(1, old)).await;
    let errors = again.get_array("writeErrors").unwrap();
    assert_eq!(
        errors[0].as_document().unwrap().get_i32("code").unwrap(),
        11000,
        "sent again after its session expired, the insert is a new write: {again}"
    );
    let kept = ok(&s, "db", insert(2, recent)).await;
    assert!(kept.contains_key("retriedStmtIds"), "{kept}");
    for _ in 0..100 {
        if s.transactions().sessions() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.transactions().sessions(),
        0,
        "the finished transaction is forgotten"
    );
    s.shutdown().await;
}

/// A shard whose wall clock moves only when the test advances it (with its directory).
async fn on_manual_clock() -> (
    tempfile::TempDir,
    std::sync::Arc<shard::ManualClock>,
    std::sync::Arc<shard::Shard>,
) {
    let dir = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(shard::ManualClock::new(1_000_000_000_000));
    let s = shard::Shard::open(options(dir.path(), clock.clone()))
        .await
        .unwrap();
    (dir, clock, s)
}

/// `refreshSessions` keeps a session's retryable-write record alive for another timeout from
/// the refresh, not from its last write; sessions it does not name expire as before.
#[tokio::test]
async fn a_refreshed_session_keeps_its_record_for_another_timeout() {
    let (_dir, clock, s) = on_manual_clock().await;
    let (refreshed, idle) = (Uuid::new(), Uuid::new());
    let insert = |id: i32, lsid: Uuid| {
        with(
            doc! {"insert": "c", "documents": [{"_id": id}]},
            session(lsid, 1),
        )
    };
    ok(&s, "db", insert(1, refreshed)).await;
    ok(&s, "db", insert(2, idle)).await;

    clock.advance(25 * 60 * 1000);
    ok(
        &s,
        "admin",
        doc! {"refreshSessions": [{"id": refreshed}, {"id": Uuid::new()}]},
    )
    .await;
    clock.advance(10 * 60 * 1000);
    // 35 minutes after both writes, 10 after the refresh: only the idle session's record goes.
    assert_eq!(
        shard::retryable::purge(s.state(), s.writer())
            .await
            .unwrap(),
        1
    );
    let kept = ok(&s, "db", insert(1, refreshed)).await;
    assert!(kept.contains_key("retriedStmtIds"), "{kept}");
    let again = run(&s, "db", insert(2, idle)).await;
    assert!(again.contains_key("writeErrors"), "a new write: {again}");

    // The retry above was no write: the record goes 30 minutes after the refresh.
    clock.advance(21 * 60 * 1000);
    assert_eq!(
        shard::retryable::purge(s.state(), s.writer())
            .await
            .unwrap(),
        1
    );

    let refused = run(&s, "admin", doc! {"refreshSessions": [{"uid": 1}]}).await;
    assert_eq!(refused.get_i32("code").unwrap(), 4, "{refused}");
    let refused = run(&s, "admin", doc! {"refreshSessions": 1}).await;
    assert_eq!(refused.get_i32("code").unwrap(), 14, "{refused}");
    s.shutdown().await;
}
