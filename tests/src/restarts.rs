//! Applications through shard restarts: writers, readers and change-stream watchers that use a
//! driver as an application does (default options: retryable writes and reads, automatic
//! resume), while shards of a multi-process cluster are killed (SIGKILL) and restarted.
//!
//! What must hold (the checks of [`verify`]): no error reaches the application, and every
//! stream holds exactly the acknowledged writes of its scope, each writer's in the order it
//! made them, each once (the stream's tokens strictly increase).
//!
//! The workload is the same for every driver: writer `w` inserts `{_id: "w<w>-<i>", w, i}`
//! into `hashed` (sharded on `{_id: "hashed"}`, so over every shard) or `plain` (unsharded),
//! and updates every third document it inserted with `$set: {u: true}`. A database watcher
//! sees both collections; an updateLookup watcher on `hashed` checks that every update event
//! carries the document. The end: `{_id: "end"}` inserted into both collections.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::FullDocumentType;
use mongodb::{Client, Collection};
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use tokio::sync::watch;

use crate::ProcessCluster;

/// The database of the workload.
pub const DB: &str = "restarts";
/// The end marker's `_id`.
pub const END: &str = "end";

/// One write an application made and the server acknowledged: `(op, coll, _id)`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Write {
    pub writer: usize,
    pub op: String,
    pub coll: String,
    pub id: String,
}

/// One event a watcher saw: `(op, coll, _id)`, its token's `_data`, and whether an update had
/// its looked-up document.
#[derive(Debug, Clone, Deserialize)]
pub struct Seen {
    pub op: String,
    pub coll: String,
    pub id: String,
    pub token: String,
    #[serde(default)]
    pub full_document: bool,
}

/// What one application run observed.
#[derive(Debug, Default, Deserialize)]
pub struct Report {
    pub acked: Vec<Write>,
    /// The database stream.
    pub db_events: Vec<Seen>,
    /// The updateLookup stream on `hashed`.
    pub lookup_events: Vec<Seen>,
    pub reads: usize,
    /// Every error the application saw, from any writer, reader or watcher.
    pub errors: Vec<String>,
}

/// Kills a random shard (SIGKILL) and restarts it on the same port and data, every 1–2.5 s,
/// for `duration`. Returns how many kills it made.
pub async fn kill_shards(
    cluster: &mut ProcessCluster,
    duration: Duration,
    seed: u64,
) -> Result<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let end = tokio::time::Instant::now() + duration;
    let mut kills = 0;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..2500))).await;
        let i = rng.random_range(0..cluster.shards.len());
        let down = Duration::from_millis(rng.random_range(100..800));
        let shard = &mut cluster.shards[i];
        shard.kill();
        kills += 1;
        tokio::time::sleep(down).await;
        shard
            .restart()
            .await
            .with_context(|| format!("restarting shard{i}"))?;
    }
    Ok(kills)
}

/// Creates the workload's collections (before any fault).
pub async fn setup(client: &Client) -> Result<()> {
    let db = client.database(DB);
    db.create_collection("plain").await?;
    crate::shard_collection(client, &format!("{DB}.hashed"), doc! {"_id": "hashed"}).await?;
    Ok(())
}

/// The workload through the Rust driver: `writers` writers, one reader, the two watchers;
/// writes until `stop` turns true, then writes the end marker and waits for the watchers.
pub async fn run_rust(
    client: &Client,
    writers: usize,
    stop: watch::Receiver<bool>,
) -> Result<Report> {
    let db = client.database(DB);
    // The watchers open before the first write.
    let db_stream = db.watch().await?.with_type::<Document>();
    let hashed: Collection<Document> = db.collection("hashed");
    let lookup_stream = hashed
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .await?
        .with_type::<Document>();
    let db_watcher = tokio::spawn(read_stream(db_stream, 2));
    let lookup_watcher = tokio::spawn(read_stream(lookup_stream, 1));
    let reader = tokio::spawn(read_loop(client.clone(), stop.clone()));
    let writer_tasks: Vec<_> = (0..writers)
        .map(|w| tokio::spawn(write_loop(client.clone(), w, stop.clone())))
        .collect();
    let mut report = Report::default();
    for t in writer_tasks {
        let (acked, errors) = t.await?;
        report.acked.extend(acked);
        report.errors.extend(errors);
    }
    let (reads, errors) = reader.await?;
    report.reads = reads;
    report.errors.extend(errors);
    for coll in ["plain", "hashed"] {
        db.collection::<Document>(coll)
            .insert_one(doc! {"_id": END})
            .await
            .with_context(|| format!("inserting the end marker into {coll}"))?;
    }
    let (events, errors) = db_watcher.await?;
    report.db_events = events;
    report.errors.extend(errors);
    let (events, errors) = lookup_watcher.await?;
    report.lookup_events = events;
    report.errors.extend(errors);
    Ok(report)
}

async fn write_loop(
    client: Client,
    w: usize,
    stop: watch::Receiver<bool>,
) -> (Vec<Write>, Vec<String>) {
    let db = client.database(DB);
    let mut acked = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        let coll = if i % 2 == 0 { "hashed" } else { "plain" };
        let id = format!("w{w}-{i}");
        let c = db.collection::<Document>(coll);
        match c
            .insert_one(doc! {"_id": &id, "w": w as i64, "i": i as i64})
            .await
        {
            Ok(_) => acked.push(write(w, "insert", coll, &id)),
            Err(e) => errors.push(format!("writer {w}: insert {id}: {e}")),
        }
        if i % 3 == 0 {
            match c
                .update_one(doc! {"_id": &id}, doc! {"$set": {"u": true}})
                .await
            {
                Ok(r) if r.modified_count == 1 => acked.push(write(w, "update", coll, &id)),
                Ok(_) => {}
                Err(e) => errors.push(format!("writer {w}: update {id}: {e}")),
            }
        }
        i += 1;
    }
    (acked, errors)
}

fn write(writer: usize, op: &str, coll: &str, id: &str) -> Write {
    Write {
        writer,
        op: op.into(),
        coll: coll.into(),
        id: id.into(),
    }
}

/// Reads (retryable: find and count) in a loop until `stop`.
async fn read_loop(client: Client, stop: watch::Receiver<bool>) -> (usize, Vec<String>) {
    let db = client.database(DB);
    let mut reads = 0;
    let mut errors = Vec::new();
    while !*stop.borrow() {
        for coll in ["hashed", "plain"] {
            let c = db.collection::<Document>(coll);
            match c.count_documents(doc! {}).await {
                Ok(_) => reads += 1,
                Err(e) => errors.push(format!("reader: count {coll}: {e}")),
            }
            match c.find_one(doc! {"_id": "w0-0"}).await {
                Ok(_) => reads += 1,
                Err(e) => errors.push(format!("reader: find_one {coll}: {e}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (reads, errors)
}

/// Reads a stream until it has seen `ends` end markers. Any error ends the stream for the
/// application (the driver resumes by itself from what it can), so it ends the read too.
async fn read_stream(
    mut stream: mongodb::change_stream::ChangeStream<Document>,
    ends: usize,
) -> (Vec<Seen>, Vec<String>) {
    let mut events = Vec::new();
    let mut seen_ends = 0;
    while seen_ends < ends {
        match tokio::time::timeout(Duration::from_secs(120), stream.next()).await {
            Err(_) => return (events, vec!["a watcher saw nothing for 120 s".into()]),
            Ok(None) => return (events, vec!["a watcher's stream ended".into()]),
            Ok(Some(Err(e))) => return (events, vec![format!("watcher: {e}")]),
            Ok(Some(Ok(ev))) => match seen(&ev) {
                Ok(s) => {
                    if s.id == END {
                        seen_ends += 1;
                    } else {
                        events.push(s);
                    }
                }
                Err(e) => return (events, vec![format!("watcher: unreadable event {ev}: {e}")]),
            },
        }
    }
    (events, Vec::new())
}

fn seen(ev: &Document) -> Result<Seen> {
    let id = match ev.get_document("documentKey")?.get("_id") {
        Some(Bson::String(s)) => s.clone(),
        other => anyhow::bail!("documentKey._id is {other:?}"),
    };
    Ok(Seen {
        op: ev.get_str("operationType")?.to_string(),
        coll: ev.get_document("ns")?.get_str("coll")?.to_string(),
        id,
        token: ev.get_document("_id")?.get_str("_data")?.to_string(),
        full_document: matches!(ev.get("fullDocument"), Some(Bson::Document(_))),
    })
}

/// The checks: no error reached the application; each stream holds exactly the acknowledged
/// writes of its scope, in each writer's order, each once; updateLookup filled in every
/// update. Returns the failures (empty when the run is good).
pub fn verify(report: &Report) -> Vec<String> {
    let mut failures: Vec<String> = report
        .errors
        .iter()
        .map(|e| format!("the application saw an error: {e}"))
        .collect();
    let streams = [
        ("database stream", &report.db_events, None),
        (
            "updateLookup stream on hashed",
            &report.lookup_events,
            Some("hashed"),
        ),
    ];
    for (name, events, only) in streams {
        failures.extend(check_stream(name, events, &report.acked, only));
    }
    for e in &report.lookup_events {
        if e.op == "update" && !e.full_document {
            failures.push(format!(
                "updateLookup stream: update of {} without its document",
                e.id
            ));
        }
    }
    failures
}

fn check_stream(name: &str, events: &[Seen], acked: &[Write], only: Option<&str>) -> Vec<String> {
    let mut failures = Vec::new();
    for pair in events.windows(2) {
        if pair[1].token <= pair[0].token {
            failures.push(format!(
                "{name}: tokens do not increase: {} {} then {} {}",
                pair[0].op, pair[0].id, pair[1].op, pair[1].id
            ));
        }
    }
    let writers = acked.iter().map(|w| w.writer + 1).max().unwrap_or(0);
    for w in 0..writers {
        let expected: Vec<(&str, &str, &str)> = acked
            .iter()
            .filter(|a| a.writer == w && only.is_none_or(|c| a.coll == c))
            .map(|a| (a.op.as_str(), a.coll.as_str(), a.id.as_str()))
            .collect();
        let prefix = format!("w{w}-");
        let got: Vec<(&str, &str, &str)> = events
            .iter()
            .filter(|e| e.id.starts_with(&prefix))
            .map(|e| (e.op.as_str(), e.coll.as_str(), e.id.as_str()))
            .collect();
        if got != expected {
            let at = got.iter().zip(&expected).position(|(g, x)| g != x);
            failures.push(format!(
                "{name}: writer {w} made {} acknowledged writes, the stream has {} events; first difference at {at:?}: stream {:?}, writes {:?}",
                expected.len(),
                got.len(),
                at.and_then(|i| got.get(i)),
                at.and_then(|i| expected.get(i)),
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: &str, id: &str, token: &str) -> Seen {
        Seen {
            op: op.into(),
            coll: "plain".into(),
            id: id.into(),
            token: token.into(),
            full_document: false,
        }
    }

    fn report(events: Vec<Seen>) -> Report {
        Report {
            acked: vec![
                write(0, "insert", "plain", "w0-0"),
                write(0, "insert", "plain", "w0-1"),
            ],
            db_events: events,
            ..Report::default()
        }
    }

    #[test]
    fn the_checks_pass_an_exact_stream_and_fail_each_defect() {
        let good = report(vec![ev("insert", "w0-0", "01"), ev("insert", "w0-1", "02")]);
        assert!(verify(&good).is_empty(), "{:?}", verify(&good));
        let missing = report(vec![ev("insert", "w0-1", "02")]);
        assert!(verify(&missing)[0].contains("first difference at Some(0)"));
        let dup = report(vec![
            ev("insert", "w0-0", "01"),
            ev("insert", "w0-0", "01"),
            ev("insert", "w0-1", "02"),
        ]);
        assert!(
            verify(&dup)
                .iter()
                .any(|f| f.contains("tokens do not increase"))
        );
        let swapped = report(vec![ev("insert", "w0-1", "01"), ev("insert", "w0-0", "02")]);
        assert!(!verify(&swapped).is_empty());
        let mut errored = report(vec![ev("insert", "w0-0", "01"), ev("insert", "w0-1", "02")]);
        errored.errors.push("watcher: HostUnreachable".into());
        assert!(verify(&errored)[0].contains("saw an error"));
    }
}
