//! A first end-to-end check: `watch()` through the router sees writes as events, in order.

use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{Document, doc};
use tests::EmbeddedCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_crud_events_in_order() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let coll = client.database("cs").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0}).await?;
    let mut stream = coll.watch().await?;
    coll.insert_one(doc! {"_id": 1, "a": 1}).await?;
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 2}})
        .await?;
    coll.replace_one(doc! {"_id": 1}, doc! {"b": 1}).await?;
    coll.delete_one(doc! {"_id": 1}).await?;
    let mut kinds = Vec::new();
    for _ in 0..4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await?
            .expect("stream ended")?;
        kinds.push(format!("{:?}", ev.operation_type));
    }
    assert_eq!(kinds, ["Insert", "Update", "Replace", "Delete"]);
    cluster.stop().await;
    Ok(())
}
