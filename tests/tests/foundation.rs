//! The foundation issue's checks, against the embedded cluster and a multi-process cluster:
//! the same driver scenarios must pass in both modes.

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use tests::scenarios;
use tests::{EmbeddedCluster, ProcessCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_cluster_serves_the_driver_scenarios() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    scenarios::handshake_and_admin(&client).await?;
    scenarios::crud(&client, "crud").await?;
    scenarios::ddl(&client, "ddl").await?;
    scenarios::sharded_crud(&client, "hashed", doc! {"sk": "hashed"}).await?;
    scenarios::sharded_crud(&client, "ranged", doc! {"sk": 1}).await?;
    // Before the retryable-write scenario: it leaves a pooled session whose server-side
    // txnNumber is far above the driver's.
    scenarios::transactions(&client, "txn").await?;
    scenarios::cross_shard_transaction(&client, "xtxn").await?;
    scenarios::retryable_write_dedupe(&client, "retry").await?;
    scenarios::bad_input(&client, "bad").await?;
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_process_cluster_serves_the_driver_scenarios() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(3).await?;
    let client = cluster.client().await?;
    scenarios::handshake_and_admin(&client).await?;
    scenarios::crud(&client, "crud").await?;
    scenarios::ddl(&client, "ddl").await?;
    scenarios::sharded_crud(&client, "hashed", doc! {"sk": "hashed"}).await?;
    scenarios::sharded_crud(&client, "ranged", doc! {"sk": 1}).await?;
    // Before the retryable-write scenario: it leaves a pooled session whose server-side
    // txnNumber is far above the driver's.
    scenarios::transactions(&client, "txn").await?;
    scenarios::cross_shard_transaction(&client, "xtxn").await?;
    scenarios::retryable_write_dedupe(&client, "retry").await?;
    scenarios::bad_input(&client, "bad").await?;
    Ok(())
}

/// A hashed collection is pre-split over every shard and each document lives on exactly one;
/// an unsharded collection lives only on its database's primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_are_routed_to_the_right_shard() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "routed.h", doc! {"_id": "hashed"}).await?;
    let h = client.database("routed").collection::<Document>("h");
    h.insert_many((0..600).map(|i| doc! {"_id": i})).await?;
    let u = client.database("routed").collection::<Document>("u");
    u.insert_many((0..10).map(|i| doc! {"_id": i})).await?;
    let primary = client
        .database("config")
        .collection::<Document>("databases")
        .find_one(doc! {"_id": "routed"})
        .await?
        .expect("config.databases has the database");
    let primary = primary.get_str("primary")?.to_string();
    let mut total = 0;
    let mut uuids = Vec::new();
    for i in 0..3 {
        let direct = cluster.shard_client(i).await?;
        let n = direct
            .database("routed")
            .collection::<Document>("h")
            .count_documents(doc! {})
            .await?;
        assert!(n > 100, "shard{i} holds {n} of 600 hashed documents");
        total += n;
        let un = direct
            .database("routed")
            .collection::<Document>("u")
            .count_documents(doc! {})
            .await?;
        let expected = if primary == format!("shard{i}") {
            10
        } else {
            0
        };
        assert_eq!(
            un, expected,
            "unsharded documents on shard{i} (primary {primary})"
        );
        let spec = direct
            .database("routed")
            .run_command(doc! {"listCollections": 1, "filter": {"name": "h"}})
            .await?;
        let info = spec.get_document("cursor")?.get_array("firstBatch")?[0]
            .as_document()
            .expect("a collection spec")
            .get_document("info")?
            .get("uuid")
            .cloned();
        uuids.push(info);
    }
    assert_eq!(total, 600);
    assert!(
        uuids.iter().all(|u| u.is_some() && *u == uuids[0]),
        "one UUID on every shard: {uuids:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_a_restart() -> anyhow::Result<()> {
    let mut cluster = EmbeddedCluster::start(3).await?;
    {
        let client = cluster.client().await?;
        tests::shard_collection(&client, "keep.h", doc! {"k": "hashed"}).await?;
        let h = client.database("keep").collection::<Document>("h");
        h.insert_many((0..100).map(|i| doc! {"_id": i, "k": i}))
            .await?;
        let u = client.database("keep").collection::<Document>("u");
        u.insert_one(doc! {"_id": "x", "v": 1}).await?;
        u.update_one(doc! {"_id": "x"}, doc! {"$set": {"v": 2}})
            .await?;
    }
    cluster.restart().await?;
    let client = cluster.client().await?;
    let h = client.database("keep").collection::<Document>("h");
    assert_eq!(h.count_documents(doc! {}).await?, 100);
    assert_eq!(h.count_documents(doc! {"k": 42}).await?, 1);
    let u = client.database("keep").collection::<Document>("u");
    assert_eq!(
        u.find_one(doc! {"_id": "x"}).await?,
        Some(doc! {"_id": "x", "v": 2})
    );
    cluster.stop().await;
    Ok(())
}

/// A router whose cached routing is stale (another router just sharded the collection) has its
/// writes refused with StaleConfig by the shard, reloads, and routes them right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_router_reloads_its_routing() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(3).await?;
    let a = cluster.client().await?;
    let other = cluster.start_extra_router().await?;
    let b = tests::connect(other.addr).await?;
    let via_a = a.database("stale").collection::<Document>("c");
    let via_b = b.database("stale").collection::<Document>("c");
    via_a.insert_one(doc! {"_id": "seed"}).await?;
    via_a.delete_one(doc! {"_id": "seed"}).await?;
    // Router B learns that the collection is unsharded.
    assert_eq!(via_b.count_documents(doc! {}).await?, 0);
    tests::shard_collection(&a, "stale.c", doc! {"_id": "hashed"}).await?;
    via_b.insert_many((0..300).map(|i| doc! {"_id": i})).await?;
    // Router A routes each lookup by the hash; a document on the wrong shard would be missed.
    for i in 0..300 {
        assert!(
            via_a.find_one(doc! {"_id": i}).await?.is_some(),
            "document {i} is misrouted"
        );
    }
    Ok(())
}

/// Three shards whose commits a test counts: without the lineage record the routers write on
/// the config shard about once a second, which would add commits of its own there.
async fn counting_cluster() -> anyhow::Result<EmbeddedCluster> {
    let options = router::RouterOptions {
        lineage_interval: std::time::Duration::ZERO,
        ..router::RouterOptions::default()
    };
    EmbeddedCluster::start_with_options(3, options).await
}

/// An ordered `insert_many` into a hashed collection is validated on every shard, then
/// committed as one batch per shard: 10,000 documents cost each shard one durable commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_hashed_insert_many_is_one_commit_per_shard() -> anyhow::Result<()> {
    let cluster = counting_cluster().await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "batched.o", doc! {"_id": "hashed"}).await?;
    let h = client.database("batched").collection::<Document>("o");
    let shards = cluster.shards();
    let before: Vec<u64> = shards.iter().map(|s| s.state().commit_count()).collect();
    let inserted = h
        .insert_many((0..10_000).map(|i| doc! {"_id": i, "pad": "x".repeat(16)}))
        .await?;
    assert_eq!(inserted.inserted_ids.len(), 10_000);
    for (i, s) in shards.iter().enumerate() {
        let commits = s.state().commit_count() - before[i];
        assert_eq!(commits, 1, "shard{i} committed the batch {commits} times");
    }
    assert_eq!(h.count_documents(doc! {}).await?, 10_000);
    cluster.stop().await;
    Ok(())
}

/// An ordered `insert_many` across shards applies nothing after its first failing document,
/// on any shard, and everything before it; the error carries the driver's index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_insert_across_shards_applies_nothing_after_its_first_error()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "batched.e", doc! {"_id": "hashed"}).await?;
    let c = client.database("batched").collection::<Document>("e");
    // Two documents already there: the batch meets 700 first (and 300 never).
    c.insert_many([
        doc! {"_id": 700, "old": true},
        doc! {"_id": 1300, "old": true},
    ])
    .await?;
    let err = c
        .insert_many((0..2000).map(|i| doc! {"_id": i}))
        .await
        .expect_err("a duplicate key");
    let mongodb::error::ErrorKind::InsertMany(failure) = *err.kind else {
        anyhow::bail!("not an insert_many failure: {err}");
    };
    let errors = failure.write_errors.unwrap_or_default();
    assert_eq!(
        errors.len(),
        1,
        "an ordered write reports its first error only"
    );
    assert_eq!(errors[0].index, 700);
    assert_eq!(errors[0].code, 11000);
    let present = c.count_documents(doc! {"old": {"$exists": false}}).await?;
    assert_eq!(present, 700, "documents 0..700 and nothing after");
    let after = c
        .count_documents(doc! {"_id": {"$gt": 700}, "old": {"$exists": false}})
        .await?;
    assert_eq!(after, 0, "no document after the failure, on any shard");
    for s in cluster.shards() {
        assert_eq!(s.state().reservations.open(), 0, "every reservation ended");
    }
    cluster.stop().await;
    Ok(())
}

/// Inserts of single documents racing an ordered `insert_many` of the same ids: each id ends
/// up inserted once, and the batch's outcome is one MongoDB could give (stopped at an id a
/// racer took first, with nothing after it; or whole, the racers refused). No write sees the
/// batch's holds as an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_inserts_racing_an_ordered_batch_keep_its_ordered_outcome() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "batched.r", doc! {"_id": "hashed"}).await?;
    let c = client.database("batched").collection::<Document>("r");
    for round in 0..20_i32 {
        let base = round * 1000;
        let racer_ids: Vec<i32> = (0..4).map(|k| base + 50 + k * 97 + round).collect();
        let batch = {
            let c = c.clone();
            tokio::spawn(async move {
                c.insert_many((base..base + 500).map(|i| doc! {"_id": i, "by": "batch"}))
                    .await
            })
        };
        let racers: Vec<_> = racer_ids
            .iter()
            .map(|&id| {
                let c = c.clone();
                tokio::spawn(async move { c.insert_one(doc! {"_id": id, "by": "racer"}).await })
            })
            .collect();
        let batch = batch.await?;
        let mut won = Vec::new();
        for (id, r) in racer_ids.iter().zip(racers) {
            match r.await? {
                Ok(_) => won.push(*id),
                Err(e) => assert_eq!(scenarios::code_of(&e), Some(11000), "racer {id}: {e}"),
            }
        }
        let docs: Vec<Document> = c
            .find(doc! {"_id": {"$gte": base, "$lt": base + 1000}})
            .sort(doc! {"_id": 1})
            .await?
            .try_collect()
            .await?;
        let by_batch: Vec<i32> = docs
            .iter()
            .filter(|d| d.get_str("by").ok() == Some("batch"))
            .map(|d| d.get_i32("_id").unwrap_or(-1))
            .collect();
        match batch {
            Ok(r) => {
                assert_eq!(r.inserted_ids.len(), 500);
                assert!(
                    won.is_empty(),
                    "round {round}: racers {won:?} and the batch both won"
                );
            }
            Err(e) => {
                let stop = won.iter().copied().min().expect("a racer won");
                let mongodb::error::ErrorKind::InsertMany(f) = *e.kind else {
                    anyhow::bail!("round {round}: {e}");
                };
                let errors = f.write_errors.unwrap_or_default();
                assert_eq!(errors.len(), 1, "round {round}");
                assert_eq!(errors[0].code, 11000, "round {round}: {:?}", errors[0]);
                assert_eq!(errors[0].index as i32, stop - base, "round {round}");
                let expected: Vec<i32> = (base..stop).collect();
                assert_eq!(by_batch, expected, "round {round}: the batch's documents");
            }
        }
    }
    for s in cluster.shards() {
        assert_eq!(s.state().reservations.open(), 0);
    }
    cluster.stop().await;
    Ok(())
}

/// An unordered `insert_many` into a hashed collection is split once per shard and committed as
/// one batch per shard: 10,000 documents cost each shard one durable commit (the shards' own
/// commit counters), not one per run of documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unordered_hashed_insert_many_is_one_commit_per_shard() -> anyhow::Result<()> {
    let cluster = counting_cluster().await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "batched.h", doc! {"_id": "hashed"}).await?;
    let h = client.database("batched").collection::<Document>("h");
    let shards = cluster.shards();
    let before: Vec<u64> = shards.iter().map(|s| s.state().commit_count()).collect();
    let inserted = h
        .insert_many((0..10_000).map(|i| doc! {"_id": i, "pad": "x".repeat(16)}))
        .ordered(false)
        .await?;
    assert_eq!(inserted.inserted_ids.len(), 10_000);
    for (i, s) in shards.iter().enumerate() {
        let commits = s.state().commit_count() - before[i];
        assert_eq!(commits, 1, "shard{i} committed the batch {commits} times");
    }
    assert_eq!(h.count_documents(doc! {}).await?, 10_000);
    cluster.stop().await;
    Ok(())
}
