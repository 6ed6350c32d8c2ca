//! Router cursors: what a driver's cursor id stands for on the router.
//!
//! A cursor is one of: a pass-through to a single shard cursor; a merge of shard cursors done by
//! the router (k-way by sort key, or concatenation); a pipeline the router runs over such a
//! merge as the client reads ([`Run`]); or results already computed by the router.
//! Invariants: cursor ids are random, non-zero Int64s, unique in the table; a cursor is used by
//! one getMore at a time (a concurrent one gets `CursorInUse`); an exhausted or killed cursor is
//! removed from the table, and its shard cursors are killed. A [`Run`] holds what its stages
//! hold (a blocking stage up to its limit, spilling under `allowDiskUse`), the shards' current
//! batches and one reply's worth of output, never its whole input or output. A reply to the
//! client is assembled from each document's BSON bytes as it is taken (at most 16 MiB and one
//! document), not from the batch parsed, which for small documents takes several times that.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use pipeline::agg::{Docs, PushRun};
use pipeline::projection::Projection;
use pipeline::sort::SortSpec;
use shard::sharding::ShardId;
use wire::{ErrorCode, MongoError, Result};

use crate::kernel::transport::Shards;
use crate::kernel::transport::{cursor_id, next_batch};
use crate::txn::Enlisting;

/// Idle cursors are reaped after this long by default, as in MongoDB
/// (`cursorTimeoutMillis`, which `setParameter` changes).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The shard replies change streams may hold on the router by default before the streams
/// read least recently are parked (`changeStreamHeldReplyBytesLimit`).
pub const STREAM_HELD_BYTES: usize = 256 * 1024 * 1024;

/// How long a change stream goes unread before it may be parked.
pub const PARK_AFTER: Duration = Duration::from_secs(5);

/// The reply size budget for one batch (MongoDB's 16 MiB reply cap).
pub const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// The most documents the router asks a shard for per getMore. It holds each source's batch
/// parsed, which for small documents takes several times their BSON size: a 16 MiB batch of
/// 60-byte documents is ~110 MB parsed. A thousand documents keep that to a few MB (a shard
/// batch is also at most 16 MiB, whatever its count), for one more round trip per thousand.
pub const SHARD_GET_MORE_DOCS: i64 = 1_000;

/// One shard cursor feeding a router cursor.
#[derive(Debug)]
pub struct Source {
    pub shard: ShardId,
    pub cursor_id: i64,
    pub buffer: VecDeque<Document>,
}

impl Source {
    /// A source from a shard's first cursor reply.
    pub fn from_reply(shard: ShardId, reply: &Document) -> Result<Source> {
        Ok(Source {
            shard,
            cursor_id: cursor_id(reply),
            buffer: crate::kernel::transport::first_batch(reply)?.into(),
        })
    }

    fn exhausted(&self) -> bool {
        self.buffer.is_empty() && self.cursor_id == 0
    }
}

/// Shard cursors merged by the router.
#[derive(Debug)]
pub struct Merge {
    pub db: String,
    pub collection: String,
    pub sources: Vec<Source>,
    /// Merge order; `None` concatenates the sources in order.
    pub sort: Option<SortSpec>,
    /// Documents still to skip / to return at most (applied here, after the merge).
    pub skip: u64,
    pub limit: Option<u64>,
    /// Applied here when the shards could not apply it (it would hide the sort key).
    pub projection: Option<Projection>,
    /// A tailable `awaitData` cursor: the client's getMore `maxTimeMS` goes to the shards,
    /// which wait that long for new documents.
    pub await_data: bool,
    /// The current getMore's `maxTimeMS`, for an `awaitData` cursor.
    pub max_await_ms: Option<i64>,
}

impl Merge {
    /// A merge that hands on the sources' documents in order, unsorted, unlimited (a shard's
    /// cursor passed through the router).
    pub fn concat(db: &str, collection: &str, sources: Vec<Source>) -> Merge {
        Merge {
            db: db.to_string(),
            collection: collection.to_string(),
            sources,
            sort: None,
            skip: 0,
            limit: None,
            projection: None,
            await_data: false,
            max_await_ms: None,
        }
    }

    /// The next merged document, fetching from shards as needed; `None` at the end.
    async fn next(&mut self, shards: &Enlisting) -> Result<Option<Document>> {
        loop {
            if self.limit == Some(0) {
                return Ok(None);
            }
            self.refill(shards).await?;
            let pick = match &self.sort {
                Some(spec) => self
                    .sources
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.buffer.front().map(|d| (i, d)))
                    .min_by(|(_, a), (_, b)| spec.compare(a, b))
                    .map(|(i, _)| i),
                None => self.sources.iter().position(|s| !s.buffer.is_empty()),
            };
            let Some(i) = pick else { return Ok(None) };
            let Some(doc) = self.sources[i].buffer.pop_front() else {
                return Ok(None);
            };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if let Some(limit) = self.limit.as_mut() {
                *limit -= 1;
            }
            return Ok(Some(match &self.projection {
                Some(p) => p.apply(&doc)?,
                None => doc,
            }));
        }
    }

    /// Fetches the next batch of every source whose buffer is empty but whose cursor is open.
    /// With a sort every source needs a head; without one only the first open source does.
    async fn refill(&mut self, shards: &Enlisting) -> Result<()> {
        let needy: Vec<usize> = match self.sort {
            Some(_) => (0..self.sources.len())
                .filter(|&i| self.sources[i].buffer.is_empty() && self.sources[i].cursor_id != 0)
                .collect(),
            None => self
                .sources
                .iter()
                .position(|s| !s.exhausted())
                .filter(|&i| self.sources[i].buffer.is_empty())
                .into_iter()
                .collect(),
        };
        let fetches = needy.iter().map(|&i| {
            let s = &self.sources[i];
            shards.command(s.shard, &self.db, self.get_more(s.cursor_id))
        });
        let replies = futures::future::join_all(fetches).await;
        for (i, reply) in needy.into_iter().zip(replies) {
            let reply = reply?;
            let source = &mut self.sources[i];
            source.cursor_id = cursor_id(&reply);
            source.buffer.extend(next_batch(&reply)?);
        }
        Ok(())
    }

    /// The getMore for a shard cursor: at most [`SHARD_GET_MORE_DOCS`], and for an `awaitData`
    /// cursor the client's wait.
    fn get_more(&self, cursor_id: i64) -> Document {
        let mut get_more = doc! {
            "getMore": cursor_id,
            "collection": &self.collection,
            "batchSize": SHARD_GET_MORE_DOCS,
        };
        if self.await_data
            && let Some(ms) = self.max_await_ms
        {
            get_more.insert("maxTimeMS", ms);
        }
        get_more
    }

    async fn kill(&mut self, shards: &Enlisting) {
        for s in self.sources.iter_mut().filter(|s| s.cursor_id != 0) {
            let kill = doc! {"killCursors": &self.collection, "cursors": [s.cursor_id]};
            // Best effort: a shard that lost the cursor has nothing to clean up.
            let _ = shards.command(s.shard, &self.db, kill).await;
            s.cursor_id = 0;
        }
    }
}

/// A pipeline the router runs over merged shard cursors, pulled as the client reads: each
/// merged document is pushed through the streaming stages as it comes; a blocking stage takes
/// the whole input (within its memory limit, spilling under `allowDiskUse`) before its first
/// output, which is then pulled lazily through the later stages.
pub struct Run {
    merge: Merge,
    /// Fed from `merge` until the input ends or a `$limit` has all it needs.
    push: Option<PushRun>,
    /// What the streaming stages passed and the client has not had yet.
    ready: VecDeque<Document>,
    /// The output once the input has ended.
    out: Option<std::iter::Peekable<Docs>>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("merge", &self.merge)
            .field("ready", &self.ready.len())
            .field("finished", &self.out.is_some())
            .finish_non_exhaustive()
    }
}

impl Run {
    pub fn new(merge: Merge, push: PushRun) -> Run {
        Run {
            merge,
            push: Some(push),
            ready: VecDeque::new(),
            out: None,
        }
    }

    /// The next output document, reading the shards as needed; `None` at the end.
    async fn next(&mut self, shards: &Enlisting) -> Result<Option<Document>> {
        loop {
            if let Some(doc) = self.ready.pop_front() {
                return Ok(Some(doc));
            }
            if let Some(out) = &mut self.out {
                return out.next().transpose();
            }
            let Some(push) = self.push.as_mut() else {
                return Ok(None);
            };
            let more = match self.merge.next(shards).await? {
                Some(doc) => push.push(doc)?,
                None => false,
            };
            self.ready.extend(push.take_ready());
            if !more {
                // The input ended, or nothing more of it can reach the output.
                self.merge.kill(shards).await;
                if let Some(push) = self.push.take() {
                    self.out = Some(push.finish()?.peekable());
                }
            }
        }
    }

    fn exhausted(&mut self) -> bool {
        self.ready.is_empty() && self.out.as_mut().is_some_and(|out| out.peek().is_none())
    }
}

/// What a router cursor reads from.
#[derive(Debug)]
pub enum CursorState {
    Merge(Box<Merge>),
    /// A pipeline run over a merge (an aggregation split between the shards and the router).
    Run(Box<Run>),
    /// Results computed by the router (e.g. `$currentOp`).
    Buffered(VecDeque<Document>),
    /// The output of a pipeline the router ran over what it spooled (one that reads other
    /// collections), read as the client asks.
    Spooled(Spooled),
    /// A change stream merged from every shard.
    ChangeStream(Box<crate::streams::ChangeStreamCursor>),
}

impl CursorState {
    pub fn merge(m: Merge) -> CursorState {
        CursorState::Merge(Box::new(m))
    }

    pub fn spooled(docs: Docs) -> CursorState {
        CursorState::Spooled(Spooled(docs.peekable()))
    }
}

/// A router pipeline's output (see [`CursorState::Spooled`]).
pub struct Spooled(std::iter::Peekable<Docs>);

impl std::fmt::Debug for Spooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spooled").finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct RouterCursor {
    /// `db.collection` as the driver sees it in `cursor.ns`.
    pub ns: String,
    pub state: CursorState,
    /// What `currentOp` shows of it (change streams).
    pub info: Option<Arc<Mutex<StreamInfo>>>,
}

/// What `currentOp` (`idleCursors: true`) shows of a change-stream cursor: its namespace,
/// the command that opened it, how far it has got.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub ns: String,
    pub originating_command: Document,
    pub created: bson::DateTime,
    pub last_access: bson::DateTime,
    pub returned: i64,
    /// The post-batch resume token of its last reply.
    pub last_token: Option<Document>,
}

impl StreamInfo {
    pub fn new(ns: &str, command: &Document) -> StreamInfo {
        let now = bson::DateTime::now();
        StreamInfo {
            ns: ns.to_string(),
            originating_command: command.clone(),
            created: now,
            last_access: now,
            returned: 0,
            last_token: None,
        }
    }

    /// A reply went out with `events` events and this post-batch resume token.
    pub fn replied(&mut self, events: usize, token: Option<Document>) {
        self.last_access = bson::DateTime::now();
        self.returned += events as i64;
        if token.is_some() {
            self.last_token = token;
        }
    }
}

impl RouterCursor {
    /// Up to `n` documents (and at most [`MAX_BATCH_BYTES`]); `exhausted` when nothing is left.
    /// `max_await_ms` is the getMore's `maxTimeMS` (an `awaitData` cursor's shards wait it).
    pub(crate) async fn next_batch(
        &mut self,
        shards: &Enlisting,
        n: usize,
        max_await_ms: Option<i64>,
    ) -> Result<(Vec<Document>, bool)> {
        self.take_batch(shards, n, max_await_ms, |doc| {
            Ok((pipeline::changestream::split::document_size(&doc), doc))
        })
        .await
    }

    /// As [`RouterCursor::next_batch`], each document encoded as it is taken: what a reply to
    /// the client holds is the batch's BSON bytes (at most [`MAX_BATCH_BYTES`] and one
    /// document), not the batch parsed, which takes several times that.
    pub(crate) async fn next_encoded_batch(
        &mut self,
        shards: &Enlisting,
        n: usize,
        max_await_ms: Option<i64>,
    ) -> Result<(Vec<Vec<u8>>, bool)> {
        self.take_batch(shards, n, max_await_ms, |doc| {
            let encoded = doc
                .to_vec()
                .map_err(|e| MongoError::internal(format!("encoding a result: {e}")))?;
            Ok((encoded.len(), encoded))
        })
        .await
    }

    /// Up to `n` documents, each as `take` keeps it with its BSON size, until
    /// [`MAX_BATCH_BYTES`]; and whether nothing is left.
    async fn take_batch<T>(
        &mut self,
        shards: &Enlisting,
        n: usize,
        max_await_ms: Option<i64>,
        mut take: impl FnMut(Document) -> Result<(usize, T)>,
    ) -> Result<(Vec<T>, bool)> {
        self.set_await(max_await_ms);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < n {
            let Some(doc) = self.next_doc(shards).await? else {
                break;
            };
            let (size, kept) = take(doc)?;
            bytes += size;
            out.push(kept);
            if bytes >= MAX_BATCH_BYTES {
                break;
            }
        }
        Ok((out, self.exhausted()))
    }

    fn set_await(&mut self, max_await_ms: Option<i64>) {
        if let CursorState::Merge(m) = &mut self.state {
            m.max_await_ms = max_await_ms;
        }
    }

    /// The next document; `None` at the end, or from a tailable shard cursor with nothing new
    /// yet (it stays open, and the client asks again). Each document takes a unit of the task's
    /// cooperative budget: a batch read from documents already at hand (a shard's buffered
    /// reply, a spool) otherwise runs to 16 MiB without yielding, and a few such replies at
    /// once kept every runtime thread from the other connections (a new connection's `ping`
    /// waited 115 s behind eight 16 MiB finds).
    async fn next_doc(&mut self, shards: &Enlisting) -> Result<Option<Document>> {
        tokio::task::coop::consume_budget().await;
        match &mut self.state {
            CursorState::Merge(m) => m.next(shards).await,
            CursorState::Run(r) => r.next(shards).await,
            CursorState::Buffered(b) => Ok(b.pop_front()),
            CursorState::Spooled(s) => s.0.next().transpose(),
            CursorState::ChangeStream(_) => Err(MongoError::internal(
                "a change stream is read with its own getMore",
            )),
        }
    }

    /// Whether nothing is left to read.
    fn exhausted(&mut self) -> bool {
        match &mut self.state {
            CursorState::Merge(m) => m.limit == Some(0) || m.sources.iter().all(Source::exhausted),
            CursorState::Run(r) => r.exhausted(),
            CursorState::Buffered(b) => b.is_empty(),
            CursorState::Spooled(s) => s.0.peek().is_none(),
            CursorState::ChangeStream(c) => c.is_closed(),
        }
    }

    /// Parks a change stream until it is read again; what it held is freed by stopping the
    /// result (see [`crate::streams::ChangeStreamCursor::park`]). `None` for any other cursor,
    /// or when there is nothing to free.
    pub(crate) fn park(&mut self) -> Option<crate::streams::Stopping> {
        match &mut self.state {
            CursorState::ChangeStream(c) => c.park(),
            _ => None,
        }
    }

    pub(crate) async fn kill(&mut self, shards: &Enlisting) {
        match &mut self.state {
            CursorState::Merge(m) => m.kill(shards).await,
            CursorState::Run(r) => r.merge.kill(shards).await,
            CursorState::ChangeStream(c) => c.kill().await,
            CursorState::Buffered(_) | CursorState::Spooled(_) => {}
        }
    }
}

struct Entry {
    cursor: Arc<tokio::sync::Mutex<RouterCursor>>,
    last_used: Instant,
    info: Option<Arc<Mutex<StreamInfo>>>,
}

/// All open router cursors.
pub struct CursorTable {
    cursors: Mutex<HashMap<i64, Entry>>,
    /// `cursorTimeoutMillis`.
    idle_timeout_ms: AtomicU64,
    /// `changeStreamHeldReplyBytesLimit`.
    stream_held_bytes: AtomicU64,
}

impl Default for CursorTable {
    fn default() -> CursorTable {
        CursorTable {
            cursors: Mutex::default(),
            idle_timeout_ms: AtomicU64::new(IDLE_TIMEOUT.as_millis() as u64),
            stream_held_bytes: AtomicU64::new(STREAM_HELD_BYTES as u64),
        }
    }
}

impl CursorTable {
    /// Registers a cursor and returns its new id.
    pub fn insert(&self, cursor: RouterCursor) -> i64 {
        let mut map = lock(&self.cursors);
        let id = loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !map.contains_key(&id) {
                break id;
            }
        };
        let info = cursor.info.clone();
        map.insert(
            id,
            Entry {
                cursor: Arc::new(tokio::sync::Mutex::new(cursor)),
                last_used: Instant::now(),
                info,
            },
        );
        id
    }

    /// The open change-stream cursors, by id (read without waiting on a cursor in use).
    pub fn streams(&self) -> Vec<(i64, StreamInfo)> {
        let map = lock(&self.cursors);
        let mut out: Vec<(i64, StreamInfo)> = map
            .iter()
            .filter_map(|(id, e)| Some((*id, lock(e.info.as_ref()?).clone())))
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out
    }

    /// The cursor with this id, or `CursorNotFound`.
    pub fn get(&self, id: i64) -> Result<Arc<tokio::sync::Mutex<RouterCursor>>> {
        let mut map = lock(&self.cursors);
        match map.get_mut(&id) {
            Some(e) => {
                e.last_used = Instant::now();
                Ok(e.cursor.clone())
            }
            None => Err(MongoError::new(
                ErrorCode::CURSOR_NOT_FOUND,
                format!("cursor id {id} not found"),
            )),
        }
    }

    pub fn remove(&self, id: i64) -> Option<Arc<tokio::sync::Mutex<RouterCursor>>> {
        lock(&self.cursors).remove(&id).map(|e| e.cursor)
    }

    /// How long a cursor may stay unused before it is reaped (`cursorTimeoutMillis`).
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_idle_timeout(&self, timeout: Duration) {
        self.idle_timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    /// Removes cursors idle for longer than [`CursorTable::idle_timeout`] and returns them for
    /// cleanup.
    pub fn take_idle(&self, now: Instant) -> Vec<Arc<tokio::sync::Mutex<RouterCursor>>> {
        let timeout = self.idle_timeout();
        let mut map = lock(&self.cursors);
        let idle: Vec<i64> = map
            .iter()
            .filter(|(_, e)| now.duration_since(e.last_used) > timeout)
            .map(|(id, _)| *id)
            .collect();
        idle.into_iter()
            .filter_map(|id| map.remove(&id))
            .map(|e| e.cursor)
            .collect()
    }

    /// The shard replies change streams may hold before idle ones are parked.
    pub fn stream_held_bytes(&self) -> usize {
        usize::try_from(self.stream_held_bytes.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    pub fn set_stream_held_bytes(&self, bytes: u64) {
        self.stream_held_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The change streams unread for longer than `idle`, the least recently read first.
    pub fn idle_streams(
        &self,
        idle: Duration,
        now: Instant,
    ) -> Vec<Arc<tokio::sync::Mutex<RouterCursor>>> {
        let map = lock(&self.cursors);
        let mut idle: Vec<&Entry> = map
            .values()
            .filter(|e| e.info.is_some() && now.duration_since(e.last_used) > idle)
            .collect();
        idle.sort_by_key(|e| e.last_used);
        idle.into_iter().map(|e| e.cursor.clone()).collect()
    }

    pub fn len(&self) -> usize {
        lock(&self.cursors).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_get_mores_ask_for_a_bounded_batch_and_pass_the_await() {
        let mut merge = Merge::concat("db", "c", Vec::new());
        merge.max_await_ms = Some(500);
        assert_eq!(
            merge.get_more(7),
            doc! {"getMore": 7_i64, "collection": "c", "batchSize": SHARD_GET_MORE_DOCS}
        );
        merge.await_data = true;
        assert_eq!(merge.get_more(7).get_i64("maxTimeMS").ok(), Some(500));
    }
}
