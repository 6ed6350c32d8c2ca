//! Durability under `kill -9`: every write the router acknowledged is still there after a shard
//! process is killed mid-load and restarted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Document, doc};
use tests::ProcessCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_of_a_shard() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "durable.c", doc! {"_id": "hashed"}).await?;
    let coll = client.database("durable").collection::<Document>("c");
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4_i64 {
        let coll = coll.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut i = 0_i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 100_000 {
                let id = w * 1_000_000 + i;
                if coll.insert_one(doc! {"_id": id, "w": w}).await.is_ok() {
                    acked.lock().unwrap().push(id);
                }
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.shards[1].kill();
    let acked_at_kill = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.shards[1].restart().await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await?;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked_at_kill > 50,
        "the load was running when the shard died ({acked_at_kill} acks)"
    );
    let fresh = tests::connect(cluster.router.addr).await?;
    let c = fresh.database("durable").collection::<Document>("c");
    let mut missing = Vec::new();
    for chunk in acked.chunks(1000) {
        let n = c
            .count_documents(doc! {"_id": {"$in": chunk.to_vec()}})
            .await?;
        if n as usize != chunk.len() {
            for id in chunk {
                if c.find_one(doc! {"_id": id}).await?.is_none() {
                    missing.push(*id);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    Ok(())
}
