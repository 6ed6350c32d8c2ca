//! Change streams on the router: one shard cursor per shard, merged by resume token.
//!
//! Opening a stream validates the pipeline and fixes the start point (a stream without one
//! starts one tick after the cluster's current time, the same on every shard). A stream that
//! starts now joins a hub ([`hub`]) that shares one merge among every stream with the same
//! shard-side spec; any other stream gets a merge of its own ([`merged`]): a shard cursor on
//! every shard with the `$changeStream` stage and the user's pushed-down `$match`, each read
//! by a feed task ([`feed`]) that re-opens it from the shard's last promise if the shard is
//! lost, so the stream pauses instead of failing.
//!
//! The shards add every image (updateLookup's current document too) before their 16 MiB check
//! or split, as MongoDB 7.0 does. After the merge, per client: ensure-resume-token-present,
//! the user's stages and the `_id` check (`RouterStream`), in batches of at most 16 MiB.
//!
//! Events travel as the bytes the shard encoded ([`batch`]): the merge reads only their resume
//! tokens, and a client whose post-merge stages change nothing gets those shared bytes spliced
//! into its reply, which goes to the socket in vectored writes without a copy (a watcher that
//! stops reading holds references, not a batch of its own); only a client with stages decodes
//! an event (and encodes the result).
//!
//! Invariants: every reply carries a post-batch resume token that never goes backwards, never
//! passes an event the client has not been given, and never passes what a lost shard may still
//! return; an event is returned at most once; a stream whose history a shard reports lost, or
//! whose token is not found, fails with the shard's (or the merge's) non-resumable error; a
//! shard lost for longer than the router's patience fails the getMore with a resumable error.

mod assembler;
mod batch;
mod feed;
mod hub;
mod merged;
mod seams;

pub(crate) use batch::held_bytes;
pub use hub::REPLIES_PER_SECOND;
pub use seams::Streams;

use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document};
use bytes::Bytes;
use pipeline::changestream::post_merge::RouterStream;
use pipeline::changestream::spec::{
    ChangeStreamCommand, ChangeStreamPipeline, RequestContext, UserStage, parse_command,
    parse_pipeline,
};
use resume::ClusterTime;
use resume::token::ResumeToken;
use wire::raw::{CursorBody, CursorReply};
use wire::{MongoError, Result};

use self::assembler::{BatchAssembler, Ready};

/// Streams parked to free the router's memory since it started ([`ChangeStreamCursor::park`]).
static PARKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn parked_streams() -> u64 {
    PARKED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The client getMore's awaitData wait when it gives no `maxTimeMS`.
pub const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);

/// Codes on which a driver resumes a change stream (driver contract §4.4); the router labels
/// them so drivers at wire version ≥ 9 do.
const RESUMABLE_CODES: &[i32] = &[
    6, 7, 63, 89, 91, 133, 150, 189, 202, 234, 262, 9001, 10107, 11600, 11602, 13388, 13435, 13436,
];

/// Whether `e` says a server was away or stepping down (what a driver resumes a stream on),
/// not that the request was wrong.
pub(crate) fn is_resumable(e: &MongoError) -> bool {
    RESUMABLE_CODES.contains(&e.code) && !e.has_label("NonResumableChangeStreamError")
}

pub(crate) fn label_resumable(e: MongoError) -> MongoError {
    if is_resumable(&e) {
        e.with_label("ResumableChangeStreamError")
    } else {
        e
    }
}

/// The earliest marker (`changeStreamBounds`' `earliest`, the HTTP feed's `from=oldest`): a
/// high-water-mark token at cluster time zero, before any event a cluster can write. A stream
/// started after it begins at the oldest change every shard still keeps when it is opened,
/// however far retention has moved since the marker was handed out.
pub fn earliest_marker() -> ResumeToken {
    resume::token::ResumeTokenData::high_water_mark(ClusterTime::ZERO, Default::default()).encode()
}

fn is_earliest_marker(token: &Document) -> bool {
    ResumeToken::from_document(token)
        .ok()
        .and_then(|t| resume::token::ResumeTokenData::from_document(&t.to_document()).ok())
        .is_some_and(|t| t.is_high_water_mark() && t.cluster_time() == ClusterTime::ZERO)
}

/// What one client batch holds.
pub struct Batch {
    /// The events as the client gets them, encoded.
    pub events: Vec<Bytes>,
    /// Each event's token, when the stream keeps them ([`ChangeStreamCursor::keep_tokens`]);
    /// else none.
    pub tokens: Vec<ResumeToken>,
    pub post_batch_resume_token: Option<ResumeToken>,
    /// The stream ended with an invalidate: close the cursor (`invalidated: true`).
    pub invalidated: bool,
}

/// A stream just opened by [`Streams::open`], with its first batch.
pub(crate) struct Opened {
    /// The cursor's namespace (`db.coll`, or `db.$cmd.aggregate`).
    pub ns: String,
    /// The stream, or `None` when its first batch ended it (an invalidate).
    pub cursor: Option<ChangeStreamCursor>,
    pub batch: Batch,
}

impl Streams {
    /// The oldest cluster time from which every shard still keeps its whole history: the
    /// latest of the shards' `resumableFrom` (just after what retention truncated, within the
    /// shard's history, past any stretch it lost). A stream started at it misses nothing that
    /// is kept anywhere. Every shard must answer.
    pub(crate) async fn earliest_kept(&self) -> Result<bson::Timestamp> {
        use crate::kernel::transport::Shards;
        let asks = self.transport.all().into_iter().map(|s| {
            self.transport
                .command(s, "admin", bson::doc! {"serverStatus": 1})
        });
        let mut earliest = ClusterTime::ZERO.next();
        for status in futures::future::join_all(asks).await {
            let status = status?;
            let oplog = status.get_document("oplog").ok();
            // A shard of an older version: its oldest entry is the bound.
            let from = ["resumableFrom", "oldest"]
                .iter()
                .find_map(|f| match oplog.and_then(|o| o.get(*f)) {
                    Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
                    _ => None,
                })
                .unwrap_or(ClusterTime::ZERO);
            earliest = earliest.max(from);
        }
        Ok(earliest.timestamp())
    }

    /// `cmd` with an [`earliest_marker`] start replaced by a start at
    /// [`Streams::earliest_kept`] now; `None` when it has none.
    async fn resolve_earliest_marker(&self, cmd: &Document) -> Result<Option<Document>> {
        let spec = pipeline::changestream::spec::stage_of(cmd);
        let Some(field) = ["resumeAfter", "startAfter"].into_iter().find(|f| {
            spec.and_then(|s| s.get_document(f).ok())
                .is_some_and(is_earliest_marker)
        }) else {
            return Ok(None);
        };
        let at = resume::token::ResumeTokenData::high_water_mark(
            self.earliest_kept().await?.into(),
            Default::default(),
        )
        .encode();
        let mut cmd = cmd.clone();
        if let Ok(pipeline) = cmd.get_array_mut("pipeline")
            && let Some(Bson::Document(stage)) = pipeline.first_mut()
            && let Ok(spec) = stage.get_document_mut("$changeStream")
        {
            spec.insert(field, at.to_document());
        }
        Ok(Some(cmd))
    }

    /// Opens the stream an `aggregate` with `$changeStream` first asks for on `db`, and reads
    /// its first batch (without waiting). The start point is the command's: a token this
    /// cluster stamped is taken back to MongoDB's form (another cluster's is refused), and a
    /// resume is judged against the shards' histories as they are now; a stream without one
    /// starts now, sharing a hub.
    pub(crate) async fn open(self: &Arc<Self>, db: &str, cmd: &Document) -> Result<Opened> {
        let mut plain = self.lineages.unstamp_start(cmd).await?;
        if let Some(resolved) = self
            .resolve_earliest_marker(plain.as_ref().unwrap_or(cmd))
            .await?
        {
            plain = Some(resolved);
        }
        let ChangeStreamCommand {
            coll,
            stages,
            pipeline: parsed,
            batch_size,
        } = parse_command(db, plain.as_ref().unwrap_or(cmd), true)?;
        if parsed.spec.start != pipeline::changestream::spec::StartPoint::None {
            // A shard just restored from an older copy has its lost stretch marked before it
            // is asked.
            if let Err(e) = self.lineages.verify_now().await {
                tracing::debug!(error = %e, "shard lineages not verified before a resume");
            }
        }
        if let Err(e) = self.lineages.cluster_id().await {
            tracing::debug!(error = %e, "the cluster's id is not known yet");
        }
        let read = crate::kernel::replica_set::secondary_ok(cmd);
        let mut cursor = ChangeStreamCursor::open(self, db, coll, stages, parsed, read).await?;
        let batch = cursor.next_batch(self, batch_size, Duration::ZERO).await?;
        let ns = match coll {
            Some(c) => format!("{db}.{c}"),
            None => format!("{db}.$cmd.aggregate"),
        };
        if batch.invalidated {
            cursor.kill().await;
            return Ok(Opened {
                ns,
                cursor: None,
                batch,
            });
        }
        Ok(Opened {
            ns,
            cursor: Some(cursor),
            batch,
        })
    }

    /// The cluster's id to stamp high-water-mark tokens with (`lineages`), when the router
    /// knows it already: a reply never waits for the config shard (without it the token goes
    /// out as MongoDB's, which is accepted too). Streams learn it when they open.
    pub(crate) fn stamp(&self) -> Option<bson::Uuid> {
        self.lineages.known_cluster_id()
    }
}

/// The reply for a batch, with each event's shared bytes spliced in (no copy: the reply is
/// written to the socket from them). A batch that ends
/// with an invalidate closes the cursor (`id: 0`, `invalidated: true`). A high-water-mark
/// post-batch resume token carries the cluster's `stamp`.
pub(crate) fn cursor_reply(
    ns: &str,
    id: i64,
    mut batch: Batch,
    first: bool,
    stamp: Option<bson::Uuid>,
) -> CursorBody {
    if let (Some(cluster), Some(token)) = (stamp, &batch.post_batch_resume_token)
        && let Ok(data) = token.decode()
        && data.is_high_water_mark()
    {
        batch.post_batch_resume_token = Some(data.encode_stamped(cluster));
    }
    CursorReply {
        ns,
        id: if batch.invalidated { 0 } else { id },
        first,
        batch: &batch.events,
        post_batch_resume_token: batch
            .post_batch_resume_token
            .as_ref()
            .map(ResumeToken::to_document)
            .as_ref(),
        invalidated: batch.invalidated,
    }
    .splice()
}

/// Whether the shards run every user stage and `$changeStreamSplitLargeEvent` (and the router
/// none): a stream that splits large events must split after its stages and before any event
/// over 16 MiB leaves a shard, as MongoDB runs it. (The shards add every image, updateLookup's
/// too, so what they split is the whole event.)
fn split_on_shards(parsed: &ChangeStreamPipeline) -> bool {
    parsed.split_large_event
}

/// The user stages the shards run after `$changeStream`: all of them with the split (see
/// [`split_on_shards`]), else the leading `$match` stages that can run there.
fn shard_stages(stages: &[Bson], parsed: &ChangeStreamPipeline) -> Vec<Bson> {
    if split_on_shards(parsed) {
        return stages.iter().skip(1).cloned().collect();
    }
    pushed_down_matches(stages, parsed)
}

/// The leading `$match` stages, which the shards run on the events they make (images
/// included). Their order and semantics are unchanged; the router runs them again, harmlessly.
fn pushed_down_matches(stages: &[Bson], parsed: &ChangeStreamPipeline) -> Vec<Bson> {
    let mut out = Vec::new();
    for (raw, stage) in stages.iter().skip(1).zip(&parsed.user_stages) {
        let UserStage::Match(m) = stage else { break };
        if m.referenced_paths().is_none() {
            break;
        }
        out.push(raw.clone());
    }
    out
}

/// A router change-stream cursor: a stream of its own, or a client of a hub that shares one
/// merge among every stream with the same shard-side spec, or a stream parked to free the
/// router's memory, re-opened where its client stands at its next `getMore`.
pub struct ChangeStreamCursor {
    inner: Inner,
    /// What the stream was opened with (its start as the client gave it).
    origin: Resume,
    /// The post-batch resume token of the last batch given: the next is never lower, even
    /// from a stream re-opened behind it.
    given: Option<ResumeToken>,
    /// Its batches carry each event's token ([`Batch::tokens`]).
    keep_tokens: bool,
}

enum Inner {
    Private(Box<PrivateStream>),
    Shared(Box<hub::HubClient>),
    Parked,
}

/// A parked stream's merge (or seat in a hub), to stop: its shard cursors killed, its events
/// dropped.
pub struct Stopping(Inner);

impl Stopping {
    pub async fn stop(mut self) {
        match &mut self.0 {
            Inner::Private(p) => p.merged.kill().await,
            Inner::Shared(client) => client.kill().await,
            Inner::Parked => {}
        }
    }
}

/// A change stream's pipeline and where it is read (`$readPreference`), to open it by.
#[derive(Clone)]
pub(super) struct Resume {
    pub db: String,
    pub coll: Option<String>,
    pub stages: Vec<Bson>,
    pub read: Option<Bson>,
}

impl Resume {
    /// The same stream, resumed at `token` (after its event; at a high-water mark, from its
    /// time; after an invalidate, with `startAfter`, the only way to pass one).
    fn at(&self, token: &ResumeToken) -> Result<Resume> {
        let mut stages = self.stages.clone();
        let field = if token.decode()?.from_invalidate() {
            "startAfter"
        } else {
            "resumeAfter"
        };
        if let Some(Bson::Document(first)) = stages.first_mut()
            && let Ok(spec) = first.get_document_mut("$changeStream")
        {
            for start in ["resumeAfter", "startAfter", "startAtOperationTime"] {
                spec.remove(start);
            }
            spec.insert(field, token.to_document());
        }
        Ok(Resume {
            stages,
            ..self.clone()
        })
    }

    /// Opens the stream with a merge of its own.
    async fn open(&self, streams: &Arc<Streams>) -> Result<Inner> {
        let ctx = RequestContext {
            db: &self.db,
            coll: self.coll.as_deref(),
            through_router: true,
            standalone: false,
        };
        let parsed = parse_pipeline(&self.stages, &ctx)?;
        self.merge(streams, &parsed).await
    }

    /// Opens the stream, whose pipeline parsed to `parsed`, with a merge of its own.
    async fn merge(&self, streams: &Arc<Streams>, parsed: &ChangeStreamPipeline) -> Result<Inner> {
        let merged = merged::open(
            streams,
            &self.db,
            self.coll.as_deref(),
            &self.stages,
            parsed,
            None,
            self.read.as_ref(),
        )
        .await?;
        Ok(PrivateStream::inner(merged, parsed))
    }
}

/// A stream with a merge of its own.
struct PrivateStream {
    merged: merged::MergedStream,
    post: PostMerge,
    /// An event released and processed that did not fit the last batch: the next one starts
    /// with it.
    held: Option<(ResumeToken, Bytes)>,
    /// The token of the last released event given to the client or dropped by its stages.
    looked: Option<ResumeToken>,
    closed: bool,
}

impl PrivateStream {
    fn inner(merged: merged::MergedStream, parsed: &ChangeStreamPipeline) -> Inner {
        Inner::Private(Box::new(PrivateStream {
            merged,
            post: PostMerge::new(parsed),
            held: None,
            looked: None,
            closed: false,
        }))
    }
}

impl std::fmt::Debug for ChangeStreamCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Private(p) => p.merged.fmt(f),
            Inner::Shared(_) => f.write_str("ChangeStreamCursor(shared)"),
            Inner::Parked => f.write_str("ChangeStreamCursor(parked)"),
        }
    }
}

/// What happens to a released event before a client sees it: ensure-resume-token-present,
/// the user's stages and the `_id` check (`RouterStream`).
pub(super) struct PostMerge {
    stream: RouterStream,
}

impl PostMerge {
    fn new(parsed: &ChangeStreamPipeline) -> PostMerge {
        PostMerge {
            stream: RouterStream::new(
                &parsed.spec,
                if split_on_shards(parsed) {
                    Vec::new()
                } else {
                    parsed.user_stages.clone()
                },
            ),
        }
    }

    /// Whether events reach the client exactly as merged (no stages).
    fn passes_through(&self) -> bool {
        self.stream.passes_through()
    }

    /// A merged event as the client gets it (`None` when a stage drops it): the bytes the
    /// shard encoded when nothing changes it, decoded, processed and encoded otherwise. The
    /// router's stages may grow an event: one past 16 MiB fails with 10334, as on a shard.
    pub(super) fn given(&mut self, event: &batch::RawEvent) -> Result<Option<Bytes>> {
        if self.passes_through() {
            return Ok(Some(event.bytes.clone()));
        }
        let Some(doc) = self.stream.process(event.decode()?)? else {
            return Ok(None);
        };
        let bytes = encode(&doc)?;
        pipeline::changestream::split::check_encoded_size(bytes.len())?;
        Ok(Some(bytes))
    }
}

impl ChangeStreamCursor {
    async fn open(
        streams: &Arc<Streams>,
        db: &str,
        coll: Option<&str>,
        stages: &[Bson],
        parsed: ChangeStreamPipeline,
        read: Option<Bson>,
    ) -> Result<ChangeStreamCursor> {
        let origin = Resume {
            db: db.to_string(),
            coll: coll.map(str::to_string),
            stages: stages.to_vec(),
            read: read.clone(),
        };
        let inner = match hub::HubClient::open(streams, db, coll, stages, &parsed, read).await? {
            Some(client) => Inner::Shared(Box::new(client)),
            None => origin.merge(streams, &parsed).await?,
        };
        Ok(ChangeStreamCursor {
            inner,
            origin,
            given: None,
            keep_tokens: false,
        })
    }

    /// Parks the stream: it stops reading the shards and drops every event it holds, to be
    /// re-opened at the next `getMore` from the last post-batch resume token its client was
    /// given (which passes no event the client was not given). Returns what must be stopped,
    /// outside the cursor's lock (a `getMore` meanwhile is not refused as `CursorInUse`);
    /// `None` when there is nothing to free: the stream is parked or closed already, or its
    /// client was never given a token.
    pub fn park(&mut self) -> Option<Stopping> {
        self.given.as_ref()?;
        let open = match &self.inner {
            Inner::Private(p) => !p.closed,
            Inner::Shared(client) => !client.is_closed(),
            Inner::Parked => false,
        };
        if !open {
            return None;
        }
        PARKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(Stopping(std::mem::replace(&mut self.inner, Inner::Parked)))
    }

    /// Its batches carry each event's token from now on, for a reader that needs them (a
    /// subscription's feed) and would otherwise read them back from the events' bytes.
    pub fn keep_tokens(&mut self) {
        self.keep_tokens = true;
    }

    /// The next client batch: up to `n` events, waiting up to `max_time` for the first one.
    pub async fn next_batch(
        &mut self,
        streams: &Arc<Streams>,
        n: usize,
        max_time: Duration,
    ) -> Result<Batch> {
        if matches!(self.inner, Inner::Parked)
            && let Some(given) = &self.given
        {
            self.inner = self.origin.at(given)?.open(streams).await?;
        }
        let mut batch = self.next_batch_inner(streams, n, max_time).await?;
        if let (Some(given), Some(token)) = (&self.given, &batch.post_batch_resume_token)
            && token < given
        {
            batch.post_batch_resume_token = Some(given.clone());
        }
        if batch.post_batch_resume_token.is_some() {
            self.given.clone_from(&batch.post_batch_resume_token);
        }
        Ok(batch)
    }

    async fn next_batch_inner(
        &mut self,
        streams: &Arc<Streams>,
        n: usize,
        max_time: Duration,
    ) -> Result<Batch> {
        let keep_tokens = self.keep_tokens;
        if let Inner::Shared(client) = &mut self.inner {
            if let Some(batch) = client.next_batch(streams, n, max_time, keep_tokens).await? {
                return Ok(batch);
            }
            // It fell behind its hub: it goes on by itself from where it was.
            let resume = client.resume_stages();
            tracing::info!(db = %resume.db, "a change stream fell behind its hub's log; it goes on by itself");
            self.inner = resume.open(streams).await?;
        }
        let Inner::Private(private) = &mut self.inner else {
            return Err(MongoError::internal(
                "a shared change stream without its hub",
            ));
        };
        let PrivateStream {
            merged,
            post,
            held,
            looked,
            closed,
        } = &mut **private;
        merged.set_demand(n);
        let deadline = tokio::time::Instant::now() + max_time;
        let mut batch = BatchAssembler::new(n).keeping_tokens(keep_tokens);
        let mut invalidated = false;
        loop {
            while !batch.is_full() {
                let (token, doc) = match held.take() {
                    Some(h) => h,
                    None => {
                        let Some(event) = merged.pop_ready() else {
                            break;
                        };
                        match post.given(&event)? {
                            Some(bytes) => (event.token, bytes),
                            None => {
                                *looked = Some(event.token);
                                continue;
                            }
                        }
                    }
                };
                match batch.offer(&token, doc) {
                    Ok(()) => *looked = Some(token),
                    Err(doc) => {
                        *held = Some((token, doc));
                        break;
                    }
                }
            }
            if held.is_some() {
                break;
            }
            // As MongoDB: the batch that ends with the invalidate closes the cursor (id 0).
            if merged.invalidated().is_some() && n > 0 {
                invalidated = true;
                break;
            }
            match batch.ready(tokio::time::Instant::now(), deadline, false, None) {
                Ready::Send => break,
                Ready::WaitUntil(until) => merged.wait(streams, until).await?,
            }
        }
        let (events, tokens) = batch.into_events();
        if invalidated {
            *closed = true;
        }
        // With an event held back, the merge has released past what the client was given: the
        // token stays at the last event it was given (or dropped).
        let post_batch_resume_token = match merged.invalidated() {
            Some(t) if invalidated => Some(t.clone()),
            _ if held.is_some() => looked.clone(),
            _ => merged.post_batch_resume_token(),
        };
        // Every shard has promised past a client event token that never came: fail now.
        if events.is_empty()
            && !post.stream.resume_point_passed()
            && let Some(promise) = post_batch_resume_token.as_ref().map(ResumeToken::decode)
        {
            post.stream.check_promise(&promise?)?;
        }
        Ok(Batch {
            events,
            tokens,
            post_batch_resume_token,
            invalidated,
        })
    }

    /// Stops the stream (a hub's client leaves it; the last one stops it).
    pub async fn kill(&mut self) {
        match &mut self.inner {
            Inner::Private(p) => p.merged.kill().await,
            Inner::Shared(client) => client.kill().await,
            Inner::Parked => {}
        }
    }

    pub fn is_closed(&self) -> bool {
        match &self.inner {
            Inner::Private(p) => p.closed,
            Inner::Shared(client) => client.is_closed(),
            Inner::Parked => false,
        }
    }
}

/// An event as a client batch holds it.
fn encode(event: &Document) -> Result<Bytes> {
    event
        .to_vec()
        .map(Bytes::from)
        .map_err(|e| MongoError::internal(format!("encoding a change event: {e}")))
}
