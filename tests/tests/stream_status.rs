//! Stream status for operators, through the Rust driver: `serverStatus` shows each shard's
//! oplog (size, entries, oldest and newest `ts`), high-water mark, pre-images and change-stream
//! counters; `currentOp` / `$currentOp` with `idleCursors: true` list the open change streams
//! with their namespace, opening command, last resume token and lag.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{Document, doc};
use tests::EmbeddedCluster;
use tests::scenarios::code_of;

fn sum(status: &Document, path: &[&str]) -> i64 {
    let Ok(shards) = status.get_document("shards") else {
        return -1;
    };
    shards
        .values()
        .filter_map(|s| {
            let mut d = s.as_document()?;
            for p in &path[..path.len() - 1] {
                d = d.get_document(p).ok()?;
            }
            d.get_i64(path[path.len() - 1]).ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_status_and_current_op_show_the_streams_and_their_history() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    let db = client.database("status");
    db.run_command(doc! {"create": "c", "changeStreamPreAndPostImages": {"enabled": true}})
        .await?;
    let c = db.collection::<Document>("c");
    let mut stream = c
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    c.insert_many((0..3).map(|i| doc! {"_id": i})).await?;
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"x": 1}})
        .await?;
    for _ in 0..4 {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the stream ended"))??;
    }

    let status = admin.run_command(doc! {"serverStatus": 1}).await?;
    let shards = status.get_document("shards")?;
    assert_eq!(shards.len(), 2, "{status}");
    for (name, s) in shards {
        let s = s.as_document().ok_or_else(|| anyhow::anyhow!("{name}"))?;
        let oplog = s.get_document("oplog")?;
        let hwm = s.get_timestamp("highWaterMark")?;
        // The unsharded collection lives on its database's primary: the other shard's oplog
        // may be empty.
        if oplog.get_i64("entries")? > 0 {
            assert!(oplog.get_i64("sizeBytes")? > 0, "{name}: {s}");
            let oldest = oplog.get_timestamp("oldest")?;
            let newest = oplog.get_timestamp("newest")?;
            assert!(oldest <= newest, "{name}: {s}");
            assert!(hwm >= newest, "{name}: {s}");
        }
    }
    assert!(sum(&status, &["oplog", "entries"]) >= 5, "{status}");
    assert_eq!(sum(&status, &["preImages", "count"]), 1, "{status}");
    assert!(sum(&status, &["preImages", "bytes"]) > 0);
    let metrics = status
        .get_document("metrics")?
        .get_document("changeStreams")?;
    assert!(metrics.get_i64("showExpandedEvents")? >= 1, "{status}");
    assert_eq!(metrics.get_i64("largeEventsFailed")?, 0);

    // The stream stops reading; writes go on: its lag grows.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    c.insert_one(doc! {"_id": 10}).await?;
    let ops = admin
        .run_command(doc! {"currentOp": 1, "idleCursors": true, "ns": "status.c"})
        .await?;
    let inprog = ops.get_array("inprog")?;
    assert_eq!(inprog.len(), 1, "{ops}");
    let op = inprog[0]
        .as_document()
        .ok_or_else(|| anyhow::anyhow!("{ops}"))?;
    assert_eq!(op.get_str("type")?, "idleCursor");
    let cursor = op.get_document("cursor")?;
    assert!(cursor.get_i64("nDocsReturned")? >= 4, "{op}");
    let first_stage = cursor
        .get_document("originatingCommand")?
        .get_array("pipeline")?[0]
        .as_document()
        .cloned()
        .unwrap_or_default();
    assert!(first_stage.contains_key("$changeStream"), "{op}");
    let cs = op.get_document("changeStream")?;
    assert!(cs.get_document("lastResumeToken").is_ok(), "{op}");
    assert!(cs.get_i64("lagSecs")? >= 2, "{op}");
    // Without idleCursors the operations in flight are listed, and no idle cursor.
    let without = admin.run_command(doc! {"currentOp": 1}).await?;
    assert!(
        without
            .get_array("inprog")?
            .iter()
            .filter_map(|op| op.as_document())
            .all(|op| op.get_str("type").ok() == Some("op")),
        "idle cursors only when asked: {without}"
    );

    let listed: Vec<Document> = admin
        .aggregate(vec![
            doc! {"$currentOp": {"idleCursors": true}},
            doc! {"$match": {"ns": "status.c"}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].get_document("cursor")?.get("cursorId"),
        cursor.get("cursorId")
    );
    let e = db
        .run_command(doc! {"currentOp": 1})
        .await
        .expect_err("admin only");
    assert!(code_of(&e) == Some(13));
    drop(stream);
    cluster.stop().await;
    Ok(())
}
