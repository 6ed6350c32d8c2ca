//! Pure framing: bytes ⇄ [`Message`]. No I/O, no tokio.
//!
//! Invariants:
//! * [`decode`] returns `Ok(None)` while the buffer holds less than one whole frame, and never
//!   panics on any input. It reads `messageLength` first and rejects values below 16 or above
//!   [`MAX_MESSAGE_SIZE`] before anything is allocated; a compressed frame's `uncompressedSize` is
//!   checked the same way before it is inflated.
//! * Every length inside a frame (BSON documents, document sequences, C strings) is checked
//!   against the bytes that remain in the frame before it is used; nothing reads past the frame.
//! * `decode(encode(m)) == m` for every message [`encode`] accepts, and a frame decodes the same
//!   however it was split across reads (the decoder only ever looks at complete frames).
//! * An error's [`FrameError::skip`] is `Some(len)` only when the frame boundary is trustworthy and
//!   the connection may continue after discarding `len` bytes (an unknown opcode). Every other
//!   error means the byte stream can no longer be trusted: reply if possible, then close.
//!
//! Error codes follow mongod: bad lengths and corrupt compression are `ProtocolError` (17, what
//! mongod's transport layer reports before closing); OP_MSG parse failures use the codes of
//! mongod's `OpMsg::parse` (`IllegalOpMsgFlag` 223, `ChecksumMismatch` 288, 40430–40433, 40587);
//! an oversize reply we would send is `BSONObjectTooLarge` (10334).

use bson::RawDocumentBuf;
use bytes::{BufMut, BytesMut};

use crate::MAX_MESSAGE_SIZE;
use crate::compression;
use crate::error::{ErrorCode, MongoError};
use crate::message::{
    Compressor, DocumentSequence, HEADER_LEN, Message, MsgFlags, Op, OpMsg, OpQuery, OpReply,
    opcode,
};

/// A frame that could not be decoded, with what is known about the request it came from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct FrameError {
    /// The client-visible error to reply with.
    pub error: MongoError,
    /// The frame's `requestID`, when the header was readable (needed to address a reply).
    pub request_id: Option<i32>,
    /// The opcode the peer used (the inner one for OP_COMPRESSED), when known: an OP_QUERY is
    /// answered with OP_REPLY.
    pub op_code: Option<i32>,
    /// `Some(n)`: discard `n` bytes and carry on with the next frame. `None`: close.
    pub skip: Option<usize>,
}

impl FrameError {
    fn fatal(error: MongoError, header: Option<&Header>) -> FrameError {
        FrameError {
            error,
            request_id: header.map(|h| h.request_id),
            op_code: header.map(|h| h.op_code),
            skip: None,
        }
    }
}

/// The 16-byte standard header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    length: usize,
    request_id: i32,
    response_to: i32,
    op_code: i32,
}

fn protocol_error(msg: impl Into<String>) -> MongoError {
    MongoError::new(ErrorCode::PROTOCOL_ERROR, msg)
}

/// Checks a declared message length (`messageLength`) against the limits.
fn check_length(len: i32) -> Result<usize, MongoError> {
    match usize::try_from(len) {
        Ok(n) if (HEADER_LEN..=MAX_MESSAGE_SIZE).contains(&n) => Ok(n),
        _ => Err(protocol_error(format!(
            "recv(): message msgLen {len} is invalid. Min {HEADER_LEN} Max: {MAX_MESSAGE_SIZE}"
        ))),
    }
}

/// Decodes one frame from the front of `src`.
///
/// `Ok(None)`: more bytes are needed. `Ok(Some((message, n)))`: the first `n` bytes were one frame.
pub fn decode(src: &[u8]) -> Result<Option<(Message, usize)>, FrameError> {
    let mut r = Reader::new(src);
    let Some(len) = r.i32() else {
        return Ok(None);
    };
    let request_id = r.i32();
    let length = check_length(len).map_err(|error| FrameError {
        error,
        request_id,
        op_code: None,
        skip: None,
    })?;
    if src.len() < length {
        return Ok(None);
    }
    let frame = &src[..length];
    let mut r = Reader::new(frame);
    let header = match (r.i32(), r.i32(), r.i32(), r.i32()) {
        (Some(_), Some(request_id), Some(response_to), Some(op_code)) => Header {
            length,
            request_id,
            response_to,
            op_code,
        },
        // Unreachable: `length >= HEADER_LEN` and the frame holds `length` bytes.
        _ => return Err(FrameError::fatal(protocol_error("short header"), None)),
    };
    let message = match header.op_code {
        opcode::OP_COMPRESSED => decode_compressed(&header, r.rest())?,
        op => Message {
            request_id: header.request_id,
            response_to: header.response_to,
            compressor: None,
            op: decode_op(op, frame, &header)?,
        },
    };
    Ok(Some((message, length)))
}

/// Decodes the operation of a frame whose header says `op`; `frame` includes the header (the
/// OP_MSG checksum covers it).
fn decode_op(op: i32, frame: &[u8], header: &Header) -> Result<Op, FrameError> {
    let body = frame.get(HEADER_LEN..).unwrap_or_default();
    let fatal = |e: MongoError| FrameError::fatal(e, Some(header));
    match op {
        opcode::OP_MSG => decode_msg(frame, body).map(Op::Msg).map_err(fatal),
        opcode::OP_QUERY => decode_query(body).map(Op::Query).map_err(fatal),
        opcode::OP_REPLY => decode_reply(body).map(Op::Reply).map_err(fatal),
        other => Err(FrameError {
            error: protocol_error(format!("Unsupported opcode {other}")),
            request_id: Some(header.request_id),
            op_code: Some(other),
            skip: Some(header.length),
        }),
    }
}

fn decode_compressed(header: &Header, payload: &[u8]) -> Result<Message, FrameError> {
    let mut r = Reader::new(payload);
    let fatal = |e: MongoError, op: Option<i32>| FrameError {
        error: e,
        request_id: Some(header.request_id),
        op_code: op,
        skip: None,
    };
    let (Some(original), Some(size), Some(id)) = (r.i32(), r.i32(), r.u8()) else {
        return Err(fatal(
            protocol_error("OP_COMPRESSED header truncated"),
            None,
        ));
    };
    // The inner message (with a rebuilt 16-byte header) must itself fit the limit.
    let inner_len = usize::try_from(size)
        .ok()
        .and_then(|s| s.checked_add(HEADER_LEN))
        .filter(|n| *n <= MAX_MESSAGE_SIZE)
        .ok_or_else(|| {
            fatal(
                protocol_error(format!(
                    "OP_COMPRESSED uncompressedSize {size} is invalid. Max: {}",
                    MAX_MESSAGE_SIZE - HEADER_LEN
                )),
                Some(original),
            )
        })?;
    if original == opcode::OP_COMPRESSED {
        return Err(fatal(
            protocol_error("OP_COMPRESSED cannot contain OP_COMPRESSED"),
            Some(original),
        ));
    }
    let compressor = Compressor::from_id(id).ok_or_else(|| {
        fatal(
            protocol_error(format!(
                "Cannot decompress message: unknown compressor id {id}"
            )),
            Some(original),
        )
    })?;
    let inflated = compression::decompress(compressor, r.rest(), inner_len - HEADER_LEN)
        .map_err(|e| fatal(e, Some(original)))?;
    // Rebuild the uncompressed message as mongod does, so an inner checksum covers the same bytes.
    let mut inner = Vec::with_capacity(inner_len);
    put_header(
        &mut inner,
        inner_len,
        header.request_id,
        header.response_to,
        original,
    );
    inner.extend_from_slice(&inflated);
    let inner_header = Header {
        length: header.length, // the bytes to skip on the wire are the outer frame's
        op_code: original,
        ..*header
    };
    let op = decode_op(original, &inner, &inner_header)?;
    Ok(Message {
        request_id: header.request_id,
        response_to: header.response_to,
        compressor: Some(compressor),
        op,
    })
}

fn decode_msg(frame: &[u8], body: &[u8]) -> Result<OpMsg, MongoError> {
    let mut r = Reader::new(body);
    let flags = MsgFlags(
        r.u32()
            .ok_or_else(|| protocol_error("OP_MSG without flags"))?,
    );
    if flags.has_unknown_required() {
        return Err(MongoError::new(
            ErrorCode::ILLEGAL_OP_MSG_FLAG,
            format!("Message contains illegal flags value: 0b{:032b}", flags.0),
        ));
    }
    let mut sections = r.rest();
    if flags.checksum_present() {
        let Some(split) = sections.len().checked_sub(4).filter(|n| *n > 0) else {
            return Err(MongoError::with_code(
                51251,
                "Invalid message size for an OpMsg containing a checksum",
            ));
        };
        let (rest, sum) = sections.split_at(split);
        let expected = Reader::new(sum).u32().unwrap_or_default();
        let covered = frame
            .get(..frame.len().saturating_sub(4))
            .unwrap_or_default();
        if crc32c::crc32c(covered) != expected {
            return Err(MongoError::new(
                ErrorCode::CHECKSUM_MISMATCH,
                "OP_MSG checksum does not match contents",
            ));
        }
        sections = rest;
    }
    let mut r = Reader::new(sections);
    let mut body = None;
    let mut sequences: Vec<DocumentSequence> = Vec::new();
    while let Some(kind) = r.u8() {
        match kind {
            0 => {
                if body.is_some() {
                    return Err(MongoError::with_code(
                        40430,
                        "Multiple body sections in message",
                    ));
                }
                body = Some(r.document()?);
            }
            1 => {
                let size = r
                    .i32()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n >= 4)
                    .ok_or_else(|| protocol_error("invalid document sequence size"))?;
                let section = r
                    .take(size - 4)
                    .ok_or_else(|| protocol_error("document sequence runs past the message"))?;
                let mut s = Reader::new(section);
                let identifier = s.cstring()?;
                if sequences.iter().any(|q| q.identifier == identifier) {
                    return Err(MongoError::with_code(
                        40431,
                        format!("Duplicate document sequence: {identifier}"),
                    ));
                }
                let mut documents = Vec::new();
                while !s.is_empty() {
                    documents.push(s.document()?);
                }
                sequences.push(DocumentSequence {
                    identifier,
                    documents,
                });
            }
            other => {
                return Err(MongoError::with_code(
                    40432,
                    format!("Unknown section kind {other}"),
                ));
            }
        }
    }
    let body =
        body.ok_or_else(|| MongoError::with_code(40587, "OP_MSG messages must have a body"))?;
    Ok(OpMsg {
        flags,
        body,
        sequences,
    })
}

fn decode_query(body: &[u8]) -> Result<OpQuery, MongoError> {
    let mut r = Reader::new(body);
    let truncated = || protocol_error("OP_QUERY truncated");
    let flags = r.u32().ok_or_else(truncated)?;
    let full_collection_name = r.cstring()?;
    let number_to_skip = r.i32().ok_or_else(truncated)?;
    let number_to_return = r.i32().ok_or_else(truncated)?;
    let query = r.document()?;
    let return_fields_selector = if r.is_empty() {
        None
    } else {
        Some(r.document()?)
    };
    if !r.is_empty() {
        return Err(protocol_error("OP_QUERY has trailing bytes"));
    }
    Ok(OpQuery {
        flags,
        full_collection_name,
        number_to_skip,
        number_to_return,
        query,
        return_fields_selector,
    })
}

fn decode_reply(body: &[u8]) -> Result<OpReply, MongoError> {
    let mut r = Reader::new(body);
    let truncated = || protocol_error("OP_REPLY truncated");
    let response_flags = r.u32().ok_or_else(truncated)?;
    let cursor_id = r.i64().ok_or_else(truncated)?;
    let starting_from = r.i32().ok_or_else(truncated)?;
    let number_returned = r
        .i32()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| protocol_error("OP_REPLY numberReturned is negative"))?;
    // Each document takes at least 5 bytes: bound the allocation by what the frame can hold.
    let mut documents = Vec::with_capacity(number_returned.min(r.remaining() / 5));
    while !r.is_empty() {
        documents.push(r.document()?);
    }
    if documents.len() != number_returned {
        return Err(protocol_error(format!(
            "OP_REPLY numberReturned {number_returned} but {} documents",
            documents.len()
        )));
    }
    Ok(OpReply {
        response_flags,
        cursor_id,
        starting_from,
        documents,
    })
}

/// Appends the frame for `msg` to `dst` (OP_COMPRESSED-wrapped when `msg.compressor` is set).
///
/// Fails with `BSONObjectTooLarge` when the frame would exceed [`MAX_MESSAGE_SIZE`], leaving
/// `dst` as it was.
pub fn encode(msg: &Message, dst: &mut BytesMut) -> Result<(), MongoError> {
    let start = dst.len();
    let result = match msg.compressor {
        None => encode_plain(msg, dst),
        Some(compressor) => {
            let mut inner = BytesMut::new();
            encode_plain(msg, &mut inner).and_then(|()| {
                let payload = inner.get(HEADER_LEN..).unwrap_or_default();
                let packed = compression::compress(compressor, payload)?;
                let len = HEADER_LEN + 4 + 4 + 1 + packed.len();
                check_out_len(len)?;
                dst.reserve(len);
                put_header(
                    dst,
                    len,
                    msg.request_id,
                    msg.response_to,
                    opcode::OP_COMPRESSED,
                );
                dst.put_i32_le(msg.op.op_code());
                dst.put_i32_le(i32_len(payload.len()));
                dst.put_u8(compressor.id());
                dst.put_slice(&packed);
                Ok(())
            })
        }
    };
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

/// An OP_MSG frame's bytes before its body: header, flags and the body section's kind.
pub type MsgPrefix = [u8; HEADER_LEN + 5];

/// The frame of a plain OP_MSG (one body: no document sequences, checksum or compression) as
/// its prefix (header, flags, section kind) and the body, which a writer sends as it is
/// rather than copying it into a frame buffer: a large reply then costs its body once.
/// `None` for any other message; `Err` when the frame would be too large.
pub fn plain_msg_parts(msg: &Message) -> Result<Option<(MsgPrefix, &[u8])>, MongoError> {
    let Op::Msg(m) = &msg.op else {
        return Ok(None);
    };
    if msg.compressor.is_some() || !m.sequences.is_empty() || m.flags.checksum_present() {
        return Ok(None);
    }
    let body = m.body.as_bytes();
    let prefix = msg_prefix(body.len(), msg.request_id, msg.response_to, m.flags)?;
    Ok(Some((prefix, body)))
}

/// The prefix of a plain OP_MSG whose body is `body_len` bytes; `Err` when the frame would be
/// too large.
pub fn msg_prefix(
    body_len: usize,
    request_id: i32,
    response_to: i32,
    flags: MsgFlags,
) -> Result<MsgPrefix, MongoError> {
    let total = HEADER_LEN + 5 + body_len;
    check_out_len(total)?;
    let mut prefix: MsgPrefix = [0; HEADER_LEN + 5];
    let mut at = &mut prefix[..];
    put_header(&mut at, total, request_id, response_to, opcode::OP_MSG);
    at.put_u32_le(flags.0);
    at.put_u8(0);
    Ok(prefix)
}

/// Encodes `msg` into a fresh buffer.
pub fn encode_to_vec(msg: &Message) -> Result<Vec<u8>, MongoError> {
    let mut buf = BytesMut::new();
    encode(msg, &mut buf)?;
    Ok(buf.to_vec())
}

fn encode_plain(msg: &Message, dst: &mut BytesMut) -> Result<(), MongoError> {
    let start = dst.len();
    put_header(dst, 0, msg.request_id, msg.response_to, msg.op.op_code());
    match &msg.op {
        Op::Msg(m) => {
            dst.put_u32_le(m.flags.0);
            dst.put_u8(0);
            dst.put_slice(m.body.as_bytes());
            for seq in &m.sequences {
                dst.put_u8(1);
                let size_at = dst.len();
                dst.put_i32_le(0);
                put_cstring(dst, &seq.identifier)?;
                for d in &seq.documents {
                    dst.put_slice(d.as_bytes());
                }
                let size = dst.len() - size_at;
                check_out_len(size)?;
                patch_i32(dst, size_at, size);
            }
            if m.flags.checksum_present() {
                let total = dst.len() - start + 4;
                check_out_len(total)?;
                patch_i32(dst, start, total);
                let sum = crc32c::crc32c(dst.get(start..).unwrap_or_default());
                dst.put_u32_le(sum);
            }
        }
        Op::Query(q) => {
            dst.put_u32_le(q.flags);
            put_cstring(dst, &q.full_collection_name)?;
            dst.put_i32_le(q.number_to_skip);
            dst.put_i32_le(q.number_to_return);
            dst.put_slice(q.query.as_bytes());
            if let Some(sel) = &q.return_fields_selector {
                dst.put_slice(sel.as_bytes());
            }
        }
        Op::Reply(r) => {
            dst.put_u32_le(r.response_flags);
            dst.put_i64_le(r.cursor_id);
            dst.put_i32_le(r.starting_from);
            check_out_len(r.documents.len())?;
            dst.put_i32_le(i32_len(r.documents.len()));
            for d in &r.documents {
                dst.put_slice(d.as_bytes());
            }
        }
    }
    let total = dst.len() - start;
    check_out_len(total)?;
    patch_i32(dst, start, total);
    Ok(())
}

fn check_out_len(len: usize) -> Result<(), MongoError> {
    if len > MAX_MESSAGE_SIZE {
        return Err(MongoError::new(
            ErrorCode::BSON_OBJECT_TOO_LARGE,
            format!(
                "BSON size limit hit while building Message. Size: {len}; maxSize: {MAX_MESSAGE_SIZE}"
            ),
        ));
    }
    Ok(())
}

/// `len` as an i32; callers have checked it against `MAX_MESSAGE_SIZE`, which fits.
fn i32_len(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn put_header(dst: &mut impl BufMut, len: usize, request_id: i32, response_to: i32, op: i32) {
    dst.put_i32_le(i32_len(len));
    dst.put_i32_le(request_id);
    dst.put_i32_le(response_to);
    dst.put_i32_le(op);
}

fn patch_i32(dst: &mut BytesMut, at: usize, value: usize) {
    if let Some(slot) = dst.get_mut(at..at + 4) {
        slot.copy_from_slice(&i32_len(value).to_le_bytes());
    }
}

fn put_cstring(dst: &mut BytesMut, s: &str) -> Result<(), MongoError> {
    if s.as_bytes().contains(&0) {
        return Err(MongoError::bad_value(format!(
            "string {s:?} contains a NUL byte and cannot be a C string"
        )));
    }
    dst.put_slice(s.as_bytes());
    dst.put_u8(0);
    Ok(())
}

/// A bounds-checked little-endian cursor over one frame.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    fn remaining(&self) -> usize {
        self.buf.len()
    }
    fn rest(&self) -> &'a [u8] {
        self.buf
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|b| b.try_into().ok())
    }
    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }
    fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }
    fn cstring(&mut self) -> Result<String, MongoError> {
        let nul = self
            .buf
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| protocol_error("unterminated C string"))?;
        let bytes = self.take(nul + 1).unwrap_or_default();
        let s = bytes.get(..nul).unwrap_or_default();
        String::from_utf8(s.to_vec())
            .map_err(|_| MongoError::new(ErrorCode::INVALID_BSON, "C string is not valid UTF-8"))
    }
    /// One BSON document: its length prefix is checked against the bytes left before copying.
    fn document(&mut self) -> Result<RawDocumentBuf, MongoError> {
        let len = Reader::new(self.buf)
            .i32()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n >= 5)
            .ok_or_else(|| {
                MongoError::new(ErrorCode::INVALID_BSON, "invalid BSON document length")
            })?;
        let bytes = self.take(len).ok_or_else(|| {
            MongoError::new(
                ErrorCode::INVALID_BSON,
                "BSON document length runs past the end of the message",
            )
        })?;
        RawDocumentBuf::from_bytes(bytes.to_vec())
            .map_err(|e| MongoError::new(ErrorCode::INVALID_BSON, format!("invalid BSON: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use super::*;

    fn hello_msg() -> Message {
        Message::msg(7, rawdoc! { "hello": 1, "$db": "admin" })
    }

    fn frame_bytes(m: &Message) -> Vec<u8> {
        encode_to_vec(m).unwrap()
    }

    /// Builds a frame by hand: header + payload.
    fn raw_frame(request_id: i32, op: i32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_header(&mut v, HEADER_LEN + payload.len(), request_id, 0, op);
        v.extend_from_slice(payload);
        v
    }

    fn doc_bytes(d: RawDocumentBuf) -> Vec<u8> {
        d.as_bytes().to_vec()
    }

    #[test]
    fn hand_built_op_msg_decodes_to_its_fields() {
        let body = doc_bytes(rawdoc! { "insert": "c", "$db": "test" });
        let d1 = doc_bytes(rawdoc! { "_id": 1 });
        let mut payload = Vec::new();
        payload.extend_from_slice(&MsgFlags::EXHAUST_ALLOWED.to_le_bytes());
        payload.push(1);
        let seq_len = 4 + "documents".len() + 1 + d1.len();
        payload.extend_from_slice(&(seq_len as i32).to_le_bytes());
        payload.extend_from_slice(b"documents\0");
        payload.extend_from_slice(&d1);
        payload.push(0);
        payload.extend_from_slice(&body);
        let bytes = raw_frame(42, opcode::OP_MSG, &payload);
        let (m, n) = decode(&bytes).unwrap().unwrap();
        assert_eq!(n, bytes.len());
        assert_eq!(m.request_id, 42);
        let Op::Msg(msg) = m.op else {
            panic!("not OP_MSG")
        };
        assert!(msg.flags.exhaust_allowed() && !msg.flags.more_to_come());
        assert_eq!(msg.body.as_bytes(), body.as_slice());
        assert_eq!(msg.sequences.len(), 1);
        assert_eq!(msg.sequences[0].identifier, "documents");
        assert_eq!(msg.sequences[0].documents[0].as_bytes(), d1.as_slice());
    }

    #[test]
    fn hand_built_op_query_decodes_to_its_fields() {
        let q = doc_bytes(rawdoc! { "$query": { "ismaster": 1 } });
        let mut payload = Vec::new();
        payload.extend_from_slice(&4u32.to_le_bytes());
        payload.extend_from_slice(b"admin.$cmd\0");
        payload.extend_from_slice(&0i32.to_le_bytes());
        payload.extend_from_slice(&(-1i32).to_le_bytes());
        payload.extend_from_slice(&q);
        let bytes = raw_frame(3, opcode::OP_QUERY, &payload);
        let (m, _) = decode(&bytes).unwrap().unwrap();
        let Op::Query(query) = m.op else {
            panic!("not OP_QUERY")
        };
        assert_eq!(query.flags, 4);
        assert_eq!(query.command_db(), Some("admin"));
        assert_eq!(query.number_to_return, -1);
        assert_eq!(query.query.as_bytes(), q.as_slice());
        assert!(query.return_fields_selector.is_none());
    }

    #[test]
    fn every_proper_prefix_is_incomplete() {
        let bytes = frame_bytes(&hello_msg());
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "prefix of {cut} bytes");
        }
    }

    #[test]
    fn length_below_header_size_is_rejected_at_once() {
        let err = decode(&10i32.to_le_bytes()).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::PROTOCOL_ERROR.code);
        assert_eq!(err.request_id, None);
        assert_eq!(err.skip, None);
    }

    #[test]
    fn oversize_length_is_rejected_before_the_body_arrives() {
        let mut bytes = ((MAX_MESSAGE_SIZE + 1) as i32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&99i32.to_le_bytes());
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::PROTOCOL_ERROR.code);
        assert_eq!(err.request_id, Some(99));
        assert_eq!(err.skip, None, "an untrusted length closes the connection");
        assert!(decode(&(-1i32).to_le_bytes()).is_err());
    }

    #[test]
    fn a_plain_msg_in_parts_is_the_frame_and_others_are_encoded_whole() {
        let mut m = hello_msg();
        m.response_to = 3;
        if let Op::Msg(msg) = &mut m.op {
            msg.flags = MsgFlags(MsgFlags::MORE_TO_COME);
        }
        let (prefix, body) = plain_msg_parts(&m).unwrap().expect("plain");
        assert_eq!([&prefix[..], body].concat(), frame_bytes(&m));
        let mut checksummed = hello_msg();
        if let Op::Msg(msg) = &mut checksummed.op {
            msg.flags = MsgFlags(MsgFlags::CHECKSUM_PRESENT);
        }
        let compressed = Message {
            compressor: Some(crate::message::Compressor::Zlib),
            ..hello_msg()
        };
        let mut sequenced = hello_msg();
        if let Op::Msg(msg) = &mut sequenced.op {
            msg.sequences.push(DocumentSequence {
                identifier: "documents".into(),
                documents: vec![rawdoc! {"_id": 1}],
            });
        }
        for other in [checksummed, compressed, sequenced] {
            assert!(plain_msg_parts(&other).unwrap().is_none(), "{other:?}");
        }
    }

    #[test]
    fn checksum_is_produced_and_verified() {
        let mut m = hello_msg();
        if let Op::Msg(msg) = &mut m.op {
            msg.flags = MsgFlags(MsgFlags::CHECKSUM_PRESENT);
        }
        let bytes = frame_bytes(&m);
        let (covered, sum) = bytes.split_at(bytes.len() - 4);
        assert_eq!(crc32c::crc32c(covered).to_le_bytes(), sum);
        assert_eq!(decode(&bytes).unwrap().unwrap().0, m);

        let mut corrupt = bytes.clone();
        let at = corrupt.len() - 8; // inside the body's last value
        corrupt[at] ^= 0x01;
        let err = decode(&corrupt).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::CHECKSUM_MISMATCH.code);
        assert_eq!(err.error.code_name, "ChecksumMismatch");
        assert_eq!(err.request_id, Some(7));
        assert_eq!(err.skip, None);
    }

    #[test]
    fn unknown_required_flag_is_illegal_but_unknown_optional_flag_is_kept() {
        let mut m = hello_msg();
        if let Op::Msg(msg) = &mut m.op {
            msg.flags = MsgFlags(1 << 5);
        }
        let err = decode(&frame_bytes(&m)).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::ILLEGAL_OP_MSG_FLAG.code);

        if let Op::Msg(msg) = &mut m.op {
            msg.flags = MsgFlags(1 << 20 | MsgFlags::MORE_TO_COME);
        }
        assert_eq!(decode(&frame_bytes(&m)).unwrap().unwrap().0, m);
    }

    #[test]
    fn op_msg_section_errors_use_mongod_codes() {
        let body = doc_bytes(rawdoc! { "ping": 1, "$db": "a" });
        let flags = 0u32.to_le_bytes();
        let cases: Vec<(Vec<u8>, i32)> = vec![
            ([&flags[..]].concat(), 40587),
            ([&flags[..], &[0], &body, &[0], &body].concat(), 40430),
            ([&flags[..], &[0], &body, &[7]].concat(), 40432),
            (
                [
                    &flags[..],
                    &[1],
                    &6i32.to_le_bytes(),
                    b"a\0",
                    &[1],
                    &6i32.to_le_bytes(),
                    b"a\0",
                    &[0],
                    &body,
                ]
                .concat(),
                40431,
            ),
            // A document sequence claiming more bytes than the message has.
            (
                [&flags[..], &[1], &1000i32.to_le_bytes(), b"a\0"].concat(),
                17,
            ),
            // A body whose length runs past the end.
            ([&flags[..], &[0], &body[..body.len() - 1]].concat(), 22),
        ];
        for (payload, code) in cases {
            let err = decode(&raw_frame(1, opcode::OP_MSG, &payload)).unwrap_err();
            assert_eq!(err.error.code, code, "{payload:?}");
            assert_eq!(err.skip, None);
        }
    }

    #[test]
    fn unknown_opcode_is_skippable() {
        let bytes = raw_frame(5, 2010, b"whatever");
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err.skip, Some(bytes.len()));
        assert_eq!(err.request_id, Some(5));
        assert_eq!(err.op_code, Some(2010));
    }

    #[test]
    fn compressed_frames_round_trip_with_each_compressor() {
        for c in [
            Compressor::Noop,
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
        ] {
            let mut m = hello_msg();
            m.compressor = Some(c);
            let bytes = frame_bytes(&m);
            assert_eq!(
                i32::from_le_bytes(bytes[12..16].try_into().unwrap()),
                opcode::OP_COMPRESSED
            );
            assert_eq!(bytes[24], c.id());
            assert_eq!(decode(&bytes).unwrap(), Some((m, bytes.len())));
        }
    }

    #[test]
    fn compressed_size_over_the_limit_is_rejected_before_inflating() {
        let mut payload = Vec::new();
        payload.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
        payload.extend_from_slice(&(MAX_MESSAGE_SIZE as i32).to_le_bytes());
        payload.push(Compressor::Zlib.id());
        payload.extend_from_slice(b"not even zlib");
        let err = decode(&raw_frame(8, opcode::OP_COMPRESSED, &payload)).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::PROTOCOL_ERROR.code);
        assert!(
            err.error.errmsg.contains("uncompressedSize"),
            "{}",
            err.error.errmsg
        );
        assert_eq!(err.request_id, Some(8));
    }

    #[test]
    fn compressed_payload_larger_than_declared_is_rejected() {
        // A small zlib stream that inflates to 1 MiB, declared as 100 bytes.
        let big = vec![0u8; 1 << 20];
        let packed = compression::compress(Compressor::Zlib, &big).unwrap();
        let mut payload = Vec::new();
        payload.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
        payload.extend_from_slice(&100i32.to_le_bytes());
        payload.push(Compressor::Zlib.id());
        payload.extend_from_slice(&packed);
        let err = decode(&raw_frame(8, opcode::OP_COMPRESSED, &payload)).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::PROTOCOL_ERROR.code);
        assert_eq!(err.skip, None);
    }

    #[test]
    fn unknown_compressor_is_a_protocol_error() {
        let mut payload = Vec::new();
        payload.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
        payload.extend_from_slice(&10i32.to_le_bytes());
        payload.push(9);
        let err = decode(&raw_frame(8, opcode::OP_COMPRESSED, &payload)).unwrap_err();
        assert_eq!(err.error.code, ErrorCode::PROTOCOL_ERROR.code);
        assert_eq!(err.op_code, Some(opcode::OP_MSG));
    }

    #[test]
    fn encoding_a_frame_over_the_limit_fails_and_leaves_the_buffer_alone() {
        let blob = bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![0u8; 13_000_000],
        };
        let big = rawdoc! { "b": blob };
        let mut m = hello_msg();
        if let Op::Msg(msg) = &mut m.op {
            // Four 13 MB documents: 52 MB of sequence.
            msg.sequences.push(DocumentSequence {
                identifier: "documents".into(),
                documents: vec![big; 4],
            });
        }
        let mut dst = BytesMut::from(&b"keep"[..]);
        let err = encode(&m, &mut dst).unwrap_err();
        assert_eq!(err.code, ErrorCode::BSON_OBJECT_TOO_LARGE.code);
        assert_eq!(&dst[..], b"keep");
    }
}
