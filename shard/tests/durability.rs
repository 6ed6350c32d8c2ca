//! Durability and atomicity: restart, group-commit atomicity, injected storage faults, the
//! clock's promise across restarts, and a SIGKILL crash test.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bson::{Bson, doc};
use common::*;
use resume::ClusterTime;
use shard::log::LocalLog;
use shard::storage::{Faults, FaultyStorage, RedbStorage};
use shard::{ManualClock, Shard, ShardOptions};

/// How many insert entries the oplog holds for database `db`.
async fn inserts(s: &Shard) -> usize {
    oplog_for(s, "db")
        .await
        .into_iter()
        .filter(|e| e.get_str("op").ok() == Some("i"))
        .count()
}

fn ts_of(e: &bson::Document) -> ClusterTime {
    ClusterTime::from(e.get_timestamp("ts").unwrap())
}

#[tokio::test]
async fn restart_keeps_documents_catalog_and_oplog() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "a": 1}, {"_id": 2}]},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"a": 1}}}]},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1", "unique": true}]},
    )
    .await;
    let before = oplog(&s).await;
    let uuid_before = first_batch(&ok(&s, "db", doc! {"listCollections": 1}).await)[0].clone();
    s.shutdown().await;
    drop(s);

    let s = open(dir.path()).await;
    assert_eq!(
        find(&s, "db", "c", doc! {}).await,
        vec![doc! {"_id": 1, "a": 2}, doc! {"_id": 2}]
    );
    assert_eq!(oplog(&s).await, before);
    let after = first_batch(&ok(&s, "db", doc! {"listCollections": 1}).await)[0].clone();
    assert_eq!(after, uuid_before);
    let r = ok(&s, "db", doc! {"listIndexes": "c"}).await;
    assert_eq!(first_batch(&r).len(), 2);
    // The unique index is still enforced.
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 3, "a": 2}]},
    )
    .await;
    assert_eq!(
        r.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .get_i32("code")
            .unwrap(),
        11000
    );
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 4, "a": 10}]},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let log = oplog(&s).await;
    assert!(
        ts_of(log.last().unwrap()) > ts_of(before.last().unwrap()),
        "{:?} vs {:?}",
        log.last(),
        before.last()
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_op_in_a_group_commit_batch_leaves_nothing_and_batch_mates_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": "taken"}]},
    )
    .await;
    let commits_before = s.state().commit_count();
    let mut futs = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        let id = if i == 31 {
            Bson::from("taken")
        } else {
            Bson::from(i)
        };
        futs.push(async move {
            run(
                &s,
                "db",
                doc! {"insert": "c", "documents": [{"_id": id, "i": i}]},
            )
            .await
        });
    }
    let replies = futures::future::join_all(futs).await;
    let commits = s.state().commit_count() - commits_before;
    assert!(
        commits < 64,
        "writes must be group-committed ({commits} commits for 64 ops)"
    );
    for (i, r) in replies.iter().enumerate() {
        assert!(is_ok(r));
        if i == 31 {
            assert_eq!(r.get_i32("n").unwrap(), 0);
            assert!(r.contains_key("writeErrors"));
        } else {
            assert_eq!(
                r.get_i32("n").unwrap(),
                1,
                "batch-mate {i} must succeed: {r:?}"
            );
        }
    }
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 64);
    assert!(find(&s, "db", "c", doc! {"i": 31}).await.is_empty());
    assert_eq!(inserts(&s).await, 64);
    s.shutdown().await;
}

#[tokio::test]
async fn a_storage_failure_aborts_the_batch_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::new();
    // The engine shards run on (redb behind its write-ahead log), failing on command.
    let path = dir.path().join("f.redb");
    let redb = Arc::new(RedbStorage::open_behind_log(&path).unwrap());
    let log = LocalLog::open(&path, redb.clone()).unwrap();
    let opts = ShardOptions {
        dbpath: dir.path().to_path_buf(),
        name: "f".into(),
        clock: Arc::new(shard::SystemClock),
    };
    let storage = FaultyStorage::new(redb, faults.clone());
    let s = Shard::open_with_storage(opts.clone(), Arc::new(storage), Arc::new(log))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The second put of the batch (the oplog entry after the catalog entry) fails.
    faults.fail_put_after.store(1, Ordering::SeqCst);
    let r = run(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    assert_eq!(r.get_i32("code").unwrap(), 1, "{r:?}");
    assert!(find(&s, "db", "c", doc! {}).await.is_empty());
    assert!(oplog_for(&s, "db").await.is_empty());
    assert!(first_batch(&ok(&s, "db", doc! {"listCollections": 1}).await).is_empty());
    // A failing commit leaves nothing either, though its write set reached the log first.
    faults.fail_commits.store(true, Ordering::SeqCst);
    let r = run(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1, "failed": true}]},
    )
    .await;
    assert!(!is_ok(&r));
    faults.fail_commits.store(false, Ordering::SeqCst);
    assert!(oplog_for(&s, "db").await.is_empty());
    // Healthy again.
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 1);
    s.shutdown().await;
    drop(s);
    // Replaying the log after a restart does not bring the failed batch back.
    let s = Shard::open(opts).await.unwrap();
    assert_eq!(find(&s, "db", "c", doc! {}).await, vec![doc! {"_id": 1}]);
    assert_eq!(inserts(&s).await, 1);
    s.shutdown().await;
}

#[tokio::test]
async fn the_clock_never_goes_below_a_high_water_mark_given_before_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let opts = options(dir.path(), clock.clone());
    let s = Shard::open(opts.clone()).await.unwrap();
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    // Let the reservation get renewed, then take the highest H we can.
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.advance(900);
    let h = s.high_water_mark();
    s.shutdown().await;
    drop(s);
    // Restart with the wall clock set back by a minute.
    clock.set(1_000_000_000_000 - 60_000);
    let s = Shard::open(opts).await.unwrap();
    let r = ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 2}]}).await;
    let ts = ClusterTime::from(r.get_timestamp("operationTime").unwrap());
    assert!(
        ts > h,
        "first write after restart ({ts}) must be above the old H ({h})"
    );
    assert!(s.cluster_time() > h);
    s.shutdown().await;
}

/// The child side of the crash test: writes until killed, printing what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(dir) = std::env::var("SHARD_CRASH_CHILD_DIR") else {
        return;
    };
    let s = open(std::path::Path::new(&dir)).await;
    let mut tasks = Vec::new();
    for t in 0..4_i64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let id = t * 1_000_000 + i;
                let r = run(
                    &s,
                    "db",
                    doc! {"insert": "c", "documents": [{"_id": id, "pad": "x".repeat(100)}]},
                )
                .await;
                if is_ok(&r) && r.get_i32("n").ok() == Some(1) {
                    let h = s.high_water_mark();
                    println!("ACK {id} {}", h.as_u64());
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("SHARD_CRASH_CHILD_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (acked, max_h) = tokio::task::spawn_blocking(move || {
        let mut acked = Vec::new();
        let mut max_h = 0_u64;
        let start = Instant::now();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut parts = line.split_whitespace();
            if parts.next() == Some("ACK") {
                let id: i64 = parts.next().unwrap().parse().unwrap();
                let h: u64 = parts.next().unwrap().parse().unwrap();
                acked.push(id);
                max_h = max_h.max(h);
            }
            if acked.len() >= 400 || start.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL
        let _ = child.wait();
        (acked, max_h)
    })
    .await
    .unwrap();
    assert!(
        acked.len() >= 100,
        "child acknowledged only {} writes",
        acked.len()
    );

    let s = open(dir.path()).await;
    let docs = find(&s, "db", "c", doc! {}).await;
    let ids: std::collections::HashSet<i64> = docs
        .iter()
        .map(|d| match d.get("_id") {
            Some(Bson::Int64(i)) => *i,
            other => panic!("unexpected _id {other:?}"),
        })
        .collect();
    for id in &acked {
        assert!(ids.contains(id), "acknowledged document {id} lost");
    }
    let log = oplog(&s).await;
    for w in log.windows(2) {
        assert!(
            ts_of(&w[0]) < ts_of(&w[1]),
            "oplog ts must strictly increase"
        );
    }
    // Every document has its oplog entry and vice versa (one atomic commit).
    let inserted = log
        .iter()
        .filter(|e| e.get_str("op").ok() == Some("i"))
        .count();
    assert_eq!(inserted, docs.len());
    let r = ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": -1_i64}]},
    )
    .await;
    let ts = ClusterTime::from(r.get_timestamp("operationTime").unwrap());
    assert!(
        ts.as_u64() > max_h,
        "first write after the crash must be above every high-water mark given out"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn the_oplog_is_truncated_from_the_front_by_size_and_age() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(2_000_000_000_000));
    let opts = options(dir.path(), clock.clone());
    let s = Shard::open(opts.clone()).await.unwrap();
    s.set_oplog_retention(shard::retention::Retention::bytes(4_000));
    insert_padded(&s, 0..100, 50).await;
    let log = oplog(&s).await;
    let stats = s.state().oplog_stats();
    let total: usize = log
        .iter()
        .map(|e| {
            let mut b = Vec::new();
            e.to_writer(&mut b).unwrap();
            b.len()
        })
        .sum();
    assert_eq!(
        stats.bytes as usize, total,
        "the size counter matches storage"
    );
    assert!(total <= 4_000 + 200, "oplog kept {total} bytes");
    let oldest = ts_of(&log[0]);
    assert!(stats.truncated_through > ClusterTime::ZERO);
    assert!(oldest > stats.truncated_through);
    // The newest entries survive and the documents are untouched.
    assert_eq!(
        log.last()
            .unwrap()
            .get_document("o")
            .unwrap()
            .get_i32("_id")
            .unwrap(),
        99
    );
    assert_eq!(find(&s, "db", "c", doc! {}).await.len(), 100);
    // Age: entries older than 10 s go once the clock moves on.
    s.set_oplog_retention(shard::retention::Retention {
        max_bytes: u64::MAX,
        max_age_secs: Some(10),
        min_retention_secs: None,
    });
    clock.advance(60_000);
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1000}]}).await;
    let log = oplog(&s).await;
    assert_eq!(log.len(), 1, "only the fresh entry is younger than 10 s");
    let through = s.state().oplog_truncated_through();
    s.shutdown().await;
    drop(s);
    let s = Shard::open(opts).await.unwrap();
    assert_eq!(
        s.state().oplog_truncated_through(),
        through,
        "the truncation point persists"
    );
    s.shutdown().await;
}

/// `--oplogMinRetentionHours`: an entry younger than the minimum retention is never truncated
/// for size (the oplog outgrows its size meanwhile); once it is older, size truncation takes it.
#[tokio::test]
async fn entries_younger_than_the_minimum_retention_outlive_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(2_000_000_000_000));
    let s = Shard::open(options(dir.path(), clock.clone()))
        .await
        .unwrap();
    // 4 KB, kept at least one hour.
    let mut retention = shard::retention::Retention::from_flags(0, 1.0);
    retention.max_bytes = 4_000;
    assert_eq!(retention.min_retention_secs, Some(3_600));
    s.set_oplog_retention(retention);
    insert_padded(&s, 0..100, 50).await;
    let inserts = |log: Vec<bson::Document>| {
        log.iter()
            .filter(|e| e.get_str("op").ok() == Some("i"))
            .count()
    };
    assert_eq!(
        inserts(oplog_for(&s, "db").await),
        100,
        "every entry is younger than an hour: none truncated"
    );
    assert!(s.state().oplog_stats().bytes > 4_000);
    assert_eq!(s.state().oplog_truncated_through(), ClusterTime::ZERO);
    // Two hours later, the next write truncates for size again.
    clock.advance(2 * 3_600 * 1_000);
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 1000}]}).await;
    assert!(inserts(oplog_for(&s, "db").await) < 100);
    assert!(s.state().oplog_stats().bytes <= 4_000 + 200);
    assert!(s.state().oplog_truncated_through() > ClusterTime::ZERO);
    s.shutdown().await;
}
