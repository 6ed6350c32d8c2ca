//! Property test: random CRUD sequences against a real shard. Each reply is checked against the
//! state before it (duplicate inserts fail, deletes count what existed), and the invariant change
//! streams rely on holds: replaying the oplog (inserts, `$v: 2` diffs, replacements, deletes)
//! from an empty collection reproduces exactly the collection's final contents, and `ts`
//! strictly increases.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::collections::BTreeMap;

use bson::{Bson, Document, doc};
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(i32, i32),
    Set(i32, String, i32),
    Unset(i32, String),
    Inc(i32, i32),
    Push(i32, i32),
    Pop(i32),
    SetNested(i32, i32),
    Replace(i32, i32),
    Delete(i32),
    UpsertSet(i32, i32),
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..6_i32;
    let field = prop::sample::select(vec!["a".to_string(), "b".into(), "c".into()]);
    prop_oneof![
        (id.clone(), any::<i8>()).prop_map(|(i, v)| Op::Insert(i, v.into())),
        (id.clone(), field.clone(), any::<i8>()).prop_map(|(i, f, v)| Op::Set(i, f, v.into())),
        (id.clone(), field).prop_map(|(i, f)| Op::Unset(i, f)),
        (id.clone(), -3..3_i32).prop_map(|(i, v)| Op::Inc(i, v)),
        (id.clone(), any::<i8>()).prop_map(|(i, v)| Op::Push(i, v.into())),
        id.clone().prop_map(Op::Pop),
        (id.clone(), any::<i8>()).prop_map(|(i, v)| Op::SetNested(i, v.into())),
        (id.clone(), any::<i8>()).prop_map(|(i, v)| Op::Replace(i, v.into())),
        id.clone().prop_map(Op::Delete),
        (id, any::<i8>()).prop_map(|(i, v)| Op::UpsertSet(i, v.into())),
    ]
}

fn update(q: Document, u: Document, upsert: bool) -> Document {
    doc! {"update": "c", "updates": [{"q": q, "u": u, "upsert": upsert}]}
}

fn command(op: &Op) -> Document {
    match op {
        Op::Insert(i, v) => doc! {"insert": "c", "documents": [{"_id": i, "a": v, "arr": [1, 2]}]},
        Op::Set(i, f, v) => update(doc! {"_id": i}, doc! {"$set": {f: v}}, false),
        Op::Unset(i, f) => update(doc! {"_id": i}, doc! {"$unset": {f: 1}}, false),
        Op::Inc(i, v) => update(doc! {"_id": i}, doc! {"$inc": {"n": v}}, false),
        Op::Push(i, v) => update(doc! {"_id": i}, doc! {"$push": {"arr": v}}, false),
        Op::Pop(i) => update(doc! {"_id": i}, doc! {"$pop": {"arr": 1}}, false),
        Op::SetNested(i, v) => update(doc! {"_id": i}, doc! {"$set": {"o.p.q": v}}, false),
        Op::Replace(i, v) => update(doc! {"_id": i}, doc! {"r": v}, false),
        Op::Delete(i) => doc! {"delete": "c", "deletes": [{"q": {"_id": i}, "limit": 1}]},
        Op::UpsertSet(i, v) => update(doc! {"_id": i}, doc! {"$set": {"u": v}}, true),
    }
}

/// Applies the collection's oplog entries to an empty map.
fn replay(entries: &[Document]) -> BTreeMap<i32, Document> {
    let mut m: BTreeMap<i32, Document> = BTreeMap::new();
    for e in entries
        .iter()
        .filter(|e| e.get_str("ns").ok() == Some("db.c"))
    {
        let o = e.get_document("o").unwrap();
        match e.get_str("op").unwrap() {
            "i" => {
                m.insert(o.get_i32("_id").unwrap(), o.clone());
            }
            "u" => {
                let id = e.get_document("o2").unwrap().get_i32("_id").unwrap();
                let cur = m.get(&id).expect("update of a missing document").clone();
                let new = if o.contains_key("$v") {
                    shard::update::apply_diff(&cur, o.get_document("diff").unwrap()).unwrap()
                } else {
                    o.clone()
                };
                m.insert(id, new);
            }
            "d" => {
                m.remove(&o.get_i32("_id").unwrap());
            }
            other => panic!("unexpected op {other}"),
        }
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn oplog_replay_reproduces_the_collection(ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let s = open(dir.path()).await;
            let mut model: BTreeMap<i32, Document> = BTreeMap::new();
            for op in &ops {
                let r = run(&s, "db", command(op)).await;
                assert!(is_ok(&r), "{op:?}: {r:?}");
                // `model` is the collection before this op.
                match op {
                    Op::Insert(i, _) if model.contains_key(i) => {
                        assert!(r.contains_key("writeErrors"), "duplicate insert must fail");
                    }
                    Op::Delete(i) => {
                        assert_eq!(r.get_i32("n").unwrap(), i32::from(model.contains_key(i)));
                    }
                    _ => {}
                }
                model = find(&s, "db", "c", doc! {})
                    .await
                    .into_iter()
                    .map(|d| (d.get_i32("_id").unwrap(), d))
                    .collect();
            }
            let log = oplog(&s).await;
            for w in log.windows(2) {
                assert!(w[0].get_timestamp("ts").unwrap() < w[1].get_timestamp("ts").unwrap());
            }
            let replayed = replay(&log);
            assert_eq!(replayed, model, "oplog replay must equal the collection");
            // Every document has `_id` first.
            for d in model.values() {
                assert_eq!(d.keys().next().map(String::as_str), Some("_id"));
                assert!(matches!(d.get("_id"), Some(Bson::Int32(_))));
            }
            s.shutdown().await;
        });
    }
}
