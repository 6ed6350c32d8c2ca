//! Cluster time and change-stream resume tokens, byte-compatible with MongoDB (KeyString V1).
//!
//! Pure: no I/O, no clock. Invariant: comparing two tokens' `_data` bytes gives their logical
//! order (§5.7 of `shared/reference/mongodb-change-streams.md`), and `decode(encode(x)) == x`.
//!
//! # Map
//!
//! * [`ClusterTime`]: the `(secs, inc)` BSON Timestamp newtype every event is ordered by.
//! * [`ResumeTokenData`]: a token's logical content (§5.1): cluster time, [`TokenVersion`],
//!   [`TokenType`], txnOpIndex, fromInvalidate, uuid, event identifier, fragmentNum.
//!   Build with [`ResumeTokenData::high_water_mark`] or [`ResumeTokenData::event`] (plus
//!   [`ResumeTokenData::with_from_invalidate`] / [`ResumeTokenData::with_fragment_num`]); the
//!   v2 identifier `{operationType, documentKey | operationDescription}` comes from
//!   [`event_identifier`], or is built in place by [`ResumeTokenData::event_from_parts`]
//!   (from a decoded document) and [`ResumeTokenData::event_from_raw_parts`] (from its BSON
//!   bytes, which then need not be decoded). Constructors and the decoder enforce the rules
//!   of §5.2.
//! * [`ResumeToken`]: the wire form `{_data: <uppercase hex>, _typeBits?: BinData(0)}`.
//!   [`ResumeTokenData::encode`] → [`ResumeToken`] → [`ResumeToken::to_document`] /
//!   [`ResumeToken::to_raw_document`]; back with [`ResumeToken::from_document`] /
//!   [`ResumeToken::from_raw_document`] → [`ResumeToken::decode`]. `Eq`, `Hash` and `Ord` on a
//!   token use `_data` only, as MongoDB's do (mongos merges on `{_id._data: 1}`).
//! * [`compare_against_client_token`] → [`ResumeStatus`]: the resumability check of
//!   `compareAgainstClientResumeToken` (version ignored).
//! * [`TokenError`]: every decoding failure, with MongoDB's code ([`TokenError::code`]) and a
//!   conversion into `wire::MongoError`.
//! * [`keystring`]: the KeyString V1 value codec itself, including [`keystring::key_bytes`], an
//!   order-preserving storage key for any BSON value (used by the shard for `_id`).
//!
//! # Example
//!
//! ```
//! use bson::{doc, oid::ObjectId, Uuid};
//! use resume::{ClusterTime, ResumeTokenData, ResumeToken, TokenVersion, event_identifier};
//!
//! let id = event_identifier("insert", Some(("documentKey", doc! {"_id": ObjectId::new()})));
//! let data = ResumeTokenData::event(
//!     ClusterTime::new(1_700_000_000, 1), TokenVersion::V2, 0, Some(Uuid::new()), Some(id),
//! )?;
//! let wire = data.encode().to_document();          // {_data: "826553F1...04"}
//! let back = ResumeToken::from_document(&wire)?.decode()?;
//! assert_eq!(back, data);
//! let hwm = ResumeTokenData::high_water_mark(ClusterTime::new(1_700_000_000, 1), TokenVersion::V2);
//! assert!(hwm.encode() < data.encode());           // a high-water mark sorts before events
//! # Ok::<(), resume::TokenError>(())
//! ```

mod decimal;
pub mod keystring;
pub mod time;
pub mod token;

pub use time::ClusterTime;
pub use token::{
    MAX_TXN_OP_INDEX, ResumeStatus, ResumeToken, ResumeTokenData, TokenError, TokenType,
    TokenVersion, compare_against_client_token, compare_tokens, event_identifier,
};
