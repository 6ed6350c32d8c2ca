//! A participant of a two-phase commit, driven by hand: what its commit at the coordinator's
//! `commitTimestamp` makes visible, and as of which cluster time.

mod common;

use bson::{Bson, Document, Timestamp, doc};
use common::*;

/// A shard under `dir` whose `bank.accounts` holds `account`.
async fn bank(dir: &std::path::Path, account: Document) -> std::sync::Arc<shard::Shard> {
    let s = open(dir).await;
    ok(
        &s,
        "bank",
        doc! {"insert": "accounts", "documents": [account]},
    )
    .await;
    s
}

fn session() -> Document {
    doc! {
        "lsid": {"id": Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Uuid,
            bytes: vec![7; 16],
        })},
        "txnNumber": 1_i64,
        "autocommit": false,
    }
}

/// Updates account 1 with `u` in the session's transaction and prepares it; returns the
/// prepare time.
async fn update_and_prepare(s: &shard::Shard, u: Document) -> Timestamp {
    let mut update = doc! {
        "update": "accounts",
        "updates": [{"q": {"_id": 1}, "u": u}],
        "startTransaction": true,
    };
    update.extend(session());
    ok(s, "bank", update).await;
    let mut prepare = doc! {"prepareTransaction": 1};
    prepare.extend(session());
    let prepared = ok(s, "admin", prepare).await;
    prepared.get_timestamp("prepareTimestamp").expect("ts")
}

/// Commits the session's prepared transaction at `ts`, as its coordinator would.
async fn commit_at(s: &shard::Shard, ts: Timestamp) {
    let mut commit = doc! {"commitTransaction": 1, "commitTimestamp": ts};
    commit.extend(session());
    ok(s, "admin", commit).await;
}

/// Checks that `task` (a read or write of what the transaction prepared at `p` holds) is still
/// waiting a while later, commits the transaction, and returns what `task` then answers.
async fn after_the_decision<T>(
    s: &shard::Shard,
    p: Timestamp,
    task: tokio::task::JoinHandle<T>,
    what: &str,
) -> T {
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "{what} waits for the decision");
    commit_at(s, p).await;
    task.await.expect("the waiting task")
}

async fn value_as_of(s: &shard::Shard, at: Timestamp) -> i32 {
    let r = ok(
        s,
        "bank",
        doc! {"find": "accounts", "filter": {"_id": 1},
        "readConcern": {"level": "snapshot", "atClusterTime": at}},
    )
    .await;
    first_batch(&r)[0].get_i32("v").expect("v")
}

/// The coordinator's commit time is the highest prepare time of all participants, which may be
/// ahead of this shard's clock. The invariant: this shard's commit entry comes after that time,
/// and a read as of a time before it does not see the transaction here (as it does not on the
/// participant whose prepare set the time).
#[tokio::test]
async fn a_commit_at_a_later_participants_time_is_invisible_before_that_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = bank(dir.path(), doc! {"_id": 1, "v": 0}).await;
    let p = update_and_prepare(&s, doc! {"$set": {"v": 1}}).await;
    // Another participant prepared five ticks later.
    let commit_ts = Timestamp {
        time: p.time,
        increment: p.increment + 5,
    };
    commit_at(&s, commit_ts).await;

    let entry = oplog(&s)
        .await
        .into_iter()
        .find(|e| {
            e.get_document("o")
                .is_ok_and(|o| o.contains_key("commitTransaction"))
        })
        .expect("the commitTransaction entry");
    let entry_ts = entry.get_timestamp("ts").expect("ts");
    assert!(
        (entry_ts.time, entry_ts.increment) > (commit_ts.time, commit_ts.increment),
        "the commit entry {entry_ts:?} comes after the commit time {commit_ts:?}"
    );
    let between = Timestamp {
        time: p.time,
        increment: p.increment + 3,
    };
    assert_eq!(value_as_of(&s, between).await, 0, "as of before the commit");
    assert_eq!(value_as_of(&s, commit_ts).await, 1, "as of the commit");
}

/// A write outside any transaction to a document a prepared transaction holds waits for the
/// decision (as in MongoDB), then applies over the transaction's outcome.
#[tokio::test]
async fn a_plain_write_to_a_prepared_document_waits_for_the_decision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path()).await;
    ok(
        &s,
        "bank",
        doc! {"insert": "accounts", "documents": [{"_id": 1, "v": 0}, {"_id": 2, "v": 0}]},
    )
    .await;
    let p = update_and_prepare(&s, doc! {"$inc": {"v": 10}}).await;
    let plain = {
        let s = s.clone();
        tokio::spawn(async move {
            run(
                &s,
                "bank",
                doc! {"update": "accounts", "updates": [{"q": {}, "u": {"$inc": {"v": 1}}, "multi": true}]},
            )
            .await
        })
    };
    let reply = after_the_decision(&s, p, plain, "the write").await;
    assert!(is_ok(&reply), "{reply}");
    assert_eq!(reply.get_i32("nModified").ok(), Some(2), "{reply}");
    assert!(!reply.contains_key("writeErrors"), "{reply}");
    let docs = find(&s, "bank", "accounts", doc! {}).await;
    let values: Vec<i32> = docs.iter().map(|d| d.get_i32("v").expect("v")).collect();
    assert_eq!(
        values,
        vec![11, 1],
        "applied once each, over the transaction's write"
    );
}

/// A read of the latest state waits only for a prepared transaction that holds a key of what it
/// reads: one on another collection goes on at once.
#[tokio::test]
async fn a_read_waits_only_for_a_prepared_transaction_on_its_collection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = bank(dir.path(), doc! {"_id": 1, "v": 0}).await;
    ok(
        &s,
        "bank",
        doc! {"insert": "audit", "documents": [{"_id": 1}]},
    )
    .await;
    let p = update_and_prepare(&s, doc! {"$inc": {"v": 10}}).await;
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        find(&s, "bank", "audit", doc! {}),
    )
    .await
    .expect("a read of another collection does not wait");
    assert_eq!(other.len(), 1);
    let same = {
        let s = s.clone();
        tokio::spawn(async move { find(&s, "bank", "accounts", doc! {}).await })
    };
    let docs = after_the_decision(&s, p, same, "a read of the prepared collection").await;
    assert_eq!(
        docs[0].get_i32("v").ok(),
        Some(10),
        "it sees the decided transaction"
    );
}

/// Two deliveries of the same decision at once (a coordinator's redelivery racing its first
/// delivery, or a participant's own question answered meanwhile) commit the transaction once:
/// one `commitTransaction` entry, and every delivery that is answered `ok` after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_a_decision_at_once_commit_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = bank(dir.path(), doc! {"_id": 1, "v": 0}).await;
    let p = update_and_prepare(&s, doc! {"$inc": {"v": 1}}).await;
    let mut commit = doc! {"commitTransaction": 1, "commitTimestamp": p, "$db": "admin"};
    commit.extend(session());
    let deliveries = futures::future::join_all((0..8).map(|_| s.run_command(commit.clone()))).await;
    // A delivery that found the commit under way is told to try again (117); once it is
    // durable, every retry is `ok`.
    for reply in &deliveries {
        let code = reply.get_i32("code").ok();
        assert!(
            reply.get_f64("ok").ok() == Some(1.0) || code == Some(117),
            "{reply}"
        );
    }
    assert_eq!(
        ok(&s, "admin", commit.clone()).await.get_f64("ok").ok(),
        Some(1.0)
    );
    let commits = oplog(&s)
        .await
        .into_iter()
        .filter(|e| {
            e.get_document("o")
                .is_ok_and(|o| o.contains_key("commitTransaction"))
        })
        .count();
    assert_eq!(commits, 1, "the decision was applied once");
    let latest = ok(&s, "bank", doc! {"find": "accounts", "filter": {"_id": 1}}).await;
    assert_eq!(first_batch(&latest)[0].get_i32("v").ok(), Some(1));
}

/// A plain write queued right behind a prepare, in the writer's next batch or in the same one,
/// finds the prepared keys held: a prepare lists its keys while its batch runs, not after it
/// was acknowledged (replication's design, "prepared-key race").
#[tokio::test]
async fn a_write_queued_behind_a_prepare_waits_for_the_decision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = bank(dir.path(), doc! {"_id": 1, "v": 0}).await;
    let mut update = doc! {
        "update": "accounts",
        "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 10}}}],
        "startTransaction": true,
    };
    update.extend(session());
    ok(&s, "bank", update).await;

    // Hold the writer, queue the prepare and then the plain write behind it, let it go.
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let gate = {
        let s = s.clone();
        tokio::spawn(async move {
            let job: shard::writer::WriteFn = Box::new(move |_w| {
                let _ = gate_rx.recv_timeout(std::time::Duration::from_secs(10));
                Ok(shard::writer::WriteOutput {
                    reply: doc! {"ok": 1.0},
                    op_time: None,
                })
            });
            s.writer().submit(job).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let prepare = {
        let s = s.clone();
        let mut cmd = doc! {"prepareTransaction": 1};
        cmd.extend(session());
        tokio::spawn(async move { run(&s, "admin", cmd).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let plain = {
        let s = s.clone();
        tokio::spawn(async move {
            run(
                &s,
                "bank",
                doc! {"update": "accounts", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 1}}}]},
            )
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    gate_tx.send(()).expect("the gate job waits");
    gate.await.expect("gate").expect("the gate job");
    let prepared = prepare.await.expect("prepare");
    assert!(is_ok(&prepared), "{prepared}");
    let p = prepared.get_timestamp("prepareTimestamp").expect("ts");

    let reply = after_the_decision(&s, p, plain, "the plain write").await;
    assert!(is_ok(&reply), "{reply}");
    let docs = find(&s, "bank", "accounts", doc! {}).await;
    assert_eq!(
        docs[0].get_i32("v").ok(),
        Some(11),
        "both applied, in order"
    );
}
