//! A merged stream: the shard cursors of one change stream (one feed per shard, see [`feed`])
//! and their k-way merge by resume token, up to the released events. What happens to an event
//! after the merge (the post-merge stages) is the business of whoever reads the
//! stream: one client ([`super::ChangeStreamCursor`]), or a hub that shares it among many
//! ([`super::hub`]).
//!
//! Invariants: an event is released only when every shard's promise has passed it, so
//! released tokens strictly increase; the post-batch resume token never goes backwards and
//! never passes what a shard (a lost one included) may still return. An idle shard does not
//! hold the stream back: when an event is buffered behind a shard's promise, that shard is
//! nudged to promise past the event's time. A lagging (or lost) shard does not make the
//! others' events pile up: a shard whose merge buffer holds a getMore's worth of events is not
//! read again until some are released, so a stream holds at most about
//! [`FEED_DEPTH`] + 3 replies per shard, whatever the lag.
//!
//! [`feed`]: super::feed

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bson::{Bson, doc};
use pipeline::changestream::Merger;
use pipeline::changestream::spec::{ChangeStreamPipeline, StartPoint};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};
use shard::sharding::ShardId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::{ErrorCode, MongoError, Result};

use super::Streams;
use super::batch::{RawEvent, ShardBatch};
use super::feed::{self, FeedReply};
use super::label_resumable;
use crate::kernel::transport::{Resend, Shards};

/// Replies queued per shard before its feed waits for the reader (one more waits in the
/// feed's hand, and one is in flight).
const FEED_DEPTH: usize = 1;

/// A shard cursor feeding the merge.
struct ShardCursor {
    shard: ShardId,
    cursor_id: i64,
    /// The latest promise (post-batch resume token).
    promise: Option<ResumeToken>,
    /// The highest time this shard was nudged to promise.
    nudged: ClusterTime,
    /// After the feed re-opened the shard's stream from an event token: that token. The shard
    /// delivers its event again (resumability passes the resume point's own event); it was
    /// merged already, so events up to it are dropped.
    resumed_after: Option<ResumeToken>,
}

/// The shard cursors of a stream and their merge.
pub(super) struct MergedStream {
    db: String,
    /// The `collection` of shard getMores: the collection, or `$cmd.aggregate`.
    shard_collection: String,
    shards: Vec<ShardCursor>,
    merger: Merger<RawEvent>,
    /// Tokens of events pushed but not yet released, with their times (for nudges).
    unreleased: BTreeMap<ResumeToken, ClusterTime>,
    /// Each shard's feed, by index (`None` once the feed has ended).
    rx: Vec<Option<mpsc::Receiver<FeedReply>>>,
    /// Where the next look over `rx` starts, so no shard's replies wait behind another's.
    turn: usize,
    cancel: CancellationToken,
    feeds: Vec<tokio::task::JoinHandle<()>>,
    /// Events per shard getMore, shared with the feeds ([`MergedStream::set_demand`]).
    demand: Arc<AtomicI64>,
}

impl std::fmt::Debug for MergedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergedStream")
            .field("db", &self.db)
            .field("shards", &self.shards.len())
            .field("buffered", &self.merger.buffered())
            .finish()
    }
}

/// Opens the shard cursors of a stream: `stages` as the client sent them, parsed as `parsed`.
/// A stream without a start point starts at `now`, the same time on every shard: when not
/// given, one tick after the cluster's current time, asked of the shards first so "now" is
/// theirs too. `read` is the client's read preference when it accepts secondaries.
pub(super) async fn open(
    streams: &Arc<Streams>,
    db: &str,
    coll: Option<&str>,
    stages: &[Bson],
    parsed: &ChangeStreamPipeline,
    now: Option<ClusterTime>,
    read: Option<&Bson>,
) -> Result<MergedStream> {
    let Some(Bson::Document(first)) = stages.first() else {
        return Err(MongoError::internal(
            "change stream pipeline without its first stage",
        ));
    };
    let mut spec_doc = first
        .get_document("$changeStream")
        .cloned()
        .unwrap_or_default();
    if parsed.spec.start == StartPoint::None {
        let start = match now {
            Some(t) => t,
            None => cluster_now(streams).await?,
        };
        spec_doc.insert("startAtOperationTime", Bson::Timestamp(start.timestamp()));
    }
    let mut pipeline = vec![Bson::Document(doc! {"$changeStream": spec_doc})];
    pipeline.extend(super::shard_stages(stages, parsed));
    let target = match coll {
        Some(c) => Bson::String(c.to_string()),
        None => Bson::Int32(1),
    };
    // `fromRouter`: the shard leaves the resume proof to the router (`EnsureResumeTokenPresent`
    // runs after the merge), as MongoDB's shards do for mongos.
    let mut shard_cmd =
        doc! {"aggregate": target, "pipeline": pipeline, "cursor": {}, "fromRouter": true};
    if let Some(read) = read {
        // Replicated shards serve it from the members the client's preference names; the
        // re-opened cursors of a lost shard keep it (`feed`).
        shard_cmd.insert("$readPreference", read.clone());
    }
    if parsed.spec.start == StartPoint::None {
        // The start is the router's "now", not a time a client brought from some history.
        shard_cmd.insert(shard::lineage::STARTS_NOW, true);
    }
    let shards = streams.transport.all();
    let replies = futures::future::join_all(
        shards
            .iter()
            .map(|&s| streams.transport.read_body(s, db, shard_cmd.clone())),
    )
    .await;
    let initial = match &parsed.spec.start {
        StartPoint::None => None,
        _ => Some(
            parsed
                .spec
                .initial_post_batch_resume_token(ClusterTime::ZERO),
        ),
    };
    let mut cursor = MergedStream {
        db: db.to_string(),
        shard_collection: coll
            .map(str::to_string)
            .unwrap_or_else(|| "$cmd.aggregate".into()),
        shards: Vec::with_capacity(shards.len()),
        merger: Merger::new(shards.len(), initial),
        unreleased: BTreeMap::new(),
        rx: Vec::with_capacity(shards.len()),
        turn: 0,
        cancel: streams.services.shutdown().child_token(),
        feeds: Vec::with_capacity(shards.len()),
        demand: Arc::new(AtomicI64::new(feed::SHARD_BATCH)),
    };
    let mut failure = None;
    for (&shard, reply) in shards.iter().zip(replies) {
        let batch = match reply.and_then(ShardBatch::parse) {
            Ok(batch) => batch,
            Err(e) => {
                failure.get_or_insert(e);
                continue;
            }
        };
        let id = batch.cursor_id;
        let position = batch.post_batch_resume_token.to_document();
        cursor.shards.push(ShardCursor {
            shard,
            cursor_id: id,
            promise: None,
            nudged: ClusterTime::ZERO,
            resumed_after: None,
        });
        let idx = cursor.shards.len() - 1;
        let (tx, rx) = mpsc::channel(FEED_DEPTH);
        cursor.rx.push(Some(rx));
        // The feed owns the shard cursor from here on (and kills it with the stream).
        if id != 0 {
            let feed = feed::Feed {
                transport: streams.transport.clone(),
                lineages: streams.lineages.clone(),
                patience: streams.patience,
                idx,
                shard,
                db: cursor.db.clone(),
                collection: cursor.shard_collection.clone(),
                open: shard_cmd.clone(),
                cursor_id: id,
                position,
                tx,
                cancel: cursor.cancel.clone(),
                demand: cursor.demand.clone(),
            };
            cursor
                .feeds
                .push(streams.services.spawn_background("feed", feed.run()));
        }
        if let Err(e) = cursor.absorb(idx, batch) {
            failure.get_or_insert(e);
        }
    }
    if let Some(e) = failure {
        cursor.kill().await;
        return Err(e);
    }
    Ok(cursor)
}

/// The cluster's time, asked of the shards first so "now" is theirs too, plus one tick.
pub(super) async fn cluster_now(streams: &Arc<Streams>) -> Result<ClusterTime> {
    let transport = &streams.transport;
    for r in transport
        .broadcast(&transport.all(), "admin", &doc! {"ping": 1})
        .await
    {
        r?;
    }
    Ok(transport.clock().now().next())
}

impl MergedStream {
    /// Sizes the feeds' shard getMores to the reader's batches of `n` events (at most
    /// [`feed::SHARD_BATCH`]; `0`, a batch that only opens the cursor, changes nothing).
    pub(super) fn set_demand(&self, n: usize) {
        if n > 0 {
            let n = i64::try_from(n).unwrap_or(i64::MAX).min(feed::SHARD_BATCH);
            self.demand.store(n, Ordering::Relaxed);
        }
    }

    /// Takes one shard reply into the merge.
    fn absorb(&mut self, idx: usize, batch: ShardBatch) -> Result<()> {
        let ShardBatch {
            events: received,
            post_batch_resume_token: pbrt,
            cursor_id,
            invalidated,
        } = batch;
        let mut events = Vec::with_capacity(received.len());
        for e in received {
            let resumed_after = &mut self.shards[idx].resumed_after;
            if let Some(after) = resumed_after {
                if e.token <= *after {
                    continue;
                }
                *resumed_after = None;
            }
            self.unreleased.insert(e.token.clone(), e.time);
            events.push(e);
        }
        self.merger.push_batch(idx, events, pbrt.clone())?;
        let shard = &mut self.shards[idx];
        if shard.promise.as_ref().is_none_or(|p| pbrt > *p) {
            shard.promise = Some(pbrt);
        }
        if cursor_id == 0 {
            shard.cursor_id = 0;
            if invalidated {
                self.merger.mark_invalidated(idx);
            } else {
                return Err(MongoError::new(
                    ErrorCode::CURSOR_KILLED,
                    format!("{} closed its change stream cursor", shard.shard),
                ));
            }
        }
        Ok(())
    }

    /// The next released event, if every promise has passed one.
    pub fn pop_ready(&mut self) -> Option<RawEvent> {
        let event = self.merger.pop_ready()?;
        self.unreleased.remove(&event.token);
        Some(event)
    }

    /// The invalidate token, once the stream is over (nothing before it is left to release).
    pub fn invalidated(&self) -> Option<&ResumeToken> {
        self.merger.invalidated()
    }

    /// The merge's post-batch resume token (see `Merger::post_batch_resume_token`).
    pub fn post_batch_resume_token(&mut self) -> Option<ResumeToken> {
        self.merger.post_batch_resume_token()
    }

    /// Waits until a shard reply arrives (or `deadline`), nudging idle shards when events wait
    /// behind their promises, and takes every reply that is there into the merge. Only shards
    /// holding less than a getMore's worth of unreleased events are read (see the invariants).
    pub async fn wait(
        &mut self,
        streams: &Arc<Streams>,
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        self.nudge_laggards(streams);
        let msg = tokio::select! {
            m = std::future::poll_fn(|cx| self.poll_reply(cx)) => m,
            _ = tokio::time::sleep_until(deadline) => return Ok(()),
        };
        self.take(msg)?;
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        while let std::task::Poll::Ready(msg) = self.poll_reply(&mut cx) {
            self.take(msg)?;
        }
        Ok(())
    }

    /// A reply from a shard that may be read now (its merge buffer holds less than a getMore's
    /// worth), looking at each shard in turn; pending while there is none (an ended feed is
    /// forgotten).
    fn poll_reply(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<FeedReply> {
        let enough = usize::try_from(self.demand.load(Ordering::Relaxed))
            .unwrap_or(1)
            .max(1);
        let n = self.rx.len();
        for k in 0..n {
            let idx = (self.turn + k) % n;
            if self.merger.buffered_of(idx) >= enough {
                continue;
            }
            let Some(rx) = &mut self.rx[idx] else {
                continue;
            };
            match rx.poll_recv(cx) {
                std::task::Poll::Ready(Some(msg)) => {
                    self.turn = (idx + 1) % n;
                    return std::task::Poll::Ready(msg);
                }
                std::task::Poll::Ready(None) => self.rx[idx] = None,
                std::task::Poll::Pending => {}
            }
        }
        std::task::Poll::Pending
    }

    fn take(&mut self, msg: FeedReply) -> Result<()> {
        let batch = msg.reply.map_err(label_resumable)?;
        if msg.reopened {
            let shard = &mut self.shards[msg.idx];
            shard.cursor_id = batch.cursor_id;
            shard.nudged = ClusterTime::ZERO;
            shard.resumed_after = shard.promise.clone();
        }
        self.absorb(msg.idx, batch)
    }

    /// Asks every shard whose promise is below the oldest buffered event to promise past it.
    fn nudge_laggards(&mut self, streams: &Arc<Streams>) {
        // A shard's promise passes an event at `ts` once it is a high-water mark above `ts`
        // (high-water marks sort before the events of their own time).
        let Some(floor) = self.unreleased.values().next().map(|ts| ts.next()) else {
            return;
        };
        let needed = ResumeTokenData::high_water_mark(floor, TokenVersion::default()).encode();
        for s in &mut self.shards {
            let behind = s.promise.as_ref().is_none_or(|p| *p < needed);
            if s.cursor_id == 0 || !behind || s.nudged >= floor {
                continue;
            }
            s.nudged = floor;
            streams.idle_shard_nudges.inc();
            let transport = streams.transport.clone();
            let (shard, id) = (s.shard, s.cursor_id);
            streams.services.spawn("nudge", async move {
                let cmd = doc! {"_tributaryNudgeChangeStream": id, "floor": Bson::Timestamp(floor.timestamp())};
                // A failed nudge only costs latency: the shard's getMore ends on its own (and a
                // lost shard is its feed's business, so no waiting for a connection).
                let _ = transport.send_body(shard, "admin", cmd, Duration::ZERO, Resend::Unsent).await;
            });
        }
    }

    /// Stops the feeds, which close their shard cursors.
    pub async fn kill(&mut self) {
        self.cancel.cancel();
        for feed in self.feeds.drain(..) {
            let _ = feed.await;
        }
        for s in &mut self.shards {
            s.cursor_id = 0;
        }
    }
}
