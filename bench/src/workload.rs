//! The load: writers and watchers through the Rust driver, and the per-second sampler.
//!
//! Every write carries a sequence number (`seq`: in the document for inserts, in the `$set`
//! for updates); a writer records, per `seq`, when it sent the write and when the server
//! acknowledged it, and a watcher that receives the event measures send → arrival (the write's
//! durable commit included) and acknowledgement → arrival. An event that arrives before its
//! writer has recorded the acknowledgement counts as 0 µs (it beat the acknowledgement).
//!
//! Invariants: counts only grow; a watcher counts only the events of the bench's collection;
//! acknowledgement times live in a fixed ring (`ACK_RING` slots), so memory does not grow with
//! the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bson::{Document, RawBsonRef, RawDocument, RawDocumentBuf, doc};
use futures::StreamExt;
use hdrhistogram::Histogram;
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::options::FullDocumentType;
use mongodb::{Client, Collection};

/// Slots of the acknowledgement-time ring (a seq's slot is `seq % ACK_RING`).
const ACK_RING: usize = 1 << 21;

/// What the writers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Op {
    Insert,
    Update,
    /// Inserts and updates, alternating.
    Mixed,
}

/// Where the watchers watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Level {
    Collection,
    Database,
    Cluster,
}

/// The writers' settings.
#[derive(Debug, Clone)]
pub struct WriteSpec {
    pub writers: usize,
    pub op: Op,
    pub batch: usize,
    /// Writes per second per writer; 0 is flat out.
    pub rate: u64,
    pub payload: usize,
    /// Stop after this many writes in all.
    pub limit: Option<u64>,
    pub ordered: bool,
    /// Each insert batch is one transaction of single-document inserts.
    pub txn: bool,
}

/// The watchers' settings.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub level: Level,
    pub pipeline: Vec<Document>,
    pub full_document: Option<FullDocumentType>,
    pub full_document_before_change: Option<mongodb::options::FullDocumentBeforeChangeType>,
    pub start_at: Option<bson::Timestamp>,
}

/// State shared by the writers, the watchers and the sampler.
pub struct Shared {
    pub start: Instant,
    pub next_seq: AtomicU64,
    pub acked: AtomicU64,
    pub write_errors: AtomicU64,
    pub stop_writing: AtomicBool,
    /// Set once every writer has returned: `acked` is final.
    pub writers_done: AtomicBool,
    /// Acknowledgement time of a seq, in µs since `start`, plus one (0: not yet).
    acks: Vec<AtomicU64>,
    /// Send time of a seq, likewise.
    sends: Vec<AtomicU64>,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            start: Instant::now(),
            next_seq: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            stop_writing: AtomicBool::new(false),
            writers_done: AtomicBool::new(false),
            acks: (0..ACK_RING).map(|_| AtomicU64::new(0)).collect(),
            sends: (0..ACK_RING).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn record_ack(&self, seq: u64) {
        self.acks[seq as usize % ACK_RING].store(self.now_us() + 1, Ordering::Release);
    }

    fn record_send(&self, seq: u64) {
        let slot = seq as usize % ACK_RING;
        self.acks[slot].store(0, Ordering::Relaxed);
        self.sends[slot].store(self.now_us() + 1, Ordering::Release);
    }

    /// µs from `seq`'s acknowledgement to now (0 if the event came first).
    fn since_ack(&self, seq: u64) -> u64 {
        match self.acks[seq as usize % ACK_RING].load(Ordering::Acquire) {
            0 => 0,
            at => self.now_us().saturating_sub(at - 1),
        }
    }

    /// µs from `seq`'s send to now (`None` if it was never recorded).
    fn since_send(&self, seq: u64) -> Option<u64> {
        match self.sends[seq as usize % ACK_RING].load(Ordering::Acquire) {
            0 => None,
            at => Some(self.now_us().saturating_sub(at - 1)),
        }
    }
}

/// Inserts the documents updates work on: 100 per writer, `_id: "p<w>-<k>"`.
pub async fn seed_update_pool(coll: &Collection<Document>, spec: &WriteSpec) -> Result<()> {
    if spec.op == Op::Insert {
        return Ok(());
    }
    let docs: Vec<Document> = (0..spec.writers)
        .flat_map(|w| (0..100).map(move |k| doc! {"_id": format!("p{w}-{k}"), "n": 0_i64}))
        .collect();
    coll.insert_many(docs)
        .await
        .context("seeding the documents to update")?;
    Ok(())
}

/// One writer, until `shared.stop_writing` or the write limit.
pub async fn write(coll: Collection<Document>, w: usize, spec: WriteSpec, shared: Arc<Shared>) {
    let payload = "x".repeat(spec.payload);
    let per_round = match spec.op {
        Op::Insert => spec.batch,
        Op::Update => 1,
        Op::Mixed => spec.batch + 1,
    };
    let interval =
        (spec.rate > 0).then(|| Duration::from_secs_f64(per_round as f64 / spec.rate as f64));
    let mut session = None;
    if spec.txn {
        match coll.client().start_session().await {
            Ok(s) => session = Some(s),
            Err(_) => {
                shared.write_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let mut next = tokio::time::Instant::now();
    let mut round = 0_u64;
    while !shared.stop_writing.load(Ordering::Relaxed) {
        if let Some(limit) = spec.limit
            && shared.next_seq.load(Ordering::Relaxed) >= limit
        {
            break;
        }
        if let Some(i) = interval {
            tokio::time::sleep_until(next).await;
            next += i;
        }
        if spec.op != Op::Update {
            insert_batch(&coll, w, &spec, &payload, &shared, session.as_mut()).await;
        }
        if spec.op != Op::Insert {
            let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
            shared.record_send(seq);
            let id = format!("p{w}-{}", round % 100);
            let update = doc! {"$set": {"seq": seq as i64}, "$inc": {"n": 1_i64}};
            match coll.update_one(doc! {"_id": id}, update).await {
                Ok(_) => {
                    shared.record_ack(seq);
                    shared.acked.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    shared.write_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        round += 1;
    }
}

async fn insert_batch(
    coll: &Collection<Document>,
    w: usize,
    spec: &WriteSpec,
    payload: &str,
    shared: &Shared,
    session: Option<&mut mongodb::ClientSession>,
) {
    let first = shared
        .next_seq
        .fetch_add(spec.batch as u64, Ordering::Relaxed);
    let seqs = first..first + spec.batch as u64;
    for s in seqs.clone() {
        shared.record_send(s);
    }
    let docs: Vec<Document> = seqs
        .clone()
        .map(|s| doc! {"_id": format!("w{w}-{s}"), "seq": s as i64, "payload": payload})
        .collect();
    let result = if let Some(session) = session {
        in_transaction(coll, &docs, session).await
    } else if docs.len() == 1 {
        coll.insert_one(&docs[0]).await.map(|_| ())
    } else {
        coll.insert_many(&docs)
            .ordered(spec.ordered)
            .await
            .map(|_| ())
    };
    match result {
        Ok(()) => {
            for s in seqs {
                shared.record_ack(s);
            }
            shared.acked.fetch_add(spec.batch as u64, Ordering::Relaxed);
        }
        Err(_) => {
            shared
                .write_errors
                .fetch_add(spec.batch as u64, Ordering::Relaxed);
        }
    }
}

/// Inserts `docs` one statement each in one transaction, retrying it whole on a transient
/// error and its commit on an unknown result, as drivers' convenient APIs do.
async fn in_transaction(
    coll: &Collection<Document>,
    docs: &[Document],
    session: &mut mongodb::ClientSession,
) -> mongodb::error::Result<()> {
    loop {
        session.start_transaction().await?;
        let mut failed = None;
        for d in docs {
            if let Err(e) = coll.insert_one(d).session(&mut *session).await {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            let _ = session.abort_transaction().await;
            if e.contains_label("TransientTransactionError") {
                continue;
            }
            return Err(e);
        }
        loop {
            match session.commit_transaction().await {
                Ok(()) => return Ok(()),
                Err(e) if e.contains_label("UnknownTransactionCommitResult") => continue,
                Err(e) if e.contains_label("TransientTransactionError") => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Opens one watcher's stream.
pub async fn open(
    client: &Client,
    db: &str,
    coll: &str,
    spec: &WatchSpec,
) -> Result<ChangeStream<RawDocumentBuf>> {
    macro_rules! build {
        ($w:expr) => {{
            let mut w = $w;
            if let Some(f) = &spec.full_document {
                w = w.full_document(f.clone());
            }
            if let Some(f) = &spec.full_document_before_change {
                w = w.full_document_before_change(f.clone());
            }
            if let Some(t) = spec.start_at {
                w = w.start_at_operation_time(t);
            }
            w.max_await_time(Duration::from_millis(500))
                .await?
                .with_type::<RawDocumentBuf>()
        }};
    }
    let pipeline = spec.pipeline.clone();
    let database = client.database(db);
    let collection = database.collection::<Document>(coll);
    Ok(match spec.level {
        Level::Collection => build!(collection.watch().pipeline(pipeline)),
        Level::Database => build!(database.watch().pipeline(pipeline)),
        Level::Cluster => build!(client.watch().pipeline(pipeline)),
    })
}

/// Resumes a stream after the first event at or after `start` (its token read by a stream
/// opened there first) and times it from the `watch` call to its first event.
pub async fn resume_to_first_event(
    client: &Client,
    db: &str,
    coll: &str,
    spec: &WatchSpec,
    start: bson::Timestamp,
) -> Result<Duration> {
    let mut at_start = WatchSpec {
        level: spec.level,
        pipeline: spec.pipeline.clone(),
        full_document: spec.full_document.clone(),
        full_document_before_change: spec.full_document_before_change.clone(),
        start_at: Some(start),
    };
    let mut first = open(client, db, coll, &at_start).await?;
    let token = match first.next().await {
        Some(event) => event?
            .get_document("_id")
            .map_err(|e| anyhow::anyhow!("an event without a resume token: {e}"))?
            .to_owned(),
        None => anyhow::bail!("no event to resume after"),
    };
    drop(first);
    at_start.start_at = None;
    let token: ResumeToken = bson::deserialize_from_slice(token.as_bytes())?;
    let opened = Instant::now();
    let database = client.database(db);
    let collection = database.collection::<Document>(coll);
    let mut resumed = match spec.level {
        Level::Collection => {
            collection
                .watch()
                .pipeline(at_start.pipeline)
                .resume_after(token)
                .await?
        }
        Level::Database => {
            database
                .watch()
                .pipeline(at_start.pipeline)
                .resume_after(token)
                .await?
        }
        Level::Cluster => {
            client
                .watch()
                .pipeline(at_start.pipeline)
                .resume_after(token)
                .await?
        }
    };
    match resumed.next().await {
        Some(event) => {
            event?;
            Ok(opened.elapsed())
        }
        None => anyhow::bail!("the resumed stream ended"),
    }
}

/// What one watcher measured.
pub struct Watched {
    pub events: u64,
    /// Acknowledgement → arrival, µs.
    pub latency: Histogram<u64>,
    /// Send → arrival, µs.
    pub send_latency: Histogram<u64>,
    /// From the call to [`watch`] to the first event.
    pub first_event: Option<Duration>,
    /// When the first event arrived.
    pub first_event_at: Option<Instant>,
    /// From the call to [`watch`] to the last event.
    pub last_event: Option<Duration>,
    pub error: Option<String>,
}

/// Reads `stream` until `done` says so: it gets the count so far and whether the stream has
/// been idle for a second.
pub async fn watch(
    mut stream: ChangeStream<RawDocumentBuf>,
    coll: String,
    count: Arc<AtomicU64>,
    shared: Arc<Shared>,
    done: impl Fn(u64, bool) -> bool,
) -> Watched {
    let opened = Instant::now();
    let mut out = Watched {
        events: 0,
        latency: Histogram::new(3).expect("3 significant figures is a valid histogram"),
        send_latency: Histogram::new(3).expect("3 significant figures is a valid histogram"),
        first_event: None,
        first_event_at: None,
        last_event: None,
        error: None,
    };
    loop {
        let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
        let ev = match next {
            Err(_) => {
                if done(out.events, true) {
                    return out;
                }
                continue;
            }
            Ok(None) => {
                out.error = Some("the stream ended".into());
                return out;
            }
            Ok(Some(Err(e))) => {
                out.error = Some(e.to_string());
                return out;
            }
            Ok(Some(Ok(ev))) => ev,
        };
        if ev.get_document("ns").and_then(|n| n.get_str("coll")).ok() != Some(coll.as_str()) {
            continue;
        }
        out.events += 1;
        count.store(out.events, Ordering::Relaxed);
        out.first_event.get_or_insert_with(|| opened.elapsed());
        out.first_event_at.get_or_insert_with(Instant::now);
        out.last_event = Some(opened.elapsed());
        if let Some(seq) = seq_of(&ev) {
            let _ = out.latency.record(shared.since_ack(seq));
            if let Some(us) = shared.since_send(seq) {
                let _ = out.send_latency.record(us);
            }
        }
        if done(out.events, false) {
            return out;
        }
    }
}

/// The write's sequence number carried by an event (read in place: a watcher decodes only
/// what it measures).
fn seq_of(ev: &RawDocument) -> Option<u64> {
    let from = |d: &RawDocument| match d.get("seq").ok().flatten() {
        Some(RawBsonRef::Int64(s)) => Some(s as u64),
        Some(RawBsonRef::Int32(s)) => Some(s as u64),
        _ => None,
    };
    ev.get_document("fullDocument")
        .ok()
        .and_then(from)
        .or_else(|| {
            ev.get_document("updateDescription")
                .and_then(|u| u.get_document("updatedFields"))
                .ok()
                .and_then(from)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(d: Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(&d).expect("encodes")
    }

    #[test]
    fn the_sequence_number_comes_from_the_document_or_the_update() {
        assert_eq!(seq_of(&raw(doc! {"fullDocument": {"seq": 7_i64}})), Some(7));
        assert_eq!(
            seq_of(&raw(
                doc! {"updateDescription": {"updatedFields": {"seq": 9_i64, "n": 2}}}
            )),
            Some(9)
        );
        assert_eq!(seq_of(&raw(doc! {"operationType": "drop"})), None);
        assert_eq!(seq_of(&raw(doc! {"fullDocument": {"seq": 3_i32}})), Some(3));
    }

    #[test]
    fn latency_is_measured_from_the_recorded_acknowledgement() {
        let shared = Shared::new();
        assert_eq!(shared.since_ack(5), 0, "not acknowledged yet");
        shared.record_ack(5);
        std::thread::sleep(Duration::from_millis(2));
        assert!(shared.since_ack(5) >= 2000);
        assert_eq!(shared.since_ack(6), 0, "another seq");
    }
}
