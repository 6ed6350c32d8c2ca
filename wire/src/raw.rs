//! A BSON writer for replies assembled from bytes that are already encoded: a change-stream
//! batch copies each event into its reply as it was encoded once, instead of decoding it into a
//! `Document` and encoding it again.
//!
//! Invariants: elements are written in call order; every `begin_*` is closed by one `end`, which
//! writes the terminator and patches the length prefix; [`Writer::finish`] returns a document
//! whose bytes equal encoding the same fields as a `Document` (tested below). Keys must not
//! contain NUL (callers pass literals and array indexes).

use bson::spec::ElementType;
use bson::{Document, RawDocumentBuf, Timestamp};

use crate::error::MongoError;

/// A command reply's body: a document, or one already encoded (change-stream batches, whose
/// events are written into it as bytes).
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Document(Document),
    Raw(RawDocumentBuf),
}

impl Body {
    /// The body as a document (an encoded one is decoded).
    pub fn into_document(self) -> Result<Document, MongoError> {
        match self {
            Body::Document(d) => Ok(d),
            Body::Raw(raw) => Document::try_from(raw.as_ref())
                .map_err(|e| MongoError::internal(format!("an encoded reply: {e}"))),
        }
    }

    /// The body encoded (a document is encoded here).
    pub fn into_raw(self) -> Result<RawDocumentBuf, MongoError> {
        match self {
            Body::Raw(raw) => Ok(raw),
            Body::Document(d) => RawDocumentBuf::try_from(&d)
                .map_err(|e| MongoError::internal(format!("encoding a reply: {e}"))),
        }
    }
}

impl From<Document> for Body {
    fn from(d: Document) -> Body {
        Body::Document(d)
    }
}

impl From<RawDocumentBuf> for Body {
    fn from(raw: RawDocumentBuf) -> Body {
        Body::Raw(raw)
    }
}

/// A cursor's batch reply, `{cursor: {firstBatch | nextBatch, postBatchResumeToken?, id, ns},
/// invalidated?, ok: 1}`, with each document of the batch given as its encoded bytes.
pub struct CursorReply<'a, B> {
    pub ns: &'a str,
    /// 0 when the cursor is closed.
    pub id: i64,
    /// `firstBatch` (the reply that opens the cursor) rather than `nextBatch`.
    pub first: bool,
    pub batch: &'a [B],
    pub post_batch_resume_token: Option<&'a Document>,
    /// A change stream that ended with an invalidate (`invalidated: true`).
    pub invalidated: bool,
}

impl<B: AsRef<[u8]>> CursorReply<'_, B> {
    pub fn write(&self) -> RawDocumentBuf {
        let size: usize = self.batch.iter().map(|d| d.as_ref().len() + 8).sum();
        let mut w = Writer::with_capacity(size + 256);
        w.begin_document(None);
        w.begin_document(Some("cursor"));
        w.begin_array(if self.first {
            "firstBatch"
        } else {
            "nextBatch"
        });
        for (i, doc) in self.batch.iter().enumerate() {
            w.document_bytes(&i.to_string(), doc.as_ref());
        }
        w.end();
        if let Some(t) = self.post_batch_resume_token {
            w.document("postBatchResumeToken", t);
        }
        w.int64("id", self.id);
        w.string("ns", self.ns);
        w.end();
        if self.invalidated {
            w.boolean("invalidated", true);
        }
        w.double("ok", 1.0);
        w.finish()
    }
}

/// Writes one BSON document front to back.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    /// Where each open document's length prefix is.
    open: Vec<usize>,
}

impl Writer {
    /// A writer whose buffer starts with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(capacity),
            open: Vec::new(),
        }
    }

    fn key(&mut self, kind: ElementType, key: &str) {
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(0);
    }

    fn begin(&mut self) {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&[0; 4]);
    }

    /// Opens the top-level document (`None`) or a sub-document under `key`.
    pub fn begin_document(&mut self, key: Option<&str>) {
        if let Some(key) = key {
            self.key(ElementType::EmbeddedDocument, key);
        }
        self.begin();
    }

    /// Opens an array under `key`; its elements are keyed "0", "1", ….
    pub fn begin_array(&mut self, key: &str) {
        self.key(ElementType::Array, key);
        self.begin();
    }

    /// Closes the innermost open document or array.
    pub fn end(&mut self) {
        self.buf.push(0);
        if let Some(at) = self.open.pop() {
            let len = (self.buf.len() - at) as i32;
            self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }

    /// A sub-document given as its encoded bytes, copied as they are.
    pub fn document_bytes(&mut self, key: &str, bytes: &[u8]) {
        self.key(ElementType::EmbeddedDocument, key);
        self.buf.extend_from_slice(bytes);
    }

    /// A sub-document, encoded here.
    pub fn document(&mut self, key: &str, doc: &Document) {
        self.key(ElementType::EmbeddedDocument, key);
        if doc.to_writer(&mut self.buf).is_err() {
            // Only a document with an invalid key fails to encode; write it empty instead.
            self.buf.extend_from_slice(&[5, 0, 0, 0, 0]);
        }
    }

    pub fn string(&mut self, key: &str, s: &str) {
        self.key(ElementType::String, key);
        self.buf
            .extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    pub fn int64(&mut self, key: &str, v: i64) {
        self.key(ElementType::Int64, key);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn double(&mut self, key: &str, v: f64) {
        self.key(ElementType::Double, key);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn boolean(&mut self, key: &str, v: bool) {
        self.key(ElementType::Boolean, key);
        self.buf.push(u8::from(v));
    }

    pub fn timestamp(&mut self, key: &str, t: Timestamp) {
        self.key(ElementType::Timestamp, key);
        self.buf.extend_from_slice(&t.increment.to_le_bytes());
        self.buf.extend_from_slice(&t.time.to_le_bytes());
    }

    /// The document written, once every `begin_*` has been ended.
    pub fn finish(mut self) -> RawDocumentBuf {
        while !self.open.is_empty() {
            self.end();
        }
        RawDocumentBuf::from_bytes(self.buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use bson::{Bson, doc};

    use super::*;

    #[test]
    fn writes_the_bytes_a_document_encodes_to() {
        let event = doc! {"_id": {"_data": "82AB"}, "operationType": "insert", "n": 1};
        let token = doc! {"_data": "82CD"};
        let mut w = Writer::default();
        w.begin_document(None);
        w.begin_document(Some("cursor"));
        w.begin_array("nextBatch");
        for i in 0..2 {
            w.document_bytes(&i.to_string(), &event.to_vec().expect("encodes"));
        }
        w.end();
        w.document("postBatchResumeToken", &token);
        w.int64("id", 42);
        w.string("ns", "db.c");
        w.end();
        w.boolean("invalidated", false);
        w.timestamp(
            "operationTime",
            Timestamp {
                time: 7,
                increment: 3,
            },
        );
        w.double("ok", 1.0);
        let raw = w.finish();
        let expected = doc! {
            "cursor": {
                "nextBatch": [Bson::Document(event.clone()), Bson::Document(event)],
                "postBatchResumeToken": token,
                "id": 42_i64,
                "ns": "db.c",
            },
            "invalidated": false,
            "operationTime": Timestamp { time: 7, increment: 3 },
            "ok": 1.0,
        };
        assert_eq!(
            raw.as_bytes(),
            expected.to_vec().expect("encodes").as_slice()
        );
    }

    #[test]
    fn a_cursor_reply_is_the_document_a_driver_expects() {
        let event = doc! {"_id": {"_data": "82AB"}, "n": 1};
        let bytes = vec![event.to_vec().expect("encodes")];
        let token = doc! {"_data": "82CD"};
        let reply = CursorReply {
            ns: "db.c",
            id: 0,
            first: false,
            batch: &bytes,
            post_batch_resume_token: Some(&token),
            invalidated: true,
        }
        .write();
        let expected = doc! {
            "cursor": {"nextBatch": [event], "postBatchResumeToken": token, "id": 0_i64, "ns": "db.c"},
            "invalidated": true,
            "ok": 1.0,
        };
        assert_eq!(
            Document::try_from(reply.as_ref()).expect("decodes"),
            expected
        );
    }

    #[test]
    fn an_empty_array_and_document_are_well_formed() {
        let mut w = Writer::with_capacity(64);
        w.begin_document(None);
        w.begin_array("a");
        w.end();
        let raw = w.finish();
        let expected = doc! {"a": []};
        assert_eq!(
            raw.as_bytes(),
            expected.to_vec().expect("encodes").as_slice()
        );
    }
}
