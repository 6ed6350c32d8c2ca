//! Limits against hostile input, through the real driver: each test is named after the limit
//! it holds, and shows the request is refused with MongoDB's error (or bounded) and that the
//! cluster goes on serving afterwards.

use std::time::Duration;

use mongodb::bson::{Document, Timestamp, doc};
use tests::EmbeddedCluster;
use tests::scenarios::code_of;
use tests::streams::next_event as next;

/// The cluster's time as a `ping` reply gives it.
async fn operation_time(client: &mongodb::Client) -> anyhow::Result<Timestamp> {
    let reply = client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await?;
    Ok(reply.get_timestamp("operationTime")?)
}

/// A read may not name a time ahead of the cluster's (`atClusterTime`, `afterClusterTime`):
/// the shards would move their clocks there, and every later write would be stamped in the
/// future (and refused by drivers' own drift check). MongoDB answers 72.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_a_future_cluster_time_is_refused_and_moves_no_clock() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("future");
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await?;
    let year_2096 = Timestamp {
        time: 4_000_000_000,
        increment: 1,
    };
    for read_concern in [
        doc! {"level": "snapshot", "atClusterTime": year_2096},
        doc! {"level": "majority", "afterClusterTime": year_2096},
        doc! {"afterClusterTime": year_2096},
    ] {
        let err = db
            .run_command(doc! {"find": "c", "readConcern": read_concern.clone()})
            .await
            .expect_err("a time in 2096");
        assert_eq!(code_of(&err), Some(72), "{read_concern}: {err}");
    }
    // In a transaction too: the first statement's read concern fixes the snapshot.
    let mut session = client.start_session().await?;
    let err = db
        .run_command(doc! {
            "find": "c",
            "lsid": session.id().clone(),
            "txnNumber": 1_i64,
            "startTransaction": true,
            "autocommit": false,
            "readConcern": {"level": "snapshot", "atClusterTime": year_2096},
        })
        .await
        .expect_err("a transaction in 2096");
    assert_eq!(code_of(&err), Some(72), "{err}");
    session.abort_transaction().await.ok();

    let now = operation_time(&client).await?;
    assert!(now.time < 4_000_000_000, "the clock stayed: {now:?}");
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 2})
        .await?;
    // A time the cluster has given out is still a valid snapshot.
    let reply = db
        .run_command(doc! {"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": now}})
        .await?;
    let batch = reply.get_document("cursor")?.get_array("firstBatch")?.len();
    assert_eq!(batch, 1, "as of {now:?}, before the second insert");
    cluster.stop().await;
    Ok(())
}

/// Every reply carries the cluster's time, from the first command a fresh cluster answers:
/// connectors (Debezium) take the start of their change stream from a `ping`'s
/// `operationTime`, which must not be `Timestamp(0, 0)` (a time before all history, 286).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_reply_of_a_fresh_cluster_carries_its_time() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let start = operation_time(&client).await?;
    assert!(start.time > 0, "operationTime {start:?}");
    let c = client.database("fresh").collection::<Document>("c");
    let mut stream = c
        .watch()
        .start_at_operation_time(start)
        .max_await_time(Duration::from_millis(200))
        .await?;
    c.insert_one(doc! {"_id": "first"}).await?;
    let event = next(&mut stream.with_type::<Document>()).await?;
    assert_eq!(event.get_str("operationType")?, "insert");
    assert_eq!(event.get_document("documentKey")?, &doc! {"_id": "first"});
    cluster.stop().await;
    Ok(())
}

/// A transaction creates only what is not there (48, as MongoDB 7.0), and its statements take
/// no write concern of their own (72): the commit's is the transaction's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_refuses_an_existing_collection_and_a_statement_write_concern()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("txn_limits");
    db.create_collection("there").await?;
    // Outside a transaction, creating it again with the same options is fine (7.0).
    db.run_command(doc! {"create": "there"}).await?;

    let mut session = client.start_session().await?;
    session.start_transaction().await?;
    let err = db
        .run_command(doc! {"create": "there"})
        .session(&mut session)
        .await
        .expect_err("it exists");
    assert_eq!(code_of(&err), Some(48), "{err}");
    session.abort_transaction().await.ok();

    let mut session = client.start_session().await?;
    let lsid = session.id().clone();
    let err = db
        .run_command(doc! {
            "insert": "there",
            "documents": [{"_id": 1}],
            "lsid": lsid,
            "txnNumber": 1_i64,
            "startTransaction": true,
            "autocommit": false,
            "writeConcern": {"w": 1},
        })
        .await
        .expect_err("a statement's write concern");
    assert_eq!(code_of(&err), Some(72), "{err}");
    session.abort_transaction().await.ok();
    let n = db
        .collection::<Document>("there")
        .count_documents(doc! {})
        .await?;
    assert_eq!(n, 0, "the refused insert left nothing");
    cluster.stop().await;
    Ok(())
}
