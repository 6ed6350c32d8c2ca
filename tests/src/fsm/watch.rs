//! Change-stream watchers for the FSM suites, in four modes: continuous reading, resuming
//! after every event from its token, reading as an application does (one stream, the driver's
//! own automatic resume), and prefix reads (a new stream started at a recorded time or token
//! must replay exactly the recorded stream's suffix from there).
//!
//! Invariants: a watcher never skips what it was given: on any error it reopens the stream from
//! the last token it returned (any token must resume, on any router, after any restart); it
//! stops at its stream's end (`invalidate`) or at the end marker of a cluster stream. A
//! driver-resume watcher records every error that reaches it as an application error (the
//! driver resumes from resumable errors by itself; whatever it lets through, an application
//! sees), then reopens so the rest of its stream is still checked.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use mongodb::bson::{Bson, Document, Timestamp};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::{Client, Collection};

use super::model::{Scope, WatchSpec, compare_suffix, suffix_from_time};

/// How a watcher reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One stream, read to its end.
    Continuous,
    /// A new stream for every event, resumed from the previous event's token.
    ResumeEach,
    /// One stream on a client with default options over every router (retryable reads on):
    /// the driver resumes by itself, and any error it lets through is a failure.
    DriverResume,
    /// A consumer of a subscription to the cluster stream (`readSubscription`), over every
    /// router in turn, acking, nacking and dropping deliveries at random: its first deliveries
    /// must be the stream, in order (checked like the others); a first delivery out of token
    /// order is an application error.
    Subscription,
}

/// Where a stream starts.
#[derive(Debug, Clone)]
pub enum Start {
    Now,
    ResumeAfter(ResumeToken),
    StartAfter(ResumeToken),
    AtTime(Timestamp),
}

/// When a cluster stream is done: after this event identity (the workload's `dropDatabase`).
pub fn cluster_end_marker(db: &str) -> String {
    format!("dropDatabase {db}")
}

/// Opens a stream for `spec`.
pub async fn open(
    client: &Client,
    spec: &WatchSpec,
    start: &Start,
) -> mongodb::error::Result<ChangeStream<Document>> {
    macro_rules! build {
        ($w:expr) => {{
            let mut w = $w.show_expanded_events(spec.expanded);
            if spec.images {
                w = w
                    .full_document(mongodb::options::FullDocumentType::Required)
                    .full_document_before_change(
                        mongodb::options::FullDocumentBeforeChangeType::Required,
                    );
            }
            match start {
                Start::Now => {}
                Start::ResumeAfter(t) => w = w.resume_after(t.clone()),
                Start::StartAfter(t) => w = w.start_after(t.clone()),
                Start::AtTime(t) => w = w.start_at_operation_time(*t),
            }
            Ok(w.max_await_time(Duration::from_millis(500))
                .await?
                .with_type::<Document>())
        }};
    }
    match &spec.scope {
        Scope::Collection { db, coll } => {
            let c: Collection<Document> = client.database(db).collection(coll);
            build!(c.watch())
        }
        Scope::Database(db) => {
            let d = client.database(db);
            build!(d.watch())
        }
        Scope::Cluster => build!(client.watch()),
    }
}

fn is_end(spec: &WatchSpec, ev: &Document, end_marker: &str) -> bool {
    match spec.scope {
        Scope::Cluster => super::model::ident_of_event(ev).is_ok_and(|i| i == end_marker),
        _ => ev
            .get_str("operationType")
            .is_ok_and(|op| op == "invalidate"),
    }
}

pub fn token_of(ev: &Document) -> Result<ResumeToken> {
    let id = ev.get("_id").cloned().context("event without _id")?;
    Ok(mongodb::bson::deserialize_from_bson(id)?)
}

/// What a watcher read.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    pub events: Vec<Document>,
    /// Read to the stream's end.
    pub complete: bool,
    /// Errors it resumed from (kills in flight), for the report.
    pub resumed_errors: Vec<String>,
    /// Errors that reached it although the driver resumes by itself ([`Mode::DriverResume`]):
    /// each one is a failure, unless the whole cluster was down then (see [`AppError`]).
    pub application_errors: Vec<AppError>,
    /// Where it reopened its stream: (events read so far, the error, the router it moved to).
    pub reopens: Vec<(usize, String, usize)>,
}

/// An error that reached a [`Mode::DriverResume`] application.
#[derive(Debug, Clone)]
pub struct AppError {
    pub at: tokio::time::Instant,
    /// No router accepted a connection: the driver labels a failed connect
    /// `SystemOverloadedError`, keeps the router selectable and retries twice within ~0.3 s
    /// (mongodb 3.9's backpressure), after its one resume. While every router is down (a
    /// whole-cluster restart) that gives up, as the driver's specification lets it.
    pub unreachable: bool,
    pub what: String,
}

impl AppError {
    fn new(what: String, unreachable: bool) -> AppError {
        AppError {
            at: tokio::time::Instant::now(),
            unreachable,
            what,
        }
    }
}

/// Whether the driver failed to connect (see [`AppError::unreachable`]).
fn unreachable(e: &mongodb::error::Error) -> bool {
    e.contains_label(mongodb::error::SYSTEM_OVERLOADED_ERROR)
}

/// An opened watcher, ready before the workload's threads start.
pub struct Watcher {
    pub spec: WatchSpec,
    pub mode: Mode,
    /// Clients of every router: each reopen moves to the next one (any token must resume on
    /// any router).
    clients: Vec<Client>,
    next_client: usize,
    stream: Option<ChangeStream<Document>>,
    /// Where to resume: the token of the last event returned, or of the stream's start.
    resume: Start,
    end_marker: String,
    /// [`Mode::Subscription`]'s consumer.
    consumer: Option<Consumer>,
}

/// A subscription consumer's state: its subscription, the deliveries seen (by token), the
/// last first delivery's token, and the randomness of its acks.
struct Consumer {
    name: String,
    seen: std::collections::HashSet<String>,
    last: Option<String>,
    rng: rand::rngs::StdRng,
}

impl Watcher {
    /// Opens the stream now (so it sees everything after this point).
    pub async fn open(
        clients: Vec<Client>,
        first: usize,
        spec: WatchSpec,
        mode: Mode,
        db: &str,
    ) -> Result<Watcher> {
        let client = clients
            .get(first % clients.len().max(1))
            .context("no clients")?;
        let mut stream = open(client, &spec, &Start::Now).await?;
        // The post-batch resume token is "now": resuming from it sees everything after here.
        let _ = stream.next_if_any().await?;
        let token = stream
            .resume_token()
            .context("no resume token after opening")?;
        let consumer = if mode == Mode::Subscription {
            // The subscription starts where the stream opened: it sees everything after here.
            let name = format!("fsm_{db}_{first}");
            let mut change_stream = mongodb::bson::doc! {
                "allChangesForCluster": true, "showExpandedEvents": spec.expanded,
            };
            if spec.images {
                change_stream.insert("fullDocument", "required");
                change_stream.insert("fullDocumentBeforeChange", "required");
            }
            let start = mongodb::bson::serialize_to_bson(&token)?;
            client
                .database("admin")
                .run_command(mongodb::bson::doc! {
                    "createSubscription": &name, "changeStream": change_stream,
                    "start": start, "ackTimeoutSecs": 2, "maxDeliveries": 1000,
                })
                .await?;
            use rand::SeedableRng;
            Some(Consumer {
                name,
                seen: Default::default(),
                last: None,
                rng: rand::rngs::StdRng::seed_from_u64(first as u64),
            })
        } else {
            None
        };
        Ok(Watcher {
            spec,
            mode,
            next_client: first + 1,
            clients,
            stream: (mode != Mode::Subscription).then_some(stream),
            resume: Start::ResumeAfter(token),
            end_marker: cluster_end_marker(db),
            consumer,
        })
    }

    /// Reads until the stream's end, or until no event came for `idle` (then incomplete).
    pub async fn run(mut self, idle: Duration, deadline: tokio::time::Instant) -> Observed {
        if self.consumer.is_some() {
            return self.consume(idle, deadline).await;
        }
        let mut out = Observed::default();
        let mut last_progress = tokio::time::Instant::now();
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline || now.duration_since(last_progress) > idle {
                return out;
            }
            if self.stream.is_none() {
                let Some(client) = self.clients.get(self.next_client % self.clients.len()) else {
                    return out;
                };
                self.next_client += 1;
                match open(client, &self.spec, &self.resume).await {
                    Ok(s) => self.stream = Some(s),
                    Err(e) => {
                        if self.mode == Mode::DriverResume {
                            out.application_errors.push(AppError::new(
                                format!("reopening after an error: {e}"),
                                unreachable(&e),
                            ));
                        }
                        out.resumed_errors.push(format!("reopen: {e}"));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            match tokio::time::timeout(Duration::from_secs(2), stream.next()).await {
                Err(_) => {} // nothing yet
                Ok(None) => {
                    // The stream ended without our end marker (a closed cursor): reopen.
                    if self.mode == Mode::DriverResume {
                        out.application_errors.push(AppError::new(
                            format!(
                                "after {} events: the stream ended before its end",
                                out.events.len()
                            ),
                            false,
                        ));
                    }
                    self.stream = None;
                }
                Ok(Some(Err(e))) => {
                    if self.mode == Mode::DriverResume {
                        out.application_errors.push(AppError::new(
                            format!("after {} events: {e}", out.events.len()),
                            unreachable(&e),
                        ));
                    }
                    out.resumed_errors.push(e.to_string());
                    out.reopens.push((
                        out.events.len(),
                        e.to_string().chars().take(120).collect(),
                        self.next_client % self.clients.len().max(1),
                    ));
                    self.stream = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Some(Ok(ev))) => {
                    last_progress = tokio::time::Instant::now();
                    let end = is_end(&self.spec, &ev, &self.end_marker);
                    if let Ok(t) = token_of(&ev) {
                        self.resume = Start::ResumeAfter(t);
                    }
                    out.events.push(ev);
                    if end {
                        out.complete = true;
                        return out;
                    }
                    if self.mode == Mode::ResumeEach {
                        self.stream = None;
                    }
                }
            }
        }
    }
}

impl Watcher {
    /// [`Mode::Subscription`]: reads the subscription until the end marker's first delivery,
    /// or until nothing new came for `idle`.
    async fn consume(mut self, idle: Duration, deadline: tokio::time::Instant) -> Observed {
        use mongodb::bson::doc;
        use rand::Rng;
        let mut out = Observed::default();
        let Some(mut c) = self.consumer.take() else {
            return out;
        };
        let mut last_progress = tokio::time::Instant::now();
        let mut ended = false;
        loop {
            let now = tokio::time::Instant::now();
            if ended || now >= deadline || now.duration_since(last_progress) > idle {
                out.complete = ended;
                return out;
            }
            let Some(client) = self
                .clients
                .get(self.next_client % self.clients.len().max(1))
            else {
                return out;
            };
            let admin = client.database("admin");
            let max = c.rng.random_range(1..100);
            let read = admin
                .run_command(
                    doc! {"readSubscription": &c.name, "consumer": "c", "max": max, "waitMS": 500},
                )
                .await;
            let messages: Vec<Document> = match read
                .map_err(anyhow::Error::from)
                .and_then(|r| Ok(r.get_array("messages")?.clone()))
            {
                Ok(m) => m
                    .into_iter()
                    .filter_map(|m| m.as_document().cloned())
                    .collect(),
                Err(e) => {
                    // A router killed or a lease moving: the next router, a little later.
                    out.resumed_errors.push(e.to_string());
                    self.next_client += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let (mut ack, mut nack) = (Vec::new(), Vec::new());
            for m in messages {
                let (Ok(id), Ok(event)) = (m.get_str("deliveryId"), m.get_document("event")) else {
                    continue;
                };
                let token = event
                    .get_document("_id")
                    .and_then(|t| t.get_str("_data"))
                    .unwrap_or("")
                    .to_string();
                if c.seen.insert(token.clone()) {
                    if c.last.as_ref().is_some_and(|l| *l > token) {
                        out.application_errors.push(AppError::new(
                            format!(
                                "a first delivery out of token order after {} events",
                                out.events.len()
                            ),
                            false,
                        ));
                    }
                    c.last = Some(token);
                    last_progress = tokio::time::Instant::now();
                    ended |= is_end(&self.spec, event, &self.end_marker);
                    out.events.push(event.clone());
                }
                match c.rng.random_range(0..10) {
                    0..8 => ack.push(Bson::String(id.to_string())),
                    8 => nack.push(Bson::String(id.to_string())),
                    _ => {} // dropped: delivered again after the ack timeout
                }
            }
            // Failed acks and nacks only bring deliveries again.
            if !nack.is_empty() {
                let _ = admin
                    .run_command(doc! {"nackSubscription": &c.name, "consumer": "c", "deliveryIds": nack, "retryInMS": 50})
                    .await;
            }
            if !ack.is_empty() {
                let durable = c.rng.random_bool(0.2);
                let _ = admin
                    .run_command(doc! {"ackSubscription": &c.name, "consumer": "c", "deliveryIds": ack, "waitDurable": durable})
                    .await;
            }
        }
    }
}

/// A stream from `start`, read until it has given `n` events (or ended, or stalled).
async fn read_n(
    client: &Client,
    spec: &WatchSpec,
    start: &Start,
    n: usize,
    idle: Duration,
) -> Result<Vec<Document>> {
    let mut out = Vec::new();
    let mut resume = start.clone();
    let mut stream = None;
    let mut last_progress = tokio::time::Instant::now();
    let mut errors = 0;
    while out.len() < n {
        if last_progress.elapsed() > idle {
            break;
        }
        if stream.is_none() {
            match open(client, spec, &resume).await {
                Ok(s) => stream = Some(s),
                Err(e) => {
                    errors += 1;
                    if errors > 50 {
                        bail!("opening a prefix read from {start:?}: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let Some(s) = stream.as_mut() else { continue };
        match tokio::time::timeout(Duration::from_secs(2), s.next()).await {
            Err(_) => {}
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                errors += 1;
                if errors > 50 {
                    bail!("a prefix read from {start:?} keeps failing: {e}");
                }
                stream = None;
            }
            Ok(Some(Ok(ev))) => {
                last_progress = tokio::time::Instant::now();
                if let Ok(t) = token_of(&ev) {
                    resume = Start::ResumeAfter(t);
                }
                out.push(ev);
            }
        }
    }
    Ok(out)
}

fn cluster_time(ev: &Document) -> Option<Timestamp> {
    match ev.get("clusterTime") {
        Some(Bson::Timestamp(t)) => Some(*t),
        _ => None,
    }
}

/// Prefix reads against a verified recording: from `points` positions, start new streams with
/// `resumeAfter`/`startAfter` the event's token (→ the events after it), `startAtOperationTime`
/// its clusterTime and one tick later (→ the events at or after that time), and from each of
/// `times` (recorded times, e.g. oplog entries). Returns the failures.
pub async fn prefix_reads(
    client: &Client,
    spec: &WatchSpec,
    recorded: &[Document],
    points: usize,
    times: &[(u32, u32)],
    idle: Duration,
) -> Result<(usize, Vec<String>)> {
    // Start points before the stream's end (the terminating event and its invalidate).
    let usable = recorded
        .iter()
        .position(|e| {
            let op = e.get_str("operationType").unwrap_or("");
            match spec.scope {
                Scope::Cluster => false,
                Scope::Database(_) => matches!(op, "invalidate" | "dropDatabase"),
                Scope::Collection { .. } => {
                    matches!(op, "invalidate" | "dropDatabase" | "drop" | "rename")
                }
            }
        })
        .unwrap_or(recorded.len());
    let mut failures = Vec::new();
    let mut reads = 0;
    if usable == 0 {
        return Ok((0, failures));
    }
    let step = (usable / points.max(1)).max(1);
    let mut starts: Vec<(Start, &[Document], String)> = Vec::new();
    for i in (0..usable).step_by(step).take(points) {
        let ev = &recorded[i];
        let token = token_of(ev)?;
        starts.push((
            Start::ResumeAfter(token.clone()),
            &recorded[i + 1..],
            format!("resumeAfter the token of event {i}"),
        ));
        starts.push((
            Start::StartAfter(token),
            &recorded[i + 1..],
            format!("startAfter the token of event {i}"),
        ));
        if let Some(t) = cluster_time(ev) {
            starts.push((
                Start::AtTime(t),
                suffix_from_time(recorded, (t.time, t.increment)),
                format!("startAtOperationTime {t:?} (event {i})"),
            ));
            let later = Timestamp {
                time: t.time,
                increment: t.increment + 1,
            };
            starts.push((
                Start::AtTime(later),
                suffix_from_time(recorded, (later.time, later.increment)),
                format!("startAtOperationTime {later:?} (after event {i})"),
            ));
        }
    }
    // Recorded times within the stream's span.
    let first = recorded.first().and_then(cluster_time);
    let last_usable = recorded
        .get(usable.saturating_sub(1))
        .and_then(cluster_time);
    if let (Some(a), Some(b)) = (first, last_usable) {
        let inside: Vec<&(u32, u32)> = times
            .iter()
            .filter(|t| **t >= (a.time, a.increment) && **t <= (b.time, b.increment))
            .collect();
        let step = (inside.len() / points.max(1)).max(1);
        for t in inside.into_iter().step_by(step).take(points) {
            starts.push((
                Start::AtTime(Timestamp {
                    time: t.0,
                    increment: t.1,
                }),
                suffix_from_time(recorded, *t),
                format!("startAtOperationTime {t:?} (an oplog time)"),
            ));
        }
    }
    for (start, expected, what) in starts {
        let got = read_n(client, spec, &start, expected.len(), idle).await?;
        reads += 1;
        if let Some(diff) = compare_suffix(expected, &got) {
            failures.push(format!("{} prefix read {what}: {diff}", spec.scope));
        }
    }
    Ok((reads, failures))
}
