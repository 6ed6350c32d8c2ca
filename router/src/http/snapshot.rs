//! `GET /v1/snapshot?ns=<db>.<coll>`: every document of a collection as of one cluster time,
//! as NDJSON (one Extended JSON document a line), then a last line
//! `{"next": "<cursor>", "atClusterTime": ..., "count": n}` whose cursor is where
//! `GET /v1/changes` follows that snapshot exactly (`snapshotCursor`).
//!
//! Invariants: the documents are read with `readConcern: {level: "snapshot", atClusterTime}`
//! through the router's own `find` and `getMore`, with the caller's rights; a batch is read
//! only once the client has taken the one before; a failure after the first line is a last
//! line `{"error": <MongoError document>}` with no `next` (a copy without its cursor is not
//! to be followed), and the cursor is killed when the client goes.

use bson::{Bson, RawDocument, RawDocumentBuf, doc};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::Response;
use hyper::body::Frame;
use hyper::header::{self, HeaderValue};
use serde_json::json;
use wire::{MongoError, Result};

use super::extjson::{self, Form};
use super::query::{self, Scope, cursor_of};
use super::{Body, Caller, failure};

/// Documents asked for per batch.
const BATCH: i64 = 1000;

struct Copy {
    /// Taken by the drop that kills an unfinished cursor.
    caller: Option<Caller>,
    db: String,
    coll: String,
    /// The find's cursor (0: read through).
    id: i64,
    at: Bson,
    next: String,
    count: u64,
    canonical: bool,
    done: bool,
}

pub async fn snapshot(caller: Caller, query: &str) -> Response<Body> {
    match open(caller, query).await {
        Ok((copy, first)) => body(copy, first),
        Err(e) => failure(&e),
    }
}

async fn open(caller: Caller, query: &str) -> Result<(Copy, Vec<RawDocumentBuf>)> {
    let params = query::params(query)?;
    let mut canonical = false;
    let mut ns = None;
    for (k, v) in &params {
        match (k.as_str(), v.as_str()) {
            ("ns", v) => ns = Some(v.to_string()),
            ("json", "canonical") => canonical = true,
            ("json", "relaxed") | ("authSource", _) => {}
            (k, _) => {
                return Err(MongoError::bad_value(format!(
                    "unknown or bad query parameter '{k}'"
                )));
            }
        }
    }
    let Scope::Collection(db, coll) = Scope::parse(ns.as_deref())? else {
        return Err(MongoError::bad_value(
            "a snapshot is of one collection: ns=<db>.<coll>",
        ));
    };
    let point = caller
        .run(&db, doc! {"snapshotCursor": coll.as_str()})
        .await?;
    let at = point
        .get("atClusterTime")
        .cloned()
        .ok_or_else(|| MongoError::internal("snapshotCursor gave no atClusterTime"))?;
    let next = point
        .get_document("cursor")
        .ok()
        .and_then(cursor_of)
        .ok_or_else(|| MongoError::internal("snapshotCursor gave no cursor"))?;
    let find = doc! {
        "find": coll.as_str(),
        "filter": {},
        "batchSize": BATCH,
        "readConcern": {"level": "snapshot", "atClusterTime": at.clone()},
    };
    let reply = caller.run_raw(&db, find).await?;
    let mut copy = Copy {
        caller: Some(caller),
        db,
        coll,
        id: 0,
        at,
        next,
        count: 0,
        canonical,
        done: false,
    };
    let first = copy.take(&reply, "firstBatch")?;
    Ok((copy, first))
}

impl Copy {
    fn take(&mut self, reply: &RawDocument, batch: &str) -> Result<Vec<RawDocumentBuf>> {
        let malformed = || MongoError::internal("a find reply without its cursor");
        let cursor = reply.get_document("cursor").map_err(|_| malformed())?;
        self.id = cursor.get_i64("id").unwrap_or(0);
        Ok(cursor
            .get_array(batch)
            .map_err(|_| malformed())?
            .into_iter()
            .filter_map(|d| Some(d.ok()?.as_document()?.to_owned()))
            .collect())
    }

    async fn more(&mut self) -> Result<Vec<RawDocumentBuf>> {
        let Some(caller) = &self.caller else {
            return Ok(Vec::new());
        };
        let cmd = doc! {"getMore": self.id, "collection": self.coll.as_str(), "batchSize": BATCH};
        let reply = caller.run_raw(&self.db, cmd).await;
        match reply {
            Ok(reply) => self.take(&reply, "nextBatch"),
            Err(e) => {
                self.id = 0;
                Err(e)
            }
        }
    }

    fn render(&mut self, docs: Vec<RawDocumentBuf>, out: &mut String) -> Result<()> {
        let form = if self.canonical {
            Form::Canonical
        } else {
            Form::Relaxed
        };
        for d in docs {
            extjson::write_document(out, &d, form)?;
            out.push('\n');
            self.count += 1;
        }
        Ok(())
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        if self.id != 0
            && let Some(caller) = self.caller.take()
        {
            caller.kill_cursor_later(&self.db, &self.coll, self.id);
        }
    }
}

fn body(copy: Copy, first: Vec<RawDocumentBuf>) -> Response<Body> {
    let state = (copy, Some(first));
    let lines = futures::stream::unfold(state, |(mut copy, first)| async move {
        if copy.done {
            return None;
        }
        let mut out = String::new();
        let batch = match first {
            Some(first) => Ok(first),
            None if copy.id == 0 => Ok(Vec::new()),
            None => copy.more().await,
        };
        match batch.and_then(|docs| copy.render(docs, &mut out)) {
            Ok(()) => {
                if copy.id == 0 {
                    let end = json!({
                        "next": copy.next,
                        "atClusterTime": copy.at.clone().into_relaxed_extjson(),
                        "count": copy.count,
                    });
                    out.push_str(&end.to_string());
                    out.push('\n');
                    copy.done = true;
                }
            }
            Err(e) => {
                let error = Bson::Document(e.to_document()).into_relaxed_extjson();
                out.push_str(&json!({ "error": error }).to_string());
                out.push('\n');
                copy.done = true;
            }
        }
        Some((
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(out))),
            (copy, None),
        ))
    });
    let body = http_body_util::StreamBody::new(StreamExt::boxed(lines));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
