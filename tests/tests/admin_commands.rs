//! Admin commands with the `mongodb` driver: `explain` of reads and writes (the plan each
//! shard runs, and that an explained write writes nothing), `validate`, and
//! `setParameter` / `getParameter`.

use mongodb::bson::{Bson, Document, doc};
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

/// The shards' winning plans of a router explain.
fn shard_plans(explain: &Document) -> Vec<Document> {
    explain
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .and_then(|w| w.get_array("shards"))
        .map(|s| {
            s.iter()
                .filter_map(Bson::as_document)
                .filter_map(|s| s.get_document("winningPlan").ok().cloned())
                .collect()
        })
        .unwrap_or_default()
}

fn stage(explain: &Document) -> &str {
    explain
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .and_then(|w| w.get_str("stage"))
        .unwrap_or("")
}

fn total(explain: &Document, field: &str) -> i64 {
    explain
        .get_document("executionStats")
        .and_then(|s| s.get_i64(field))
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_each_shards_plan_and_writes_nothing() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let plain = db.collection::<Document>("plain");
    plain
        .insert_many((0..50).map(|i| doc! {"_id": i, "x": i % 5}))
        .await?;
    tests::shard_collection(&client, "app.spread", doc! {"_id": "hashed"}).await?;
    let spread = db.collection::<Document>("spread");
    spread
        .insert_many((0..50).map(|i| doc! {"_id": i, "x": i % 5}))
        .await?;

    // A point lookup on an unsharded collection: one shard, by _id.
    let e = db
        .run_command(doc! {"explain": {"find": "plain", "filter": {"_id": 7}}, "verbosity": "executionStats"})
        .await?;
    assert_eq!(stage(&e), "SINGLE_SHARD", "{e}");
    assert_eq!(shard_plans(&e)[0].get_str("stage")?, "IDHACK");
    assert_eq!(total(&e, "totalDocsExamined"), 1);
    assert_eq!(total(&e, "nReturned"), 1);

    // A filter on another field scans; sort, skip and limit sit above the scan.
    let e = db
        .run_command(doc! {
            "explain": {"find": "plain", "filter": {"x": 2}, "sort": {"_id": -1}, "skip": 1, "limit": 3},
            "verbosity": "executionStats",
        })
        .await?;
    let plan = &shard_plans(&e)[0];
    assert_eq!(plan.get_str("stage")?, "LIMIT", "{plan}");
    let skip = plan.get_document("inputStage")?;
    assert_eq!(skip.get_str("stage")?, "SKIP");
    let sort = skip.get_document("inputStage")?;
    assert_eq!(sort.get_str("stage")?, "SORT");
    assert_eq!(
        sort.get_document("inputStage")?.get_str("stage")?,
        "COLLSCAN"
    );
    assert_eq!(total(&e, "totalDocsExamined"), 50);
    assert_eq!(total(&e, "nReturned"), 3);

    // A hashed collection: every shard scans, merged by the sort; a queryPlanner explain
    // runs nothing.
    let e = db
        .run_command(
            doc! {"explain": {"find": "spread", "sort": {"x": 1}}, "verbosity": "queryPlanner"},
        )
        .await?;
    assert_eq!(stage(&e), "SHARD_MERGE_SORT", "{e}");
    assert_eq!(shard_plans(&e).len(), 2);
    assert!(!e.contains_key("executionStats"));
    let e = db
        .run_command(
            doc! {"explain": {"count": "spread", "query": {"x": 1}}, "verbosity": "executionStats"},
        )
        .await?;
    assert_eq!(stage(&e), "SHARD_MERGE");
    assert_eq!(total(&e, "totalDocsExamined"), 50, "{e}");

    // Explained writes report what they would do, and do nothing.
    let e = db
        .run_command(doc! {
            "explain": {"update": "spread", "updates": [{"q": {"x": 3}, "u": {"$set": {"y": 1}}, "multi": true}]},
            "verbosity": "executionStats",
        })
        .await?;
    assert_eq!(stage(&e), "SHARD_WRITE", "{e}");
    let modified: i64 = e
        .get_document("executionStats")?
        .get_document("executionStages")?
        .get_array("shards")?
        .iter()
        .filter_map(Bson::as_document)
        .map(|s| {
            s.get_document("executionStages")
                .and_then(|st| st.get_i64("nWouldModify"))
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(modified, 10);
    assert_eq!(
        spread.count_documents(doc! {"y": 1}).await?,
        0,
        "nothing written"
    );
    let e = db
        .run_command(doc! {
            "explain": {"delete": "plain", "deletes": [{"q": {"x": 4}, "limit": 0}]},
            "verbosity": "executionStats",
        })
        .await?;
    let delete = e
        .get_document("executionStats")?
        .get_document("executionStages")?
        .get_array("shards")?[0]
        .as_document()
        .expect("a shard")
        .get_document("executionStages")?
        .clone();
    assert_eq!(delete.get_str("stage")?, "DELETE");
    assert_eq!(delete.get_i64("nWouldDelete")?, 10);
    assert_eq!(plain.count_documents(doc! {}).await?, 50, "nothing deleted");

    // aggregate with explain: how the pipeline is split between shards and router.
    let pipeline = vec![
        doc! {"$match": {"x": 1}},
        doc! {"$group": {"_id": null, "n": {"$sum": 1}}},
    ];
    let e = db
        .run_command(doc! {"aggregate": "spread", "pipeline": pipeline.clone(), "explain": true})
        .await?;
    let split = e.get_document("splitPipeline")?;
    assert_eq!(
        split.get_array("shardsPart")?,
        &vec![Bson::Document(doc! {"$match": {"x": 1}})]
    );
    assert_eq!(split.get_array("mergerPart")?.len(), 2);
    assert_eq!(e.get_document("shards")?.len(), 2);
    let e = db
        .run_command(doc! {"explain": {"aggregate": "plain", "pipeline": pipeline, "cursor": {}}})
        .await?;
    assert_eq!(e.get("splitPipeline"), Some(&Bson::Null));
    let (_, only) = e.get_document("shards")?.iter().next().expect("one shard");
    let stages = only.as_document().expect("doc").get_array("stages")?;
    assert_eq!(stages.len(), 3, "$cursor, then the pipeline's own");

    // What MongoDB refuses.
    let bad = db
        .run_command(doc! {"explain": {"find": "plain"}, "verbosity": "loud"})
        .await
        .expect_err("bad verbosity");
    assert_eq!(code(&bad), Some(2));
    let bad = db
        .run_command(doc! {"explain": {"listIndexes": "plain"}})
        .await
        .expect_err("not explainable");
    assert_eq!(code(&bad), Some(59));
    cluster.stop().await;
    Ok(())
}
