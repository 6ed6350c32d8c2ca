//! Capped collections through the `mongodb` driver: insertion order whatever the `_id`s, the
//! oldest documents deleted past `max` (and `size`) with `delete` events, a tailable awaitData
//! cursor that follows new inserts, and the errors a 7.0 server gives.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{Document, doc};
use mongodb::options::CursorType;
use tests::EmbeddedCluster;

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter().filter_map(|d| d.get_i32("_id").ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_collections_keep_insertion_order_and_their_limits() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let err = db
        .run_command(doc! {"create": "nosize", "capped": true})
        .await
        .expect_err("size is required");
    assert_eq!(tests::scenarios::code_of(&err), Some(72), "{err}");
    db.run_command(doc! {"create": "log", "capped": true, "size": 100_000, "max": 5})
        .await?;
    let log = db.collection::<Document>("log");
    let mut events = log.watch().await?;
    // `_id`s that sort against insertion order.
    for i in (0..8).rev() {
        log.insert_one(doc! {"_id": i, "n": i}).await?;
    }
    let all: Vec<Document> = log.find(doc! {}).await?.try_collect().await?;
    assert_eq!(
        ids(&all),
        [4, 3, 2, 1, 0],
        "the five newest, in insertion order"
    );
    let backward: Vec<Document> = log
        .find(doc! {})
        .sort(doc! {"$natural": -1})
        .await?
        .try_collect()
        .await?;
    assert_eq!(ids(&backward), [0, 1, 2, 3, 4]);
    // Evictions are delete events, after the inserts that caused them.
    let mut deletes = Vec::new();
    while deletes.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await?
            .expect("stream open")?;
        if event.operation_type == mongodb::change_stream::event::OperationType::Delete {
            deletes.push(event.document_key.expect("key").get_i32("_id")?);
        }
    }
    assert_eq!(deletes, [7, 6, 5]);

    // By size: each document ~1 KiB, 4 KiB of room.
    db.run_command(doc! {"create": "small", "capped": true, "size": 4096})
        .await?;
    let small = db.collection::<Document>("small");
    for i in 0..10 {
        small
            .insert_one(doc! {"_id": i, "pad": "x".repeat(1000)})
            .await?;
    }
    let left: Vec<Document> = small.find(doc! {}).await?.try_collect().await?;
    assert!(
        left.len() <= 4 && !left.is_empty(),
        "{} documents",
        left.len()
    );
    assert_eq!(ids(&left).last(), Some(&9));
    // A document larger than the collection's size is refused, as MongoDB's record store
    // refuses it; nothing is evicted for it.
    let err = small
        .insert_one(doc! {"_id": 99, "pad": "x".repeat(5000)})
        .await
        .expect_err("larger than the capped size");
    assert_eq!(tests::scenarios::code_of(&err), Some(2), "{err}");
    assert!(err.to_string().contains("exceeds cappedMaxSize"), "{err}");
    let still: Vec<Document> = small.find(doc! {}).await?.try_collect().await?;
    assert_eq!(ids(&still), ids(&left));
    // An update may resize a document (as since 6.0); the next insert makes room by the
    // documents' current sizes.
    small
        .update_one(doc! {"_id": 9}, doc! {"$set": {"pad": "y".repeat(3100)}})
        .await?;
    small.insert_one(doc! {"_id": 10}).await?;
    let left: Vec<Document> = small.find(doc! {}).await?.try_collect().await?;
    let bytes: usize = left
        .iter()
        .map(|d| d.to_vec().map(|v| v.len()).unwrap_or(0))
        .sum();
    assert!(bytes <= 4096, "{bytes} bytes in {:?}", ids(&left));
    assert_eq!(ids(&left), [9, 10]);
    let v = db.run_command(doc! {"validate": "small"}).await?;
    assert!(v.get_bool("valid")?, "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailable_await_cursor_follows_new_inserts() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    db.run_command(doc! {"create": "feed", "capped": true, "size": 1_000_000})
        .await?;
    let feed = db.collection::<Document>("feed");
    feed.insert_many((0..3).map(|i| doc! {"_id": i})).await?;
    let mut cursor = feed
        .find(doc! {})
        .cursor_type(CursorType::TailableAwait)
        .max_await_time(Duration::from_millis(300))
        .batch_size(2)
        .await?;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let d = tokio::time::timeout(Duration::from_secs(10), cursor.next())
            .await?
            .expect("open")?;
        seen.push(d.get_i32("_id")?);
    }
    assert_eq!(seen, [0, 1, 2]);
    // Nothing new yet: the cursor waits; a later insert arrives on it.
    let writer = {
        let feed = feed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            feed.insert_one(doc! {"_id": 3}).await
        })
    };
    let d = tokio::time::timeout(Duration::from_secs(10), cursor.next())
        .await?
        .expect("open")?;
    assert_eq!(d.get_i32("_id")?, 3);
    writer.await??;
    // A getMore's maxTimeMS is how long the router's shards wait for news (not their default
    // one second): an empty batch does not come back before it.
    let opened = db
        .run_command(doc! {"find": "feed", "filter": {}, "tailable": true, "awaitData": true})
        .await?;
    let id = opened.get_document("cursor")?.get_i64("id")?;
    let started = std::time::Instant::now();
    let more = db
        .run_command(doc! {"getMore": id, "collection": "feed", "maxTimeMS": 2500_i64})
        .await?;
    assert!(
        started.elapsed() >= Duration::from_millis(2000),
        "returned after {:?}",
        started.elapsed()
    );
    let cursor = more.get_document("cursor")?;
    assert!(cursor.get_array("nextBatch")?.is_empty());
    assert_eq!(cursor.get_i64("id")?, id, "a tailable cursor stays open");
    // A tailable cursor on a collection that is not capped is refused.
    db.run_command(doc! {"create": "plain"}).await?;
    let err = db
        .collection::<Document>("plain")
        .find(doc! {})
        .cursor_type(CursorType::Tailable)
        .await
        .expect_err("not capped");
    assert_eq!(tests::scenarios::code_of(&err), Some(2), "{err}");
    Ok(())
}
