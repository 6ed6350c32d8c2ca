//! The write path's replay property (house.md §7): the write sets a shard's log received,
//! applied in order to an empty store, give the shard's tables byte for byte. A random
//! workload runs against a shard whose log keeps a copy of every set it made durable (and
//! drops the ones retracted); nothing of the shard's state may come from anywhere else, so a
//! write that bypassed the writer, or an observer that wrote, fails the comparison. It is also
//! the first follower test: a replica applies exactly these sets.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::sync::{Arc, Mutex};

use bson::{Bson, Document, doc};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shard::log::{Appended, Log, Unlogged, WriteSet};
use shard::storage::{KeyRange, RedbStorage, Scan, Storage, StorageResult, Table};
use shard::{Shard, ShardOptions, SystemClock};

/// A log that keeps every appended set until it is retracted (over an engine whose own
/// commits are durable, so it need not write anything).
#[derive(Default)]
struct Copying {
    sets: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl Log for Copying {
    fn write_set(&self, promise: resume::ClusterTime) -> WriteSet {
        Unlogged.write_set(promise)
    }

    fn append(&self, set: &mut WriteSet) -> StorageResult<Appended> {
        let mut sets = self.sets.lock().unwrap();
        let at = sets.len() as u64;
        sets.push((at, set.encoded().to_vec()));
        Ok(Appended { at, len: 1 })
    }

    fn retract(&self, appended: Appended) {
        self.sets
            .lock()
            .unwrap()
            .retain(|(at, _)| *at != appended.at);
    }

    fn applied(&self, _appended: Appended) {}
}

/// Every key and value of every table.
fn dump(storage: &dyn Storage) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
    let read = storage.begin_read().unwrap();
    let mut rows = Vec::new();
    for table in Table::ALL {
        read.scan(table, &KeyRange::all(), false, &mut |k, v| {
            rows.push((table, k.to_vec(), v.to_vec()));
            Scan::Continue
        })
        .unwrap();
    }
    rows
}

fn session(lsid: u8, txn_number: i64) -> Document {
    doc! {
        "lsid": {"id": Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Uuid,
            bytes: vec![lsid; 16],
        })},
        "txnNumber": txn_number,
    }
}

/// One random command of the workload (against `db.c`, whose `_id`s are 0..50).
fn random_command(rng: &mut StdRng, step: i64) -> (&'static str, Document) {
    let id = rng.random_range(0..50);
    let n = rng.random_range(0..1000);
    match rng.random_range(0..10) {
        0..=2 => (
            "db",
            doc! {"insert": "c", "ordered": false, "documents": [
                {"_id": id, "n": n, "tag": format!("t{}", n % 7), "a": [n, n + 1]},
                {"_id": id + 1000, "n": n},
            ]},
        ),
        3 => (
            "db",
            doc! {"update": "c", "updates": [
                {"q": {"_id": id}, "u": {"$inc": {"n": 1}, "$set": {"s": step}}, "upsert": true},
            ]},
        ),
        4 => (
            "db",
            doc! {"update": "c", "updates": [
                {"q": {"n": {"$lt": n}}, "u": {"$unset": {"tag": ""}}, "multi": true},
            ]},
        ),
        5 => (
            "db",
            doc! {"delete": "c", "deletes": [{"q": {"_id": {"$lt": id}}, "limit": 0}]},
        ),
        6 => (
            "db",
            doc! {"findAndModify": "c", "query": {"_id": id},
            "update": {"_id": id, "replaced": step}, "upsert": true, "new": true},
        ),
        7 => {
            // A retryable write: its session record is stored with it.
            let mut cmd = doc! {"insert": "r", "documents": [{"_id": step}]};
            cmd.extend(session(id as u8, step));
            ("db", cmd)
        }
        8 => (
            "db",
            doc! {"insert": "p", "documents": [{"_id": step, "n": n}]},
        ),
        _ => (
            "db",
            doc! {"update": "p", "updates": [{"q": {}, "u": {"$inc": {"n": 1}}, "multi": true}]},
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_workloads_write_sets_replayed_on_an_empty_store_give_the_same_tables() {
    let seed: u64 = std::env::var("REPLAY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("REPLAY_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(RedbStorage::open(&dir.path().join("leader.redb")).unwrap());
    let log = Arc::new(Copying::default());
    let opts = ShardOptions {
        dbpath: dir.path().to_path_buf(),
        name: "leader".into(),
        clock: Arc::new(SystemClock),
    };
    let s: Arc<Shard> = Shard::open_with_storage(opts, storage.clone(), log.clone())
        .await
        .unwrap();
    ok(
        &s,
        "db",
        doc! {"createIndexes": "c", "indexes": [
            {"key": {"tag": 1}, "name": "tag_1"},
            {"key": {"a": 1}, "name": "a_1"},
            {"key": {"replaced": 1}, "name": "replaced_1", "unique": true, "sparse": true},
        ]},
    )
    .await;
    ok(
        &s,
        "db",
        doc! {"create": "p", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    // Rounds of concurrent commands, so the writer group-commits several jobs per batch;
    // some fail (duplicate keys), which must leave nothing in any set.
    for round in 0..40_i64 {
        let mut tasks = Vec::new();
        for k in 0..8 {
            let (db, cmd) = random_command(&mut rng, round * 8 + k);
            let s = s.clone();
            tasks.push(tokio::spawn(async move { run(&s, db, cmd).await }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    // A multi-document transaction and DDL.
    let mut start = doc! {"insert": "t", "documents": [{"_id": 1}, {"_id": 2}],
    "startTransaction": true, "autocommit": false};
    start.extend(session(200, 1));
    ok(&s, "db", start).await;
    let mut commit = doc! {"commitTransaction": 1, "autocommit": false};
    commit.extend(session(200, 1));
    ok(&s, "admin", commit).await;
    ok(&s, "db", doc! {"dropIndexes": "c", "index": "tag_1"}).await;
    ok(&s, "db", doc! {"drop": "p"}).await;
    let written = dump(&*storage);
    s.shutdown().await;

    let sets = log.sets.lock().unwrap().clone();
    let replica = RedbStorage::open(&dir.path().join("replica.redb")).unwrap();
    for (_, bytes) in &sets {
        let set = WriteSet::decode(bytes).unwrap();
        let mut txn = replica.begin_write().unwrap();
        shard::log::replay(&mut *txn, &set).unwrap();
        txn.commit().unwrap();
    }
    let replayed = dump(&replica);
    // The workload left something in every table but two: no transaction is prepared at its
    // end, and the pre-images went with their collection's drop.
    let tables: std::collections::BTreeSet<Table> = written.iter().map(|r| r.0).collect();
    for t in Table::ALL {
        let kept = !matches!(t, Table::Transactions | Table::PreImages);
        assert!(
            !kept || tables.contains(&t),
            "the workload left nothing in {t:?}"
        );
    }
    assert!(sets.len() > 40, "only {} batches", sets.len());
    assert_eq!(
        written.len(),
        replayed.len(),
        "row counts differ (seed {seed})"
    );
    for (w, r) in written.iter().zip(&replayed) {
        assert_eq!(w, r, "first differing row (seed {seed})");
    }
}
