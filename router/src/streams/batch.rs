//! A shard's change-stream reply as the router merges it: each event read from the reply's
//! bytes once, for its resume token (the merge's sort key) and time, and kept as a slice of
//! the reply's buffer (one allocation per reply, not one per event). An event is decoded into
//! a document only for a client whose post-merge stages change it (user stages); every other
//! client gets the bytes the shard encoded.
//!
//! Invariants: every event of a parsed batch has a valid resume token `_id`; a reply that is
//! an error (`ok: 0`) parses to that error, as the shard sent it; [`held_bytes`] counts every
//! reply buffer that an event (in a merge, a hub's log or a client's reply) still holds.

use std::sync::atomic::{AtomicUsize, Ordering};

use bson::{Document, RawBsonRef, RawDocument};
use bytes::Bytes;
use pipeline::changestream::ChangeEvent;
use pipeline::changestream::merge::Keyed;
use resume::ClusterTime;
use resume::token::ResumeToken;
use wire::raw::Body;
use wire::{MongoError, Result};

/// An event as the merge carries it.
#[derive(Debug, Clone)]
pub(crate) struct RawEvent {
    pub token: ResumeToken,
    pub time: ClusterTime,
    pub bytes: Bytes,
}

impl Keyed for RawEvent {
    fn token(&self) -> &ResumeToken {
        &self.token
    }
}

impl RawEvent {
    /// The event from its encoded form, copied.
    #[cfg(test)]
    pub fn parse(doc: &RawDocument) -> Result<RawEvent> {
        RawEvent::within(doc, Bytes::copy_from_slice(doc.as_bytes()))
    }

    /// The event `doc`, whose encoded form `bytes` holds (a slice of the reply it came in).
    fn within(doc: &RawDocument, bytes: Bytes) -> Result<RawEvent> {
        let id = doc
            .get_document("_id")
            .map_err(|_| MongoError::with_code(40647, "change event has no resume token _id"))?;
        let token = ResumeToken::from_raw_document(id).map_err(MongoError::from)?;
        let time = token.decode().map_err(MongoError::from)?.cluster_time();
        Ok(RawEvent { token, time, bytes })
    }

    /// The event decoded, for post-merge stages that change it.
    pub fn decode(&self) -> Result<ChangeEvent> {
        let doc = Document::from_reader(&mut &self.bytes[..])
            .map_err(|e| MongoError::internal(format!("a change event: {e}")))?;
        ChangeEvent::from_parts(self.token.clone(), doc)
    }
}

/// One shard reply to a change-stream `aggregate` or `getMore`.
#[derive(Debug)]
pub(crate) struct ShardBatch {
    pub events: Vec<RawEvent>,
    pub post_batch_resume_token: ResumeToken,
    /// 0 when the shard closed its cursor.
    pub cursor_id: i64,
    /// The cursor closed on an invalidate.
    pub invalidated: bool,
}

impl ShardBatch {
    /// Reads a reply; an `ok: 0` reply is its error.
    pub fn parse(body: Body) -> Result<ShardBatch> {
        let raw = match body {
            Body::Document(d) => {
                if let Some(e) = MongoError::from_reply(&d) {
                    return Err(e);
                }
                Body::Document(d).into_raw()?
            }
            Body::Raw(raw) => {
                if !ok(&raw) {
                    let doc = Document::try_from(raw.as_ref()).map_err(malformed)?;
                    return Err(MongoError::from_reply(&doc).unwrap_or_else(|| {
                        MongoError::internal("a shard reply that is neither ok nor an error")
                    }));
                }
                raw
            }
            Body::Cursor(c) => c.doc.to_raw()?,
        };
        // The events stay in the reply's buffer: each is a slice of it.
        let buffer = Bytes::from_owner(Held::new(raw.into_bytes()));
        let raw = RawDocument::from_bytes(&buffer).map_err(malformed)?;
        let cursor = raw.get_document("cursor").map_err(malformed)?;
        let batch = match cursor.get_array("nextBatch") {
            Ok(b) => b,
            Err(_) => cursor.get_array("firstBatch").map_err(malformed)?,
        };
        let mut events = Vec::new();
        for e in batch {
            let doc = e
                .map_err(malformed)?
                .as_document()
                .ok_or_else(|| MongoError::internal("a change event that is not a document"))?;
            events.push(RawEvent::within(doc, slice_of(&buffer, doc.as_bytes()))?);
        }
        let pbrt = cursor
            .get_document("postBatchResumeToken")
            .map_err(|_| MongoError::internal("shard reply without a postBatchResumeToken"))?;
        let cursor_id = match cursor.get("id").map_err(malformed)? {
            Some(RawBsonRef::Int64(id)) => id,
            Some(RawBsonRef::Int32(id)) => i64::from(id),
            _ => return Err(MongoError::internal("shard reply without a cursor id")),
        };
        Ok(ShardBatch {
            events,
            post_batch_resume_token: ResumeToken::from_raw_document(pbrt)
                .map_err(MongoError::from)?,
            cursor_id,
            invalidated: raw.get_bool("invalidated").unwrap_or(false),
        })
    }
}

/// Bytes of shard change-stream replies held now, by this process's merges, hubs' logs and
/// replies (`serverStatus` `metrics.changeStreams.heldReplyBytes`).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// The bytes of shard change-stream replies the router holds now.
pub(crate) fn held_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// A reply's buffer, counted in [`HELD`] while any of its events is held.
struct Held(Vec<u8>);

impl Held {
    fn new(bytes: Vec<u8>) -> Held {
        HELD.fetch_add(bytes.len(), Ordering::Relaxed);
        Held(bytes)
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0.len(), Ordering::Relaxed);
    }
}

/// `part`, which lies within `buffer`, as a slice of it.
fn slice_of(buffer: &Bytes, part: &[u8]) -> Bytes {
    let start = (part.as_ptr() as usize).saturating_sub(buffer.as_ptr() as usize);
    buffer.slice(start..start + part.len())
}

/// `ok` as MongoDB reads it: a non-zero number or `true`.
fn ok(reply: &RawDocument) -> bool {
    match reply.get("ok") {
        Ok(Some(RawBsonRef::Double(v))) => v != 0.0,
        Ok(Some(RawBsonRef::Int32(v))) => v != 0,
        Ok(Some(RawBsonRef::Int64(v))) => v != 0,
        Ok(Some(RawBsonRef::Boolean(v))) => v,
        _ => false,
    }
}

fn malformed(e: impl std::fmt::Display) -> MongoError {
    MongoError::internal(format!("a malformed change-stream reply from a shard: {e}"))
}

#[cfg(test)]
mod tests {
    use bson::{Bson, RawDocumentBuf, doc};
    use resume::token::{ResumeTokenData, TokenVersion};

    use super::*;

    fn token(secs: u32, n: i32) -> ResumeToken {
        let id = resume::token::event_identifier("insert", Some(("documentKey", doc! {"_id": n})));
        ResumeTokenData::event(
            ClusterTime::new(secs, 1),
            TokenVersion::default(),
            0,
            Some(bson::Uuid::from_bytes([7; 16])),
            Some(id),
        )
        .expect("a valid token")
        .encode()
    }

    fn reply(events: Vec<Document>, id: i64) -> Document {
        let pbrt = token(9, 0).to_document();
        let events: Vec<Bson> = events.into_iter().map(Bson::Document).collect();
        doc! {"cursor": {"nextBatch": events, "postBatchResumeToken": pbrt, "id": id, "ns": "db.c"}, "ok": 1.0}
    }

    #[test]
    fn events_keep_the_bytes_the_shard_sent() {
        let event = doc! {"_id": token(5, 1).to_document(), "operationType": "insert", "n": 1};
        let raw = RawDocumentBuf::try_from(&reply(vec![event.clone()], 42)).expect("encodes");
        let batch = ShardBatch::parse(Body::Raw(raw)).expect("parses");
        assert_eq!(batch.cursor_id, 42);
        assert!(!batch.invalidated);
        assert_eq!(batch.post_batch_resume_token, token(9, 0));
        let [e] = batch.events.as_slice() else {
            panic!("one event: {:?}", batch.events);
        };
        assert_eq!(e.token, token(5, 1));
        assert_eq!(e.time, ClusterTime::new(5, 1));
        assert_eq!(&e.bytes[..], event.to_vec().expect("encodes").as_slice());
        assert_eq!(e.decode().expect("decodes").doc, event);
    }

    #[test]
    fn a_reply_is_held_once_by_its_events_and_counted_while_held() {
        let events: Vec<Document> = (1..=3)
            .map(|n| doc! {"_id": token(5, n).to_document(), "operationType": "insert", "n": n})
            .collect();
        let raw = RawDocumentBuf::try_from(&reply(events, 42)).expect("encodes");
        let size = raw.as_bytes().len();
        let batch = ShardBatch::parse(Body::Raw(raw)).expect("parses");
        // Each event is a slice of the one reply buffer: the next one starts after this one's
        // end and the next array element's header (its type byte, one-digit key and NUL).
        for w in batch.events.windows(2) {
            let end = w[0].bytes.as_ptr() as usize + w[0].bytes.len();
            assert_eq!(w[1].bytes.as_ptr() as usize, end + 3);
        }
        // Counted while any event holds it (other tests of this process may hold more).
        let last = batch.events.last().cloned().expect("three events");
        drop(batch);
        assert!(held_bytes() >= size, "{} < {size}", held_bytes());
        assert_eq!(
            last.decode().expect("decodes").doc.get_i32("n").ok(),
            Some(3)
        );
    }

    #[test]
    fn a_document_reply_parses_the_same() {
        let event = doc! {"_id": token(5, 1).to_document(), "operationType": "insert"};
        let from_doc =
            ShardBatch::parse(Body::Document(reply(vec![event.clone()], 0))).expect("parses");
        assert_eq!(from_doc.cursor_id, 0);
        assert_eq!(from_doc.events.len(), 1);
    }

    #[test]
    fn an_error_reply_is_its_error() {
        let err =
            doc! {"ok": 0.0, "code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "gone"};
        let raw = RawDocumentBuf::try_from(&err).expect("encodes");
        let e = ShardBatch::parse(Body::Raw(raw)).expect_err("an error");
        assert_eq!(e.code, 286);
        assert_eq!(e.errmsg, "gone");
    }

    #[test]
    fn an_event_without_a_token_is_refused() {
        let raw = RawDocumentBuf::try_from(&reply(vec![doc! {"operationType": "insert"}], 1))
            .expect("encodes");
        let e = ShardBatch::parse(Body::Raw(raw)).expect_err("no token");
        assert_eq!(e.code, 40647);
    }
}
