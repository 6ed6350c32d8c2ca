//! Snapshot reads outside transactions (`readConcern: {level: "snapshot"}`), through the router
//! with the Rust driver: a read as of a past `atClusterTime`, the time chosen and reported when
//! none is given, too old a time refused, and the bootstrap pattern (copy a snapshot at `T`,
//! then apply the change stream from `T`) ending exactly in step under concurrent writes on
//! three shards.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{Bson, Document, Timestamp, doc};
use tests::EmbeddedCluster;

/// The documents of a cursor reply's first batch (and later batches), read through getMore.
async fn all_docs(db: &mongodb::Database, reply: Document) -> anyhow::Result<Vec<Document>> {
    let cursor = reply.get_document("cursor")?;
    let mut docs: Vec<Document> = cursor
        .get_array("firstBatch")?
        .iter()
        .filter_map(|d| d.as_document().cloned())
        .collect();
    let mut id = cursor.get_i64("id")?;
    let coll = cursor
        .get_str("ns")?
        .split_once('.')
        .map(|(_, c)| c.to_string())
        .unwrap_or_default();
    while id != 0 {
        let more = db
            .run_command(doc! {"getMore": id, "collection": &coll})
            .await?;
        let c = more.get_document("cursor")?;
        docs.extend(
            c.get_array("nextBatch")?
                .iter()
                .filter_map(|d| d.as_document().cloned()),
        );
        id = c.get_i64("id")?;
    }
    Ok(docs)
}

fn ids(docs: &[Document]) -> Vec<String> {
    let mut v: Vec<String> = docs
        .iter()
        .map(|d| d.get("_id").map(Bson::to_string).unwrap_or_default())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_read_answers_as_of_its_cluster_time() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let db = client.database("snap");
    let reply = db
        .run_command(doc! {"insert": "c", "documents": [{"_id": "a"}]})
        .await?;
    let t1 = reply.get_timestamp("operationTime")?;
    db.run_command(doc! {"insert": "c", "documents": [{"_id": "b"}]})
        .await?;
    db.run_command(doc! {"delete": "c", "deletes": [{"q": {"_id": "a"}, "limit": 1}]})
        .await?;

    let then = db
        .run_command(doc! {"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": t1}})
        .await?;
    assert_eq!(
        then.get_document("cursor")?
            .get_timestamp("atClusterTime")?,
        t1,
        "{then}"
    );
    assert_eq!(ids(&all_docs(&db, then).await?), vec!["\"a\""]);

    let now = db
        .run_command(doc! {"find": "c", "batchSize": 0, "readConcern": {"level": "snapshot"}})
        .await?;
    let chosen = now.get_document("cursor")?.get_timestamp("atClusterTime")?;
    assert!(chosen > t1, "the router picks its current time: {chosen:?}");
    assert_eq!(ids(&all_docs(&db, now).await?), vec!["\"b\""]);

    let distinct = db
        .run_command(doc! {"distinct": "c", "key": "_id", "readConcern": {"level": "snapshot", "atClusterTime": t1}})
        .await?;
    assert_eq!(
        distinct.get_array("values")?,
        &vec![Bson::String("a".into())]
    );

    let old = db
        .run_command(doc! {"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": Timestamp {time: 1, increment: 1}}})
        .await
        .expect_err("a time older than the history kept");
    assert_eq!(tests::scenarios::code_of(&old), Some(239), "{old}");
    cluster.stop().await;
    Ok(())
}

/// A write batch that replaces more than the shard's history may hold (dropping a collection
/// of 40 MiB against the 32 MiB history) keeps none of it rather than holding it all on the
/// way: reads as of a time before the batch are refused with 239, never answered from
/// incomplete history; reads after it are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_the_history_bound_moves_its_floor() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("snap");
    let pad = "h".repeat(1 << 20);
    for chunk in (0..40).collect::<Vec<i32>>().chunks(8) {
        db.collection::<Document>("big")
            .insert_many(chunk.iter().map(|i| doc! {"_id": i, "pad": &pad}))
            .await?;
    }
    let reply = db
        .run_command(doc! {"insert": "small", "documents": [{"_id": 1}]})
        .await?;
    let before = reply.get_timestamp("operationTime")?;
    db.collection::<Document>("big").drop().await?;
    let refused = db
        .run_command(
            doc! {"find": "small", "readConcern": {"level": "snapshot", "atClusterTime": before}},
        )
        .await
        .expect_err("history from before the drop was not kept");
    assert_eq!(tests::scenarios::code_of(&refused), Some(239), "{refused}");
    let reply = db
        .run_command(doc! {"insert": "small", "documents": [{"_id": 2}]})
        .await?;
    let after = reply.get_timestamp("operationTime")?;
    let then = db
        .run_command(
            doc! {"find": "small", "readConcern": {"level": "snapshot", "atClusterTime": after}},
        )
        .await?;
    assert_eq!(ids(&all_docs(&db, then).await?).len(), 2);
    cluster.stop().await;
    Ok(())
}

/// Applies one change event to `copy`, strictly: an insert of a document the copy has, or an
/// update or delete of one it lacks, is a duplicate or a gap and fails.
fn apply(copy: &mut BTreeMap<String, Document>, ev: &Document) -> anyhow::Result<()> {
    let id = ev
        .get_document("documentKey")?
        .get("_id")
        .map(Bson::to_string)
        .unwrap_or_default();
    match ev.get_str("operationType")? {
        "insert" => {
            let doc = ev.get_document("fullDocument")?.clone();
            anyhow::ensure!(
                copy.insert(id.clone(), doc).is_none(),
                "duplicate insert of {id}"
            );
        }
        "update" => {
            let d = copy
                .get_mut(&id)
                .ok_or_else(|| anyhow::anyhow!("update of missing {id}"))?;
            let u = ev.get_document("updateDescription")?;
            for (k, v) in u.get_document("updatedFields")? {
                d.insert(k.clone(), v.clone());
            }
            for k in u.get_array("removedFields")? {
                if let Some(k) = k.as_str() {
                    d.remove(k);
                }
            }
        }
        "delete" => {
            anyhow::ensure!(copy.remove(&id).is_some(), "delete of missing {id}");
        }
        other => anyhow::bail!("unexpected event {other}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_copy_then_the_stream_from_its_time_ends_exactly_in_step() -> anyhow::Result<()>
{
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "boot.c", doc! {"_id": "hashed"}).await?;
    let db = client.database("boot");
    let c = db.collection::<Document>("c");
    let docs: Vec<Document> = (0..300).map(|i| doc! {"_id": i, "n": 0}).collect();
    c.insert_many(docs).await?;

    // Writers insert, update and delete on every shard while the copy is made.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..2_i32 {
        let c = c.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut i = 0_i32;
            while !stop.load(Ordering::Relaxed) {
                let id = (i * 7 + w * 13) % 300;
                c.update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}, "$set": {"by": w}})
                    .await?;
                c.insert_one(doc! {"_id": format!("w{w}-{i}"), "n": i})
                    .await?;
                if i % 3 == 0 {
                    c.delete_one(doc! {"_id": format!("w{w}-{}", i / 2)})
                        .await?;
                }
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The copy is as of `at`; writes made after it (these, and the writers') must not be in it.
    let at = db
        .run_command(doc! {"ping": 1})
        .await?
        .get_timestamp("operationTime")?;
    for i in 0..30 {
        c.insert_one(doc! {"_id": format!("late-{i}")}).await?;
        c.update_one(doc! {"_id": 200 + i}, doc! {"$set": {"late": true}})
            .await?;
    }
    c.delete_many(doc! {"_id": {"$gte": 290, "$lt": 300}})
        .await?;
    let reply = db
        .run_command(doc! {"find": "c", "batchSize": 50, "readConcern": {"level": "snapshot", "atClusterTime": at}})
        .await?;
    assert_eq!(
        reply
            .get_document("cursor")?
            .get_timestamp("atClusterTime")?,
        at
    );
    let snapshot = all_docs(&db, reply).await?;
    let mut copy: BTreeMap<String, Document> = snapshot
        .into_iter()
        .map(|d| (d.get("_id").map(Bson::to_string).unwrap_or_default(), d))
        .collect();
    let mut stream = c
        .watch()
        .start_at_operation_time(at)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await??;
    }
    c.insert_one(doc! {"_id": "end"}).await?;
    let mut applied = 0;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the stream ended"))??;
        // Events at exactly `at` are in the snapshot already.
        if ev.get_timestamp("clusterTime")? <= at {
            continue;
        }
        apply(&mut copy, &ev)?;
        applied += 1;
        if ev
            .get_document("documentKey")?
            .get_str("_id")
            .is_ok_and(|id| id == "end")
        {
            break;
        }
    }
    let actual: BTreeMap<String, Document> = c
        .find(doc! {})
        .await?
        .map(|d| d.map(|d| (d.get("_id").map(Bson::to_string).unwrap_or_default(), d)))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert!(
        applied > 10,
        "the writers ran during the copy: {applied} events applied"
    );
    assert_eq!(copy.len(), actual.len());
    assert!(copy == actual, "the copy and the collection differ");
    cluster.stop().await;
    Ok(())
}
