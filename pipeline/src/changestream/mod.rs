//! Change streams: the pure stages that turn a shard's oplog into change events, and the
//! router's merge of the shards' event streams (reference `mongodb-change-streams.md` §1–§6).
//!
//! Data flow (each box is a module here; nothing in this tree does I/O or reads a clock):
//!
//! ```text
//! shard:  oplog entry ─ oplog_match ─ unwind ─ transform ─ invalidate ─ resumability
//!         ─ classic-types filter ─ images (pre-images looked up by the shard) ─ user stages
//!         (post_merge::UserPipeline)
//!         ─ split large events (split)
//! router: merge (k-way by token) ─ resumability::EnsureResumeTokenPresent ─ post_merge (`_id` check)
//! ```
//!
//! [`shard::ShardStream`] composes the shard half in that order; [`post_merge::RouterStream`]
//! the router half after [`merge::Merger`].
//!
//! Invariants shared by every module:
//! * one event is built once ([`ChangeEvent`]), with its resume token computed beside it; later
//!   stages read it, drop it, or (user stages, the split) reshape its document, never its token
//!   (fragments get their own tokens);
//! * an event's sort key is its token's `_data` bytes ([`ChangeEvent::token`]), never the
//!   document's `_id`, which user stages may have changed (the router then fails with 280);
//! * every client-visible failure is a [`wire::MongoError`] with MongoDB's code.

pub(crate) mod bson_writer;
pub mod diff_apply;
pub mod diff_parser;
pub mod images;
pub mod invalidate;
pub mod merge;
pub mod net_effect;
pub mod oplog_match;
pub mod post_merge;
pub mod resumability;
pub mod selectors;
pub mod shard;
pub mod spec;
pub mod split;
pub mod transform;
pub mod unwind;

#[cfg(test)]
pub(crate) mod test_util;

use bson::Document;
use resume::token::{ResumeToken, ResumeTokenData};
use wire::{MongoError, Result};

pub use merge::Merger;
pub use spec::{ChangeStreamSpec, StartPoint, StreamLevel};

/// One change event: its document and its resume token, in wire form (the sort key) and decoded
/// (for the resume comparisons). `doc._id` equals `token` when the event is built.
#[derive(Debug, Clone)]
pub struct ChangeEvent {
    pub token: ResumeToken,
    pub data: ResumeTokenData,
    pub doc: Document,
}

impl ChangeEvent {
    /// An event received from elsewhere (e.g. a shard's reply) with its sort key; decodes the
    /// token, failing with the token-parse code when it is not a valid token.
    pub fn from_parts(token: ResumeToken, doc: Document) -> Result<ChangeEvent> {
        let data = token.decode().map_err(MongoError::from)?;
        Ok(ChangeEvent { token, data, doc })
    }

    /// An event whose sort key is its own `_id` (events straight from [`transform`]).
    pub fn from_document(doc: Document) -> Result<ChangeEvent> {
        let id = doc
            .get_document("_id")
            .map_err(|_| MongoError::with_code(40647, "change event has no resume token _id"))?;
        let token = ResumeToken::from_document(id).map_err(MongoError::from)?;
        ChangeEvent::from_parts(token, doc)
    }

    /// `operationType`, or "" when a user stage removed it.
    pub fn operation_type(&self) -> &str {
        self.doc.get_str("operationType").unwrap_or("")
    }
}
