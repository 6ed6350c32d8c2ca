//! Helpers shared by the shard's integration tests: a shard on a temporary redb file and
//! command shorthands.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use bson::{Bson, Document, doc};
use shard::{Shard, ShardOptions, SystemClock};

pub async fn open(dir: &Path) -> Arc<Shard> {
    Shard::open(ShardOptions {
        dbpath: dir.to_path_buf(),
        name: "shard0".into(),
        clock: Arc::new(SystemClock),
    })
    .await
    .expect("open shard")
}

/// The options of a shard named `shard0` under `dir`, timed by `clock`.
pub fn options(dir: &Path, clock: Arc<dyn shard::Clock>) -> ShardOptions {
    ShardOptions {
        dbpath: dir.to_path_buf(),
        name: "shard0".into(),
        clock,
    }
}

/// Inserts `{_id: i, pad}` into `db.c` for each `i`, one insert each, with `pad_len` bytes of
/// filler (to grow the oplog).
pub async fn insert_padded(s: &Shard, ids: std::ops::Range<i32>, pad_len: usize) {
    for i in ids {
        ok(
            s,
            "db",
            doc! {"insert": "c", "documents": [{"_id": i, "pad": "x".repeat(pad_len)}]},
        )
        .await;
    }
}

pub async fn run(s: &Shard, db: &str, mut cmd: Document) -> Document {
    cmd.insert("$db", db);
    s.run_command(cmd).await
}

pub fn is_ok(r: &Document) -> bool {
    matches!(r.get("ok"), Some(Bson::Double(v)) if *v == 1.0)
}

/// Runs a command and asserts `ok: 1`.
pub async fn ok(s: &Shard, db: &str, cmd: Document) -> Document {
    let r = run(s, db, cmd.clone()).await;
    assert!(is_ok(&r), "command {cmd:?} failed: {r:?}");
    r
}

/// Runs a command and returns its error code (asserting it failed).
pub async fn err_code(s: &Shard, db: &str, cmd: Document) -> i32 {
    let r = run(s, db, cmd.clone()).await;
    assert!(!is_ok(&r), "command {cmd:?} should fail: {r:?}");
    r.get_i32("code").expect("code")
}

pub fn first_batch(r: &Document) -> Vec<Document> {
    r.get_document("cursor")
        .expect("cursor")
        .get_array("firstBatch")
        .expect("firstBatch")
        .iter()
        .map(|b| b.as_document().expect("doc").clone())
        .collect()
}

pub async fn find(s: &Shard, db: &str, coll: &str, filter: Document) -> Vec<Document> {
    let r = ok(
        s,
        db,
        doc! {"find": coll, "filter": filter, "batchSize": 100_000},
    )
    .await;
    first_batch(&r)
}

/// The whole oplog, oldest first.
pub async fn oplog(s: &Shard) -> Vec<Document> {
    let r = ok(
        s,
        "local",
        doc! {"find": "oplog.rs", "filter": {}, "batchSize": 1_000_000},
    )
    .await;
    first_batch(&r)
}

/// Oplog entries that are not housekeeping, for `ns` (CRUD) or `<db>.$cmd` (DDL).
pub async fn oplog_for(s: &Shard, db: &str) -> Vec<Document> {
    oplog(s)
        .await
        .into_iter()
        .filter(|e| {
            e.get_str("ns")
                .is_ok_and(|ns| ns.starts_with(&format!("{db}.")))
        })
        .collect()
}
