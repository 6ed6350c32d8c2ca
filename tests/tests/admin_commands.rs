//! Admin commands with the `mongodb` driver: `explain` of reads and writes (the plan each
//! shard runs, and that an explained write writes nothing), `validate`, and
//! `setParameter` / `getParameter`.

use futures::TryStreamExt;
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

    // A filter on another field scans; skip and limit sit above the scan, and the documents'
    // `_id` order read backward gives the sort (no SORT stage).
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
    let scan = skip.get_document("inputStage")?;
    assert_eq!(scan.get_str("stage")?, "COLLSCAN", "{plan}");
    assert_eq!(scan.get_str("direction")?, "backward");
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
    // The shards group their own documents; the router adds up the partial counts.
    assert_eq!(
        split.get_array("shardsPart")?,
        &vec![
            Bson::Document(doc! {"$match": {"x": 1}}),
            Bson::Document(doc! {"$group": {"_id": null, "n": {"$sum": 1}}}),
        ]
    );
    assert_eq!(
        split.get_array("mergerPart")?,
        &vec![Bson::Document(
            doc! {"$group": {"_id": "$_id", "n": {"$sum": "$n"}}}
        )]
    );
    assert_eq!(e.get_document("shards")?.len(), 2);
    let e = db
        .run_command(doc! {"explain": {"aggregate": "plain", "pipeline": pipeline, "cursor": {}}})
        .await?;
    assert_eq!(e.get("splitPipeline"), Some(&Bson::Null));
    let (_, only) = e.get_document("shards")?.iter().next().expect("one shard");
    let stages = only.as_document().expect("doc").get_array("stages")?;
    assert_eq!(stages.len(), 3, "$cursor, then the pipeline's own");

    // $avg, $push and $addToSet split too: the shards sum, count and push, the router divides
    // and concatenates; the answers equal the unsharded copy's.
    let pipeline = vec![
        doc! {"$group": {"_id": {"$mod": ["$_id", 2]}, "avg": {"$avg": "$_id"}, "ids": {"$push": "$_id"}, "xs": {"$addToSet": "$x"}}},
        doc! {"$set": {
            "ids": {"$reduce": {"input": "$ids", "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}},
            "xs": {"$size": "$xs"},
        }},
        doc! {"$sort": {"_id": 1}},
    ];
    let e = db
        .run_command(doc! {"aggregate": "spread", "pipeline": pipeline.clone(), "explain": true})
        .await?;
    let split = e.get_document("splitPipeline")?;
    assert_eq!(
        split.get_array("shardsPart")?.len(),
        1,
        "the group runs on the shards: {split}"
    );
    let mut answers = Vec::new();
    for coll in ["spread", "plain"] {
        let out: Vec<Document> = db
            .collection::<Document>(coll)
            .aggregate(pipeline.clone())
            .await?
            .try_collect()
            .await?;
        answers.push(out);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[0],
        vec![
            doc! {"_id": 0, "avg": 24.0, "ids": 600, "xs": 5},
            doc! {"_id": 1, "avg": 25.0, "ids": 625, "xs": 5},
        ]
    );

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_checks_documents_and_index_entries() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let c = db.collection::<Document>("c");
    c.insert_many((0..20).map(|i| doc! {"_id": i, "email": format!("u{i}@x"), "n": i}))
        .await?;
    db.run_command(doc! {"createIndexes": "c", "indexes": [
        {"key": {"email": 1}, "name": "email_1", "unique": true},
        {"key": {"n": 1}, "name": "n_1"},
        {"key": {"t": "text"}, "name": "t_text"},
    ]})
    .await?;
    let report = db.run_command(doc! {"validate": "c"}).await?;
    assert!(report.get_bool("valid")?, "{report}");
    assert_eq!(report.get_i64("nrecords")?, 20);
    let keys = report.get_document("keysPerIndex")?;
    assert_eq!(keys.get_i64("_id_")?, 20);
    assert_eq!(keys.get_i64("email_1")?, 20);
    assert_eq!(keys.get_i64("n_1")?, 20);
    assert!(
        format!("{:?}", report.get_array("warnings")?).contains("t_text"),
        "the unmaterialized (text) index is named: {report}"
    );
    let e = db
        .run_command(doc! {"validate": "nonesuch"})
        .await
        .expect_err("no such collection");
    assert_eq!(code(&e), Some(26));

    // Take one index entry away behind the store's back: validate finds it.
    let shard = cluster
        .shards()
        .into_iter()
        .find(|s| s.state().catalog().lookup("app", "c").is_some())
        .expect("a shard holds app.c");
    let entry = shard
        .state()
        .catalog()
        .lookup("app", "c")
        .cloned()
        .expect("entry");
    let doc7 = doc! {"_id": 7, "email": "u7@x", "n": 7};
    let (_, key) = shard::indexes::named_entry_keys(&entry, &doc7)
        .into_iter()
        .next()
        .expect("an email_1 entry");
    let mut txn = shard.state().storage.begin_write()?;
    txn.delete(shard::storage::Table::Indexes, &key)?;
    txn.commit()?;
    let report = db.run_command(doc! {"validate": "c", "full": true}).await?;
    assert!(!report.get_bool("valid")?, "{report}");
    let errors = format!("{:?}", report.get_array("errors")?);
    assert!(
        errors.contains("email_1") && errors.contains("7"),
        "{errors}"
    );
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_are_read_and_set_at_runtime() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    let got = admin
        .run_command(doc! {"getParameter": 1, "cursorTimeoutMillis": 1, "logLevel": 1})
        .await?;
    assert_eq!(got.get_i64("cursorTimeoutMillis")?, 600_000);
    let details = admin
        .run_command(doc! {"getParameter": {"showDetails": true}, "enableTestCommands": 1})
        .await?;
    assert!(
        !details
            .get_document("enableTestCommands")?
            .get_bool("settableAtRuntime")?
    );
    let all = admin.run_command(doc! {"getParameter": "*"}).await?;
    assert!(all.contains_key("maxAcceptableLogicalClockDriftSecs"));
    assert_eq!(all.get_i64("changeStreamHeldReplyBytesLimit")?, 256 << 20);

    // A shorter cursor timeout reaps an idle cursor.
    let set = admin
        .run_command(doc! {"setParameter": 1, "cursorTimeoutMillis": 300})
        .await?;
    assert_eq!(set.get_i64("was")?, 600_000);
    let db = client.database("app");
    db.collection::<Document>("c")
        .insert_many((0..5).map(|i| doc! {"_id": i}))
        .await?;
    let first = db.run_command(doc! {"find": "c", "batchSize": 1}).await?;
    let id = first.get_document("cursor")?.get_i64("id")?;
    assert_ne!(id, 0);
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let e = db
        .run_command(doc! {"getMore": id, "collection": "c"})
        .await
        .expect_err("reaped");
    assert_eq!(code(&e), Some(43), "{e}");

    let was = admin
        .run_command(doc! {"setParameter": 1, "logLevel": 1})
        .await?;
    assert_eq!(was.get_i32("was")?, 0);
    let got = admin
        .run_command(doc! {"getParameter": 1, "logLevel": 1})
        .await?;
    assert_eq!(got.get_i32("logLevel")?, 1);
    admin
        .run_command(doc! {"setParameter": 1, "logLevel": 0})
        .await?;

    // What mongod refuses.
    for (cmd, expected) in [
        (doc! {"setParameter": 1, "logLevel": 9}, 2),
        (doc! {"setParameter": 1, "enableTestCommands": true}, 2),
        (doc! {"setParameter": 1, "noSuchParameter": 1}, 2),
        (
            doc! {"setParameter": 1, "changeStreamHeldReplyBytesLimit": 0},
            2,
        ),
        (doc! {"setParameter": 1}, 72),
        (doc! {"getParameter": 1, "noSuchParameter": 1}, 72),
    ] {
        let e = admin.run_command(cmd.clone()).await.expect_err("refused");
        assert_eq!(code(&e), Some(expected), "{cmd}: {e}");
    }
    let e = db
        .run_command(doc! {"setParameter": 1, "logLevel": 1})
        .await
        .expect_err("admin only");
    assert_eq!(code(&e), Some(13));
    cluster.stop().await;
    Ok(())
}

/// Every command `listCommands` names is one the router runs (none answers CommandNotFound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_commands_names_only_what_runs() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let listed = client
        .database("admin")
        .run_command(doc! {"listCommands": 1})
        .await?;
    let names: Vec<String> = listed.get_document("commands")?.keys().cloned().collect();
    assert!(names.len() > 50, "{names:?}");
    let db = client.database("probe");
    for name in names {
        if matches!(name.as_str(), "endSessions" | "logout") {
            continue; // harmless, but they would end this test's session or login
        }
        if let Err(e) = db.run_command(doc! {name.clone(): 1}).await {
            assert_ne!(code(&e), Some(59), "{name}: {e}");
        }
    }
    cluster.stop().await;
    Ok(())
}
