//! The wire messages as plain values: OP_MSG, OP_QUERY, OP_REPLY, and the compressor a message
//! travelled with.
//!
//! Invariants:
//! * A [`Message`] is what the peer meant, independent of how it was framed: a message that
//!   arrived inside OP_COMPRESSED is the inner message with [`Message::compressor`] set, carrying
//!   the outer header's `requestID`/`responseTo`. Encoding it again with the same compressor gives
//!   back an equal message (`decode(encode(m)) == m`).
//! * Documents are kept as [`RawDocumentBuf`]: the framing checks only their length prefixes and
//!   terminators; the full BSON check happens once, in [`to_document`], where a command is parsed.
//! * [`MsgFlags`] keeps every bit it was given; `CHECKSUM_PRESENT` on an outgoing message asks the
//!   encoder to append a CRC-32C, and on an incoming one says the checksum was present and matched.

use bson::raw::RawIter;
use bson::{Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::error::{ErrorCode, MongoError};

/// Opcodes this crate frames.
pub mod opcode {
    pub const OP_REPLY: i32 = 1;
    pub const OP_QUERY: i32 = 2004;
    pub const OP_COMPRESSED: i32 = 2012;
    pub const OP_MSG: i32 = 2013;
}

/// Size of the standard message header (`messageLength`, `requestID`, `responseTo`, `opCode`).
pub const HEADER_LEN: usize = 16;

/// MongoDB's default `maxBSONDepth`: documents nested deeper are rejected before they are
/// converted (the conversion is recursive, so this also bounds stack use).
pub const MAX_BSON_DEPTH: usize = 200;

/// OP_MSG flag bits. Bits 0–15 are "required": a receiver must reject unknown ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    pub const CHECKSUM_PRESENT: u32 = 1 << 0;
    pub const MORE_TO_COME: u32 = 1 << 1;
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    /// Required bits this implementation understands.
    const KNOWN_REQUIRED: u32 = Self::CHECKSUM_PRESENT | Self::MORE_TO_COME;
    const REQUIRED_MASK: u32 = 0xFFFF;

    pub fn contains(self, bit: u32) -> bool {
        self.0 & bit == bit
    }
    pub fn checksum_present(self) -> bool {
        self.contains(Self::CHECKSUM_PRESENT)
    }
    pub fn more_to_come(self) -> bool {
        self.contains(Self::MORE_TO_COME)
    }
    pub fn exhaust_allowed(self) -> bool {
        self.contains(Self::EXHAUST_ALLOWED)
    }
    /// Whether a required bit this implementation does not know is set.
    pub fn has_unknown_required(self) -> bool {
        self.0 & Self::REQUIRED_MASK & !Self::KNOWN_REQUIRED != 0
    }
}

/// A kind-1 section: documents sent beside the body under an identifier (`documents`, `updates`…).
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentSequence {
    pub identifier: String,
    pub documents: Vec<RawDocumentBuf>,
}

/// OP_MSG (2013): one kind-0 body and any number of kind-1 document sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct OpMsg {
    pub flags: MsgFlags,
    pub body: RawDocumentBuf,
    pub sequences: Vec<DocumentSequence>,
}

impl OpMsg {
    /// A message with just a body and no flags.
    pub fn new(body: RawDocumentBuf) -> OpMsg {
        OpMsg {
            flags: MsgFlags::default(),
            body,
            sequences: Vec::new(),
        }
    }
}

/// Legacy OP_QUERY (2004), accepted only for the first handshake on `<db>.$cmd`.
#[derive(Debug, Clone, PartialEq)]
pub struct OpQuery {
    pub flags: u32,
    pub full_collection_name: String,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: RawDocumentBuf,
    pub return_fields_selector: Option<RawDocumentBuf>,
}

impl OpQuery {
    /// The database of a `<db>.$cmd` namespace (`None` for anything that is not a command).
    pub fn command_db(&self) -> Option<&str> {
        self.full_collection_name.strip_suffix(".$cmd")
    }
}

/// Legacy OP_REPLY (1), the answer to an OP_QUERY.
#[derive(Debug, Clone, PartialEq)]
pub struct OpReply {
    pub response_flags: u32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub documents: Vec<RawDocumentBuf>,
}

impl OpReply {
    /// `AwaitCapable`, the flag servers set on every OP_REPLY.
    pub const AWAIT_CAPABLE: u32 = 8;

    /// The one-document reply servers send to a command over OP_QUERY.
    pub fn command_reply(doc: RawDocumentBuf) -> OpReply {
        OpReply {
            response_flags: Self::AWAIT_CAPABLE,
            cursor_id: 0,
            starting_from: 0,
            documents: vec![doc],
        }
    }
}

/// The operation a message carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Msg(OpMsg),
    Query(OpQuery),
    Reply(OpReply),
}

impl Op {
    /// The bytes of the documents it carries.
    pub fn bytes(&self) -> usize {
        let docs = |d: &[RawDocumentBuf]| d.iter().map(|d| d.as_bytes().len()).sum::<usize>();
        match self {
            Op::Msg(m) => {
                m.body.as_bytes().len()
                    + m.sequences
                        .iter()
                        .map(|s| docs(&s.documents))
                        .sum::<usize>()
            }
            Op::Query(q) => {
                q.query.as_bytes().len()
                    + q.return_fields_selector
                        .as_ref()
                        .map_or(0, |d| d.as_bytes().len())
            }
            Op::Reply(r) => docs(&r.documents),
        }
    }

    pub fn op_code(&self) -> i32 {
        match self {
            Op::Msg(_) => opcode::OP_MSG,
            Op::Query(_) => opcode::OP_QUERY,
            Op::Reply(_) => opcode::OP_REPLY,
        }
    }
}

/// OP_COMPRESSED compressor ids and their handshake names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compressor {
    Noop,
    Snappy,
    Zlib,
    Zstd,
}

impl Compressor {
    /// The compressors offered in the handshake, in our order of preference (noop is never
    /// negotiated; it is accepted when a peer uses it).
    pub const NEGOTIABLE: [Compressor; 3] =
        [Compressor::Snappy, Compressor::Zlib, Compressor::Zstd];

    pub fn id(self) -> u8 {
        match self {
            Compressor::Noop => 0,
            Compressor::Snappy => 1,
            Compressor::Zlib => 2,
            Compressor::Zstd => 3,
        }
    }

    pub fn from_id(id: u8) -> Option<Compressor> {
        match id {
            0 => Some(Compressor::Noop),
            1 => Some(Compressor::Snappy),
            2 => Some(Compressor::Zlib),
            3 => Some(Compressor::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    /// A negotiable compressor by its handshake name.
    pub fn from_name(name: &str) -> Option<Compressor> {
        Compressor::NEGOTIABLE
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// One framed message: header ids, the operation, and the compressor it travelled with.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub request_id: i32,
    pub response_to: i32,
    /// `Some` when the message is (to be) wrapped in OP_COMPRESSED with this compressor.
    pub compressor: Option<Compressor>,
    pub op: Op,
}

impl Message {
    /// An uncompressed OP_MSG request with a body.
    pub fn msg(request_id: i32, body: RawDocumentBuf) -> Message {
        Message {
            request_id,
            response_to: 0,
            compressor: None,
            op: Op::Msg(OpMsg::new(body)),
        }
    }
}

/// Fully checks a raw document (every element, nesting at most [`MAX_BSON_DEPTH`]) and converts
/// it. Walks with an explicit stack, so hostile nesting cannot overflow ours; the conversion that
/// follows recurses at most `MAX_BSON_DEPTH` deep.
pub fn to_document(raw: &RawDocument) -> Result<Document, MongoError> {
    check_document(raw)?;
    convert_document(raw).map_err(|e| invalid_bson(&e.to_string()))
}

/// The conversion of [`to_document`], with each array allocated at its exact length: the bson
/// crate's own collects arrays by doubling, which holds up to twice their 112-byte values (a
/// 16 MB array of small elements: ~180 MB instead of ~300 MB).
fn convert_document(raw: &RawDocument) -> bson::error::Result<Document> {
    let mut doc = Document::new();
    for element in raw {
        let (key, value) = element?;
        doc.insert(key.as_str(), convert(value)?);
    }
    Ok(doc)
}

fn convert(value: RawBsonRef<'_>) -> bson::error::Result<Bson> {
    Ok(match value {
        RawBsonRef::Document(d) => Bson::Document(convert_document(d)?),
        RawBsonRef::Array(a) => {
            let mut items = Vec::with_capacity(a.into_iter().count());
            for item in a {
                items.push(convert(item?)?);
            }
            Bson::Array(items)
        }
        other => Bson::try_from(other)?,
    })
}

/// The check half of [`to_document`]: `InvalidBSON` for malformed contents, `Overflow` when nested
/// too deep.
pub fn check_document(raw: &RawDocument) -> Result<(), MongoError> {
    let mut stack: Vec<RawIter<'_>> = vec![raw.iter_elements()];
    while let Some(top) = stack.last_mut() {
        let Some(element) = top.next() else {
            stack.pop();
            continue;
        };
        let value = element
            .and_then(|e| e.value())
            .map_err(|e| invalid_bson(&e.to_string()))?;
        let child = match value {
            RawBsonRef::Document(d) => Some(d.iter_elements()),
            RawBsonRef::Array(a) => Some(a.iter_elements()),
            RawBsonRef::JavaScriptCodeWithScope(c) => Some(c.scope.iter_elements()),
            _ => None,
        };
        if let Some(child) = child {
            if stack.len() >= MAX_BSON_DEPTH {
                return Err(MongoError::new(
                    ErrorCode::OVERFLOW,
                    format!("BSONObj exceeded maximum nested object depth: {MAX_BSON_DEPTH}"),
                ));
            }
            stack.push(child);
        }
    }
    Ok(())
}

fn invalid_bson(detail: &str) -> MongoError {
    MongoError::new(ErrorCode::INVALID_BSON, format!("invalid BSON: {detail}"))
}
