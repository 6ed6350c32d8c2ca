use std::collections::HashMap;

use bson::{Bson, Document, doc};

use super::*;
use crate::changestream::test_util::*;

fn op(ns: &str, id: i32) -> Document {
    doc! {"op": "i", "ns": ns, "ui": uuid(1), "o": {"_id": id}, "o2": {"_id": id}}
}

fn apply_ops(secs: u32, ops: Vec<Document>, prev: Option<u32>, extra: Document) -> Document {
    let mut o = doc! {"applyOps": ops};
    o.extend(extra);
    let prev = match prev {
        Some(p) => doc! {"ts": ts(p, 1), "t": 1_i64},
        None => doc! {"ts": ts(0, 0), "t": -1_i64},
    };
    doc! {"ts": ts(secs, 1), "t": 1_i64, "op": "c", "ns": "admin.$cmd", "o": o,
    "lsid": {"id": uuid(9)}, "txnNumber": 7_i64, "prevOpTime": prev, "wall": wall(i64::from(secs))}
}

fn oplog(entries: &[Document]) -> HashMap<OpTime, Document> {
    entries
        .iter()
        .map(|e| {
            let Some(Bson::Timestamp(t)) = e.get("ts") else {
                panic!()
            };
            (
                OpTime {
                    ts: ClusterTime::from(*t),
                    term: 1,
                },
                e.clone(),
            )
        })
        .collect()
}

fn ids(out: &[Document]) -> Vec<(i32, i64, i64)> {
    out.iter()
        .map(|d| {
            (
                d.get_document("o").unwrap().get_i32("_id").unwrap(),
                d.get_i64("txnOpIndex").unwrap(),
                d.get_i64("applyOpsIndex").unwrap(),
            )
        })
        .collect()
}

#[test]
fn small_transaction_stamps_every_op_and_counts_filtered_ones() {
    let e = apply_ops(
        20,
        vec![op("db.c", 1), op("db.x", 2), op("db.c", 3)],
        None,
        doc! {},
    );
    let out = unwind(&coll_spec("db", "c"), &e, &mut |_| None).unwrap();
    assert_eq!(ids(&out), [(1, 0, 0), (3, 2, 2)]);
    for d in &out {
        assert_eq!(d.get("ts"), Some(&ts(20, 1)));
        assert_eq!(d.get("wall"), Some(&wall(20)));
        assert_eq!(d.get_i64("txnNumber").unwrap(), 7);
        assert_eq!(d.get_document("lsid").unwrap(), &doc! {"id": uuid(9)});
        assert_eq!(d.get("applyOpsTs"), Some(&ts(20, 1)));
    }
}

#[test]
fn large_transaction_replays_the_chain_oldest_first() {
    let first = apply_ops(
        10,
        vec![op("db.c", 1), op("db.c", 2)],
        None,
        doc! {"partialTxn": true},
    );
    let second = apply_ops(11, vec![op("db.x", 3)], Some(10), doc! {"partialTxn": true});
    let last = apply_ops(12, vec![op("db.c", 4)], Some(11), doc! {"count": 4});
    let log = oplog(&[first, second]);
    let out = unwind(&coll_spec("db", "c"), &last, &mut |at| {
        log.get(&at).cloned()
    })
    .unwrap();
    assert_eq!(ids(&out), [(1, 0, 0), (2, 1, 1), (4, 3, 0)]);
    let apply_ts: Vec<&Bson> = out.iter().map(|d| d.get("applyOpsTs").unwrap()).collect();
    assert_eq!(apply_ts, [&ts(10, 1), &ts(10, 1), &ts(12, 1)]);
    assert!(out.iter().all(|d| d.get("ts") == Some(&ts(12, 1))));
}

#[test]
fn prepared_transaction_is_stamped_with_the_commit_entry() {
    let prepare = apply_ops(
        10,
        vec![op("db.c", 1), op("db.c", 2)],
        None,
        doc! {"prepare": true},
    );
    let mut commit = cmd(
        "admin",
        15,
        doc! {"commitTransaction": 1, "commitTimestamp": ts(13, 1)},
    );
    commit.remove("ui");
    commit.insert("lsid", doc! {"id": uuid(9)});
    commit.insert("txnNumber", 7_i64);
    commit.insert("prevOpTime", doc! {"ts": ts(10, 1), "t": 1_i64});
    let log = oplog(&[prepare]);
    let out = unwind(&coll_spec("db", "c"), &commit, &mut |at| {
        log.get(&at).cloned()
    })
    .unwrap();
    assert_eq!(ids(&out), [(1, 0, 0), (2, 1, 1)]);
    for d in &out {
        assert_eq!(d.get("ts"), Some(&ts(15, 1)));
        assert_eq!(d.get("commitTimestamp"), Some(&ts(13, 1)));
        assert_eq!(d.get("applyOpsTs"), Some(&ts(10, 1)));
    }
}

#[test]
fn missing_chain_link_is_history_lost() {
    let last = apply_ops(12, vec![op("db.c", 4)], Some(11), doc! {});
    let err = unwind(&coll_spec("db", "c"), &last, &mut |_| None).unwrap_err();
    assert_eq!(err.code, 286);
    assert!(err.has_label("NonResumableChangeStreamError"));
    let mut commit = cmd("admin", 15, doc! {"commitTransaction": 1});
    commit.insert("prevOpTime", doc! {"ts": ts(10, 1), "t": 1_i64});
    assert_eq!(
        unwind(&coll_spec("db", "c"), &commit, &mut |_| None)
            .unwrap_err()
            .code,
        286
    );
}

#[test]
fn a_chain_that_loops_fails_instead_of_spinning() {
    let last = apply_ops(12, vec![op("db.c", 4)], Some(11), doc! {});
    // The "previous" entry claims to follow itself.
    let looping = apply_ops(11, vec![op("db.c", 1)], Some(11), doc! {"partialTxn": true});
    let err = unwind(&coll_spec("db", "c"), &last, &mut |_| Some(looping.clone())).unwrap_err();
    assert_eq!(err.code, 286);
}

#[test]
fn batched_writes_without_lsid_carry_none() {
    let mut e = apply_ops(20, vec![op("db.c", 1)], None, doc! {"multiOpType": 1});
    e.remove("lsid");
    e.remove("txnNumber");
    let out = unwind(&coll_spec("db", "c"), &e, &mut |_| None).unwrap();
    assert_eq!(out.len(), 1);
    assert!(
        out.iter()
            .all(|d| !d.contains_key("lsid") && !d.contains_key("txnNumber"))
    );
}

#[test]
fn inner_migrated_ops_are_dropped() {
    let mut migrated = op("db.c", 2);
    migrated.insert("fromMigrate", true);
    let e = apply_ops(20, vec![op("db.c", 1), migrated], None, doc! {});
    assert_eq!(
        ids(&unwind(&coll_spec("db", "c"), &e, &mut |_| None).unwrap()),
        [(1, 0, 0)]
    );
}
