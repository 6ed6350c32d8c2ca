//! History identity (`shard::lineage`, `router::lineages`) in a multi-process cluster: a
//! shard whose data directory is put back from an older copy, and one replaced by an empty
//! one at the same address. Tokens and times from the history they lost are refused with a
//! non-resumable error that says so; fresh streams work; an ordinary restart refuses nothing.

use std::time::Duration;

use mongodb::bson::{Document, doc};
use tests::streams::{next_event, next_events, token_of};
use tests::{ProcessCluster, copy_dir};

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

/// The registry on the config shard records how far each history reached about once a
/// second (`router::kernel::lineages::INTERVAL`).
const REGISTRY_CATCH_UP: Duration = Duration::from_millis(2_500);
/// A shard's clock reserves this far ahead (`shard::clock`, three seconds), and a bit more.
const RESERVATION_WINDOW: Duration = Duration::from_millis(3_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_restored_shards_lost_history_is_refused() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "app.c", doc! {"_id": "hashed"}).await?;
    let coll = client.database("app").collection::<Document>("c");
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_many((0..10).map(|i| doc! {"_id": i})).await?;
    let before_copy = next_events(&mut stream, 10).await?;
    let early = token_of(&before_copy[9])?;

    // Copy shard1's data directory (stopped, so the copy is whole), then carry on without it.
    let dbpath = cluster.dir.path().join("shard1");
    let backup = cluster.dir.path().join("shard1-copy");
    cluster.shards[1].kill();
    copy_dir(&dbpath, &backup)?;
    cluster.shards[1].restart().await?;
    // The lost run goes on past the copy's clock reservation, as any real one does (a restore
    // within those seconds is the documented window where times alone cannot tell).
    tokio::time::sleep(RESERVATION_WINDOW).await;
    coll.insert_many((100..120).map(|i| doc! {"_id": i}))
        .await?;
    let lost = next_events(&mut stream, 20).await?;
    let last = lost.last().expect("events");
    let lost_token = token_of(last)?;
    let lost_time = last.get_timestamp("clusterTime")?;
    drop(stream);
    tokio::time::sleep(REGISTRY_CATCH_UP).await;

    // Put the copy back: shard1 comes back with less history than the cluster has seen.
    cluster.shards[1].kill();
    std::fs::remove_dir_all(&dbpath)?;
    copy_dir(&backup, &dbpath)?;
    cluster.shards[1].restart().await?;

    let e = coll
        .watch()
        .resume_after(lost_token.clone())
        .await
        .expect_err("a token from the lost stretch");
    assert_eq!(code(&e), Some(286), "{e}");
    assert!(e.to_string().contains("restored"), "{e}");
    assert!(
        e.contains_label("NonResumableChangeStreamError"),
        "not resumable: {e}"
    );
    let e = coll
        .watch()
        .start_at_operation_time(lost_time)
        .await
        .expect_err("a time in the lost stretch");
    assert_eq!(code(&e), Some(286), "{e}");

    // What the shard still has, and what comes next, stream as usual.
    let mut resumed = coll
        .watch()
        .resume_after(early)
        .await?
        .with_type::<Document>();
    let mut fresh = coll.watch().await?.with_type::<Document>();
    coll.insert_one(doc! {"_id": "after"}).await?;
    let event = next_event(&mut fresh).await?;
    assert_eq!(
        event.get_document("documentKey")?.get("_id"),
        Some(&"after".into())
    );
    let mut seen_after = false;
    for _ in 0..40 {
        let e = next_event(&mut resumed).await?;
        if e.get_document("documentKey")?.get("_id") == Some(&"after".into()) {
            seen_after = true;
            break;
        }
    }
    assert!(
        seen_after,
        "a stream from before the copy reaches the new history"
    );

    // An ordinary restart refuses nothing: the newest token still resumes.
    let token = fresh.resume_token().expect("a token");
    cluster.shards[1].restart().await?;
    let mut again = coll
        .watch()
        .resume_after(token)
        .await?
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": "later"}).await?;
    let event = next_event(&mut again).await?;
    assert_eq!(
        event.get_document("documentKey")?.get("_id"),
        Some(&"later".into())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_before_an_empty_replacement_is_refused() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let coll = client.database("app").collection::<Document>("c");
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await?;
    let event = next_event(&mut stream).await?;
    let token = token_of(&event)?;
    drop(stream);

    // shard1 replaced by an empty one at the same address: a new history (a second later at
    // least: times are whole seconds plus a counter, and a new clock starts at the second).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    cluster.shards[1].kill();
    std::fs::remove_dir_all(cluster.dir.path().join("shard1"))?;
    cluster.shards[1].restart().await?;
    let e = coll
        .watch()
        .resume_after(token)
        .await
        .expect_err("a token from before shard1's history");
    assert_eq!(code(&e), Some(280), "{e}");
    assert!(e.to_string().contains("before shard"), "{e}");
    Ok(())
}

/// Tokens carry nothing of their cluster but a high-water mark's stamp (`encode_stamped`):
/// another cluster's high-water mark is refused by its stamp, its event token because no
/// shard here has its event; this cluster's own resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_another_cluster_is_refused() -> anyhow::Result<()> {
    let here = tests::EmbeddedCluster::start(2).await?;
    let there = tests::EmbeddedCluster::start(2).await?;
    let (a, b) = (there.client().await?, here.client().await?);
    let theirs = a.database("app").collection::<Document>("c");
    let ours = b.database("app").collection::<Document>("c");
    ours.insert_one(doc! {"_id": 0}).await?;

    let mut stream = theirs.watch().await?.with_type::<Document>();
    theirs.insert_one(doc! {"_id": 1}).await?;
    let event_token = token_of(&next_event(&mut stream).await?)?;
    let mut idle = theirs.watch().await?.with_type::<Document>();
    assert!(idle.next_if_any().await?.is_none());
    let high_water_mark = idle.resume_token().expect("a post-batch resume token");

    let e = ours
        .watch()
        .resume_after(high_water_mark)
        .await
        .expect_err("another cluster's high-water mark");
    assert_eq!(code(&e), Some(280), "{e}");
    assert!(e.to_string().contains("another cluster"), "{e}");
    // An event token carries no stamp: it is refused once our shards' history has passed its
    // time without its event, which an idle shard's nudge may take a moment to show (until
    // then the batches are empty, as MongoDB's are). An event would be a misread.
    let e = match ours.watch().resume_after(event_token).await {
        Err(e) => e,
        Ok(mut s) => {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                match s.next_if_any().await {
                    Err(e) => break e,
                    Ok(Some(event)) => panic!("another cluster's token resumed at {event:?}"),
                    Ok(None) => assert!(
                        std::time::Instant::now() < deadline,
                        "another cluster's event token was not refused within 20 s"
                    ),
                }
            }
        }
    };
    assert_eq!(code(&e), Some(280), "{e}");

    // Our own high-water mark resumes.
    let mut mine = ours.watch().await?.with_type::<Document>();
    assert!(mine.next_if_any().await?.is_none());
    let token = mine.resume_token().expect("a post-batch resume token");
    let mut resumed = ours
        .watch()
        .resume_after(token)
        .await?
        .with_type::<Document>();
    ours.insert_one(doc! {"_id": 2}).await?;
    assert_eq!(
        next_event(&mut resumed)
            .await?
            .get_document("documentKey")?
            .get("_id"),
        Some(&2.into())
    );
    here.stop().await;
    there.stop().await;
    Ok(())
}
