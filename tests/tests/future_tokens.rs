//! Start points ahead of the cluster's time, handled as MongoDB 7.0 handles them: the request
//! does not move any clock forward (a client cannot push the cluster's time); the stream opens
//! at once and returns nothing written before that time; once the cluster's time passes it,
//! a `startAtOperationTime` (or a high-water-mark token) stream goes on from there, and a
//! stream resumed after an event token that no event matched fails with 280
//! (`ChangeStreamFatalError`: the token was not found), as it does for any token the stream
//! moves past without seeing.

use std::time::Duration;

use mongodb::bson::{Document, Timestamp, doc};
use resume::ClusterTime;
use resume::token::ResumeTokenData;
use tests::EmbeddedCluster;
use tests::scenarios::code_of_any;
use tests::streams::next_event as next;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_ahead_of_the_cluster_waits_for_its_time_and_moves_no_clock() -> anyhow::Result<()>
{
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("future").collection::<Document>("c");
    c.insert_one(doc! {"_id": 0}).await?;
    let mut plain = c
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    c.insert_one(doc! {"_id": 1}).await?;
    let seen = next(&mut plain).await?;
    let now = seen.get_timestamp("clusterTime")?;
    let ahead = Timestamp {
        time: now.time + 3,
        increment: 1,
    };
    // A real event's token, moved three seconds ahead: an event that never happened.
    let real = ResumeTokenData::from_document(seen.get_document("_id")?)?;
    let future_event = ResumeTokenData::event(
        ClusterTime::new(ahead.time, 1),
        real.version(),
        0,
        real.uuid(),
        real.event_identifier().cloned(),
    )?
    .encode()
    .to_document();

    let mut at = c
        .watch()
        .start_at_operation_time(ahead)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let mut resumed = c
        .watch()
        .resume_after(mongodb::bson::deserialize_from_document::<
            mongodb::change_stream::event::ResumeToken,
        >(future_event)?)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    // Nothing moved the clock: a write now is still before `ahead`.
    let before = c.insert_one(doc! {"_id": 2}).await;
    before?;
    let t = client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await?
        .get_timestamp("operationTime")?;
    assert!(
        t < ahead,
        "the future start moved the cluster's time to {t:?}"
    );
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    c.insert_one(doc! {"_id": 3}).await?;
    let first = next(&mut at).await?;
    assert_eq!(
        first.get_document("documentKey")?.get_i32("_id")?,
        3,
        "the write before the start time is not in the stream: {first}"
    );
    assert!(first.get_timestamp("clusterTime")? >= ahead);
    let err = next(&mut resumed)
        .await
        .expect_err("the token was never an event");
    let code = code_of_any(&err);
    assert_eq!(code, Some(280), "{err}");
    cluster.stop().await;
    Ok(())
}
