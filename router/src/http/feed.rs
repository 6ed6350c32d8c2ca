//! `GET /v1/changes` and `GET /v1/bounds`: a change stream read over plain HTTP.
//!
//! A page opens the stream where its cursor says (`from`: `oldest`, `head`, or the `next` of
//! the page before, which is a resume token), reads up to `limit` changes (waiting up to
//! `waitMs` for the first), closes it and answers `{changes, next, caught_up}`. With
//! `Accept: text/event-stream` the same stream stays open and each change is a server-sent
//! event whose `id` is its resume token, so an `EventSource` that reconnects with
//! `Last-Event-ID` resumes exactly; an idle stream sends a `heartbeat` event carrying the
//! stream's position every `heartbeatMs`.
//!
//! Invariants: each change is exactly the event `watch()` returns (the router's own
//! `aggregate` and `getMore` produce it), rendered as Extended JSON; `next` resumes after the
//! last change given and never skips one; a page holds at most `limit` changes and about
//! [`MAX_PAGE_BYTES`]; an event stream asks for the next batch only once the client has taken
//! the one before; a stream is killed when its page is done or its client goes.

use std::time::Duration;

use bson::{Bson, Document, RawDocument, RawDocumentBuf, doc};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use wire::{MongoError, Result};

use super::extjson;
use super::query::{self, FeedRequest, Scope, cursor_of};
use super::{Body, Caller, failure, json_response, json_text};

/// About the most bytes of JSON a page holds: a page stops taking batches past it.
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;

/// `GET /v1/bounds?ns=`: `{earliest, current}` cursors (with their cluster times).
pub async fn bounds(caller: Caller, query: &str) -> Response<Body> {
    let reply = async {
        let params = query::params(query)?;
        if let Some((k, _)) = params
            .iter()
            .find(|(k, _)| !matches!(k.as_str(), "ns" | "authSource"))
        {
            return Err(MongoError::bad_value(format!(
                "unknown query parameter '{k}'"
            )));
        }
        let ns = params
            .iter()
            .find(|(k, _)| k == "ns")
            .map(|(_, v)| v.as_str());
        let scope = Scope::parse(ns)?;
        let (db, cmd) = scope.bounds_command();
        let reply = caller.run(db, cmd).await?;
        let cursor = |field: &str| {
            reply
                .get_document(field)
                .ok()
                .and_then(cursor_of)
                .unwrap_or_default()
        };
        let time = |field: &str| {
            reply
                .get(field)
                .cloned()
                .unwrap_or(Bson::Null)
                .into_relaxed_extjson()
        };
        Ok(json!({
            "earliest": cursor("earliest"),
            "current": cursor("current"),
            "earliestTime": time("earliestTime"),
            "currentTime": time("currentTime"),
        }))
    };
    match reply.await {
        Ok(json) => json_response(StatusCode::OK, &json),
        Err(e) => failure(&e),
    }
}

/// `GET /v1/changes`: a page, or server-sent events when the client accepts them.
pub async fn changes(caller: Caller, req: &Request<Incoming>, query: &str) -> Response<Body> {
    let feed = match FeedRequest::parse(query) {
        Ok(f) => f,
        Err(e) => return failure(&e),
    };
    let accepts_events = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"));
    if !accepts_events {
        return match page(caller, &feed).await {
            Ok(json) => json_text(StatusCode::OK, json),
            Err(e) => failure(&e),
        };
    }
    let last_event_id = match req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(query::token_of)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => return failure(&e),
    };
    match Stream::open(caller, &feed, last_event_id, 0).await {
        Ok((stream, first)) => events(stream, first, feed),
        Err(e) => failure(&e),
    }
}

/// How long a page goes on reading to catch up with what was committed before it was asked
/// for, when the changes come slower than that, before it answers without `caught_up`.
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(5);
/// A getMore's wait while catching up: the stream's position moves on at least this often.
const CATCH_UP_STEP: Duration = Duration::from_millis(50);

/// One page: up to `limit` changes from the request's cursor. It is `caught_up` when it holds
/// every change committed before the request came (its `next` is past the cluster time the
/// router had then): an empty batch alone says only that none had arrived yet.
async fn page(caller: Caller, feed: &FeedRequest) -> Result<String> {
    let asked_at = caller.seams().cluster_time();
    let (mut stream, mut events) = Stream::open(caller, feed, None, feed.limit).await?;
    let limit = feed.limit as usize;
    let started = tokio::time::Instant::now();
    let deadline = started + feed.wait;
    let patience = started + feed.wait.max(CATCH_UP_PATIENCE);
    let mut body = String::with_capacity(64 * 1024);
    body.push_str("{\"changes\":[");
    let mut n = 0;
    let caught_up = loop {
        for event in events.drain(..) {
            if n > 0 {
                body.push(',');
            }
            extjson::write_document(&mut body, &event, feed.form())?;
            n += 1;
        }
        if stream.id == 0 {
            // An invalidate ended the stream: there is nothing after it.
            break true;
        }
        if n >= limit || body.len() >= MAX_PAGE_BYTES {
            break false;
        }
        let now = tokio::time::Instant::now();
        let reached = stream.time().is_some_and(|t| t > asked_at);
        if reached && (n > 0 || now >= deadline) {
            break true;
        }
        if !reached && now >= patience {
            break false;
        }
        // Caught up and still without a change: wait for the first until the deadline.
        let wait = if reached {
            deadline.saturating_duration_since(now)
        } else {
            CATCH_UP_STEP
        };
        events = stream.more((limit - n) as u32, wait).await?;
    };
    let next = stream.position();
    stream.close().await;
    body.push_str("],\"next\":");
    extjson::write_str(&mut body, &next);
    body.push_str(if caught_up {
        ",\"caught_up\":true}"
    } else {
        ",\"caught_up\":false}"
    });
    Ok(body)
}

/// The event-stream body: the first batch, then a batch at a time as the client takes them.
fn events(stream: Stream, first: Vec<RawDocumentBuf>, feed: FeedRequest) -> Response<Body> {
    struct State {
        stream: Stream,
        pending: Option<Vec<RawDocumentBuf>>,
        feed: FeedRequest,
        done: bool,
    }
    let state = State {
        stream,
        pending: Some(first),
        feed,
        done: false,
    };
    let body = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            st.stream.close().await;
            return None;
        }
        let mut out = String::new();
        let batch = match st.pending.take() {
            Some(first) => {
                // How long a reconnecting EventSource waits.
                out.push_str("retry: 1000\n\n");
                Ok(first)
            }
            None => st.stream.more(st.feed.limit, st.feed.heartbeat).await,
        };
        match batch {
            Ok(batch) if batch.is_empty() => {
                let next = st.stream.position();
                out.push_str(&format!(
                    "event: heartbeat\nid: {next}\ndata: {}\n\n",
                    json!({"next": next})
                ));
            }
            Ok(batch) => {
                for event in batch {
                    if let Some(id) = event_cursor(&event) {
                        out.push_str("id: ");
                        out.push_str(&id);
                        out.push('\n');
                    }
                    out.push_str("data: ");
                    if let Err(e) = extjson::write_document(&mut out, &event, st.feed.form()) {
                        tracing::warn!(error = %e, "an event not rendered");
                    }
                    out.push_str("\n\n");
                }
            }
            Err(e) => {
                let error = Bson::Document(e.to_document()).into_relaxed_extjson();
                out.push_str(&format!("event: error\ndata: {error}\n\n"));
                st.done = true;
            }
        }
        // An invalidate ends the stream, after it is sent.
        st.done = st.done || st.stream.id == 0;
        Some((
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(out))),
            st,
        ))
    });
    let body = http_body_util::StreamBody::new(StreamExt::boxed(body));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The cursor an event's token makes (its `_id`).
fn event_cursor(event: &RawDocument) -> Option<String> {
    let id = event.get_document("_id").ok()?;
    cursor_of(&Document::try_from(id).ok()?)
}

/// A change stream open through the router's own commands, as a driver holds one.
struct Stream {
    caller: Option<Caller>,
    db: String,
    /// The cursor's collection, as `getMore` names it.
    collection: String,
    /// 0 once the stream is closed (an invalidate closes it).
    id: i64,
    /// The post-batch resume token of the last reply: after everything given so far.
    next: Option<Document>,
}

impl Stream {
    /// Opens the stream `feed` asks for (after `after` instead of its start when given),
    /// with up to `first` changes in its first batch.
    async fn open(
        caller: Caller,
        feed: &FeedRequest,
        after: Option<Document>,
        first: u32,
    ) -> Result<(Stream, Vec<RawDocumentBuf>)> {
        let (db, mut cmd) = feed.aggregate(after);
        cmd.insert("cursor", doc! {"batchSize": i64::from(first)});
        let reply = caller.run_raw(db, cmd).await?;
        let cursor = cursor_of_reply(&reply)?;
        let ns = cursor.get_str("ns").unwrap_or("");
        let collection = ns.split_once('.').map_or("", |(_, c)| c).to_string();
        let mut stream = Stream {
            caller: Some(caller),
            db: db.to_string(),
            collection,
            id: 0,
            next: None,
        };
        let events = stream.take(cursor, "firstBatch")?;
        Ok((stream, events))
    }

    /// The next batch: up to `n` changes, waiting up to `wait` for the first.
    async fn more(&mut self, n: u32, wait: Duration) -> Result<Vec<RawDocumentBuf>> {
        let Some(caller) = &self.caller else {
            return Ok(Vec::new());
        };
        if self.id == 0 {
            return Ok(Vec::new());
        }
        let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1);
        let cmd = doc! {
            "getMore": self.id,
            "collection": &self.collection,
            "batchSize": i64::from(n),
            "maxTimeMS": wait_ms,
        };
        let reply = caller.run_raw(&self.db, cmd).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.id = 0;
                return Err(e);
            }
        };
        self.take(cursor_of_reply(&reply)?, "nextBatch")
    }

    fn take(&mut self, cursor: &RawDocument, batch: &str) -> Result<Vec<RawDocumentBuf>> {
        self.id = cursor.get_i64("id").unwrap_or(0);
        if let Ok(token) = cursor.get_document("postBatchResumeToken") {
            self.next = Some(Document::try_from(token).map_err(|_| malformed())?);
        }
        let events = cursor
            .get_array(batch)
            .map_err(|_| malformed())?
            .into_iter()
            .filter_map(|e| Some(e.ok()?.as_document()?.to_owned()))
            .collect::<Vec<_>>();
        if self.next.is_none()
            && let Some(last) = events.last()
            && let Ok(id) = last.get_document("_id")
        {
            self.next = Document::try_from(id).ok();
        }
        Ok(events)
    }

    /// The cluster time of the stream's position.
    fn time(&self) -> Option<resume::ClusterTime> {
        let token = resume::token::ResumeToken::from_document(self.next.as_ref()?).ok()?;
        let token = token.unstamp().map_or(token, |(plain, _)| plain);
        token.decode().ok().map(|t| t.cluster_time())
    }

    /// The cursor after everything given so far.
    fn position(&self) -> String {
        self.next.as_ref().and_then(cursor_of).unwrap_or_default()
    }

    async fn close(&mut self) {
        if let Some(caller) = self.caller.take()
            && self.id != 0
        {
            let cmd = doc! {"killCursors": &self.collection, "cursors": [self.id]};
            let _ = caller.run(&self.db, cmd).await;
            self.id = 0;
        }
    }
}

impl Drop for Stream {
    /// A client that went away mid-stream: its cursor is killed now, not when it idles out.
    fn drop(&mut self) {
        if let Some(caller) = self.caller.take()
            && self.id != 0
        {
            caller.kill_cursor_later(&self.db, &self.collection, self.id);
        }
    }
}

/// A cursor reply's `cursor`.
fn cursor_of_reply(reply: &RawDocument) -> Result<&RawDocument> {
    reply.get_document("cursor").map_err(|_| malformed())
}

fn malformed() -> MongoError {
    MongoError::internal("the router's own cursor reply is malformed")
}
