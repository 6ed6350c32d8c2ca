//! Views read through the router with the `mongodb` driver: `find` (filter, sort, skip,
//! limit, projection, getMore under the view's namespace), `count` and
//! `estimatedDocumentCount`, `distinct`, `aggregate`, a view on a view, and a view over a
//! sharded collection; writes to a view are refused.

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use tests::EmbeddedCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_are_read_through_their_pipeline() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "app.orders", doc! {"_id": "hashed"}).await?;
    let db = client.database("app");
    let orders = db.collection::<Document>("orders");
    orders
        .insert_many(
            (0..300).map(|i| doc! {"_id": i, "qty": i % 10, "tags": ["a", format!("t{}", i % 3)]}),
        )
        .await?;
    db.run_command(
        doc! {"create": "big", "viewOn": "orders", "pipeline": [{"$match": {"qty": {"$gte": 5}}}]},
    )
    .await?;
    db.run_command(doc! {"create": "bigger", "viewOn": "big", "pipeline": [{"$match": {"qty": {"$gte": 8}}}, {"$project": {"tags": 0}}]})
        .await?;
    let big = db.collection::<Document>("big");
    let bigger = db.collection::<Document>("bigger");

    // find with every option, in batches (getMores under the view's namespace).
    let found: Vec<Document> = big
        .find(doc! {"qty": {"$lt": 7}})
        .sort(doc! {"_id": -1})
        .skip(2)
        .limit(50)
        .projection(doc! {"qty": 1})
        .batch_size(7)
        .await?
        .try_collect()
        .await?;
    assert_eq!(found.len(), 50);
    assert_eq!(found[0], doc! {"_id": 286, "qty": 6}); // 296 and 295 skipped
    assert!(found.iter().all(|d| matches!(d.get_i32("qty"), Ok(5 | 6))));
    assert!(
        found
            .windows(2)
            .all(|w| w[0].get_i32("_id").ok() > w[1].get_i32("_id").ok())
    );

    // count, estimatedDocumentCount, distinct, aggregate.
    assert_eq!(big.count_documents(doc! {}).await?, 150);
    assert_eq!(big.count_documents(doc! {"qty": 9}).await?, 30);
    assert_eq!(big.estimated_document_count().await?, 150);
    let tags = big.distinct("tags", doc! {"qty": 5}).await?;
    assert_eq!(tags.len(), 4, "{tags:?}");
    let grouped: Vec<Document> = big
        .aggregate([
            doc! {"$group": {"_id": "$qty", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(grouped.len(), 5);
    assert_eq!(grouped[0], doc! {"_id": 5, "n": 30});

    // A view on a view: both pipelines, innermost first.
    assert_eq!(bigger.count_documents(doc! {}).await?, 60);
    let one = bigger
        .find_one(doc! {"_id": 9})
        .await?
        .expect("9 is in bigger");
    assert_eq!(one, doc! {"_id": 9, "qty": 9});

    // Writes to a view are refused.
    let err = big
        .insert_one(doc! {"x": 1})
        .await
        .expect_err("a view is read-only");
    assert_eq!(tests::scenarios::code_of(&err), Some(166), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_from_a_view_reads_the_views_documents() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    db.collection::<Document>("items")
        .insert_many([
            doc! {"_id": 1, "k": "a", "live": true},
            doc! {"_id": 2, "k": "a", "live": false},
        ])
        .await?;
    db.collection::<Document>("keys")
        .insert_one(doc! {"_id": "a"})
        .await?;
    db.run_command(
        doc! {"create": "live", "viewOn": "items", "pipeline": [{"$match": {"live": true}}]},
    )
    .await?;
    let joined: Vec<Document> = db
        .collection::<Document>("keys")
        .aggregate([doc! {"$lookup": {"from": "live", "localField": "_id", "foreignField": "k", "as": "items"}}])
        .await?
        .try_collect()
        .await?;
    assert_eq!(
        joined,
        [doc! {"_id": "a", "items": [{"_id": 1, "k": "a", "live": true}]}]
    );
    // A $unionWith's sub-pipeline and a $graphLookup's search run over the view's documents.
    let keys = db.collection::<Document>("keys");
    let union: Vec<Document> = keys
        .aggregate([doc! {"$unionWith": {"coll": "live", "pipeline": [{"$project": {"k": 1}}]}}])
        .await?
        .try_collect()
        .await?;
    assert_eq!(union, [doc! {"_id": "a"}, doc! {"_id": 1, "k": "a"}]);
    let graph: Vec<Document> = keys
        .aggregate([doc! {"$graphLookup": {"from": "live", "startWith": "$_id", "connectFromField": "_id", "connectToField": "k", "as": "items"}}])
        .await?
        .try_collect()
        .await?;
    assert_eq!(
        graph,
        [doc! {"_id": "a", "items": [{"_id": 1, "k": "a", "live": true}]}]
    );
    Ok(())
}
