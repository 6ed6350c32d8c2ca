//! Change-stream cursors on a shard: the shard half of a `$changeStream` aggregate.
//!
//! Every cursor reads the shared tail window (one copy of each entry in memory for all cursors,
//! published once by the writer); a cursor that has fallen behind the window reads the oplog
//! from storage in batches and rejoins. The pure stages (`pipeline::changestream::ShardStream`)
//! turn entries into events: the common case (a CRUD entry, no shard-side stages) straight from
//! the entry's stored bytes to the event's, the rest through decoded documents. Each event is
//! encoded once, when it is made; replies are written from those bytes (`wire::raw::Writer`). A cursor holds at most one batch of pending events, so a slow or
//! idle reader costs its position and nothing more: writers never wait for readers.
//!
//! Invariants:
//! * `position` only grows; every oplog entry with `ts <= position` has been run through the
//!   stages, and its events are either returned already or in `pending`.
//! * The post-batch resume token only grows. When nothing is pending and the cursor has read
//!   every entry at or below the shard's high-water mark `H`, it is the high-water-mark token
//!   at `H + 1`: every event this shard will still return sorts after it, and resuming from it
//!   (scan `ts >= H + 1`) neither repeats nor skips an event. Routers merge on that promise.
//! * A getMore returns as soon as it has an event, or when the router asked for a promise at
//!   least some time `F` (a nudge) and the token has reached it, or at its deadline.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Bson, Document, RawDocument, RawDocumentBuf};
use bytes::Bytes;
use pipeline::changestream::ChangeEvent;
use pipeline::changestream::images::{ImageSource, PreImageId};
use pipeline::changestream::resumability::check_history;
use pipeline::changestream::shard::ShardStream;
use pipeline::changestream::spec::{ChangeStreamCommand, StartPoint, parse_command};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};
use tokio::sync::Notify;
use wire::raw::CursorReply;
use wire::{ErrorCode, MongoError, Result};

mod shared;

use crate::oplog::{self, WindowRead};
use crate::state::{ShardState, StreamMetrics};
use crate::storage::Table;

/// Entries read from the window or storage per step.
const READ_BATCH: usize = 512;
/// getMore's awaitData wait when the request gives no `maxTimeMS`.
pub const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);
/// Reply budget for one batch of events.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Change-stream cursors idle for longer than this are dropped.
const IDLE_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// The router's request for a promise: wake the cursor once its token can reach `floor`.
#[derive(Default)]
struct Nudge {
    floor: AtomicU64,
    notify: Notify,
}

struct Entry {
    cursor: tokio::sync::Mutex<StreamCursor>,
    nudge: Nudge,
    last_used_ms: AtomicU64,
}

/// The shard's open change-stream cursors, and the readers they share.
#[derive(Default)]
pub struct ChangeStreams {
    cursors: Mutex<HashMap<i64, Arc<Entry>>>,
    readers: shared::Readers,
}

/// An event waiting for a reply, encoded once: the reply copies its bytes as they are. Shared
/// readers hand the same event to every cursor that reads from them.
struct Pending {
    /// The `ts` of the oplog entry it was made from.
    ts: ClusterTime,
    token: ResumeToken,
    bytes: Bytes,
    /// The invalidate that ends the stream: the cursor closes once it hands it out. (Not the
    /// invalidate a `startAfter` stream finds as its resume point: that one only proves the
    /// resume, and the stream goes on after it.)
    invalidate: bool,
}

impl Pending {
    fn new(ts: ClusterTime, event: ChangeEvent, stream: &ShardStream) -> Result<Pending> {
        let bytes = event
            .doc
            .to_vec()
            .map_err(|e| MongoError::internal(format!("encoding a change event: {e}")))?;
        Ok(Pending {
            ts,
            invalidate: stream.invalidated() == Some(&event.token),
            token: event.token,
            bytes: Bytes::from(bytes),
        })
    }
}

/// A stream's stages and how far they have read: a cursor's own, or a shared reader's.
#[derive(Clone)]
struct Reading {
    stream: ShardStream,
    /// Every oplog entry with `ts <= position` has been run through the stages.
    position: ClusterTime,
}

impl Reading {
    /// Runs the stages over up to one read batch of entries after `position`, appending the
    /// events to `out`. Returns whether it read every entry visible when it looked.
    fn step(&mut self, state: &ShardState, out: &mut VecDeque<Arc<Pending>>) -> Result<bool> {
        if self.stream.invalidated().is_some() {
            return Ok(true);
        }
        let entries = match state.tail.read_after(self.position, READ_BATCH) {
            WindowRead::Entries(e) => e,
            WindowRead::Behind => {
                // The entries after `position` must still be in the oplog.
                check_history(self.position.next(), state.oplog_truncated_through().next())?;
                let read = state.storage.begin_read().map_err(storage_error)?;
                oplog::read_from_storage(&*read, self.position, READ_BATCH)
                    .map_err(storage_error)?
            }
        };
        let exhausted = entries.len() < READ_BATCH;
        for (ts, bytes) in entries {
            let corrupt = |e: bson::error::Error| {
                MongoError::internal(format!("corrupt oplog entry at {ts}: {e}"))
            };
            let raw = RawDocument::from_bytes(&bytes).map_err(corrupt)?;
            // The common case (CRUD) goes from the entry's bytes to the event's.
            let encoded = self
                .stream
                .process_encoded(raw)
                .inspect_err(|e| failed(state, e))?;
            if let Some(events) = encoded {
                out.extend(events.into_iter().map(|e| {
                    Arc::new(Pending {
                        ts,
                        token: e.token,
                        bytes: Bytes::from(e.bytes),
                        invalidate: false,
                    })
                }));
            } else {
                let entry = Document::try_from(raw).map_err(corrupt)?;
                let mut lookup =
                    |optime: pipeline::changestream::unwind::OpTime| read_entry(state, optime.ts);
                let events = self
                    .stream
                    .process_entry_with_images(&entry, &mut lookup, &mut StoredImages(state))
                    .inspect_err(|e| failed(state, e))?;
                for event in events {
                    if event
                        .doc
                        .get_document("splitEvent")
                        .is_ok_and(|s| s.get_i32("fragment").ok() == Some(1))
                    {
                        StreamMetrics::count(&state.stream_metrics.large_events_split);
                    }
                    out.push_back(Arc::new(Pending::new(ts, event, &self.stream)?));
                }
            }
            self.position = ts;
            if self.stream.invalidated().is_some() {
                return Ok(true);
            }
        }
        Ok(exhausted)
    }
}

/// Counts a stream failed by an event over 16 MiB.
fn failed(state: &ShardState, e: &MongoError) {
    if e.code == ErrorCode::BSON_OBJECT_TOO_LARGE.code {
        StreamMetrics::count(&state.stream_metrics.large_events_failed);
    }
}

/// The images a stream reads, from this shard's storage: the pre-images stored with writes,
/// and the documents as they are now (`updateLookup`). A storage failure is an error, a damaged
/// document too: neither is a missing image.
struct StoredImages<'a>(&'a ShardState);

impl StoredImages<'_> {
    fn read(&self, table: Table, key: &[u8], what: &str) -> Result<Option<Document>> {
        let read = self.0.storage.begin_read().map_err(storage_error)?;
        match read.get(table, key).map_err(storage_error)? {
            None => Ok(None),
            Some(bytes) => Document::from_reader(bytes.as_slice())
                .map(Some)
                .map_err(|e| MongoError::internal(format!("a damaged {what}: {e}"))),
        }
    }
}

impl ImageSource for StoredImages<'_> {
    fn pre_image(&mut self, id: &PreImageId) -> Result<Option<Document>> {
        let key = crate::keys::pre_image_key(&id.uuid, id.ts, id.apply_ops_index);
        self.read(Table::PreImages, &key, "pre-image")
    }

    fn current(&mut self, uuid: &bson::Uuid, id: &Bson) -> Result<Option<Document>> {
        self.read(
            Table::Documents,
            &crate::keys::doc_key(uuid, id),
            "document",
        )
    }
}

/// One cursor's reading state. See the module invariants.
pub struct StreamCursor {
    /// Its own stages and position; while it reads from a shared reader, the position only.
    reading: Reading,
    /// The shared reader it reads from, once it has joined one.
    shared: Option<Arc<shared::Reader>>,
    /// How it may join one: the readers' key for its shard-side spec and a fresh copy of its
    /// stages (they hold no state once its resume point is behind it).
    share: Option<(Vec<u8>, ShardStream)>,
    ns: String,
    pending: VecDeque<Arc<Pending>>,
    pbrt: ResumeToken,
    /// The post-batch resume token of the last reply: a nudge is answered once, by the first
    /// reply whose promise reaches its floor.
    reported: ResumeToken,
    /// Set once the invalidate event has been handed out: the cursor then closes.
    closed: bool,
}

impl StreamCursor {
    /// Runs the stages over entries after its position until `want` events are pending or every
    /// visible entry is read, through a shared reader once it can join one. Returns whether it
    /// read everything visible.
    fn advance(
        &mut self,
        state: &ShardState,
        readers: &shared::Readers,
        want: usize,
    ) -> Result<bool> {
        self.try_to_share(readers);
        if let Some(reader) = &self.shared {
            match reader.read(state, self.reading.position, want)? {
                Some(taken) => {
                    self.pending.extend(taken.events);
                    self.reading.position = taken.position;
                    return Ok(taken.read_through);
                }
                // It fell behind what the reader keeps: it goes on by itself, from where it
                // is, and joins again once it has caught up.
                None => self.shared = None,
            }
        }
        while self.pending.len() < want.max(1) && self.reading.stream.invalidated().is_none() {
            if self.reading.step(state, &mut self.pending)? {
                return Ok(true);
            }
        }
        Ok(self.pending.is_empty() && self.reading.stream.invalidated().is_none())
    }

    /// Joins the shared reader of its spec once its own stages hold nothing a fresh copy would
    /// not: past its resume point, not invalidated.
    fn try_to_share(&mut self, readers: &shared::Readers) {
        if self.shared.is_some()
            || !self.reading.stream.resume_point_passed()
            || self.reading.stream.invalidated().is_some()
        {
            return;
        }
        if let Some((key, fresh)) = &self.share {
            self.shared = readers.join(key, self.reading.position, || Reading {
                stream: fresh.clone(),
                position: self.reading.position,
            });
        }
    }

    /// Moves up to `n` pending events (and at most the reply budget) into a batch.
    fn take_batch(&mut self, n: usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut bytes = 0;
        while out.len() < n {
            let Some(e) = self.pending.front() else { break };
            let size = e.bytes.len();
            if !out.is_empty() && bytes + size > MAX_BATCH_BYTES {
                break;
            }
            let Some(e) = self.pending.pop_front() else {
                break;
            };
            bytes += size;
            self.raise(&e.token);
            if e.invalidate {
                self.closed = true;
            }
            out.push(e.bytes.clone());
        }
        out
    }

    fn raise(&mut self, token: &ResumeToken) {
        if *token > self.pbrt {
            self.pbrt = token.clone();
        }
    }

    /// After reading everything visible at or below `hwm`: promise `hwm + 1` (a direct reader
    /// whose resume token was not found there gets 280 instead).
    fn promise(&mut self, hwm: ClusterTime) -> Result<()> {
        if self.pending.is_empty() && self.reading.stream.invalidated().is_none() && !self.closed {
            let t = ResumeTokenData::high_water_mark(hwm.next(), TokenVersion::default());
            self.reading.stream.check_promise(&t)?;
            self.raise(&t.encode());
        }
        Ok(())
    }

    fn reply(&self, id: i64, batch: Vec<Bytes>, first: bool) -> RawDocumentBuf {
        CursorReply {
            ns: &self.ns,
            id: if self.closed { 0 } else { id },
            first,
            batch: &batch,
            post_batch_resume_token: Some(&self.pbrt.to_document()),
            invalidated: self.closed,
        }
        .write()
    }
}

fn storage_error(e: impl std::fmt::Display) -> MongoError {
    MongoError::internal(format!("reading the oplog: {e}"))
}

/// One oplog entry by `ts` (for walking a transaction's `prevOpTime` chain).
fn read_entry(state: &ShardState, ts: ClusterTime) -> Option<Document> {
    let read = state.storage.begin_read().ok()?;
    let bytes = read.get(Table::Oplog, &oplog::oplog_key(ts)).ok()??;
    Document::from_reader(&mut bytes.as_slice()).ok()
}

impl ChangeStreams {
    /// `aggregate` with `$changeStream` first: opens a cursor and returns its first batch
    /// (without waiting). A stream without a start option starts at the shard's next tick.
    pub fn open(&self, state: &ShardState, db: &str, cmd: &Document) -> Result<RawDocumentBuf> {
        let ChangeStreamCommand {
            coll,
            pipeline: parsed,
            batch_size: n,
            ..
        } = parse_command(db, cmd, false)?;
        if parsed.spec.options.show_expanded_events {
            StreamMetrics::count(&state.stream_metrics.show_expanded_events);
        }
        let now = state.high_water_mark().next();
        let start = parsed.spec.scan_start(now);
        let pbrt = parsed.spec.initial_post_batch_resume_token(now);
        let ns = match coll {
            Some(c) => format!("{db}.{c}"),
            None => format!("{db}.$cmd.aggregate"),
        };
        // Entries at `start` are included: the scan is `ts > position`. Entries up to the
        // truncation point are gone: a start at or before it has lost history (286).
        let position = start.prev();
        check_history(start, state.oplog_truncated_through().next())?;
        // A start point in a stretch of history this shard no longer has (`lineage`).
        let asked = match &parsed.spec.start {
            StartPoint::None => None,
            StartPoint::StartAtOperationTime(t) => Some((*t, false)),
            StartPoint::ResumeAfter(t) | StartPoint::StartAfter(t) => {
                Some((t.cluster_time(), true))
            }
        };
        let starts_now = cmd.get_bool(crate::lineage::STARTS_NOW).unwrap_or(false);
        if let (Some((at, token)), Some(lineage), false) = (asked, state.lineage(), starts_now) {
            lineage.check_start(&state.name, at, token)?;
        }
        let mut fresh = parsed.clone();
        fresh.spec.start = StartPoint::None;
        let share = shared::key(db, cmd).map(|key| (key, ShardStream::from_pipeline(fresh)));
        // A driver reading this shard's replica set directly gets the resume proof a router
        // would make (MongoDB's routers say `fromRouter`).
        let mut stream = ShardStream::from_pipeline(parsed);
        if !cmd.get_bool("fromRouter").unwrap_or(false) {
            stream = stream.ensuring_resume_token();
        }
        let mut cursor = StreamCursor {
            reading: Reading { stream, position },
            shared: None,
            share,
            ns,
            pending: VecDeque::new(),
            reported: pbrt.clone(),
            pbrt,
            closed: false,
        };
        if n > 0 {
            let hwm = state.high_water_mark();
            let read_through = cursor.advance(state, &self.readers, n)?;
            let batch = cursor.take_batch(n);
            if read_through {
                cursor.promise(hwm)?;
            }
            return self.register(state, cursor, batch);
        }
        self.register(state, cursor, Vec::new())
    }

    fn register(
        &self,
        state: &ShardState,
        cursor: StreamCursor,
        batch: Vec<Bytes>,
    ) -> Result<RawDocumentBuf> {
        if cursor.closed {
            return Ok(cursor.reply(0, batch, true));
        }
        let id = self.insert(cursor, state.now_millis());
        let entry = self.get(id)?;
        let cursor = entry
            .cursor
            .try_lock()
            .map_err(|_| MongoError::internal("a new cursor is busy"))?;
        Ok(cursor.reply(id, batch, true))
    }

    fn insert(&self, cursor: StreamCursor, now_ms: u64) -> i64 {
        let mut map = lock(&self.cursors);
        let id = loop {
            let id = (rand::random::<u64>() >> 1) as i64;
            if id != 0 && !map.contains_key(&id) {
                break id;
            }
        };
        map.insert(
            id,
            Arc::new(Entry {
                cursor: tokio::sync::Mutex::new(cursor),
                nudge: Nudge::default(),
                last_used_ms: AtomicU64::new(now_ms),
            }),
        );
        id
    }

    fn get(&self, id: i64) -> Result<Arc<Entry>> {
        lock(&self.cursors).get(&id).cloned().ok_or_else(|| {
            MongoError::new(
                ErrorCode::CURSOR_NOT_FOUND,
                format!("cursor id {id} not found"),
            )
        })
    }

    /// Whether `id` is one of ours (getMore/killCursors dispatch on it).
    pub fn contains(&self, id: i64) -> bool {
        lock(&self.cursors).contains_key(&id)
    }

    /// `getMore` on a change-stream cursor: waits (awaitData) up to `max_time` for an event.
    pub async fn get_more(
        &self,
        state: &ShardState,
        id: i64,
        batch_size: Option<usize>,
        max_time: Duration,
    ) -> Result<RawDocumentBuf> {
        let entry = self.get(id)?;
        let Ok(mut cursor) = entry.cursor.try_lock() else {
            return Err(MongoError::new(
                ErrorCode::CURSOR_IN_USE,
                format!("cursor id {id} is already in use"),
            ));
        };
        entry
            .last_used_ms
            .store(state.now_millis(), Ordering::Relaxed);
        let n = batch_size.unwrap_or(usize::MAX);
        let deadline = tokio::time::Instant::now() + max_time;
        let mut visible = state.tail.subscribe();
        // The high-water mark below which this cursor has read every entry, if it has.
        let mut read_through;
        loop {
            visible.borrow_and_update();
            let hwm = state.high_water_mark();
            read_through = cursor.advance(state, &self.readers, n)?.then_some(hwm);
            if let Some(h) = read_through {
                cursor.promise(h)?;
            }
            if !cursor.pending.is_empty() || cursor.reading.stream.invalidated().is_some() {
                break;
            }
            let floor = ClusterTime::from_u64(entry.nudge.floor.load(Ordering::Acquire));
            if floor > ClusterTime::ZERO {
                let wanted =
                    ResumeTokenData::high_water_mark(floor, TokenVersion::default()).encode();
                if cursor.pbrt >= wanted && cursor.reported < wanted {
                    break;
                }
            }
            tokio::select! {
                _ = visible.changed() => {}
                _ = entry.nudge.notify.notified() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let batch = cursor.take_batch(n);
        if let Some(h) = read_through {
            cursor.promise(h)?;
        }
        let reply = cursor.reply(id, batch, false);
        cursor.reported = cursor.pbrt.clone();
        if cursor.closed {
            drop(cursor);
            lock(&self.cursors).remove(&id);
        }
        Ok(reply)
    }

    /// The router needs this cursor's promise to reach `floor`: advance the clock to it and
    /// wake a waiting getMore so it answers as soon as it can promise that much.
    pub fn nudge(&self, state: &ShardState, id: i64, floor: ClusterTime) -> Result<()> {
        let entry = self.get(id)?;
        state.observe(floor);
        entry
            .nudge
            .floor
            .fetch_max(floor.as_u64(), Ordering::AcqRel);
        entry.nudge.notify.notify_one();
        Ok(())
    }

    pub fn kill(&self, id: i64) -> bool {
        lock(&self.cursors).remove(&id).is_some()
    }

    /// Drops cursors nobody has used for ten minutes.
    pub fn reap(&self, now_ms: u64) {
        lock(&self.cursors).retain(|_, e| {
            now_ms.saturating_sub(e.last_used_ms.load(Ordering::Relaxed)) < IDLE_TIMEOUT_MS
        });
    }

    pub fn len(&self) -> usize {
        lock(&self.cursors).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shared readers alive now (cursors of one shard-side spec share one).
    pub fn shared_readers(&self) -> usize {
        self.readers.len()
    }
}

/// Never held across `.await`; a poisoned map is still consistent (entries are whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
