//! Change-stream resume tokens: their logical content ([`ResumeTokenData`]), their wire form
//! ([`ResumeToken`], `{_data: <hex>, _typeBits?: BinData(0)}`) and the two comparisons a change
//! stream needs (by `_data` bytes, and `compareAgainstClientResumeToken`).
//!
//! Invariants:
//! * every [`ResumeTokenData`] obeys §5.2 of the reference: a high-water mark has
//!   `txnOpIndex = 0`, `fromInvalidate = false`, no uuid and no event identifier; before v2 an
//!   event identifier requires a uuid; from v2 an event token has an event identifier;
//!   `fragmentNum` exists only on v2 event tokens. Constructors and the decoder both enforce it.
//! * `decode(encode(x)) == x`, and `encode(x).data()` byte order equals
//!   [`ResumeTokenData::logical_cmp`] order.
//! * decoding never panics; every failure is a [`TokenError`] with MongoDB's code.
//! * decoding has one meaning: the common v2 layout takes a single-pass fast path (`fast`),
//!   which answers only where it yields exactly what the general decoder would, and defers
//!   to it for everything else, errors included.

use std::cmp::Ordering;
use std::fmt;
use std::sync::OnceLock;

use bson::raw::{RawBinaryRef, RawDocument, RawDocumentBuf, cstr};
use bson::{Binary, Bson, Document, Uuid, spec::BinarySubtype};
use wire::MongoError;

mod fast;

use crate::ClusterTime;
use crate::keystring::{
    self, Builder, Reader, Scalar, TypeBits, TypeBitsReader, ctype, decode_value, fast_scalar,
    skip_value,
};

/// Resume token format version. V2 is the default of current MongoDB releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TokenVersion {
    /// Legacy (4.0): no tokenType, no fromInvalidate. Decoded, never produced by default.
    V0 = 0,
    /// 4.2 – 6.x: tokenType and fromInvalidate; the event identifier is the document key.
    V1 = 1,
    /// Current: null uuid allowed, `{operationType, ...}` identifiers, `fragmentNum`.
    #[default]
    V2 = 2,
}

impl TokenVersion {
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    pub fn from_i32(v: i32) -> Option<TokenVersion> {
        match v {
            0 => Some(TokenVersion::V0),
            1 => Some(TokenVersion::V1),
            2 => Some(TokenVersion::V2),
            _ => None,
        }
    }
}

/// `kHighWaterMarkToken = 0` sorts before `kEventToken = 128` at the same cluster time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TokenType {
    HighWaterMark = 0,
    Event = 128,
}

impl TokenType {
    pub fn as_i32(self) -> i32 {
        self as i32
    }
}

/// Outcome of comparing an event in the resumed stream against the client's resume token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResumeStatus {
    /// The event precedes the resume point: keep scanning.
    CheckNextDoc,
    /// This event is the resume point.
    FoundToken,
    /// The client token names a fragment of this event, which has not been split yet.
    NeedsSplit,
    /// The scan has passed the resume point without seeing it.
    SurpassedToken,
}

/// A resume-token parse or validation failure; [`TokenError::code`] is MongoDB's error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("resume token _data field must be a string")]
    DataMissing,
    #[error("invalid resume token _typeBits: {0}")]
    BadTypeBits(String),
    #[error("resume token string was not a valid hex string")]
    NotHex,
    #[error("invalid empty resume token")]
    Empty,
    #[error("invalid resume token: {0}")]
    Malformed(String),
    #[error("Resume Token does not contain version")]
    VersionMissing,
    #[error("Invalid resume token: wrong type for version")]
    VersionNotInt,
    #[error("Invalid Resume Token: only supports version 0, 1 and 2, got {0}")]
    BadVersion(i32),
    #[error("Resume Token does not contain tokenType")]
    TokenTypeMissing,
    #[error("Resume Token tokenType is not an int.")]
    TokenTypeNotInt,
    #[error("Token type {0} not recognized")]
    BadTokenType(i32),
    #[error("Resume Token does not contain txnOpIndex")]
    TxnOpIndexMissing,
    #[error("Resume Token txnOpIndex is not an integer")]
    TxnOpIndexNotInt,
    #[error("Invalid Resume Token: txnOpIndex should be non-negative")]
    NegativeTxnOpIndex,
    #[error("Resume Token does not contain fromInvalidate")]
    FromInvalidateMissing,
    #[error("Resume Token fromInvalidate is not a boolean.")]
    FromInvalidateNotBool,
    #[error("Invalid resume token: expected a UUID or null")]
    BadUuid,
    #[error("Invalid resume token: a high water mark token cannot have an eventIdentifier")]
    HighWaterMarkWithEventIdentifier,
    #[error("Invalid resume token: an event token must have an eventIdentifier")]
    EventWithoutIdentifier,
    #[error("Invalid resume token: eventIdentifier must be an object")]
    EventIdentifierNotObject,
    #[error("Invalid resume token: fragmentNum must be a non-negative integer")]
    BadFragmentNum,
    #[error("invalid oversized resume token")]
    TrailingData,
}

impl TokenError {
    /// MongoDB's code for this failure (`resume_token.cpp` uasserts; 9 and 260 otherwise).
    pub fn code(&self) -> i32 {
        match self {
            TokenError::DataMissing => 40647,
            TokenError::BadTypeBits(_) => 40648,
            TokenError::NotHex => 9,
            TokenError::Empty => 40649,
            TokenError::Malformed(_) => 260,
            TokenError::VersionMissing => 50796,
            TokenError::VersionNotInt => 50854,
            TokenError::BadVersion(_) => 50795,
            TokenError::TokenTypeMissing => 51055,
            TokenError::TokenTypeNotInt => 51056,
            TokenError::BadTokenType(_) => 51057,
            TokenError::TxnOpIndexMissing => 50793,
            TokenError::TxnOpIndexNotInt => 50855,
            TokenError::NegativeTxnOpIndex => 50794,
            TokenError::FromInvalidateMissing => 50872,
            TokenError::FromInvalidateNotBool => 50870,
            TokenError::BadUuid => 6189500,
            TokenError::HighWaterMarkWithEventIdentifier => 6189504,
            TokenError::EventWithoutIdentifier => 6189501,
            TokenError::EventIdentifierNotObject => 6189503,
            TokenError::BadFragmentNum => 7182501,
            TokenError::TrailingData => 40646,
        }
    }
}

impl From<TokenError> for MongoError {
    fn from(e: TokenError) -> MongoError {
        MongoError::with_code(e.code(), e.to_string())
    }
}

/// txnOpIndex values at or above this are appended as int64 (as `BSONObjBuilder::appendNumber`
/// does), which MongoDB's decoder then rejects; constructors refuse them.
pub const MAX_TXN_OP_INDEX: u32 = (1 << 30) - 1;

/// The logical content of a resume token (§5.1).
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeTokenData {
    cluster_time: ClusterTime,
    version: TokenVersion,
    token_type: TokenType,
    txn_op_index: u32,
    from_invalidate: bool,
    uuid: Option<Uuid>,
    event_identifier: Option<Identifier>,
    fragment_num: Option<u32>,
}

impl ResumeTokenData {
    /// A high-water mark at `cluster_time`: `ts, version, 0, 0, false[, null]`. V0 has no
    /// token type and so no high-water marks; asking for one yields a V1 token.
    pub fn high_water_mark(cluster_time: ClusterTime, version: TokenVersion) -> Self {
        let version = if version == TokenVersion::V0 {
            TokenVersion::V1
        } else {
            version
        };
        ResumeTokenData {
            cluster_time,
            version,
            token_type: TokenType::HighWaterMark,
            txn_op_index: 0,
            from_invalidate: false,
            uuid: None,
            event_identifier: None,
            fragment_num: None,
        }
    }

    /// An event token. `event_identifier` is `{operationType, documentKey}` /
    /// `{operationType, operationDescription}` in v2 (see [`event_identifier`]) and the bare
    /// document key before. Fails when v2 has no identifier, when an identifier has no uuid
    /// before v2, or when `txn_op_index > MAX_TXN_OP_INDEX`.
    pub fn event(
        cluster_time: ClusterTime,
        version: TokenVersion,
        txn_op_index: u32,
        uuid: Option<Uuid>,
        event_identifier: Option<Document>,
    ) -> Result<Self, TokenError> {
        let data = ResumeTokenData {
            cluster_time,
            version,
            token_type: TokenType::Event,
            txn_op_index,
            from_invalidate: false,
            uuid,
            event_identifier: event_identifier.map(Identifier::from_document),
            fragment_num: None,
        };
        data.validate()?;
        Ok(data)
    }

    /// An event token whose identifier is built from its parts without an intermediate
    /// document (the per-event fast path): in v2 `{operationType, <name>: <document>}` (the
    /// second field omitted when absent or empty, as [`event_identifier`] does); before v2 the
    /// identifier is the document itself (the document key), or none. Same rules as
    /// [`ResumeTokenData::event`].
    pub fn event_from_parts(
        cluster_time: ClusterTime,
        version: TokenVersion,
        txn_op_index: u32,
        uuid: Option<Uuid>,
        operation_type: &str,
        second: Option<(&str, &Document)>,
    ) -> Result<Self, TokenError> {
        let identifier = identifier_from_parts(
            version,
            operation_type,
            second.map(|(name, d)| (name, d.is_empty())),
            |b, name| {
                match name {
                    Some(name) => b.field_document(name, second.map(|s| s.1)?),
                    None => b.append_document(second.map(|s| s.1)?),
                }
                Some(())
            },
        );
        Self::event_with(cluster_time, version, txn_op_index, uuid, identifier)
    }

    /// [`ResumeTokenData::event_from_parts`] with the document as BSON bytes, encoded without
    /// being decoded ([`Builder::append_raw_document`]): the same token as
    /// `event_from_parts` of the decoded document. `Ok(None)` where that encoder declines
    /// (malformed bytes among others): decode the document and call `event_from_parts`.
    pub fn event_from_raw_parts(
        cluster_time: ClusterTime,
        version: TokenVersion,
        txn_op_index: u32,
        uuid: Option<Uuid>,
        operation_type: &str,
        second: Option<(&str, &RawDocument)>,
    ) -> Result<Option<Self>, TokenError> {
        // A document's bytes hold no field exactly when they are the 5 bytes of `{}`.
        let empty = |d: &RawDocument| d.as_bytes().len() == 5;
        let mut declined = false;
        let identifier = identifier_from_parts(
            version,
            operation_type,
            second.map(|(name, d)| (name, empty(d))),
            |b, name| {
                let d = second.map(|s| s.1)?;
                let encoded = match name {
                    Some(name) => b.field_raw_document(name, d),
                    None => b.append_raw_document(d),
                };
                declined = !encoded;
                encoded.then_some(())
            },
        );
        if declined {
            return Ok(None);
        }
        Self::event_with(cluster_time, version, txn_op_index, uuid, identifier).map(Some)
    }

    fn event_with(
        cluster_time: ClusterTime,
        version: TokenVersion,
        txn_op_index: u32,
        uuid: Option<Uuid>,
        event_identifier: Option<Identifier>,
    ) -> Result<Self, TokenError> {
        let data = ResumeTokenData {
            cluster_time,
            version,
            token_type: TokenType::Event,
            txn_op_index,
            from_invalidate: false,
            uuid,
            event_identifier,
            fragment_num: None,
        };
        data.validate()?;
        Ok(data)
    }

    /// Marks the token as the invalidate that follows its triggering event. High-water marks
    /// cannot be invalidates; the call is ignored for them, and for v0 (no such field).
    pub fn with_from_invalidate(mut self, from_invalidate: bool) -> Self {
        if self.token_type == TokenType::Event && self.version >= TokenVersion::V1 {
            self.from_invalidate = from_invalidate;
        }
        self
    }

    /// Sets the fragment number of a split event (v2 event tokens only).
    pub fn with_fragment_num(mut self, fragment_num: Option<u32>) -> Result<Self, TokenError> {
        if fragment_num.is_some()
            && (self.version != TokenVersion::V2 || self.token_type != TokenType::Event)
        {
            return Err(TokenError::Malformed(
                "fragmentNum is only allowed on v2 event tokens".into(),
            ));
        }
        if fragment_num.is_some_and(|f| f > i32::MAX as u32) {
            return Err(TokenError::BadFragmentNum);
        }
        self.fragment_num = fragment_num;
        Ok(self)
    }

    fn validate(&self) -> Result<(), TokenError> {
        if self.txn_op_index > MAX_TXN_OP_INDEX {
            return Err(TokenError::Malformed("txnOpIndex too large".into()));
        }
        match self.token_type {
            TokenType::HighWaterMark => {
                if self.event_identifier.is_some() {
                    return Err(TokenError::HighWaterMarkWithEventIdentifier);
                }
                if self.uuid.is_some()
                    || self.txn_op_index != 0
                    || self.from_invalidate
                    || self.fragment_num.is_some()
                    || self.version == TokenVersion::V0
                {
                    return Err(TokenError::Malformed(
                        "a high water mark token has only clusterTime and version".into(),
                    ));
                }
            }
            TokenType::Event => {
                if self.version == TokenVersion::V2 && self.event_identifier.is_none() {
                    return Err(TokenError::EventWithoutIdentifier);
                }
                if self.version < TokenVersion::V2
                    && self.event_identifier.is_some()
                    && self.uuid.is_none()
                {
                    return Err(TokenError::Malformed(
                        "an eventIdentifier requires a uuid before version 2".into(),
                    ));
                }
                if self.version == TokenVersion::V0 && self.from_invalidate {
                    return Err(TokenError::Malformed(
                        "v0 tokens have no fromInvalidate".into(),
                    ));
                }
                if self.version != TokenVersion::V2 && self.fragment_num.is_some() {
                    return Err(TokenError::Malformed(
                        "fragmentNum is only allowed on v2 tokens".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn cluster_time(&self) -> ClusterTime {
        self.cluster_time
    }
    pub fn version(&self) -> TokenVersion {
        self.version
    }
    pub fn token_type(&self) -> TokenType {
        self.token_type
    }
    pub fn is_high_water_mark(&self) -> bool {
        self.token_type == TokenType::HighWaterMark
    }
    pub fn txn_op_index(&self) -> u32 {
        self.txn_op_index
    }
    pub fn from_invalidate(&self) -> bool {
        self.from_invalidate
    }
    pub fn uuid(&self) -> Option<Uuid> {
        self.uuid
    }
    pub fn event_identifier(&self) -> Option<&Document> {
        self.event_identifier.as_ref().map(Identifier::document)
    }

    /// The KeyString bytes of the event identifier (an object: `46 ... 00`), which order
    /// identifiers as BSON does.
    pub fn event_identifier_key(&self) -> Option<&[u8]> {
        self.event_identifier.as_ref().map(|i| i.key.as_slice())
    }
    pub fn fragment_num(&self) -> Option<u32> {
        self.fragment_num
    }

    /// The KeyString value sequence of §5.2, in encoding order.
    fn values(&self) -> Vec<Bson> {
        let mut v = Vec::with_capacity(8);
        v.push(Bson::Timestamp(self.cluster_time.timestamp()));
        v.push(Bson::Int32(self.version.as_i32()));
        if self.version >= TokenVersion::V1 {
            v.push(Bson::Int32(self.token_type.as_i32()));
        }
        v.push(Bson::Int32(self.txn_op_index as i32));
        if self.version >= TokenVersion::V1 {
            v.push(Bson::Boolean(self.from_invalidate));
        }
        match self.uuid {
            Some(u) => v.push(uuid_bson(u)),
            None if self.version >= TokenVersion::V2 => v.push(Bson::Null),
            None => {}
        }
        if let Some(id) = &self.event_identifier {
            v.push(Bson::Document(id.document().clone()));
        }
        if let Some(f) = self.fragment_num {
            v.push(Bson::Int32(f as i32));
        }
        v
    }

    /// The wire token: KeyString V1, ascending, end byte `0x04`, plus its type bits.
    pub fn encode(&self) -> ResumeToken {
        let mut b = Builder::new();
        b.append_timestamp(self.cluster_time.secs, self.cluster_time.inc);
        b.append_i32(self.version.as_i32());
        if self.version >= TokenVersion::V1 {
            b.append_i32(self.token_type.as_i32());
        }
        b.append_i32(self.txn_op_index as i32);
        if self.version >= TokenVersion::V1 {
            b.append_bool(self.from_invalidate);
        }
        match self.uuid {
            Some(u) => b.append_uuid(&u.bytes()),
            None if self.version >= TokenVersion::V2 => b.append_null(),
            None => {}
        }
        if let Some(id) = &self.event_identifier {
            b.append_raw(&id.key, &id.bits);
        }
        if let Some(f) = self.fragment_num {
            b.append_i32(f as i32);
        }
        b.append_end();
        let (data, bits) = b.finish();
        ResumeToken {
            data,
            type_bits: bits.to_bytes(),
        }
    }

    /// `{_data, _typeBits?}`.
    pub fn to_document(&self) -> Document {
        self.encode().to_document()
    }

    /// The wire token with Tributary's cluster stamp: a v2 high-water-mark token carries its
    /// cluster's id in the uuid slot, which MongoDB leaves null there, so a router can tell a
    /// token from another cluster. Every other token encodes as [`ResumeTokenData::encode`]
    /// (an event token's uuid is its collection's). The public decoder reads a stamped token
    /// as a high-water mark whose uuid is the cluster's; [`ResumeToken::unstamp`] takes the
    /// stamp off again.
    pub fn encode_stamped(&self, cluster: Uuid) -> ResumeToken {
        if !self.is_high_water_mark() || self.version < TokenVersion::V2 {
            return self.encode();
        }
        let mut stamped = self.clone();
        stamped.uuid = Some(cluster);
        stamped.encode()
    }

    /// Parses and decodes `{_data, _typeBits?}`.
    pub fn from_document(doc: &Document) -> Result<Self, TokenError> {
        ResumeToken::from_document(doc)?.decode()
    }

    /// Decodes the raw KeyString bytes and serialized type bits of a token.
    pub fn decode(data: &[u8], type_bits: &[u8]) -> Result<Self, TokenError> {
        // The common v2 layout is read in one pass; anything else (and every error) goes
        // through the general decoder, which the fast path agrees with where it answers.
        match fast::decode_common(data, type_bits) {
            Some(out) => Ok(out),
            None => Self::decode_general(data, type_bits),
        }
    }

    /// The general decoder: every version, type bits and value type, and all the errors.
    fn decode_general(data: &[u8], type_bits: &[u8]) -> Result<Self, TokenError> {
        if data.is_empty() {
            return Err(TokenError::Empty);
        }
        // Like MongoDB, check the whole KeyString first (so its errors take precedence), then
        // the fields in order. Pass 1 validates every value without building it and records
        // where each lies; pass 2 reads the scalars and keeps the identifier's raw bytes.
        let mut bits = TypeBitsReader::new(type_bits).map_err(|e| TokenError::BadTypeBits(e.0))?;
        let malformed = |e: keystring::KeyStringError| TokenError::Malformed(e.to_string());
        let mut slots = [Slot::default(); 9];
        let mut n = 0;
        let mut overflow = false;
        let mut r = Reader::new(data);
        loop {
            let ct = r
                .u8()
                .map_err(|_| TokenError::Malformed("key has no end byte".into()))?;
            if ct == ctype::END {
                if r.remaining() != 0 {
                    return Err(TokenError::Malformed(
                        "bytes after the end of the key".into(),
                    ));
                }
                break;
            }
            let (start, bit_start) = (r.position(), bits.position());
            let value = fast_scalar(ct, &mut r, &mut bits);
            if value == Scalar::Other {
                skip_value(ct, &mut r, &mut bits, 1).map_err(malformed)?;
            }
            let slot = Slot {
                ct,
                value,
                start,
                end: r.position(),
                bit_start,
                bit_end: bits.position(),
            };
            match slots.get_mut(n) {
                Some(s) => {
                    *s = slot;
                    n += 1;
                }
                None => overflow = true,
            }
        }
        // Every well-formed prefix field is a fast-path scalar; anything else (`Other`) is a
        // value of the wrong type.
        let mut it = slots.iter().take(n);
        let mut next =
            move || -> Result<Option<Scalar>, TokenError> { Ok(it.next().map(|s| s.value)) };
        let cluster_time = match next()? {
            None => return Err(TokenError::Empty),
            Some(Scalar::Timestamp(secs, inc)) => ClusterTime::new(secs, inc),
            Some(_) => {
                return Err(TokenError::Malformed(
                    "clusterTime must be a Timestamp".into(),
                ));
            }
        };
        let version = match next()? {
            None => return Err(TokenError::VersionMissing),
            Some(Scalar::Int32(v)) => TokenVersion::from_i32(v).ok_or(TokenError::BadVersion(v))?,
            Some(_) => return Err(TokenError::VersionNotInt),
        };
        let token_type = if version >= TokenVersion::V1 {
            match next()? {
                None => return Err(TokenError::TokenTypeMissing),
                Some(Scalar::Int32(0)) => TokenType::HighWaterMark,
                Some(Scalar::Int32(128)) => TokenType::Event,
                Some(Scalar::Int32(t)) => return Err(TokenError::BadTokenType(t)),
                Some(_) => return Err(TokenError::TokenTypeNotInt),
            }
        } else {
            TokenType::Event
        };
        let txn_op_index = match next()? {
            None => return Err(TokenError::TxnOpIndexMissing),
            Some(Scalar::Int32(i)) => {
                u32::try_from(i).map_err(|_| TokenError::NegativeTxnOpIndex)?
            }
            Some(_) => return Err(TokenError::TxnOpIndexNotInt),
        };
        let from_invalidate = if version >= TokenVersion::V1 {
            match next()? {
                None => return Err(TokenError::FromInvalidateMissing),
                Some(Scalar::Bool(b)) => b,
                Some(_) => return Err(TokenError::FromInvalidateNotBool),
            }
        } else {
            false
        };
        let mut out = ResumeTokenData {
            cluster_time,
            version,
            token_type,
            txn_op_index,
            from_invalidate,
            uuid: None,
            event_identifier: None,
            fragment_num: None,
        };
        let prefix = if version >= TokenVersion::V1 { 5 } else { 3 };
        let mut rest = slots.iter().take(n).skip(prefix);
        if let Some(u) = rest.next() {
            let bytes = data.get(u.start..u.end).unwrap_or(&[]);
            out.uuid = match uuid_from_slot(u.ct, bytes) {
                Some(u) => Some(u),
                None if u.ct == ctype::NULLISH && version == TokenVersion::V2 => None,
                None if version == TokenVersion::V2 => return Err(TokenError::BadUuid),
                None => return Err(TokenError::Malformed("uuid must be a UUID".into())),
            };
            if let Some(id) = rest.next() {
                if id.ct != ctype::OBJECT {
                    return Err(TokenError::EventIdentifierNotObject);
                }
                // Keep the CType byte: the identifier's key is a complete object encoding.
                let key = data
                    .get(id.start.saturating_sub(1)..id.end)
                    .unwrap_or(&[])
                    .to_vec();
                let id_bits = bits.extract(id.bit_start, id.bit_end);
                out.event_identifier = Some(Identifier::from_raw(key, id_bits));
                if version == TokenVersion::V2
                    && let Some(f) = rest.next()
                {
                    match f.value {
                        Scalar::Int32(f) if f >= 0 => out.fragment_num = Some(f as u32),
                        _ => return Err(TokenError::BadFragmentNum),
                    }
                }
            }
        }
        if rest.next().is_some() || overflow {
            return Err(TokenError::TrailingData);
        }
        out.validate()?;
        Ok(out)
    }

    /// The logical order of §5.7 (cluster time, version, token type, txnOpIndex,
    /// fromInvalidate, uuid, event identifier in BSON order, fragmentNum). Equals the byte
    /// order of the encoded `_data`.
    pub fn logical_cmp(&self, other: &Self) -> Ordering {
        self.cluster_time
            .cmp(&other.cluster_time)
            .then(self.version.cmp(&other.version))
            .then_with(|| self.rest_cmp(other))
    }

    /// Everything after the version; positional differences between versions only arise when
    /// versions differ, which `logical_cmp` has already decided.
    fn rest_cmp(&self, other: &Self) -> Ordering {
        self.token_type
            .cmp(&other.token_type)
            .then(self.txn_op_index.cmp(&other.txn_op_index))
            .then(self.from_invalidate.cmp(&other.from_invalidate))
            .then_with(|| {
                self.uuid
                    .map(|u| u.bytes())
                    .cmp(&other.uuid.map(|u| u.bytes()))
            })
            .then_with(|| {
                self.event_identifier_key()
                    .cmp(&other.event_identifier_key())
            })
            .then(self.fragment_num.cmp(&other.fragment_num))
    }

    /// `compareAgainstClientResumeToken`: where does this event (from the resumed stream) lie
    /// relative to the client's token? The version is ignored. The caller decides whether a
    /// `SurpassedToken` caused by a differing uuid or a skipped txnOpIndex is an error (it is on
    /// a replica set; on a shard feeding a merge it means the token lives on another shard).
    pub fn compare_against_client_token(&self, client: &ResumeTokenData) -> ResumeStatus {
        compare_against_client_token(self, client)
    }

    /// The KeyString value sequence in encoding order (for diagnostics and tests).
    pub fn to_values(&self) -> Vec<Bson> {
        self.values()
    }
}

impl fmt::Display for ResumeTokenData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{clusterTime: {}, version: {}, tokenType: {}, txnOpIndex: {}, fromInvalidate: {}",
            self.cluster_time,
            self.version.as_i32(),
            self.token_type.as_i32(),
            self.txn_op_index,
            self.from_invalidate
        )?;
        if let Some(u) = self.uuid {
            write!(f, ", uuid: {u}")?;
        }
        if let Some(id) = self.event_identifier() {
            write!(f, ", eventIdentifier: {id}")?;
        }
        if let Some(n) = self.fragment_num {
            write!(f, ", fragmentNum: {n}")?;
        }
        write!(f, "}}")
    }
}

/// Builds a v2 event identifier: `{operationType, documentKey}` for CRUD events,
/// `{operationType, operationDescription}` otherwise; an empty or missing second part is
/// omitted (e.g. `{operationType: "drop"}`).
pub fn event_identifier(operation_type: &str, second: Option<(&str, Document)>) -> Document {
    let mut d = Document::new();
    d.insert("operationType", operation_type);
    if let Some((name, value)) = second
        && !value.is_empty()
    {
        d.insert(name, value);
    }
    d
}

/// The event identifier of [`ResumeTokenData::event_from_parts`]: `second` names the second
/// part and says whether it is empty; `append` writes that document, as a field of the v2
/// identifier (`Some(name)`) or as the whole identifier before v2 (`None`), and answers `None`
/// when it cannot (the identifier is then meaningless and the caller discards it).
fn identifier_from_parts(
    version: TokenVersion,
    operation_type: &str,
    second: Option<(&str, bool)>,
    append: impl FnOnce(&mut Builder, Option<&str>) -> Option<()>,
) -> Option<Identifier> {
    let mut b = Builder::new();
    if version == TokenVersion::V2 {
        b.begin_object();
        b.field_str("operationType", operation_type);
        if let Some((name, empty)) = second
            && !empty
        {
            append(&mut b, Some(name))?;
        }
        b.end_object();
    } else {
        second?;
        append(&mut b, None)?;
    }
    let (key, bits) = b.finish();
    Some(Identifier::from_raw(key, bits))
}

fn uuid_bson(u: Uuid) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Uuid,
        bytes: u.bytes().to_vec(),
    })
}

/// `compareAgainstClientResumeToken` semantics (§5.7), ignoring `version`.
pub fn compare_against_client_token(
    event: &ResumeTokenData,
    client: &ResumeTokenData,
) -> ResumeStatus {
    use ResumeStatus::*;
    let by = |o: Ordering| {
        if o == Ordering::Greater {
            SurpassedToken
        } else {
            CheckNextDoc
        }
    };
    if event.cluster_time != client.cluster_time {
        return by(event.cluster_time.cmp(&client.cluster_time));
    }
    if event.token_type != client.token_type {
        return by(event.token_type.cmp(&client.token_type));
    }
    if event.txn_op_index != client.txn_op_index {
        return by(event.txn_op_index.cmp(&client.txn_op_index));
    }
    if event.from_invalidate != client.from_invalidate {
        return by(event.from_invalidate.cmp(&client.from_invalidate));
    }
    let (eu, cu) = (
        event.uuid.map(|u| u.bytes()),
        client.uuid.map(|u| u.bytes()),
    );
    if eu != cu {
        return by(eu.cmp(&cu));
    }
    let (ei, ci) = (event.event_identifier_key(), client.event_identifier_key());
    if ei != ci {
        return by(ei.cmp(&ci));
    }
    match (event.fragment_num, client.fragment_num) {
        (None, Some(_)) => NeedsSplit,
        (e, c) if e == c => FoundToken,
        (e, c) => by(e.cmp(&c)),
    }
}

/// The wire form of a resume token: raw `_data` bytes and serialized `_typeBits` (empty when
/// all type bits are zero). Equality, hashing and order use `_data` only, as in MongoDB.
#[derive(Debug, Clone)]
pub struct ResumeToken {
    data: Vec<u8>,
    type_bits: Vec<u8>,
}

impl ResumeToken {
    /// From raw parts (no validation; [`ResumeToken::decode`] validates).
    pub fn from_parts(data: Vec<u8>, type_bits: Vec<u8>) -> Self {
        ResumeToken { data, type_bits }
    }

    /// The `_data` bytes (hex-decoded).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// `_data` as MongoDB sends it: uppercase hex.
    pub fn data_hex(&self) -> String {
        let mut out = vec![0u8; self.data.len() * 2];
        write_hex_upper(&mut out, &self.data);
        // Only ASCII hex digits were written.
        String::from_utf8(out).unwrap_or_default()
    }

    /// The serialized `_typeBits`, if any bit is set.
    pub fn type_bits(&self) -> Option<&[u8]> {
        if self.type_bits.is_empty() {
            None
        } else {
            Some(&self.type_bits)
        }
    }

    /// `{_data: <uppercase hex>, _typeBits?: BinData(0)}`.
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        d.insert("_data", self.data_hex());
        if !self.type_bits.is_empty() {
            d.insert(
                "_typeBits",
                Bson::Binary(Binary {
                    subtype: BinarySubtype::Generic,
                    bytes: self.type_bits.clone(),
                }),
            );
        }
        d
    }

    /// The same document as [`ResumeToken::to_document`], as raw BSON (cheaper to build, for
    /// replies assembled with `rawdoc!`).
    pub fn to_raw_document(&self) -> RawDocumentBuf {
        // Written in one allocation of the exact size: this runs for every event returned.
        let mut out = Vec::with_capacity(self.raw_document_len());
        self.write_raw_document(&mut out);
        // `from_bytes` checks the length header and terminator, which were just written.
        RawDocumentBuf::from_bytes(out).unwrap_or_else(|_| self.to_raw_document_slow())
    }

    /// The bytes of [`ResumeToken::to_raw_document`], appended to `out` (for an event written
    /// straight into its buffer).
    pub fn write_raw_document(&self, out: &mut Vec<u8>) {
        let hex_len = self.data.len() * 2;
        let tb_len = self.type_bits.len();
        out.extend_from_slice(&(self.raw_document_len() as i32).to_le_bytes());
        out.push(0x02); // string
        out.extend_from_slice(b"_data\0");
        out.extend_from_slice(&((hex_len + 1) as i32).to_le_bytes());
        let start = out.len();
        out.resize(start + hex_len, 0);
        if let Some(dst) = out.get_mut(start..) {
            write_hex_upper(dst, &self.data);
        }
        out.push(0);
        if tb_len > 0 {
            out.push(0x05); // binary
            out.extend_from_slice(b"_typeBits\0");
            out.extend_from_slice(&(tb_len as i32).to_le_bytes());
            out.push(0x00); // subtype: generic
            out.extend_from_slice(&self.type_bits);
        }
        out.push(0);
    }

    /// The size of [`ResumeToken::to_raw_document`]'s bytes.
    pub fn raw_document_len(&self) -> usize {
        let mut size = 4 + (1 + 6 + 4 + self.data.len() * 2 + 1) + 1;
        if !self.type_bits.is_empty() {
            size += 1 + 10 + 4 + 1 + self.type_bits.len();
        }
        size
    }

    fn to_raw_document_slow(&self) -> RawDocumentBuf {
        let mut d = RawDocumentBuf::new();
        d.append(cstr!("_data"), self.data_hex().as_str());
        if !self.type_bits.is_empty() {
            d.append(
                cstr!("_typeBits"),
                RawBinaryRef {
                    subtype: BinarySubtype::Generic,
                    bytes: &self.type_bits,
                },
            );
        }
        d
    }

    /// Parses the wire form from raw BSON (see [`ResumeToken::from_document`]).
    pub fn from_raw_document(doc: &RawDocument) -> Result<Self, TokenError> {
        let mut data = None;
        let mut type_bits = Vec::new();
        for elem in doc {
            let (k, v) = elem.map_err(|e| TokenError::Malformed(e.to_string()))?;
            match k.as_str() {
                "_data" => match v.as_str() {
                    Some(s) => data = Some(decode_hex(s).ok_or(TokenError::NotHex)),
                    None => return Err(TokenError::DataMissing),
                },
                "_typeBits" => match v.as_binary() {
                    Some(b) if b.subtype == BinarySubtype::Generic => type_bits = b.bytes.to_vec(),
                    _ => {
                        return Err(TokenError::BadTypeBits(
                            "_typeBits must be BinData subtype 0".into(),
                        ));
                    }
                },
                // Like MongoDB, other fields are ignored.
                _ => {}
            }
        }
        let data = data.ok_or(TokenError::DataMissing)??;
        Ok(ResumeToken { data, type_bits })
    }

    /// Parses the wire form (without decoding the KeyString). As in MongoDB, `_data` must be a
    /// string (40647), `_typeBits` absent or BinData subtype 0 (40648), and other fields are
    /// ignored; hex is checked here (9).
    pub fn from_document(doc: &Document) -> Result<Self, TokenError> {
        let hex_str = match doc.get("_data") {
            Some(Bson::String(s)) => s,
            _ => return Err(TokenError::DataMissing),
        };
        let type_bits = match doc.get("_typeBits") {
            None => Vec::new(),
            Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Generic => b.bytes.clone(),
            Some(_) => {
                return Err(TokenError::BadTypeBits(
                    "_typeBits must be BinData subtype 0".into(),
                ));
            }
        };
        let data = decode_hex(hex_str).ok_or(TokenError::NotHex)?;
        Ok(ResumeToken { data, type_bits })
    }

    /// Decodes the logical content.
    pub fn decode(&self) -> Result<ResumeTokenData, TokenError> {
        ResumeTokenData::decode(&self.data, &self.type_bits)
    }

    /// A token with a cluster stamp ([`ResumeTokenData::encode_stamped`]): MongoDB's token
    /// and the stamp. `None` for every other token.
    pub fn unstamp(&self) -> Option<(ResumeToken, Uuid)> {
        // The stamp is the last value: BinData, 16 bytes, subtype 4 (UUID), then the end byte.
        const STAMP: usize = 3 + 16 + 1;
        let cut = self.data.len().checked_sub(STAMP)?;
        let (prefix, stamp) = self.data.split_at(cut);
        if stamp[..3] != [ctype::BIN_DATA, 16, 4] || stamp[STAMP - 1] != ctype::END {
            return None;
        }
        let cluster = Uuid::from_bytes(stamp[3..19].try_into().ok()?);
        let mut data = prefix.to_vec();
        data.extend_from_slice(&[ctype::NULLISH, ctype::END]);
        let plain = ResumeToken {
            data,
            type_bits: self.type_bits.clone(),
        };
        let decoded = plain.decode().ok()?;
        (decoded.is_high_water_mark() && decoded.version() >= TokenVersion::V2)
            .then_some((plain, cluster))
    }
}

impl PartialEq for ResumeToken {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
    }
}
impl Eq for ResumeToken {}

impl std::hash::Hash for ResumeToken {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.data.hash(state);
    }
}

impl PartialOrd for ResumeToken {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ResumeToken {
    /// Byte order of `_data`, which is the logical order of §5.7.
    fn cmp(&self, other: &Self) -> Ordering {
        self.data.cmp(&other.data)
    }
}

impl From<&ResumeToken> for Bson {
    fn from(t: &ResumeToken) -> Bson {
        Bson::Document(t.to_document())
    }
}

/// Compares two wire tokens by `_data` bytes (the merge order used by mongos).
pub fn compare_tokens(a: &ResumeToken, b: &ResumeToken) -> Ordering {
    a.cmp(b)
}

/// Where one top-level value of a token lies: its CType, its payload bytes (after the CType)
/// and its type bits.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    ct: u8,
    /// Already decoded, for the common scalars.
    value: Scalar,
    start: usize,
    end: usize,
    bit_start: usize,
    bit_end: usize,
}

/// A UUID value: `5A 10 04` + 16 bytes (`bytes` is what follows the CType).
fn uuid_from_slot(ct: u8, bytes: &[u8]) -> Option<Uuid> {
    match (ct, bytes) {
        (ctype::BIN_DATA, [16, 4, rest @ ..]) => {
            <[u8; 16]>::try_from(rest).ok().map(Uuid::from_bytes)
        }
        _ => None,
    }
}

/// An event identifier: its KeyString encoding (an object, with its own type bits) and the
/// document, built on first use when the token was decoded. Encoding and comparing tokens use
/// the bytes and never re-encode; equality is exact (types included). The document is boxed
/// so that a decoded token, which rarely needs it, stays small to move.
#[derive(Clone)]
struct Identifier {
    key: Vec<u8>,
    bits: TypeBits,
    doc: OnceLock<Box<Document>>,
}

impl Identifier {
    fn from_document(doc: Document) -> Identifier {
        let mut b = Builder::new();
        b.append_document(&doc);
        let (key, bits) = b.finish();
        Identifier {
            key,
            bits,
            doc: OnceLock::from(Box::new(doc)),
        }
    }

    /// From bytes already validated by [`skip_value`].
    fn from_raw(key: Vec<u8>, bits: TypeBits) -> Identifier {
        Identifier {
            key,
            bits,
            doc: OnceLock::new(),
        }
    }

    fn document(&self) -> &Document {
        self.doc.get_or_init(|| {
            let mut r = Reader::new(&self.key);
            let mut bits = self.bits.reader();
            Box::new(
                match r.u8().and_then(|ct| decode_value(ct, &mut r, &mut bits, 1)) {
                    Ok(Bson::Document(d)) => d,
                    // Unreachable: the bytes passed the same checks when the token was decoded.
                    _ => Document::new(),
                },
            )
        })
    }
}

impl PartialEq for Identifier {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.bits.to_bytes() == other.bits.to_bytes()
    }
}

impl fmt::Debug for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.document(), f)
    }
}

/// The value of each ASCII hex digit (either case); [`NOT_HEX`] for every other byte.
static HEX_VALUES: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};
const NOT_HEX: u8 = 0xff;

/// Decodes hex (either case, as `hex::decode` does) into bytes with one exact allocation;
/// `None` for an odd length or a non-hex character.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let mut out = vec![0u8; s.len() / 2];
    // Digit values are below 16, so a high bit in the union of all lookups means some
    // character was not a digit; checking once at the end keeps the loop branch-free.
    let mut union = 0u8;
    for (dst, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        if let [hi, lo] = pair {
            let (hi, lo) = (HEX_VALUES[usize::from(*hi)], HEX_VALUES[usize::from(*lo)]);
            union |= hi | lo;
            *dst = (hi << 4) | lo;
        }
    }
    (union & 0xf0 == 0).then_some(out)
}

/// The two uppercase hex digits of each byte value.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [DIGITS[i >> 4], DIGITS[i & 0xf]];
        i += 1;
    }
    t
};

/// Writes `src` as uppercase hex into `dst` (`dst.len() == 2 * src.len()`), one table lookup
/// per byte (this runs for every event's `_id`).
fn write_hex_upper(dst: &mut [u8], src: &[u8]) {
    for (pair, &b) in dst.chunks_exact_mut(2).zip(src) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn only_high_water_marks_are_stamped_and_unstamped() {
        let cluster = Uuid::from_bytes([3; 16]);
        let hwm = ResumeTokenData::high_water_mark(ClusterTime::new(100, 2), TokenVersion::V2);
        let stamped = hwm.encode_stamped(cluster);
        assert_ne!(stamped, hwm.encode());
        assert!(
            stamped.decode().is_err(),
            "MongoDB's decoder refuses a uuid on a high-water mark"
        );
        let (plain, stamp) = stamped.unstamp().unwrap();
        assert_eq!((plain, stamp), (hwm.encode(), cluster));
        assert!(hwm.encode().unstamp().is_none(), "an unstamped token");
        let v1 = ResumeTokenData::high_water_mark(ClusterTime::new(100, 2), TokenVersion::V1);
        assert_eq!(
            v1.encode_stamped(cluster),
            v1.encode(),
            "v1 has no uuid slot to use"
        );
        let event = ResumeTokenData::event(
            ClusterTime::new(100, 2),
            TokenVersion::V2,
            0,
            Some(Uuid::from_bytes([5; 16])),
            Some(event_identifier(
                "insert",
                Some(("documentKey", bson::doc! {"_id": 1})),
            )),
        )
        .unwrap();
        assert_eq!(event.encode_stamped(cluster), event.encode());
        assert!(event.encode().unstamp().is_none());
    }

    proptest! {
        /// The table-driven `_data` decoder accepts and yields exactly what `hex::decode`
        /// does, so the error (code 9) and the bytes are unchanged.
        #[test]
        fn decode_hex_agrees_with_the_hex_crate(s in "[0-9A-Fa-fgxz\u{e9} ]{0,24}") {
            prop_assert_eq!(decode_hex(&s), hex::decode(&s).ok());
        }

        #[test]
        fn decode_hex_inverts_uppercase_encoding(bytes in prop::collection::vec(any::<u8>(), 0..48)) {
            let token = ResumeToken::from_parts(bytes.clone(), Vec::new());
            prop_assert_eq!(decode_hex(&token.data_hex()), Some(bytes.clone()));
            prop_assert_eq!(decode_hex(&token.data_hex().to_lowercase()), Some(bytes));
        }
    }
}
