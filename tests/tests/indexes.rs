//! Secondary indexes through the `mongodb` driver: every index kind answers exactly what a
//! collection scan answers (the planner's bounds are a superset, the filter decides), on
//! random documents with arrays, missing fields and mixed types, before and after updates
//! and deletes; `explain` shows the plan chosen for typical queries; `hint` forces an index
//! or is refused; unique, multikey and parallel-array rules; TTL expiry with delete events;
//! the shard-key-prefix rule for unique indexes on sharded collections.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{Bson, Document, doc};
use rand::{Rng, SeedableRng};
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

async fn ids(
    coll: &mongodb::Collection<Document>,
    filter: Document,
    hint: Option<Document>,
) -> anyhow::Result<Vec<Bson>> {
    let mut find = coll.find(filter).sort(doc! {"_id": 1});
    if let Some(h) = hint {
        find = find.hint(mongodb::options::Hint::Keys(h));
    }
    let docs: Vec<Document> = find.await?.try_collect().await?;
    Ok(docs
        .into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect())
}

fn random_value(rng: &mut rand::rngs::StdRng) -> Option<Bson> {
    Some(match rng.random_range(0..10) {
        0 => return None,
        1 => Bson::Null,
        2 => Bson::String(format!("s{}", rng.random_range(0..5))),
        3 => Bson::Array(
            (0..rng.random_range(0..3))
                .map(|_| Bson::Int32(rng.random_range(0..6)))
                .collect(),
        ),
        4 => Bson::Double(rng.random_range(0..12) as f64 / 2.0),
        5 => Bson::Int64(rng.random_range(0..6)),
        _ => Bson::Int32(rng.random_range(0..6)),
    })
}

/// The root of the winning plan's per-shard tree, for an unsharded collection.
fn shard_plan(explain: &Document) -> Document {
    let planner = explain.get_document("queryPlanner").expect("present");
    let winning = planner.get_document("winningPlan").expect("present");
    match winning.get_array("shards") {
        Ok(shards) => shards[0]
            .as_document()
            .and_then(|s| s.get_document("winningPlan").ok())
            .cloned()
            .unwrap_or_default(),
        Err(_) => winning.clone(),
    }
}

/// The stages of a plan tree, outermost first.
fn stages(mut plan: Document) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        out.push(plan.get_str("stage").unwrap_or("?").to_string());
        match plan.get_document("inputStage") {
            Ok(inner) => plan = inner.clone(),
            Err(_) => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_index_kind_answers_what_a_scan_answers() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("items");
    db.run_command(doc! {"createIndexes": "items", "indexes": [
        {"key": {"a": 1}, "name": "a_1"},
        {"key": {"b": -1, "a": 1}, "name": "b_-1_a_1"},
        {"key": {"c": 1}, "name": "c_sparse", "sparse": true},
        {"key": {"b": 1}, "name": "b_partial", "partialFilterExpression": {"p": true}},
        {"key": {"s": "hashed"}, "name": "s_hashed"},
        {"key": {"n.x": 1}, "name": "n.x_1"},
    ]})
    .await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut docs = Vec::new();
    for i in 0..400 {
        let mut d = doc! {"_id": i};
        for f in ["a", "c"] {
            if let Some(v) = random_value(&mut rng) {
                d.insert(f, v);
            }
        }
        // b is never an array: `b_-1_a_1` holds a and b, and parallel arrays are refused.
        if let Some(v) = random_value(&mut rng).filter(|v| !matches!(v, Bson::Array(_))) {
            d.insert("b", v);
        }
        if rng.random_bool(0.5) {
            d.insert("p", true);
        }
        d.insert("s", format!("k{}", rng.random_range(0..8)));
        d.insert("n", vec![doc! {"x": rng.random_range(0..4)}, doc! {"y": 1}]);
        docs.push(d);
    }
    coll.insert_many(docs).await?;
    let filters = vec![
        doc! {"a": 3},
        doc! {"a": null},
        doc! {"a": {"$gt": 2}},
        doc! {"a": {"$gte": 1.5, "$lt": 4}},
        doc! {"a": {"$in": [1, "s2", null]}},
        doc! {"a": {"$lte": "s3"}},
        doc! {"b": 2, "a": {"$gt": 1}},
        doc! {"b": {"$in": [1, 2]}, "a": 3},
        doc! {"c": {"$gte": 2}},
        doc! {"c": 4},
        doc! {"b": 3, "p": true},
        doc! {"s": "k3"},
        doc! {"s": {"$in": ["k1", "k5"]}},
        doc! {"n.x": 2},
        doc! {"n.x": null},
        doc! {"$and": [{"a": {"$gt": 1}}, {"a": {"$lt": 5}}]},
        doc! {"_id": {"$gte": 100, "$lt": 120}},
        doc! {"_id": {"$in": [5, 7, 900]}},
    ];
    let check = |round: &'static str| {
        let coll = coll.clone();
        let filters = filters.clone();
        async move {
            for f in filters {
                let planned = ids(&coll, f.clone(), None).await?;
                let scanned = ids(&coll, f.clone(), Some(doc! {"$natural": 1})).await?;
                assert_eq!(planned, scanned, "{round}: filter {f}");
                let n = coll.count_documents(f.clone()).await?;
                assert_eq!(n as usize, scanned.len(), "{round}: count {f}");
            }
            anyhow::Ok(())
        }
    };
    check("after insert").await?;
    coll.update_many(
        doc! {"a": {"$gte": 3}},
        doc! {"$set": {"a": 9, "c": [1, 2]}},
    )
    .await?;
    coll.update_many(
        doc! {"b": 2},
        doc! {"$unset": {"b": 1}, "$set": {"p": true}},
    )
    .await?;
    coll.delete_many(doc! {"s": "k4"}).await?;
    coll.replace_one(doc! {"_id": 3}, doc! {"a": [5, 6], "c": null})
        .await?;
    check("after writes").await?;
    // The indexes hold exactly the documents' entries.
    let v = db.run_command(doc! {"validate": "items"}).await?;
    assert!(v.get_bool("valid").unwrap_or(false), "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_plan_and_hint_forces_or_refuses() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("plans");
    coll.insert_many((0..50).map(|i| doc! {"_id": i, "a": i % 10, "b": i}))
        .await?;
    db.run_command(doc! {"createIndexes": "plans", "indexes": [
        {"key": {"a": 1, "b": -1}, "name": "a_1_b_-1"},
    ]})
    .await?;
    let explain = |filter: Document, extra: Document| {
        let db = db.clone();
        async move {
            let mut find = doc! {"find": "plans", "filter": filter};
            find.extend(extra);
            db.run_command(doc! {"explain": find, "verbosity": "executionStats"})
                .await
        }
    };
    // Equality on the leading field: FETCH over IXSCAN with point bounds.
    let e = explain(doc! {"a": 3}, doc! {}).await?;
    let plan = shard_plan(&e);
    assert_eq!(stages(plan.clone()), ["FETCH", "IXSCAN"], "{e}");
    let ixscan = plan.get_document("inputStage")?;
    assert_eq!(ixscan.get_str("indexName")?, "a_1_b_-1");
    assert_eq!(
        ixscan.get_document("indexBounds")?,
        &doc! {"a": ["[3, 3]"], "b": ["[MaxKey, MinKey]"]}
    );
    let stats = e.get_document("executionStats")?;
    assert_eq!(stats.get_i64("totalDocsExamined")?, 5, "{e}");
    // A sort the index gives after the equality: no SORT stage, a backward scan for b: 1.
    let e = explain(doc! {"a": 3}, doc! {"sort": {"b": 1}}).await?;
    let plan = shard_plan(&e);
    assert_eq!(stages(plan.clone()), ["FETCH", "IXSCAN"], "{e}");
    assert_eq!(
        plan.get_document("inputStage")?.get_str("direction")?,
        "backward"
    );
    // ... and the documents come back in that order.
    let found: Vec<Document> = coll
        .find(doc! {"a": 3})
        .sort(doc! {"b": 1})
        .await?
        .try_collect()
        .await?;
    let bs: Vec<i32> = found
        .iter()
        .map(|d| d.get_i32("b").expect("present"))
        .collect();
    assert_eq!(bs, [3, 13, 23, 33, 43]);
    // A filter on no indexed field scans the collection; an _id point is IDHACK.
    assert_eq!(
        stages(shard_plan(&explain(doc! {"b": 3}, doc! {}).await?)),
        ["COLLSCAN"]
    );
    assert_eq!(
        stages(shard_plan(&explain(doc! {"_id": 3}, doc! {}).await?)),
        ["IDHACK"]
    );
    // hint by name forces the index even for an unindexed filter; a bad hint is 2 BadValue.
    let e = explain(doc! {"b": 3}, doc! {"hint": "a_1_b_-1"}).await?;
    assert_eq!(stages(shard_plan(&e)), ["FETCH", "IXSCAN"]);
    let n = ids(&coll, doc! {"b": 3}, Some(doc! {"a": 1, "b": -1})).await?;
    assert_eq!(n, [Bson::Int32(3)]);
    let err = coll
        .find(doc! {"a": 1})
        .hint(mongodb::options::Hint::Name("nope".into()))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(2), "{err}");
    let err = coll
        .delete_one(doc! {"a": 1})
        .hint(mongodb::options::Hint::Name("nope".into()))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(2), "{err}");
    // A hinted update uses the index too and changes what it matches.
    let r = coll
        .update_many(doc! {"a": 2}, doc! {"$set": {"hinted": true}})
        .hint(mongodb::options::Hint::Name("a_1_b_-1".into()))
        .await?;
    assert_eq!(r.modified_count, 5);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_multikey_and_parallel_array_rules() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("rules");
    db.run_command(doc! {"createIndexes": "rules", "indexes": [
        {"key": {"tags": 1}, "name": "tags_1", "unique": true, "sparse": true},
        {"key": {"x": 1, "y": 1}, "name": "x_1_y_1"},
    ]})
    .await?;
    coll.insert_one(doc! {"_id": 1, "tags": ["a", "b"]}).await?;
    // Each element of a multikey unique index is a key of its own.
    let err = coll
        .insert_one(doc! {"_id": 2, "tags": ["c", "b"]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    coll.insert_one(doc! {"_id": 3, "tags": ["c", "c"]}).await?;
    // Two arrays under one compound index: 171, and nothing written.
    let err = coll
        .insert_one(doc! {"_id": 4, "x": [1, 2], "y": [3, 4]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(171), "{err}");
    assert_eq!(coll.count_documents(doc! {"_id": 4}).await?, 0);
    // A non-unique index over existing arrays is built, and found by its elements.
    coll.insert_one(doc! {"_id": 5, "x": [7, 8], "y": 1})
        .await?;
    assert_eq!(ids(&coll, doc! {"x": 8}, None).await?, [Bson::Int32(5)]);
    // Building a unique index over duplicates fails and leaves no index behind.
    coll.insert_many([doc! {"_id": 6, "k": 1}, doc! {"_id": 7, "k": 1.0}])
        .await?;
    let err = db
        .run_command(doc! {"createIndexes": "rules", "indexes": [{"key": {"k": 1}, "name": "k_1", "unique": true}]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    let names: Vec<String> = coll.list_index_names().await?;
    assert!(!names.contains(&"k_1".to_string()), "{names:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_indexes_expire_documents_with_delete_events() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("sessions");
    // The TTL monitor runs every second in tests (ttlMonitorSleepSecs).
    client
        .database("admin")
        .run_command(doc! {"setParameter": 1, "ttlMonitorSleepSecs": 1})
        .await?;
    db.run_command(doc! {"createIndexes": "sessions", "indexes": [
        {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 0},
    ]})
    .await?;
    let mut stream = coll.watch().await?;
    let past = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() - 60_000,
    );
    let future = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() + 3_600_000,
    );
    coll.insert_many([
        doc! {"_id": "old", "at": past},
        doc! {"_id": "old-array", "at": [future, past]},
        doc! {"_id": "new", "at": future},
        doc! {"_id": "not-a-date", "at": "yesterday"},
    ])
    .await?;
    let mut deleted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while deleted.len() < 2 {
        let next = tokio::time::timeout_at(deadline, stream.next()).await?;
        let event = next.expect("stream ended")?;
        if event.operation_type == mongodb::change_stream::event::OperationType::Delete {
            let key = event.document_key.expect("a delete has its documentKey");
            deleted.push(key.get_str("_id")?.to_string());
        }
    }
    deleted.sort();
    assert_eq!(deleted, ["old", "old-array"]);
    let left = ids(&coll, doc! {}, None).await?;
    assert_eq!(
        left,
        [
            Bson::String("new".into()),
            Bson::String("not-a-date".into())
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_indexes_on_sharded_collections_need_the_shard_key_as_prefix() -> anyhow::Result<()>
{
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "app.users", doc! {"tenant": 1}).await?;
    let db = client.database("app");
    let err = db
        .run_command(doc! {"createIndexes": "users", "indexes": [{"key": {"email": 1}, "name": "email_1", "unique": true}]})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(67), "{err}");
    db.run_command(doc! {"createIndexes": "users", "indexes": [{"key": {"tenant": 1, "email": 1}, "name": "t_e", "unique": true}]})
        .await?;
    // A non-unique index needs no prefix.
    db.run_command(
        doc! {"createIndexes": "users", "indexes": [{"key": {"email": 1}, "name": "email_1"}]},
    )
    .await?;
    let coll = db.collection::<Document>("users");
    coll.insert_one(doc! {"tenant": 1, "email": "a@x"}).await?;
    let err = coll
        .insert_one(doc! {"tenant": 1, "email": "a@x"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    coll.insert_one(doc! {"tenant": 2, "email": "a@x"}).await?;
    let found: Vec<Document> = coll
        .find(doc! {"email": "a@x"})
        .await?
        .try_collect()
        .await?;
    assert_eq!(found.len(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_filters_an_index_cannot_decide_are_refused() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    db.collection::<Document>("p")
        .insert_one(doc! {"a": 1})
        .await?;
    for bad in [
        doc! {"a": {"$ne": 1}},
        doc! {"a": {"$exists": false}},
        doc! {"$nor": [{"a": 1}]},
        doc! {"a": {"$not": {"$gt": 1}}},
        doc! {"$expr": {"$eq": ["$a", 1]}},
    ] {
        let err = db
            .run_command(doc! {"createIndexes": "p", "indexes": [{"key": {"a": 1}, "name": "a_p", "partialFilterExpression": bad.clone()}]})
            .await
            .unwrap_err();
        assert_eq!(code(&err), Some(67), "{bad}: {err}");
    }
    for good in [
        doc! {"a": {"$gt": 1}, "b": {"$exists": true}},
        doc! {"$or": [{"a": 1}, {"b": {"$in": [1, 2]}}]},
    ] {
        db.run_command(doc! {"createIndexes": "p", "indexes": [{"key": {"a": 1}, "name": "a_p", "partialFilterExpression": good}]})
            .await?;
        db.run_command(doc! {"dropIndexes": "p", "index": "a_p"})
            .await?;
    }
    // No JavaScript engine: $where and $function answer as a 7.0 server without one; `sort`
    // on an update statement is an 8.0 field a 7.0 parser refuses.
    let coll = db.collection::<Document>("p");
    let err = coll.find(doc! {"$where": "this.a == 1"}).await.unwrap_err();
    assert_eq!(code(&err), Some(6108304), "{err}");
    let err = db
        .run_command(
            doc! {"update": "p", "updates": [{"q": {}, "u": {"$set": {"z": 1}}, "sort": {"a": 1}}]},
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(40415), "{err}");
    assert_eq!(coll.count_documents(doc! {"z": 1}).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_max_return_key_and_show_record_id() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("mm");
    coll.insert_many((0..10).map(|i| doc! {"_id": i, "a": i, "b": 10 - i}))
        .await?;
    coll.create_index(mongodb::IndexModel::builder().keys(doc! {"a": 1}).build())
        .await?;
    let a_of = |docs: &[Document]| {
        docs.iter()
            .map(|d| d.get_i32("a").expect("present"))
            .collect::<Vec<_>>()
    };
    // min inclusive, max exclusive, over the hinted index, with the filter still applied.
    let found: Vec<Document> = coll
        .find(doc! {"b": {"$ne": 6}})
        .min(doc! {"a": 2})
        .max(doc! {"a": 6})
        .hint(mongodb::options::Hint::Keys(doc! {"a": 1}))
        .await?
        .try_collect()
        .await?;
    assert_eq!(a_of(&found), [2, 3, 5]);
    // Without a hint: 51173; bounds on fields the index does not have: 51174.
    let err = coll.find(doc! {}).min(doc! {"a": 2}).await.unwrap_err();
    assert_eq!(code(&err), Some(51173), "{err}");
    let err = coll
        .find(doc! {})
        .min(doc! {"b": 2})
        .hint(mongodb::options::Hint::Keys(doc! {"a": 1}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(51174), "{err}");
    // returnKey: the scanned index's keys only.
    let keys: Vec<Document> = coll
        .find(doc! {"a": {"$gte": 8}})
        .return_key(true)
        .await?
        .try_collect()
        .await?;
    assert_eq!(keys, [doc! {"a": 8}, doc! {"a": 9}]);
    // showRecordId: a $recordId per document, stable across reads and distinct.
    let read = || async {
        let docs: Vec<Document> = coll
            .find(doc! {})
            .show_record_id(true)
            .await?
            .try_collect()
            .await?;
        anyhow::Ok(
            docs.iter()
                .map(|d| d.get_i64("$recordId").expect("present"))
                .collect::<Vec<_>>(),
        )
    };
    let first = read().await?;
    assert_eq!(first, read().await?);
    let mut distinct = first.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 10);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_covered_query_reads_only_the_index() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let coll = db.collection::<Document>("cov");
    coll.insert_many((0..40).map(|i| doc! {"_id": i, "a": i % 8, "b": i, "c": "x"}))
        .await?;
    db.run_command(
        doc! {"createIndexes": "cov", "indexes": [{"key": {"a": 1, "b": 1}, "name": "a_b"}]},
    )
    .await?;
    let explain = db
        .run_command(doc! {
            "explain": {"find": "cov", "filter": {"a": 3, "b": {"$gte": 10}}, "projection": {"b": 1, "_id": 0}},
            "verbosity": "executionStats",
        })
        .await?;
    assert_eq!(
        stages(shard_plan(&explain)),
        ["PROJECTION_COVERED", "IXSCAN"],
        "{explain}"
    );
    assert_eq!(
        explain
            .get_document("executionStats")?
            .get_i64("totalDocsExamined")?,
        0,
        "{explain}"
    );
    let found: Vec<Document> = coll
        .find(doc! {"a": 3, "b": {"$gte": 10}})
        .projection(doc! {"b": 1, "_id": 0})
        .await?
        .try_collect()
        .await?;
    assert_eq!(
        found,
        [
            doc! {"b": 11},
            doc! {"b": 19},
            doc! {"b": 27},
            doc! {"b": 35}
        ]
    );
    // A field the index does not hold, or `_id` left in, needs the documents.
    for projection in [doc! {"c": 1, "_id": 0}, doc! {"b": 1}] {
        let explain = db
            .run_command(doc! {
                "explain": {"find": "cov", "filter": {"a": 3}, "projection": projection.clone()},
                "verbosity": "queryPlanner",
            })
            .await?;
        assert_eq!(
            stages(shard_plan(&explain)),
            ["PROJECTION_DEFAULT", "FETCH", "IXSCAN"],
            "{projection}: {explain}"
        );
    }
    Ok(())
}

/// `collMod` changes only what MongoDB 7.0 changes in place, and what it changes takes effect:
/// a hidden index is not planned with (nor hinted) until it is unhidden; a field collMod does
/// not take is 40415, a conversion to unique (and its dry run) is refused rather than written
/// and ignored; a capped collection's `cappedMax` then bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coll_mod_changes_only_what_it_enforces() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("collmod");
    db.collection::<Document>("c")
        .insert_many((0..20).map(|i| doc! {"_id": i, "a": i}))
        .await?;
    db.run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]})
        .await?;
    let plan = |db: mongodb::Database| async move {
        let e = db
            .run_command(doc! {"explain": {"find": "c", "filter": {"a": 3}}})
            .await?;
        anyhow::Ok(stages(shard_plan(&e)))
    };
    assert_eq!(plan(db.clone()).await?, ["FETCH", "IXSCAN"]);
    let reply = db
        .run_command(doc! {"collMod": "c", "index": {"name": "a_1", "hidden": true}})
        .await?;
    assert!(reply.get_bool("hidden_new")?, "{reply}");
    assert_eq!(
        plan(db.clone()).await?,
        ["COLLSCAN"],
        "a hidden index is not planned"
    );
    let err = db
        .run_command(doc! {"find": "c", "filter": {"a": 3}, "hint": "a_1"})
        .await
        .expect_err("a hidden index cannot be hinted");
    assert_eq!(code(&err), Some(2), "{err}");
    db.run_command(doc! {"collMod": "c", "index": {"keyPattern": {"a": 1}, "hidden": false}})
        .await?;
    assert_eq!(plan(db.clone()).await?, ["FETCH", "IXSCAN"]);

    for (index, want) in [
        (doc! {"name": "a_1", "sparse": true}, 40415),
        (doc! {"name": "a_1", "key": {"b": 1}}, 40415),
        (doc! {"name": "a_1", "unique": true}, 115),
        (doc! {"name": "a_1"}, 72),
        (
            doc! {"name": "a_1", "keyPattern": {"a": 1}, "hidden": true},
            72,
        ),
        (doc! {"name": "nope", "hidden": true}, 27),
    ] {
        let err = db
            .run_command(doc! {"collMod": "c", "index": index.clone()})
            .await
            .expect_err("refused");
        assert_eq!(code(&err), Some(want), "{index}: {err}");
    }
    let err = db
        .run_command(
            doc! {"collMod": "c", "index": {"name": "a_1", "hidden": true}, "dryRun": true},
        )
        .await
        .expect_err("a dry run only checks a conversion to unique");
    assert_eq!(code(&err), Some(72), "{err}");
    assert_eq!(
        plan(db.clone()).await?,
        ["FETCH", "IXSCAN"],
        "the dry run changed nothing"
    );

    db.run_command(doc! {"create": "capped", "capped": true, "size": 100_000})
        .await?;
    db.run_command(doc! {"collMod": "capped", "cappedMax": 3})
        .await?;
    let capped = db.collection::<Document>("capped");
    capped.insert_many((0..10).map(|i| doc! {"_id": i})).await?;
    assert_eq!(
        capped.count_documents(doc! {}).await?,
        3,
        "cappedMax bounds it"
    );
    let err = db
        .run_command(doc! {"collMod": "c", "cappedSize": 1000})
        .await
        .expect_err("not capped");
    assert_eq!(code(&err), Some(72), "{err}");
    cluster.stop().await;
    Ok(())
}
