//! Change streams end to end with the `mongodb` driver's `watch()`, on the embedded cluster and
//! on a multi-process cluster.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use mongodb::bson::{Document, doc};
use tests::streams;
use tests::{EmbeddedCluster, ProcessCluster};

/// Every change-stream scenario of `tests::streams`, against one deployment.
async fn all_scenarios(client: &mongodb::Client) -> anyhow::Result<()> {
    streams::crud_events(client, "crud")
        .await
        .context("crud_events")?;
    streams::update_lookup_finds_current_document(client, "lookup")
        .await
        .context("update_lookup")?;
    streams::invalidate_and_start_after(client, "inv")
        .await
        .context("invalidate_and_start_after")?;
    streams::database_and_cluster_streams(client, "levels")
        .await
        .context("database_and_cluster_streams")?;
    let recorded = streams::merged_in_cluster_time_order(client, "merged")
        .await
        .context("merged_in_cluster_time_order")?;
    streams::resume_from_every_token(client, "merged", &recorded)
        .await
        .context("resume_from_every_token")?;
    streams::idle_token_advances(client, "idle")
        .await
        .context("idle_token_advances")?;
    streams::error_codes(client, "errors")
        .await
        .context("error_codes")?;
    streams::sequential_writes_across_shards_keep_their_order(client)
        .await
        .context("causality")?;
    streams::expanded_events(client, "expanded")
        .await
        .context("expanded_events")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_change_streams() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    all_scenarios(&cluster.client().await?).await?;
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_process_change_streams() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(3).await?;
    all_scenarios(&cluster.client().await?).await
}

/// A token made by one router resumes on another, and the driver resumes by itself across a
/// router restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_resume_across_routers_and_a_router_restart() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let coll = client.database("rr").collection::<Document>("c");
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await?;
    let first = streams::next_event(&mut stream)
        .await
        .context("next_event")?;
    // Restart the router process on the same port; the driver's next getMore fails and it
    // resumes from its cached token on the new process.
    cluster.router.restart().await?;
    coll.insert_one(doc! {"_id": 2}).await?;
    let second = streams::next_event(&mut stream)
        .await
        .context("next_event")?;
    assert_eq!(second.get_document("documentKey")?, &doc! {"_id": 2});
    // A second router over the same shards resumes the first router's token.
    let other = cluster.start_extra_router().await?;
    let other_client = tests::connect(other.addr).await?;
    let mut resumed = other_client
        .database("rr")
        .collection::<Document>("c")
        .watch()
        .resume_after(streams::token_of(&first)?)
        .await?
        .with_type::<Document>();
    let again = tokio::time::timeout(Duration::from_secs(15), resumed.next())
        .await?
        .expect("event")?;
    assert_eq!(again, second);
    Ok(())
}

/// An idle shard does not hold the merged stream back until its awaitData wait ends: the first
/// getMore after a write returns the event, even though it waits less than the shards' 1 s
/// awaitData period (regression: nudges for an event at the promise's own time were skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_shards_do_not_delay_events() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let db = client.database("idle_shards");
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await?;
    for i in 1..=5 {
        let opened = db
            .run_command(doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})
            .await?;
        let id = opened.get_document("cursor")?.get_i64("id")?;
        db.collection::<Document>("c")
            .insert_one(doc! {"_id": i})
            .await?;
        let more = db
            .run_command(doc! {"getMore": id, "collection": "c", "maxTimeMS": 900_i64})
            .await?;
        let batch = more.get_document("cursor")?.get_array("nextBatch")?;
        assert_eq!(batch.len(), 1, "round {i}: the event was held back: {more}");
        db.run_command(doc! {"killCursors": "c", "cursors": [id]})
            .await?;
    }
    cluster.stop().await;
    Ok(())
}

/// Resuming from a point the oplog no longer holds fails with ChangeStreamHistoryLost (286),
/// labelled non-resumable; a token still in the oplog resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_past_truncated_history_is_history_lost() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let coll = client.database("lost").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0}).await?;
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await?;
    let old = streams::token_of(&streams::next_event(&mut stream).await?)?;
    cluster.on_each_shard(|s| s.set_oplog_retention(shard::retention::Retention::bytes(4096)));
    for i in 2..200 {
        coll.insert_one(doc! {"_id": i, "pad": "x".repeat(200)})
            .await?;
    }
    let recent = streams::next_events(&mut stream, 198).await?;
    let err = match coll.watch().resume_after(old).await {
        Err(e) => e,
        Ok(s) => {
            let mut s = s.with_type::<Document>();
            tokio::time::timeout(Duration::from_secs(15), s.next())
                .await?
                .expect("the stream ended")
                .expect_err("a stream resumed from truncated history")
        }
    };
    assert_eq!(tests::scenarios::code_of(&err), Some(286), "{err}");
    assert!(err.contains_label("NonResumableChangeStreamError"), "{err}");
    // The last events are still in the oplog: resuming from one of them works.
    let mut fresh = coll
        .watch()
        .resume_after(streams::token_of(&recent[recent.len() - 2])?)
        .await?
        .with_type::<Document>();
    assert_eq!(
        streams::next_event(&mut fresh).await?,
        recent[recent.len() - 1]
    );
    cluster.stop().await;
    Ok(())
}
