//! Shared merges: client streams with the same shard-side spec share one set of shard cursors
//! and one merge, a hub. The hub's task reads the merged stream and appends every released
//! event (as the bytes the shard encoded) to a bounded log; each client keeps its own position in the log, its own post-merge
//! stages (the user's stages) and its own batches. A thousand watchers of one
//! collection cost one shard cursor per shard and one merge, not a thousand.
//!
//! Who shares: streams that start now (no `resumeAfter`, `startAfter` or
//! `startAtOperationTime`), keyed by everything the shards see except the start time (the
//! database, the target, the `$changeStream` options, the pushed-down `$match`). A stream that
//! starts now at `T` joins a hub that has every event from `T` on in its log; otherwise it
//! starts a new hub (its shard cursors start at `T`).
//!
//! A client that stops reading never slows the hub or the others: the log is bounded by bytes,
//! and a client whose position falls off its front leaves the hub and continues on a stream of
//! its own, resumed after the last event it was given (re-reading from the shards).
//!
//! Replies are paced: a client is sent at most one batch with events every `linger`, where
//! `linger` grows with the hub's clients ([`linger`]), so a hub answers at most about
//! `--streamRepliesPerSecond` getMores with events whatever its number of clients. Between two
//! replies the events gather in the log and go out together: a thousand caught-up watchers
//! cost a few large replies each, not one round trip per event each. A client that has not
//! been sent anything for `linger` gets the next event at once, so a quiet stream (or a hub
//! with few clients) sees no added latency.
//!
//! Invariants:
//! * the log holds released events in token order, each once; `base` is the sequence number
//!   of its first event and only grows;
//! * a client is given the log's events from its position on, skipping those before its start,
//!   so it sees exactly what a stream of its own would; its post-batch resume token never goes
//!   backwards, never passes an event it has not been given, and never passes the hub's;
//! * the hub's task ends (and closes the shard cursors) when its last client is gone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bson::{Bson, Document, doc};
use pipeline::changestream::spec::{ChangeStreamPipeline, StartPoint};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wire::{MongoError, Result};

use super::Streams;
use super::assembler::{BatchAssembler, Ready};
use super::batch::RawEvent;
use super::merged::{self, MergedStream};
use super::{Batch, PostMerge};
use crate::kernel::transport::Shards;

/// The default of [`RouterOptions::stream_replies_per_second`](crate::RouterOptions): about
/// how many batches with events a hub sends per second, over all its clients.
pub const REPLIES_PER_SECOND: u32 = 10_000;

/// The longest a client's reply waits for more events to join it.
const MAX_LINGER: Duration = Duration::from_millis(100);

/// The least time between two batches with events to one client of a hub with `clients`
/// clients that sends about `budget` batches per second: none with one client or a budget of
/// 0; with the default, 10 ms with 100 clients; at most [`MAX_LINGER`].
fn linger(clients: usize, budget: u32) -> Duration {
    let clients = u32::try_from(clients).unwrap_or(u32::MAX);
    if clients <= 1 || budget == 0 {
        return Duration::ZERO;
    }
    (Duration::from_secs(1) / budget)
        .saturating_mul(clients)
        .min(MAX_LINGER)
}

/// The hubs of a router, by shard-side spec.
#[derive(Default)]
pub(crate) struct Hubs {
    map: Mutex<HashMap<Vec<u8>, Weak<Hub>>>,
}

impl Hubs {
    /// The running hub for `key` that can serve a stream starting at `start`.
    fn join(&self, key: &[u8], start: ClusterTime) -> Option<(Arc<Hub>, u64)> {
        let mut map = lock(&self.map);
        map.retain(|_, h| h.strong_count() > 0);
        let hub = map.get(key)?.upgrade()?;
        let next = hub.shared.join_at(start)?;
        Some((hub, next))
    }

    fn insert(&self, key: Vec<u8>, hub: &Arc<Hub>) {
        lock(&self.map).insert(key, Arc::downgrade(hub));
    }

    /// The hubs running now and the bytes their logs hold (for `serverStatus`).
    pub fn stats(&self) -> (usize, usize) {
        let map = lock(&self.map);
        let hubs: Vec<Arc<Hub>> = map.values().filter_map(Weak::upgrade).collect();
        drop(map);
        let bytes = hubs.iter().map(|h| lock(&h.shared.log).bytes).sum();
        (hubs.len(), bytes)
    }
}

/// A hub, as its clients hold it; dropping the last one stops the hub's task.
pub(crate) struct Hub {
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What the hub's task and its clients share.
struct Shared {
    log: Mutex<Log>,
    /// Bumped whenever the log changes (new events, a new promise, the end).
    changed: watch::Sender<u64>,
    /// The log's bound, in bytes of memory its events take (see `Logged::cost`).
    max_bytes: usize,
}

struct Log {
    /// Sequence number of `events[0]`.
    base: u64,
    events: VecDeque<Arc<RawEvent>>,
    bytes: usize,
    /// The time of the newest event dropped off the front.
    trimmed_through: ClusterTime,
    /// The time the hub's shard cursors started at: it has every event from there on.
    start: ClusterTime,
    /// The merge's post-batch resume token: every event up to it is in the log (or trimmed).
    released_through: Option<ResumeToken>,
    end: Option<End>,
}

/// What a logged event costs the log in memory, as its bound counts it.
fn cost(event: &RawEvent) -> usize {
    std::mem::size_of::<RawEvent>() + event.bytes.len() + event.token.data().len() + 32
}

#[derive(Clone)]
enum End {
    Invalidated(ResumeToken),
    Failed(MongoError),
}

impl Log {
    fn new(start: ClusterTime) -> Log {
        Log {
            base: 0,
            events: VecDeque::new(),
            bytes: 0,
            trimmed_through: ClusterTime::ZERO,
            start,
            released_through: None,
            end: None,
        }
    }

    /// Where a stream starting at `start` begins in the log, if the log has every event from
    /// `start` on.
    fn join_at(&self, start: ClusterTime) -> Option<u64> {
        if self.end.is_some() || self.start > start || self.trimmed_through >= start {
            return None;
        }
        let skip = self.events.partition_point(|e| e.time < start);
        Some(self.base + skip as u64)
    }

    /// Appends a released event, dropping the oldest while the log holds more than
    /// `max_bytes` (it always keeps the newest).
    fn push(&mut self, event: RawEvent, max_bytes: usize) {
        self.bytes += cost(&event);
        self.events.push_back(Arc::new(event));
        while self.bytes > max_bytes && self.events.len() > 1 {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= cost(&old);
            self.base += 1;
            self.trimmed_through = old.time;
        }
    }
}

impl Shared {
    fn join_at(&self, start: ClusterTime) -> Option<u64> {
        lock(&self.log).join_at(start)
    }

    fn push(&self, event: RawEvent) {
        lock(&self.log).push(event, self.max_bytes);
    }

    fn update(&self, f: impl FnOnce(&mut Log)) {
        f(&mut lock(&self.log));
        self.changed.send_modify(|n| *n += 1);
    }
}

/// The hub's task: reads the merged stream into the log until cancelled or the stream ends.
async fn run(
    streams: Arc<Streams>,
    mut merged: MergedStream,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    loop {
        while let Some(e) = merged.pop_ready() {
            shared.push(e);
        }
        let pbrt = merged.post_batch_resume_token();
        let end = merged.invalidated().cloned().map(End::Invalidated);
        let over = end.is_some();
        shared.update(|log| {
            if pbrt.is_some() {
                log.released_through = pbrt;
            }
            if end.is_some() {
                log.end = end;
            }
        });
        if over {
            break;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let waited = tokio::select! {
            r = merged.wait(&streams, deadline) => r,
            _ = cancel.cancelled() => break,
        };
        if let Err(e) = waited {
            shared.update(|log| log.end = Some(End::Failed(e)));
            break;
        }
    }
    merged.kill().await;
}

/// A client stream of a hub.
pub(crate) struct HubClient {
    hub: Arc<Hub>,
    /// Sequence number of the next log event to look at.
    next: u64,
    /// Events before this time are not this stream's.
    start: ClusterTime,
    /// The token of the last log event looked at (given to the client or dropped by its
    /// stages): the client's position.
    position: Option<ResumeToken>,
    /// The last post-batch resume token reported.
    reported: Option<ResumeToken>,
    /// When the client was last sent a batch with events (replies are paced: see [`linger`]).
    last_sent: Option<tokio::time::Instant>,
    post: PostMerge,
    closed: bool,
    /// What the stream needs to go on by itself if it falls behind the log.
    db: String,
    coll: Option<String>,
    stages: Vec<Bson>,
    /// The client's read preference, when it accepts secondaries.
    read: Option<Bson>,
}

/// The hub key: the shard-side command without its start time.
fn key(
    db: &str,
    coll: Option<&str>,
    stages: &[Bson],
    parsed: &ChangeStreamPipeline,
    read: Option<&Bson>,
) -> Vec<u8> {
    let spec = match stages.first() {
        Some(Bson::Document(first)) => first
            .get_document("$changeStream")
            .cloned()
            .unwrap_or_default(),
        _ => Document::new(),
    };
    let key = doc! {
        "db": db,
        "coll": coll.map(Bson::from).unwrap_or(Bson::Null),
        "spec": spec,
        "pushedDown": super::shard_stages(stages, parsed),
        "readPreference": read.cloned().unwrap_or(Bson::Null),
    };
    key.to_vec().unwrap_or_default()
}

impl HubClient {
    /// A shared stream for a client stream that starts now; `None` for one that cannot share
    /// (it has a start point of its own).
    pub async fn open(
        streams: &Arc<Streams>,
        db: &str,
        coll: Option<&str>,
        stages: &[Bson],
        parsed: &ChangeStreamPipeline,
        read: Option<Bson>,
    ) -> Result<Option<HubClient>> {
        if parsed.spec.start != StartPoint::None {
            return Ok(None);
        }
        let key = key(db, coll, stages, parsed, read.as_ref());
        let start = merged::cluster_now(streams).await?;
        let (hub, next) = match streams.hubs.join(&key, start) {
            Some(joined) => {
                // The stream's events are those at or after `start`. A stream of its own tells
                // every shard its start (the aggregate carries the router's clock), so a write
                // made after it opened can never be older; a joining stream sends the clock
                // around itself, or a shard whose clock lagged could still write below it.
                let transport = &streams.transport;
                for r in transport
                    .broadcast(&transport.all(), "admin", &doc! {"ping": 1})
                    .await
                {
                    r?;
                }
                joined
            }
            None => {
                let merged = merged::open(
                    streams,
                    db,
                    coll,
                    stages,
                    parsed,
                    Some(start),
                    read.as_ref(),
                )
                .await?;
                let (changed, _) = watch::channel(0);
                let shared = Arc::new(Shared {
                    log: Mutex::new(Log::new(start)),
                    changed,
                    max_bytes: streams.buffer_bytes,
                });
                let cancel = streams.services.shutdown().child_token();
                let reader = run(streams.clone(), merged, shared.clone(), cancel.clone());
                streams.services.spawn("hub", reader);
                let hub = Arc::new(Hub { shared, cancel });
                streams.hubs.insert(key, &hub);
                (hub, 0)
            }
        };
        let start = lock(&hub.shared.log).start.max(start);
        Ok(Some(HubClient {
            hub,
            next,
            start,
            position: None,
            reported: None,
            last_sent: None,
            post: PostMerge::new(parsed),
            closed: false,
            db: db.to_string(),
            coll: coll.map(str::to_string),
            stages: stages.to_vec(),
            read,
        }))
    }

    /// The next client batch: up to `n` events, waiting up to `max_time` for the first one;
    /// `None` when the client has fallen off the log's front (see [`HubClient::resume_stages`]).
    pub async fn next_batch(
        &mut self,
        streams: &Arc<Streams>,
        n: usize,
        max_time: Duration,
        keep_tokens: bool,
    ) -> Result<Option<Batch>> {
        let deadline = tokio::time::Instant::now() + max_time;
        let mut changed = self.hub.shared.changed.subscribe();
        let mut batch = BatchAssembler::new(n).keeping_tokens(keep_tokens);
        loop {
            changed.borrow_and_update();
            let (taken, caught_up, released, end) = {
                let log = lock(&self.hub.shared.log);
                if self.next < log.base {
                    return Ok(None);
                }
                let from = (self.next - log.base) as usize;
                let want = n.saturating_sub(batch.len());
                let taken: Vec<Arc<RawEvent>> =
                    log.events.iter().skip(from).take(want).cloned().collect();
                let caught_up = from + taken.len() == log.events.len();
                (
                    taken,
                    caught_up,
                    log.released_through.clone(),
                    log.end.clone(),
                )
            };
            let mut full = false;
            for logged in taken {
                if logged.time >= self.start
                    && let Some(event) = self.post.given(&logged)?
                    && batch.offer(&logged.token, event).is_err()
                {
                    // The batch is full: this event starts the next one.
                    full = true;
                    break;
                }
                self.next += 1;
                self.position = Some(logged.token.clone());
            }
            let caught_up = caught_up && !full;
            if caught_up && let Some(end) = end {
                match end {
                    End::Failed(e) => return Err(super::label_resumable(e)),
                    End::Invalidated(token) if n > 0 => {
                        self.closed = true;
                        let (events, tokens) = batch.into_events();
                        return Ok(Some(Batch {
                            events,
                            tokens,
                            post_batch_resume_token: Some(token),
                            invalidated: true,
                        }));
                    }
                    End::Invalidated(_) => {}
                }
            }
            let now = tokio::time::Instant::now();
            // A batch that is neither full nor past its client's pace waits for more events.
            let budget = streams.replies_per_second;
            let pace = self
                .last_sent
                .map(|last| last + linger(Arc::strong_count(&self.hub), budget));
            let until = match batch.ready(now, deadline, !caught_up, pace) {
                Ready::WaitUntil(until) => until,
                Ready::Send => {
                    if !batch.is_empty() {
                        self.last_sent = Some(now);
                    }
                    let token = self.post_batch_resume_token(caught_up, released);
                    let (events, tokens) = batch.into_events();
                    return Ok(Some(Batch {
                        events,
                        tokens,
                        post_batch_resume_token: token,
                        invalidated: false,
                    }));
                }
            };
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(until) => {
                    if !batch.is_empty() {
                        // Paced long enough: what has gathered goes out (after one more look).
                        self.last_sent = None;
                    }
                }
            }
        }
    }

    /// Where the client stands: its last event while it has not caught up with the log; once
    /// it has, the hub's released-through token (or the high-water mark at its start).
    fn post_batch_resume_token(
        &mut self,
        caught_up: bool,
        released: Option<ResumeToken>,
    ) -> Option<ResumeToken> {
        let best = client_token(self.start, self.position.as_ref(), caught_up, released);
        if self.reported.as_ref().is_none_or(|r| best > *r) {
            self.reported = Some(best);
        }
        self.reported.clone()
    }

    /// For a client that fell off the log's front: its pipeline, resumed after the last event
    /// it was given (or at its start), to go on by itself on a stream of its own.
    pub fn resume_stages(&self) -> super::Resume {
        let mut stages = self.stages.clone();
        if let Some(Bson::Document(first)) = stages.first_mut()
            && let Ok(spec) = first.get_document_mut("$changeStream")
        {
            match &self.position {
                Some(t) => spec.insert("resumeAfter", t.to_document()),
                None => spec.insert(
                    "startAtOperationTime",
                    Bson::Timestamp(self.start.timestamp()),
                ),
            };
        }
        super::Resume {
            db: self.db.clone(),
            coll: self.coll.clone(),
            stages,
            read: self.read.clone(),
        }
    }

    pub async fn kill(&mut self) {
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// A client's post-batch resume token: the larger of the high-water mark at its start and
/// the last log event it looked at, and, once it has looked at every event in the log, the
/// hub's released-through token.
fn client_token(
    start: ClusterTime,
    position: Option<&ResumeToken>,
    caught_up: bool,
    released: Option<ResumeToken>,
) -> ResumeToken {
    let mut best = ResumeTokenData::high_water_mark(start, TokenVersion::default()).encode();
    for t in position
        .cloned()
        .into_iter()
        .chain(released.filter(|_| caught_up))
    {
        if t > best {
            best = t;
        }
    }
    best
}

/// Never held across `.await`; a poisoned log is still consistent (every update is whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: u32, i: u32) -> ClusterTime {
        ClusterTime::from_u64((u64::from(t) << 32) | u64::from(i))
    }

    fn event(ts: ClusterTime, n: i32) -> RawEvent {
        let id = resume::token::event_identifier("insert", Some(("documentKey", doc! {"_id": n})));
        let data = ResumeTokenData::event(
            ts,
            TokenVersion::default(),
            0,
            Some(bson::Uuid::from_bytes([7; 16])),
            Some(id),
        )
        .expect("a valid token");
        let doc = doc! {"_id": data.encode().to_document(), "operationType": "insert", "n": n};
        let raw = bson::RawDocumentBuf::try_from(&doc).expect("encodes");
        RawEvent::parse(&raw).expect("an event")
    }

    #[test]
    fn a_stream_joins_at_its_start_only_while_the_log_has_everything_from_there() {
        let mut log = Log::new(at(10, 1));
        for i in 1..=4 {
            log.push(event(at(10, i * 2), i as i32), usize::MAX);
        }
        // Events at (10,2) (10,4) (10,6) (10,8): a start at (10,5) begins at the third.
        assert_eq!(log.join_at(at(10, 5)), Some(2));
        assert_eq!(
            log.join_at(at(10, 9)),
            Some(4),
            "after every event: at the end"
        );
        assert_eq!(log.join_at(at(9, 0)), None, "before the hub's own start");
        log.end = Some(End::Invalidated(event(at(10, 9), 0).token));
        assert_eq!(log.join_at(at(10, 9)), None, "an ended hub takes nobody");
    }

    #[test]
    fn the_log_keeps_to_its_bound_and_remembers_what_it_dropped() {
        let mut probe = Log::new(at(5, 0));
        probe.push(event(at(5, 1), 1), usize::MAX);
        let one = probe.bytes;
        let mut log = Log::new(at(5, 0));
        for i in 1..=10 {
            log.push(event(at(5, i), i as i32), 3 * one);
        }
        assert_eq!(log.events.len(), 3);
        assert_eq!(log.base, 7, "sequence numbers go on across the trim");
        assert!(log.bytes <= 3 * one);
        assert_eq!(log.trimmed_through, at(5, 7));
        assert_eq!(log.join_at(at(5, 7)), None, "an event at (5,7) is gone");
        assert_eq!(log.join_at(at(5, 8)), Some(7));
    }

    #[test]
    fn the_pace_bounds_a_hubs_replies_whatever_its_clients() {
        let budget = 20_000;
        assert_eq!(linger(0, budget), Duration::ZERO);
        assert_eq!(
            linger(1, budget),
            Duration::ZERO,
            "a lone client is never held back"
        );
        assert_eq!(
            linger(100, 0),
            Duration::ZERO,
            "a budget of 0 paces nothing"
        );
        assert_eq!(linger(100, budget), Duration::from_millis(5));
        assert_eq!(linger(1000, budget), Duration::from_millis(50));
        assert_eq!(linger(1_000_000, budget), MAX_LINGER);
        // Clients × replies each per second stays at the budget below the cap.
        for clients in [2usize, 10, 100, 1000] {
            let each = 1.0 / linger(clients, budget).as_secs_f64();
            let total = each * clients as f64;
            assert!(
                (total - f64::from(budget)).abs() < 1.0,
                "{clients}: {total}"
            );
        }
    }

    #[test]
    fn a_client_token_never_passes_what_it_has_not_looked_at() {
        let start = at(20, 1);
        let hwm = |t| ResumeTokenData::high_water_mark(t, TokenVersion::default()).encode();
        let e1 = event(at(20, 3), 1).token;
        let released = hwm(at(20, 9));
        assert_eq!(client_token(start, None, true, None), hwm(start));
        // Behind the log's end: its own position, not the hub's.
        assert_eq!(
            client_token(start, Some(&e1), false, Some(released.clone())),
            e1
        );
        // Caught up: the hub's released-through token.
        assert_eq!(
            client_token(start, Some(&e1), true, Some(released.clone())),
            released
        );
        // A hub behind the client's start never pulls the client's token back.
        assert_eq!(
            client_token(start, None, true, Some(hwm(at(19, 0)))),
            hwm(start)
        );
    }
}
