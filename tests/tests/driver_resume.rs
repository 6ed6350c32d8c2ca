//! What the Rust driver (mongodb 3.9) does when it resumes a change stream by itself, shown
//! by its own commands: the soak's driver-resume watchers once missed acknowledged events with
//! no error, and this places the loss in the driver.
//!
//! The driver builds its resume `aggregate` by *taking* the cached resume token out of the
//! stream's state. When that `aggregate` fails in a way retryable reads retry (a closed
//! connection, a router going down), the retry is built again and finds no token: it carries
//! no `resumeAfter`, `startAfter` or `startAtOperationTime` (the initial reply had a
//! post-batch resume token, so the driver kept no start time either). The server cannot tell
//! it from a new `watch()`: the stream starts at "now" and every event between the cached
//! token and the retry is skipped, silently. Nothing in MongoDB's protocol lets a server
//! guard against it; a client on this driver that must not miss events resumes from its own
//! token (as the soak's other watchers do) or turns retryable reads off for its streams.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::ClientOptions;
use tests::EmbeddedCluster;

/// The `$changeStream` stage of every change-stream `aggregate` the client sent.
type Sent = Arc<Mutex<Vec<Document>>>;

async fn monitored_client(
    cluster: &EmbeddedCluster,
    sent: &Sent,
) -> anyhow::Result<mongodb::Client> {
    let mut opts =
        ClientOptions::parse(format!("mongodb://{}/?directConnection=true", cluster.addr)).await?;
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    let sent = sent.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(e) = ev
            && e.command_name == "aggregate"
            && let Some(stage) = e
                .command
                .get_array("pipeline")
                .ok()
                .and_then(|p| p.first())
                .and_then(|s| s.as_document())
                .and_then(|s| s.get_document("$changeStream").ok())
        {
            sent.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(stage.clone());
        }
    }));
    Ok(mongodb::Client::with_options(opts)?)
}

fn starts_somewhere(stage: &Document) -> bool {
    ["resumeAfter", "startAfter", "startAtOperationTime"]
        .iter()
        .any(|k| stage.contains_key(*k))
}

/// A resume whose first `aggregate` loses its connection: the driver retries it without the
/// token it was resuming from, and the event written before the failure is never delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_driver_drops_its_resume_token_when_it_retries_a_resume() -> anyhow::Result<()> {
    let options = router::RouterOptions {
        enable_test_commands: true,
        ..router::RouterOptions::default()
    };
    let cluster = EmbeddedCluster::start_with_options(1, options).await?;
    let sent: Sent = Arc::default();
    let client = monitored_client(&cluster, &sent).await?;
    let coll = client.database("resume").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0}).await?;
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await?;
    let first = tests::streams::next_event(&mut stream).await?;
    assert_eq!(first.get_document("documentKey")?, &doc! {"_id": 1});
    coll.insert_one(doc! {"_id": 2}).await?;
    // The next getMore loses its connection (the stream resumes), and so does the resume's
    // first aggregate (retryable reads retry it).
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": {"times": 2},
            "data": {"failCommands": ["getMore", "aggregate"], "closeConnection": true},
        })
        .await?;
    // _id 3 comes once the resume is over.
    let later = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        coll.insert_one(doc! {"_id": 3}).await
    };
    let (next, inserted) = tokio::join!(tests::streams::next_event(&mut stream), later);
    inserted?;
    let next = next?;
    let stages = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        stages.len(),
        3,
        "the watch, the resume and its retry: {stages:?}"
    );
    assert!(
        !starts_somewhere(&stages[0]),
        "a plain watch(): {}",
        stages[0]
    );
    assert!(
        stages[1].contains_key("resumeAfter"),
        "the resume carries the cached token: {}",
        stages[1]
    );
    assert!(
        !starts_somewhere(&stages[2]),
        "the driver's retry of the resume has lost the token: {}",
        stages[2]
    );
    assert_eq!(
        next.get_document("documentKey")?,
        &doc! {"_id": 3},
        "so the stream restarted at \"now\" and skipped _id 2"
    );
    Ok(())
}
