#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use bson::{Bson, Document, doc};
use proptest::prelude::*;

use super::*;
use crate::changestream::test_util::{coll_spec, ts, uuid, wall};

/// A pseudo-entry of a transaction as `unwind` makes it.
fn op(i: usize, kind: &str, o: Document, o2: Option<Document>) -> Document {
    let mut d = doc! {
        "op": kind, "ns": "db.c", "ui": uuid(1), "o": o,
        "ts": ts(50, 1), "wall": wall(50_000), "lsid": {"id": 1}, "txnNumber": 3_i64,
        "txnOpIndex": i as i64, "applyOpsIndex": i as i64, "applyOpsTs": ts(50, 1),
    };
    if let Some(o2) = o2 {
        d.insert("o2", o2);
    }
    d
}

fn transformer() -> Transformer {
    let mut spec = coll_spec("db", "c");
    spec.options.show_expanded_events = false;
    Transformer::new(&spec)
}

fn kinds(folded: &[Folded]) -> Vec<(String, Bson)> {
    folded
        .iter()
        .map(|f| {
            (
                f.event.operation_type().to_string(),
                f.event
                    .doc
                    .get_document("documentKey")
                    .unwrap()
                    .get("_id")
                    .cloned()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_examples_fold_as_documented() {
    let ops = vec![
        // 1: set twice, one change.
        op(
            0,
            "u",
            doc! {"$v": 2, "diff": {"u": {"a": 1}}},
            Some(doc! {"_id": 1}),
        ),
        op(
            1,
            "u",
            doc! {"$v": 2, "diff": {"u": {"a": 2}, "i": {"b": 1}}},
            Some(doc! {"_id": 1}),
        ),
        // 2: inserted, updated, deleted: nothing.
        op(2, "i", doc! {"_id": 2, "x": 1}, Some(doc! {"_id": 2})),
        op(
            3,
            "u",
            doc! {"$v": 2, "diff": {"u": {"x": 2}}},
            Some(doc! {"_id": 2}),
        ),
        op(4, "d", doc! {"_id": 2}, None),
        // 3: inserted then updated: an insert of the final document.
        op(5, "i", doc! {"_id": 3, "x": 1}, Some(doc! {"_id": 3})),
        op(
            6,
            "u",
            doc! {"$v": 2, "diff": {"u": {"x": 5}}},
            Some(doc! {"_id": 3}),
        ),
        // 4: deleted then inserted again: a replace.
        op(7, "d", doc! {"_id": 4}, None),
        op(8, "i", doc! {"_id": 4, "new": true}, Some(doc! {"_id": 4})),
        // 5: changed and changed back (the shard marked it): nothing.
        {
            let mut d = op(
                9,
                "u",
                doc! {"$v": 2, "diff": {"u": {"a": 9}}},
                Some(doc! {"_id": 5}),
            );
            d.insert(NO_NET_CHANGE, true);
            d
        },
    ];
    let folded = fold(&mut transformer(), &ops).unwrap();
    assert_eq!(
        kinds(&folded),
        [
            ("update".to_string(), Bson::Int32(1)),
            ("insert".to_string(), Bson::Int32(3)),
            ("replace".to_string(), Bson::Int32(4)),
        ]
    );
    let update = &folded[0].event.doc;
    assert_eq!(
        update
            .get_document("updateDescription")
            .unwrap()
            .get_document("updatedFields")
            .unwrap(),
        &doc! {"a": 2, "b": 1}
    );
    assert_eq!(
        folded[1].event.doc.get_document("fullDocument").unwrap(),
        &doc! {"_id": 3, "x": 5}
    );
    assert_eq!(
        folded[2].event.doc.get_document("fullDocument").unwrap(),
        &doc! {"_id": 4, "new": true}
    );
    // Each folded event is its last op's: its place and token.
    assert_eq!(folded[0].event.data.txn_op_index(), 1);
    assert_eq!(folded[1].event.data.txn_op_index(), 6);
    assert_eq!(folded[2].event.data.txn_op_index(), 8);
    // Images come from the document's first op.
    assert_eq!(folded[2].image_op.get_i64("txnOpIndex").unwrap(), 7);
}

#[test]
fn descriptions_compose_path_by_path() {
    let mut c = Composed::default();
    c.then(&doc! {"updatedFields": {"a": {"b": 1, "c": 2}, "x": 1}, "removedFields": ["y"]});
    c.then(&doc! {"updatedFields": {"a.b": 5, "y": 3}, "removedFields": ["x", "a.c"]});
    assert_eq!(
        c.to_document(),
        doc! {"updatedFields": {"a": {"b": 5}, "y": 3}, "removedFields": ["x"], "truncatedArrays": []}
    );
    let mut c = Composed::default();
    c.then(&doc! {"updatedFields": {"a.b": 1, "a.c": 1}, "removedFields": ["a.d"]});
    c.then(&doc! {"updatedFields": {"a": 7}, "removedFields": []});
    assert_eq!(
        c.to_document(),
        doc! {"updatedFields": {"a": 7}, "removedFields": [], "truncatedArrays": []}
    );
}

/// One step of a random transaction on a few documents.
#[derive(Debug, Clone)]
enum Step {
    Insert(i32, i32),
    Set(i32, &'static str, i32),
    Unset(i32, &'static str),
    Replace(i32, i32),
    Delete(i32),
}

fn step() -> impl Strategy<Value = Step> {
    let key = 0..4i32;
    let field = prop_oneof![Just("a"), Just("b"), Just("c")];
    prop_oneof![
        (key.clone(), 0..3i32).prop_map(|(k, v)| Step::Insert(k, v)),
        (key.clone(), field.clone(), 0..3i32).prop_map(|(k, f, v)| Step::Set(k, f, v)),
        (key.clone(), field).prop_map(|(k, f)| Step::Unset(k, f)),
        (key.clone(), 0..3i32).prop_map(|(k, v)| Step::Replace(k, v)),
        key.prop_map(Step::Delete),
    ]
}

/// Runs `steps` on `before` as a shard would (skipping what the state refuses: inserting a
/// present document, changing an absent one), returning the ops it logs and the state after.
fn run(
    before: &BTreeMap<i32, Document>,
    steps: &[Step],
) -> (Vec<Document>, BTreeMap<i32, Document>) {
    let mut state = before.clone();
    let mut ops = Vec::new();
    for s in steps {
        let i = ops.len();
        match *s {
            Step::Insert(k, v) if !state.contains_key(&k) => {
                let d = doc! {"_id": k, "a": v};
                ops.push(op(i, "i", d.clone(), Some(doc! {"_id": k})));
                state.insert(k, d);
            }
            Step::Set(k, f, v) if state.contains_key(&k) => {
                let d = state.get_mut(&k).unwrap();
                let kind = if d.contains_key(f) { "u" } else { "i" };
                d.insert(f, v);
                let diff = doc! {kind: {f: v}};
                ops.push(op(
                    i,
                    "u",
                    doc! {"$v": 2, "diff": diff},
                    Some(doc! {"_id": k}),
                ));
            }
            Step::Unset(k, f) if state.get(&k).is_some_and(|d| d.contains_key(f)) => {
                state.get_mut(&k).unwrap().remove(f);
                let diff = doc! {"d": {f: false}};
                ops.push(op(
                    i,
                    "u",
                    doc! {"$v": 2, "diff": diff},
                    Some(doc! {"_id": k}),
                ));
            }
            Step::Replace(k, v) if state.contains_key(&k) => {
                let d = doc! {"_id": k, "r": v};
                ops.push(op(i, "u", d.clone(), Some(doc! {"_id": k})));
                state.insert(k, d);
            }
            Step::Delete(k) if state.contains_key(&k) => {
                ops.push(op(i, "d", doc! {"_id": k}, None));
                state.remove(&k);
            }
            _ => {}
        }
    }
    // The shard's mark at commit: a document that ends as it began.
    for o in &mut ops {
        let key = match o.get_str("op").unwrap() {
            "d" => o.get_document("o").unwrap().get_i32("_id").unwrap(),
            _ => o.get_document("o2").unwrap().get_i32("_id").unwrap(),
        };
        if before.get(&key) == state.get(&key) {
            o.insert(NO_NET_CHANGE, true);
        }
    }
    (ops, state)
}

/// A document with a folded update's top-level description applied.
fn apply_top_level(before: &Document, description: &Document) -> Document {
    let mut d = before.clone();
    for f in description.get_array("removedFields").unwrap() {
        d.remove(f.as_str().unwrap());
    }
    for (k, v) in description.get_document("updatedFields").unwrap() {
        d.insert(k, v.clone());
    }
    d
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Against a model of the documents: one net event per document the transaction changed
    /// (none for one it left as it was), in the order of their last ops, each taking the
    /// document from where it was to where it is.
    #[test]
    fn a_folded_transaction_is_its_net_effect(
        present in proptest::collection::btree_set(0..4i32, 0..4),
        steps in proptest::collection::vec(step(), 1..16),
    ) {
        let before: BTreeMap<i32, Document> =
            present.into_iter().map(|k| (k, doc! {"_id": k, "a": 0, "b": 0})).collect();
        let (ops, after) = run(&before, &steps);
        let folded = fold(&mut transformer(), &ops).unwrap();
        let changed: Vec<i32> = (0..4).filter(|k| before.get(k) != after.get(k)).collect();
        let mut got: Vec<i32> = folded
            .iter()
            .map(|f| f.event.doc.get_document("documentKey").unwrap().get_i32("_id").unwrap())
            .collect();
        let tokens: Vec<_> = folded.iter().map(|f| f.event.data.txn_op_index()).collect();
        prop_assert!(tokens.windows(2).all(|w| w[0] < w[1]), "in the order of their last ops");
        got.sort_unstable();
        prop_assert_eq!(got, changed);
        for f in &folded {
            let e = &f.event.doc;
            let key = e.get_document("documentKey").unwrap().get_i32("_id").unwrap();
            match (before.get(&key), after.get(&key), f.event.operation_type()) {
                (None, Some(now), "insert") => {
                    prop_assert_eq!(e.get_document("fullDocument").unwrap(), now);
                }
                (Some(_), None, "delete") => {}
                (Some(_), Some(now), "replace") => {
                    prop_assert_eq!(e.get_document("fullDocument").unwrap(), now);
                }
                (Some(was), Some(now), "update") => {
                    let description = e.get_document("updateDescription").unwrap();
                    prop_assert_eq!(&apply_top_level(was, description), now);
                }
                other => prop_assert!(false, "unexpected net event {:?} for {}", other, key),
            }
        }
    }
}
