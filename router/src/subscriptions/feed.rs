//! A consumer's feed: the change stream its subscription defines, read from where the consumer
//! stands, turned into [`Message`]s (each event's token and its encoded bytes, exactly what
//! `watch()` returns).
//!
//! Invariants: messages come out in token order, each once per feed; the stream is opened at
//! the consumer's horizon (the subscription's start before its first message), so a feed
//! re-opened after a lost shard or a restart brings nothing the consumer passed; an
//! invalidate is not a message: the feed goes on after it (`startAfter`), so a collection's
//! subscription delivers its drop and then the changes of the collection created again;
//! messages read but not yet taken (a reply full) wait in a lookahead of at most one batch;
//! the scanned position is handed on only once the lookahead is empty, so the consumer's
//! horizon never passes a message it was not offered.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use resume::token::ResumeToken;
use wire::{ErrorCode, MongoError, Result};

use super::delivery::Message;
use super::spec::Definition;
use crate::streams::{ChangeStreamCursor, Streams};

/// What a fetch brought.
pub struct Fetched {
    /// Whether the stream has nothing newer than what the lookahead holds.
    pub at_head: bool,
}

#[derive(Default)]
pub struct Feed {
    cursor: Option<ChangeStreamCursor>,
    lookahead: VecDeque<Arc<Message>>,
    /// Where the stream has read to (a post-batch resume token), past the lookahead.
    scanned: Option<ResumeToken>,
}

impl Feed {
    /// The next message read, if any, without reading.
    pub fn peek(&self) -> Option<&Arc<Message>> {
        self.lookahead.front()
    }

    pub fn pop(&mut self) -> Option<Arc<Message>> {
        self.lookahead.pop_front()
    }

    /// Where the stream has read through, once every message read was taken.
    pub fn scanned(&self) -> Option<&ResumeToken> {
        if self.lookahead.is_empty() {
            self.scanned.as_ref()
        } else {
            None
        }
    }

    /// Whether its stream is open.
    pub fn is_open(&self) -> bool {
        self.cursor.is_some()
    }

    pub fn has_lookahead(&self) -> bool {
        !self.lookahead.is_empty()
    }

    /// Reads up to `n` more events into the lookahead, waiting up to `wait` for the first;
    /// the stream opens at `from` (the consumer's horizon), or at the subscription's start.
    pub async fn fetch(
        &mut self,
        streams: &Arc<Streams>,
        def: &Definition,
        from: Option<&ResumeToken>,
        n: usize,
        wait: Duration,
    ) -> Result<Fetched> {
        if self.cursor.is_none() {
            let start = from.unwrap_or(&def.start);
            let opened = streams
                .open(&def.db, &def.aggregate_from(Some(start))?)
                .await?;
            self.cursor = opened.cursor;
            self.take(opened.batch)?;
            if self.cursor.is_none() {
                return Ok(Fetched { at_head: false });
            }
        }
        let Some(cursor) = self.cursor.as_mut() else {
            return Err(MongoError::internal(
                "a subscription feed without its stream",
            ));
        };
        let batch = cursor.next_batch(streams, n, wait).await?;
        let full = batch.events.len() >= n;
        let invalidated = self.take(batch)?;
        if invalidated {
            self.close().await;
            return Ok(Fetched { at_head: false });
        }
        Ok(Fetched { at_head: !full })
    }

    /// Takes a batch into the lookahead; returns whether it ended with an invalidate.
    fn take(&mut self, batch: crate::streams::Batch) -> Result<bool> {
        let count = batch.events.len();
        for (i, event) in batch.events.into_iter().enumerate() {
            let token = event_token(&event)?;
            if batch.invalidated && i + 1 == count {
                // The stream goes on after it (`startAfter`): not a message.
                self.scanned = Some(token);
                return Ok(true);
            }
            self.lookahead.push_back(Arc::new(Message { token, event }));
        }
        if let Some(t) = batch.post_batch_resume_token {
            self.scanned = Some(t);
        }
        Ok(batch.invalidated)
    }

    /// Stops the stream (its shard cursors killed); the lookahead stays.
    pub async fn close(&mut self) {
        if let Some(mut cursor) = self.cursor.take() {
            cursor.kill().await;
        }
    }

    /// Drops the stream and the lookahead: the next fetch opens it again (after a resumable
    /// error, or a reset).
    pub async fn restart(&mut self) {
        self.close().await;
        self.lookahead.clear();
        self.scanned = None;
    }
}

/// An event's resume token (its `_id`).
fn event_token(event: &Bytes) -> Result<ResumeToken> {
    let bad = |e: String| MongoError::internal(format!("a change event without a token: {e}"));
    let doc = bson::RawDocument::from_bytes(event).map_err(|e| bad(e.to_string()))?;
    let id = doc.get_document("_id").map_err(|e| bad(e.to_string()))?;
    ResumeToken::from_raw_document(id).map_err(|e| bad(e.to_string()))
}

/// Whether a stream error means the consumer cannot go on from where it stands (its history
/// is gone, or its token is not in it), rather than a pause to wait out.
pub fn needs_reset(e: &MongoError) -> bool {
    e.code == ErrorCode::CHANGE_STREAM_HISTORY_LOST.code
        || e.code == ErrorCode::CHANGE_STREAM_FATAL_ERROR.code
        || e.has_label("NonResumableChangeStreamError")
}
