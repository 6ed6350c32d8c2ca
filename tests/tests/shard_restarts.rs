//! A shard restart must not end an application's change stream: shards of a multi-process
//! cluster are killed (SIGKILL) and restarted again and again under writes, while an
//! application on a real driver (the Rust driver here, pymongo through
//! `tests/py/restarts/workload.py`) writes, reads and watches with default options. No error
//! may reach it, and its streams hold exactly the acknowledged writes, in order
//! (`tests::restarts::verify`). Also: a shard lost for longer than the router's patience
//! fails a stream with a resumable error, and a resume while the shard is down waits for it;
//! and while one shard is down, the router does not pile up the other shards' events.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use mongodb::bson::{Bson, Document, doc};
use tests::ProcessCluster;
use tests::restarts::{self, Report};

/// Kill-and-restart rounds run this long.
const FAULTS: Duration = Duration::from_secs(20);

fn check(report: &Report, kills: usize) {
    let failures = restarts::verify(report);
    println!(
        "{kills} shard kills; {} acknowledged writes, {} reads, {} + {} events",
        report.acked.len(),
        report.reads,
        report.db_events.len(),
        report.lookup_events.len()
    );
    assert!(report.acked.len() > 50, "too few writes to mean anything");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_driver_application_sees_no_error_through_shard_restarts() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(3).await?;
    // A driver as an application makes it: default options (retryable writes and reads on).
    let client = tests::connect_uri(&format!("mongodb://{}/", cluster.router.addr)).await?;
    restarts::setup(&client).await?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let app = tokio::spawn({
        let client = client.clone();
        async move { restarts::run_rust(&client, 4, stop).await }
    });
    let kills = restarts::kill_shards(&mut cluster, FAULTS, 14).await?;
    stop_tx.send(true)?;
    let report = app.await??;
    check(&report, kills);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pymongo_application_sees_no_error_through_shard_restarts() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(3).await?;
    let client = tests::connect(cluster.router.addr).await?;
    restarts::setup(&client).await?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/restarts/workload.py");
    let uri = format!("mongodb://{}/", cluster.router.addr);
    let seconds = FAULTS.as_secs() + 2;
    let child = tokio::process::Command::new("python3")
        .args([script, &uri, &seconds.to_string(), "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("running python3 (scripts/test.sh installs pymongo)")?;
    let kills = restarts::kill_shards(&mut cluster, FAULTS, 41).await?;
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .context("the pymongo workload did not finish")??;
    anyhow::ensure!(
        out.status.success(),
        "the pymongo workload failed: {}",
        out.status
    );
    let report: Report =
        serde_json::from_slice(&out.stdout).context("reading the pymongo workload's report")?;
    check(&report, kills);
    Ok(())
}

/// Within the router's patience a lost shard pauses a stream (empty batches, then the events
/// once it is back); past it the getMore fails, labelled `ResumableChangeStreamError` so the
/// driver resumes; a resume (`aggregate`) while the shard is still down waits for it within
/// the connect patience, then fails with HostUnreachable, and succeeds if the shard is back in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_pauses_a_stream_then_fails_it_resumably() -> anyhow::Result<()> {
    let patience = [
        "--shardOutageTimeoutSecs",
        "2",
        "--shardConnectTimeoutMS",
        "1500",
    ];
    let mut cluster = ProcessCluster::start_with_router_args(2, &patience).await?;
    let client = cluster.client().await?;
    let db = client.database("outage");
    db.create_collection("c").await?;
    let coll = db.collection::<Document>("c");
    let open = db
        .run_command(doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})
        .await?;
    let id = open.get_document("cursor")?.get_i64("id")?;
    let get_more = doc! {"getMore": id, "collection": "c", "maxTimeMS": 300_i64};
    let next = || async {
        loop {
            let r = db.run_command(get_more.clone()).await?;
            if let Some(Bson::Document(ev)) =
                r.get_document("cursor")?.get_array("nextBatch")?.first()
            {
                return anyhow::Ok(ev.clone());
            }
        }
    };
    coll.insert_one(doc! {"_id": 1}).await?;
    assert_eq!(next().await?.get_document("documentKey")?, &doc! {"_id": 1});

    // The shard that holds the collection (the database's primary) restarts: the stream
    // pauses, then goes on.
    let primary = primary_shard(&client, "outage").await?;
    cluster.shards[primary].kill();
    let r = db.run_command(get_more.clone()).await?;
    assert!(r.get_document("cursor")?.get_array("nextBatch")?.is_empty());
    cluster.shards[primary].restart().await?;
    coll.insert_one(doc! {"_id": 2}).await?;
    let second = next().await?;
    assert_eq!(second.get_document("documentKey")?, &doc! {"_id": 2});

    // Down for longer than the patience: the getMore fails, labelled resumable.
    cluster.shards[primary].kill();
    let failed = loop {
        match db.run_command(get_more.clone()).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => break e,
        }
    };
    assert_eq!(tests::scenarios::code_of(&failed), Some(6), "{failed}");
    assert!(
        failed.contains_label("ResumableChangeStreamError"),
        "{failed}"
    );

    // A resume while the shard is down waits up to the connect patience, then fails.
    let token = second.get_document("_id")?.clone();
    let resume = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {"resumeAfter": token}}], "cursor": {}};
    let t = std::time::Instant::now();
    let e = db
        .run_command(resume.clone())
        .await
        .expect_err("the shard is down");
    assert!(
        t.elapsed() >= Duration::from_millis(1400),
        "failed after {:?}",
        t.elapsed()
    );
    assert_eq!(tests::scenarios::code_of(&e), Some(6), "{e}");
    // One that is still waiting when the shard comes back succeeds.
    let waiting = tokio::spawn({
        let db = db.clone();
        async move { db.run_command(resume).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.shards[primary].restart().await?;
    let resumed = waiting.await??;
    assert_ne!(resumed.get_document("cursor")?.get_i64("id")?, 0);
    Ok(())
}

/// While a shard is down, a stream's merge holds at its promise; the other shards' events
/// wait for it. They must wait on the shards, not pile up in the router: the merge reads a
/// shard again only once it holds less than a getMore's worth of its events. Then, with the
/// shard back, every event arrives once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_does_not_pile_up_the_others_events_on_the_router() -> anyhow::Result<()> {
    const BATCHES: i32 = 30;
    const PER_BATCH: i32 = 1_000;
    let patience = ["--shardOutageTimeoutSecs", "600"];
    let mut cluster = ProcessCluster::start_with_router_args(2, &patience).await?;
    let client = cluster.client().await?;
    let db = client.database("pileup");
    db.create_collection("c").await?;
    let coll = db.collection::<Document>("c");
    // Two streams: one that starts now (it shares its hub's merge, which reads 1,000 events
    // per shard getMore) and one from a start time of its own (its own merge, read in
    // getMores of 100).
    let open = |spec: Document| {
        let db = db.clone();
        async move {
            let r = tests::open_change_stream(&db, "c", spec).await?;
            let id = r.get_document("cursor")?.get_i64("id")?;
            anyhow::Ok((id, r.get_timestamp("operationTime")?))
        }
    };
    let (shared, at) = open(doc! {}).await?;
    let (own, _) = open(doc! {"startAtOperationTime": at}).await?;
    let get_more = |id: i64, batch: i32| doc! {"getMore": id, "collection": "c", "maxTimeMS": 200_i64, "batchSize": batch};
    let admin = client.database("admin");
    let held = || async {
        let metrics = tests::change_stream_metrics(&admin).await?;
        anyhow::Ok(metrics.get_i64("heldReplyBytes")?)
    };

    // The collection lives on its primary shard; the other one, which the streams read too,
    // goes down.
    let other = 1 - primary_shard(&client, "pileup").await?;
    cluster.shards[other].kill();
    let pad = "x".repeat(1_000);
    let mut most = 0;
    for b in 0..BATCHES {
        let docs = (0..PER_BATCH).map(|i| doc! {"_id": b * PER_BATCH + i, "pad": &pad});
        coll.insert_many(docs).await?;
        // The streams are read meanwhile: nothing can be released.
        for id in [shared, own] {
            let r = db.run_command(get_more(id, 100)).await?;
            assert!(r.get_document("cursor")?.get_array("nextBatch")?.is_empty());
        }
        most = most.max(held().await?);
    }
    // About 35 MB of events were written for each stream; a merge may hold a few shard
    // getMores' worth (of ~1.1 KB events): the hub's of 1,000 events, the other's of 100.
    assert!(most < 8 << 20, "the router held {most} bytes of replies");

    cluster.shards[other].restart().await?;
    for id in [shared, own] {
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while seen.len() < (BATCHES * PER_BATCH) as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "{} events",
                seen.len()
            );
            let r = db.run_command(get_more(id, 1_000)).await?;
            for e in r.get_document("cursor")?.get_array("nextBatch")? {
                let Bson::Document(e) = e else { continue };
                seen.push(e.get_document("documentKey")?.get_i32("_id")?);
            }
        }
        assert_eq!(seen, (0..BATCHES * PER_BATCH).collect::<Vec<_>>());
    }
    println!("the router held at most {most} bytes of replies while the shard was down");
    Ok(())
}

async fn primary_shard(client: &mongodb::Client, db: &str) -> anyhow::Result<usize> {
    let entry = client
        .database("config")
        .collection::<Document>("databases")
        .find_one(doc! {"_id": db})
        .await?
        .context("no config.databases entry")?;
    let name = entry.get_str("primary")?;
    Ok(name.trim_start_matches("shard").parse()?)
}
