//! A BSON writer for replies assembled from bytes that are already encoded: a change-stream
//! batch splices each event into its reply as the shared bytes it was encoded into once, instead
//! of decoding it into a `Document` and encoding it again, or copying it.
//!
//! Invariants: elements are written in call order; every `begin_*` is closed by one `end`, which
//! writes the terminator and patches the length prefix (counting spliced bytes); the parts of a
//! [`Spliced`] document, read in order, are the bytes of encoding the same fields as a
//! `Document` (tested below). Keys must not contain NUL (callers pass literals and array
//! indexes).

use bson::raw::BindRawBsonRef;
use bson::spec::ElementType;
use bson::{Document, RawDocumentBuf, Timestamp};
use bytes::Bytes;

use crate::error::MongoError;

/// A command reply's body: a document, one already encoded, or a cursor reply whose batch is
/// shared bytes spliced in (change-stream batches).
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Document(Document),
    Raw(RawDocumentBuf),
    Cursor(CursorBody),
}

/// An `ok` cursor reply held as parts ([`CursorReply::splice`]), with what the server reads of
/// it without reassembling it.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorBody {
    pub doc: Spliced,
    /// The cursor's id (0: closed).
    pub id: i64,
    /// How many documents the batch holds.
    pub batch_len: usize,
}

impl Body {
    /// The body as a document (an encoded one is decoded).
    pub fn into_document(self) -> Result<Document, MongoError> {
        match self {
            Body::Document(d) => Ok(d),
            Body::Raw(raw) => Document::try_from(raw.as_ref())
                .map_err(|e| MongoError::internal(format!("an encoded reply: {e}"))),
            Body::Cursor(c) => Body::Raw(c.doc.to_raw()?).into_document(),
        }
    }

    /// The body encoded (a document is encoded here).
    pub fn into_raw(self) -> Result<RawDocumentBuf, MongoError> {
        match self {
            Body::Raw(raw) => Ok(raw),
            Body::Cursor(c) => c.doc.to_raw(),
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

impl CursorReply<'_, Bytes> {
    /// The reply with each document of the batch spliced in as the bytes it shares, not copied.
    pub fn splice(&self) -> CursorBody {
        let mut w = Writer::with_capacity(256 + 8 * self.batch.len());
        self.write_to(&mut w, |w, key, doc| w.splice_document(key, doc.clone()));
        CursorBody {
            doc: w.finish_spliced(),
            id: self.id,
            batch_len: self.batch.len(),
        }
    }
}

impl<B: AsRef<[u8]>> CursorReply<'_, B> {
    /// The reply with each document of the batch copied in.
    pub fn write(&self) -> RawDocumentBuf {
        let size: usize = self.batch.iter().map(|d| d.as_ref().len() + 8).sum();
        let mut w = Writer::with_capacity(size + 256);
        self.write_to(&mut w, |w, key, doc| w.document_bytes(key, doc.as_ref()));
        w.finish()
    }

    fn write_to(&self, w: &mut Writer, mut document: impl FnMut(&mut Writer, &str, &B)) {
        w.begin_document(None);
        w.begin_document(Some("cursor"));
        w.begin_array(if self.first {
            "firstBatch"
        } else {
            "nextBatch"
        });
        for (i, doc) in self.batch.iter().enumerate() {
            document(w, &i.to_string(), doc);
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
    }
}

/// An encoded document held as parts: the bytes a [`Writer`] wrote, with shared byte strings
/// spliced in between them. Its bytes are its [`parts`](Spliced::parts) in order; it is sent
/// with a vectored write, so a batch of shared events reaches the socket without a copy.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spliced {
    /// What the writer wrote, the splices left out; it ends with the document's terminator.
    written: Vec<u8>,
    /// Each spliced byte string, after the offset in `written` where it goes (ascending).
    splices: Vec<(usize, Bytes)>,
    /// The document's length: `written` and the splices.
    len: usize,
}

impl Spliced {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The document's bytes, in order, as slices of what was written and of the splices.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let mut from = 0;
        let spliced = self.splices.iter().flat_map(move |(at, bytes)| {
            let written = &self.written[from..*at];
            from = *at;
            [written, &bytes[..]]
        });
        let last = self.splices.last().map_or(0, |(at, _)| *at);
        spliced
            .chain(std::iter::once(&self.written[last..]))
            .filter(|part| !part.is_empty())
    }

    /// The document in one buffer (a copy: for the paths that need it whole, such as a
    /// compressed or checksummed reply).
    pub fn to_raw(&self) -> Result<RawDocumentBuf, MongoError> {
        let mut bytes = Vec::with_capacity(self.len);
        for part in self.parts() {
            bytes.extend_from_slice(part);
        }
        RawDocumentBuf::from_bytes(bytes)
            .map_err(|e| MongoError::internal(format!("a spliced reply: {e}")))
    }

    /// Appends a field to the top-level document (`$clusterTime`, `operationTime`, …).
    pub fn append(&mut self, key: &bson::raw::CStr, value: impl BindRawBsonRef) {
        let mut field = RawDocumentBuf::new();
        field.append(key, value);
        // The field's element: the one-field document without its length and terminator.
        let element = &field.as_bytes()[4..field.as_bytes().len() - 1];
        let Some(terminator) = self.written.len().checked_sub(1) else {
            return;
        };
        self.written
            .splice(terminator..terminator, element.iter().copied());
        self.len += element.len();
        let len = self.len as i32;
        self.written[..4].copy_from_slice(&len.to_le_bytes());
    }
}

/// Writes one BSON document front to back.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    /// Shared byte strings spliced in, after the offset in `buf` where each goes.
    splices: Vec<(usize, Bytes)>,
    /// Their total length.
    spliced: usize,
    /// Each open document's length prefix: where it is in `buf`, and its offset in the document.
    open: Vec<(usize, usize)>,
}

impl Writer {
    /// A writer whose buffer starts with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(capacity),
            ..Writer::default()
        }
    }

    /// Where the next byte goes in the document.
    fn offset(&self) -> usize {
        self.buf.len() + self.spliced
    }

    fn key(&mut self, kind: ElementType, key: &str) {
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(0);
    }

    fn begin(&mut self) {
        self.open.push((self.buf.len(), self.offset()));
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
        if let Some((at, start)) = self.open.pop() {
            let len = (self.offset() - start) as i32;
            self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }

    /// A sub-document given as its encoded bytes, shared rather than copied: it goes out as
    /// its own part of the [`Spliced`] document.
    pub fn splice_document(&mut self, key: &str, bytes: Bytes) {
        self.key(ElementType::EmbeddedDocument, key);
        self.spliced += bytes.len();
        self.splices.push((self.buf.len(), bytes));
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
        self.string_of(key, &[s]);
    }

    /// A string given as the parts it is the concatenation of.
    pub fn string_of(&mut self, key: &str, parts: &[&str]) {
        self.key(ElementType::String, key);
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.buf.extend_from_slice(&(len as i32 + 1).to_le_bytes());
        for part in parts {
            self.buf.extend_from_slice(part.as_bytes());
        }
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

    /// The document written, its open documents ended, as parts.
    pub fn finish_spliced(mut self) -> Spliced {
        while !self.open.is_empty() {
            self.end();
        }
        Spliced {
            len: self.offset(),
            written: self.buf,
            splices: self.splices,
        }
    }

    /// The document written, its open documents ended, in one buffer.
    pub fn finish(self) -> RawDocumentBuf {
        let spliced = self.finish_spliced();
        if spliced.splices.is_empty() {
            return RawDocumentBuf::from_bytes(spliced.written).unwrap_or_default();
        }
        spliced.to_raw().unwrap_or_default()
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

    fn cursor_reply(batch: &[Bytes]) -> CursorReply<'_, Bytes> {
        CursorReply {
            ns: "db.c",
            id: 7,
            first: false,
            batch,
            post_batch_resume_token: None,
            invalidated: false,
        }
    }

    #[test]
    fn a_spliced_reply_is_the_copied_one_without_the_copy() {
        let events: Vec<Bytes> = (0..3)
            .map(|i| {
                Bytes::from(
                    doc! {"_id": {"_data": "82AB"}, "i": i}
                        .to_vec()
                        .expect("encodes"),
                )
            })
            .collect();
        let reply = cursor_reply(&events);
        let spliced = reply.splice();
        assert_eq!(spliced.id, 7);
        assert_eq!(spliced.batch_len, 3);
        let copied = reply.write();
        assert_eq!(spliced.doc.len(), copied.as_bytes().len());
        assert_eq!(
            spliced.doc.to_raw().expect("whole").as_bytes(),
            copied.as_bytes()
        );
        // Each event is a part of its own, pointing at the shared bytes.
        let parts: Vec<&[u8]> = spliced.doc.parts().collect();
        for event in &events {
            assert!(
                parts
                    .iter()
                    .any(|p| p.as_ptr() == event.as_ptr() && p.len() == event.len()),
                "an event was copied"
            );
        }
    }

    #[test]
    fn fields_appended_to_a_spliced_reply_are_where_a_document_puts_them() {
        let events = vec![Bytes::from(doc! {"n": 1}.to_vec().expect("encodes"))];
        let mut spliced = cursor_reply(&events).splice().doc;
        spliced.append(
            bson::cstr!("operationTime"),
            Timestamp {
                time: 9,
                increment: 2,
            },
        );
        let mut copied = cursor_reply(&events).write();
        copied.append(
            bson::cstr!("operationTime"),
            Timestamp {
                time: 9,
                increment: 2,
            },
        );
        assert_eq!(
            spliced.to_raw().expect("whole").as_bytes(),
            copied.as_bytes()
        );
        assert_eq!(spliced.len(), copied.as_bytes().len());
    }

    #[test]
    fn an_empty_spliced_batch_has_one_part() {
        let spliced = cursor_reply(&[]).splice().doc;
        assert_eq!(spliced.parts().count(), 1);
        assert_eq!(
            Document::try_from(spliced.to_raw().expect("whole").as_ref()).expect("decodes"),
            doc! {"cursor": {"nextBatch": [], "id": 7_i64, "ns": "db.c"}, "ok": 1.0}
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
