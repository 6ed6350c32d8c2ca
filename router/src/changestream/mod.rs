//! Change streams on the router: one shard cursor per shard, merged by resume token.
//!
//! Opening a stream validates the pipeline, fixes the start point (a stream without one starts
//! one tick after the cluster's current time, the same on every shard), and opens a shard
//! cursor on every shard with the `$changeStream` stage and the user's pushed-down `$match`,
//! waiting (within the router's patience) for shards that cannot be reached. Then a feed task
//! per shard ([`feed`]) keeps one awaitData getMore outstanding and hands the replies to the
//! cursor through a bounded channel, so a client that stops reading stops the feeds too. A
//! feed that loses its shard re-opens the shard's stream from the shard's last promise: the
//! stream pauses, it does not fail.
//!
//! The merge (`pipeline::changestream::Merger`) releases an event only when its token is at or
//! below every shard's promise (post-batch resume token), so released tokens strictly
//! increase. An idle shard does not hold the stream back: when an event is buffered behind a
//! shard's promise, the router nudges that shard to promise past the event's time; an idle
//! shard's clock jumps there and it answers at once. After the merge: updateLookup, then
//! ensure-resume-token-present, the user's stages and the `_id` check (`RouterStream`).
//!
//! Invariants: every reply carries a post-batch resume token that never goes backwards and
//! never passes what a lost shard may still return; an event is returned at most once; a
//! stream whose history a shard reports lost, or whose token is not found, fails with the
//! shard's (or the merge's) non-resumable error; a shard lost for longer than the router's
//! patience fails the getMore with a resumable error.

mod feed;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document, doc};
use pipeline::changestream::post_merge::RouterStream;
use pipeline::changestream::spec::{
    ChangeStreamPipeline, FullDocument, RequestContext, StartPoint, UserStage, parse_pipeline,
};
use pipeline::changestream::{ChangeEvent, Merger};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::{ErrorCode, MongoError, Result};

use self::feed::FeedReply;
use crate::metadata::Placement;
use crate::router::{Resend, Router, cursor_id, first_batch, next_batch};

/// Replies buffered per shard before its feed waits for the client.
const FEED_DEPTH: usize = 2;
/// The client getMore's awaitData wait when it gives no `maxTimeMS`.
pub const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);

/// Codes on which a driver resumes a change stream (driver contract §4.4); the router labels
/// them so drivers at wire version ≥ 9 do.
const RESUMABLE_CODES: &[i32] = &[
    6, 7, 63, 89, 91, 133, 150, 189, 202, 234, 262, 9001, 10107, 11600, 11602, 13388, 13435, 13436,
];

pub(crate) fn label_resumable(e: MongoError) -> MongoError {
    if RESUMABLE_CODES.contains(&e.code) && !e.has_label("NonResumableChangeStreamError") {
        e.with_label("ResumableChangeStreamError")
    } else {
        e
    }
}

/// A shard cursor feeding the merge.
struct ShardCursor {
    shard: usize,
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

/// A router change-stream cursor.
pub struct ChangeStreamCursor {
    db: String,
    /// The `collection` of shard getMores: the collection, or `$cmd.aggregate`.
    shard_collection: String,
    shards: Vec<ShardCursor>,
    merger: Merger,
    stream: RouterStream,
    /// Tokens of events pushed but not yet released, with their times (for nudges).
    unreleased: BTreeMap<ResumeToken, ClusterTime>,
    rx: mpsc::Receiver<FeedReply>,
    cancel: CancellationToken,
    feeds: Vec<tokio::task::JoinHandle<()>>,
    update_lookup: bool,
    /// Namespace scope for updateLookup.
    closed: bool,
}

impl std::fmt::Debug for ChangeStreamCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeStreamCursor")
            .field("db", &self.db)
            .field("shards", &self.shards.len())
            .field("buffered", &self.merger.buffered())
            .finish()
    }
}

/// What one client batch holds.
pub struct Batch {
    pub events: Vec<Document>,
    pub post_batch_resume_token: Option<ResumeToken>,
    /// The stream ended with an invalidate: close the cursor (`invalidated: true`).
    pub invalidated: bool,
}

/// `aggregate` with `$changeStream` first: opens the stream and returns the reply.
pub(crate) async fn aggregate(router: &Arc<Router>, db: &str, cmd: &Document) -> Result<Document> {
    let coll = match cmd.get("aggregate") {
        Some(Bson::String(c)) => Some(c.as_str()),
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) => None,
        Some(Bson::Double(d)) if *d == 1.0 => None,
        _ => {
            return Err(MongoError::failed_to_parse(
                "aggregate requires a collection name or 1",
            ));
        }
    };
    let stages = cmd.get_array("pipeline").map_err(|_| {
        MongoError::type_mismatch("'pipeline' option must be specified as an array")
    })?;
    let ctx = RequestContext {
        db,
        coll,
        through_router: true,
        standalone: false,
    };
    let parsed = parse_pipeline(stages, &ctx)?;
    let batch_size = match cmd
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get("batchSize"))
    {
        None => 101,
        Some(Bson::Int32(n)) if *n >= 0 => *n as usize,
        Some(Bson::Int64(n)) if *n >= 0 => *n as usize,
        Some(Bson::Double(n)) if *n >= 0.0 => *n as usize,
        Some(_) => {
            return Err(MongoError::bad_value(
                "batchSize must be a non-negative integer",
            ));
        }
    };
    let mut cursor = open(router, db, coll, stages, parsed).await?;
    let batch = cursor
        .next_batch(router, batch_size, Duration::ZERO)
        .await?;
    let ns = match coll {
        Some(c) => format!("{db}.{c}"),
        None => format!("{db}.$cmd.aggregate"),
    };
    let (reply, keep) = cursor_reply(&ns, 0, batch, true);
    if keep {
        let id = router.cursors.insert(crate::cursors::RouterCursor {
            ns,
            state: crate::cursors::CursorState::ChangeStream(Box::new(cursor)),
        });
        let mut reply = reply;
        if let Ok(c) = reply.get_document_mut("cursor") {
            c.insert("id", id);
        }
        return Ok(reply);
    }
    cursor.kill().await;
    Ok(reply)
}

/// The reply for a batch; `keep` is false when the stream closed (invalidate).
pub(crate) fn cursor_reply(ns: &str, id: i64, batch: Batch, first: bool) -> (Document, bool) {
    let events: Vec<Bson> = batch.events.into_iter().map(Bson::Document).collect();
    let mut cursor = Document::new();
    cursor.insert(if first { "firstBatch" } else { "nextBatch" }, events);
    if let Some(t) = &batch.post_batch_resume_token {
        cursor.insert("postBatchResumeToken", t.to_document());
    }
    cursor.insert("id", if batch.invalidated { 0 } else { id });
    cursor.insert("ns", ns);
    let mut reply = doc! {"cursor": cursor};
    if batch.invalidated {
        reply.insert("invalidated", true);
    }
    reply.insert("ok", 1.0);
    (reply, !batch.invalidated)
}

/// The leading `$match` stages that can run on the shards: those that do not read
/// `fullDocument` when the router fills it in (updateLookup), since the shards would see it
/// missing. Their order and semantics are unchanged; the router runs them again, harmlessly.
fn pushed_down_matches(stages: &[Bson], parsed: &ChangeStreamPipeline) -> Vec<Bson> {
    let lookup = parsed.spec.options.full_document == FullDocument::UpdateLookup;
    let mut out = Vec::new();
    for (raw, stage) in stages.iter().skip(1).zip(&parsed.user_stages) {
        let UserStage::Match(m) = stage else { break };
        let safe = match m.referenced_paths() {
            Some(paths) => {
                !lookup
                    || !paths
                        .iter()
                        .any(|p| p == "fullDocument" || p.starts_with("fullDocument."))
            }
            None => false,
        };
        if !safe {
            break;
        }
        out.push(raw.clone());
    }
    out
}

async fn open(
    router: &Arc<Router>,
    db: &str,
    coll: Option<&str>,
    stages: &[Bson],
    parsed: ChangeStreamPipeline,
) -> Result<ChangeStreamCursor> {
    let Some(Bson::Document(first)) = stages.first() else {
        return Err(MongoError::internal(
            "change stream pipeline without its first stage",
        ));
    };
    let mut spec_doc = first
        .get_document("$changeStream")
        .cloned()
        .unwrap_or_default();
    // A stream without a start point starts one tick after the cluster's current time, the
    // same time on every shard. Ask the shards for their time first so "now" is theirs too.
    if parsed.spec.start == StartPoint::None {
        for r in router
            .broadcast(&router.all_shards(), "admin", &doc! {"ping": 1})
            .await
        {
            r?;
        }
        let start = router.cluster_time().next();
        spec_doc.insert("startAtOperationTime", Bson::Timestamp(start.timestamp()));
    }
    let mut pipeline = vec![Bson::Document(doc! {"$changeStream": spec_doc})];
    pipeline.extend(pushed_down_matches(stages, &parsed));
    let target = match coll {
        Some(c) => Bson::String(c.to_string()),
        None => Bson::Int32(1),
    };
    let shard_cmd = doc! {"aggregate": target, "pipeline": pipeline, "cursor": {}};
    let shards = router.all_shards();
    let replies = router.broadcast_read(&shards, db, &shard_cmd).await;
    let initial = match &parsed.spec.start {
        StartPoint::None => None,
        _ => Some(
            parsed
                .spec
                .initial_post_batch_resume_token(ClusterTime::ZERO),
        ),
    };
    let (tx, rx) = mpsc::channel(FEED_DEPTH * shards.len().max(1));
    let update_lookup = parsed.spec.options.full_document == FullDocument::UpdateLookup;
    let stream = RouterStream::new(&parsed.spec, parsed.user_stages);
    let mut cursor = ChangeStreamCursor {
        db: db.to_string(),
        shard_collection: coll
            .map(str::to_string)
            .unwrap_or_else(|| "$cmd.aggregate".into()),
        shards: Vec::with_capacity(shards.len()),
        merger: Merger::new(shards.len(), initial),
        stream,
        unreleased: BTreeMap::new(),
        rx,
        cancel: router.shutdown.child_token(),
        feeds: Vec::with_capacity(shards.len()),
        update_lookup,
        closed: false,
    };
    let mut failure = None;
    for (&shard, reply) in shards.iter().zip(replies) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                failure.get_or_insert(e);
                continue;
            }
        };
        let id = cursor_id(&reply);
        let position = reply
            .get_document("cursor")
            .and_then(|c| c.get_document("postBatchResumeToken"))
            .cloned()
            .unwrap_or_default();
        cursor.shards.push(ShardCursor {
            shard,
            cursor_id: id,
            promise: None,
            nudged: ClusterTime::ZERO,
            resumed_after: None,
        });
        let idx = cursor.shards.len() - 1;
        // The feed owns the shard cursor from here on (and kills it with the stream).
        if id != 0 {
            let feed = feed::Feed {
                router: router.clone(),
                idx,
                shard,
                db: cursor.db.clone(),
                collection: cursor.shard_collection.clone(),
                open: shard_cmd.clone(),
                cursor_id: id,
                position,
                tx: tx.clone(),
                cancel: cursor.cancel.clone(),
            };
            cursor.feeds.push(router.tasks.spawn(feed.run()));
        }
        if let Err(e) = cursor.absorb(idx, reply, first_batch) {
            failure.get_or_insert(e);
        }
    }
    if let Some(e) = failure {
        cursor.kill().await;
        return Err(e);
    }
    Ok(cursor)
}

impl ChangeStreamCursor {
    /// Takes one shard reply into the merge.
    fn absorb(
        &mut self,
        idx: usize,
        reply: Document,
        batch_of: fn(&Document) -> Result<Vec<Document>>,
    ) -> Result<()> {
        let docs = batch_of(&reply)?;
        let pbrt = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_document("postBatchResumeToken").ok())
            .ok_or_else(|| MongoError::internal("shard reply without a postBatchResumeToken"))
            .and_then(|t| ResumeToken::from_document(t).map_err(MongoError::from))?;
        let mut events = Vec::with_capacity(docs.len());
        for d in docs {
            let e = ChangeEvent::from_document(d)?;
            let resumed_after = &mut self.shards[idx].resumed_after;
            if let Some(after) = resumed_after {
                if e.token <= *after {
                    continue;
                }
                *resumed_after = None;
            }
            self.unreleased
                .insert(e.token.clone(), e.data.cluster_time());
            events.push(e);
        }
        self.merger.push_batch(idx, events, pbrt.clone())?;
        let shard = &mut self.shards[idx];
        if shard.promise.as_ref().is_none_or(|p| pbrt > *p) {
            shard.promise = Some(pbrt);
        }
        if cursor_id(&reply) == 0 {
            shard.cursor_id = 0;
            if reply.get_bool("invalidated").unwrap_or(false) {
                self.merger.mark_invalidated(idx);
            } else {
                return Err(MongoError::new(
                    ErrorCode::CURSOR_KILLED,
                    format!("shard{} closed its change stream cursor", shard.shard),
                ));
            }
        }
        Ok(())
    }

    /// The next client batch: up to `n` events, waiting up to `max_time` for the first one.
    pub async fn next_batch(
        &mut self,
        router: &Arc<Router>,
        n: usize,
        max_time: Duration,
    ) -> Result<Batch> {
        let deadline = tokio::time::Instant::now() + max_time;
        let mut events = Vec::new();
        let mut invalidated = false;
        loop {
            while events.len() < n {
                let Some(event) = self.merger.pop_ready() else {
                    break;
                };
                self.unreleased.remove(&event.token);
                let event = self.lookup_full_document(router, event).await?;
                if let Some(doc) = self.stream.process(event)? {
                    events.push(doc);
                }
            }
            // As MongoDB: the batch that ends with the invalidate closes the cursor (id 0).
            if self.merger.invalidated().is_some() && n > 0 {
                invalidated = true;
                break;
            }
            if !events.is_empty() || n == 0 {
                break;
            }
            if self.merger.invalidated().is_some() {
                invalidated = true;
                break;
            }
            self.nudge_laggards(router);
            let msg = tokio::select! {
                m = self.rx.recv() => m,
                _ = tokio::time::sleep_until(deadline) => None,
            };
            let Some(msg) = msg else { break };
            self.take(msg)?;
            while let Ok(msg) = self.rx.try_recv() {
                self.take(msg)?;
            }
        }
        if invalidated {
            self.closed = true;
        }
        Ok(Batch {
            events,
            post_batch_resume_token: match self.merger.invalidated() {
                Some(t) if invalidated => Some(t.clone()),
                _ => self.merger.post_batch_resume_token(),
            },
            invalidated,
        })
    }

    fn take(&mut self, msg: FeedReply) -> Result<()> {
        let reply = msg.reply.map_err(label_resumable)?;
        if !msg.reopened {
            return self.absorb(msg.shard, reply, next_batch);
        }
        let shard = &mut self.shards[msg.shard];
        shard.cursor_id = cursor_id(&reply);
        shard.nudged = ClusterTime::ZERO;
        shard.resumed_after = shard.promise.clone();
        self.absorb(msg.shard, reply, first_batch)
    }

    /// Asks every shard whose promise is below the oldest buffered event to promise past it.
    fn nudge_laggards(&mut self, router: &Arc<Router>) {
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
            let router = router.clone();
            let (shard, id) = (s.shard, s.cursor_id);
            router.tasks.clone().spawn(async move {
                let cmd = doc! {"_tributaryNudgeChangeStream": id, "floor": Bson::Timestamp(floor.timestamp())};
                // A failed nudge only costs latency: the shard's getMore ends on its own (and a
                // lost shard is its feed's business, so no waiting for a connection).
                let _ = router.send(shard, "admin", cmd, Duration::ZERO, Resend::Unsent).await;
            });
        }
    }

    /// `fullDocument: updateLookup`: the current document by `documentKey` (null when gone).
    async fn lookup_full_document(
        &self,
        router: &Arc<Router>,
        mut event: ChangeEvent,
    ) -> Result<ChangeEvent> {
        if !self.update_lookup || event.operation_type() != "update" {
            return Ok(event);
        }
        let (Ok(ns), Ok(key)) = (
            event.doc.get_document("ns"),
            event.doc.get_document("documentKey"),
        ) else {
            return Ok(event);
        };
        let (Ok(db), Ok(coll)) = (ns.get_str("db"), ns.get_str("coll")) else {
            return Ok(event);
        };
        let found = lookup_one(router, db, coll, key).await?;
        event.doc.insert(
            "fullDocument",
            found.map(Bson::Document).unwrap_or(Bson::Null),
        );
        Ok(event)
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

    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// One document of `db.coll` by its document key, routed by shard key.
async fn lookup_one(
    router: &Arc<Router>,
    db: &str,
    coll: &str,
    key: &Document,
) -> Result<Option<Document>> {
    let shards = match router.placement(db, coll, false).await? {
        Placement::Unsharded { primary } if primary.is_empty() => return Ok(None),
        Placement::Unsharded { primary } => vec![router.shard_index(&primary)?],
        Placement::Sharded(sc) => crate::commands::shards_for_query(router, &sc, key)?,
    };
    let find = doc! {"find": coll, "filter": key.clone(), "limit": 1, "singleBatch": true};
    // A read: sent again if a shard restarts under it.
    let replies = router.broadcast_read(&shards, db, &find).await;
    for r in replies {
        if let Some(d) = first_batch(&r?)?.into_iter().next() {
            return Ok(Some(d));
        }
    }
    Ok(None)
}
