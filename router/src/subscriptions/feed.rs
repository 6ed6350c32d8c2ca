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

use pipeline::changestream::selectors::{Group, Grouper};

use super::delivery::Message;
use super::snapshot;
use super::spec::{Definition, at_time};
use crate::kernel::config::ConfigStore;
use crate::streams::{ChangeStreamCursor, Streams};

/// Where feeds read: the streams, and the config shard (for snapshots).
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub streams: &'a Arc<Streams>,
    pub config: &'a ConfigStore,
}

/// What a fetch brought.
pub struct Fetched {
    /// Whether the stream has nothing newer than what the lookahead holds.
    pub at_head: bool,
}

#[derive(Default)]
pub struct Feed {
    cursor: Option<ChangeStreamCursor>,
    lookahead: VecDeque<Arc<Message>>,
    /// Where the stream has read to (a post-batch resume token), past the lookahead and what
    /// the grouper holds.
    scanned: Option<ResumeToken>,
    /// A selector subscription's transactions being grouped.
    grouper: Grouper<Bytes>,
    /// Where the stream was opened to follow: a selector stream regroups the transaction
    /// there and meets messages at or before it again, which it passes over.
    after: Option<ResumeToken>,
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
        source: Source<'_>,
        def: &Definition,
        from: Option<&ResumeToken>,
        n: usize,
        wait: Duration,
    ) -> Result<Fetched> {
        if self.cursor.is_none() {
            let start = from.unwrap_or(&def.start);
            if let Some(snap) = def.snapshot
                && let Some(next) = snap.next(start)
            {
                // Inside the snapshot: its copy, a page at a time.
                let page = snapshot::page(source.config, &def.id(), snap, next, n).await?;
                for message in page {
                    self.scanned = Some(message.token.clone());
                    self.take_one(def, message.token.clone(), message.event.clone())?;
                }
                return Ok(Fetched { at_head: false });
            }
            self.after = Some(start.clone());
            let opened = source
                .streams
                .open(&def.db, &def.aggregate_from(Some(start))?)
                .await?;
            self.cursor = opened.cursor;
            if let Some(cursor) = &mut self.cursor {
                cursor.keep_tokens();
            }
            self.take(def, opened.batch)?;
            if self.cursor.is_none() {
                return Ok(Fetched { at_head: false });
            }
        }
        let Some(cursor) = self.cursor.as_mut() else {
            return Err(MongoError::internal(
                "a subscription feed without its stream",
            ));
        };
        let batch = cursor.next_batch(source.streams, n, wait).await?;
        let full = batch.events.len() >= n;
        let invalidated = self.take(def, batch)?;
        if invalidated {
            self.close().await;
            return Ok(Fetched { at_head: false });
        }
        Ok(Fetched { at_head: !full })
    }

    /// Takes a batch into the lookahead (with selectors: the matching events, grouped);
    /// returns whether it ended with an invalidate.
    fn take(&mut self, def: &Definition, batch: crate::streams::Batch) -> Result<bool> {
        let count = batch.events.len();
        // The tokens the stream kept (all of them, or none: its first batch, read before it
        // was asked to).
        let mut tokens = batch.tokens.into_iter();
        for (i, event) in batch.events.into_iter().enumerate() {
            let token = match tokens.next() {
                Some(token) => token,
                None => event_token(&event)?,
            };
            if batch.invalidated && i + 1 == count {
                // The stream goes on after it (`startAfter`): not a message. Nothing of this
                // stream follows it, so what is grouped is complete.
                let held = self.grouper.finish();
                self.keep(held);
                self.scanned = Some(token);
                return Ok(true);
            }
            self.take_one(def, token, event)?;
        }
        if let Some(t) = batch.post_batch_resume_token {
            let done = self.grouper.release(&t);
            self.keep(done);
            // Never past a transaction still being grouped: a reader resumes at its start.
            self.scanned = Some(match self.grouper.holding() {
                Some(held) => at_time(held.into()).min(t),
                None => t,
            });
        }
        Ok(batch.invalidated)
    }

    /// One event into the lookahead, or (with selectors) into its group if it matches.
    fn take_one(&mut self, def: &Definition, token: ResumeToken, event: Bytes) -> Result<()> {
        let Some(selectors) = &def.selectors else {
            self.lookahead
                .push_back(Arc::new(Message::new(token, event)));
            return Ok(());
        };
        let matched = bson::RawDocument::from_bytes(&event)
            .map(|doc| selectors.matches(doc))
            .map_err(|e| MongoError::internal(format!("a change event: {e}")))?;
        if matched {
            let done = self.grouper.push(token, event)?;
            self.keep(done);
        }
        Ok(())
    }

    /// Complete groups into the lookahead, but for those at or before where the stream was
    /// opened to follow.
    fn keep(&mut self, groups: Vec<Group<Bytes>>) {
        let after = self.after.as_ref();
        self.lookahead.extend(
            groups
                .into_iter()
                .filter(|g| after.is_none_or(|a| g.token > *a))
                .map(grouped),
        );
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
        self.grouper = Grouper::default();
        self.after = None;
    }
}

/// A selector subscription's message: the document's first matching change, and all of them.
fn grouped(group: Group<Bytes>) -> Arc<Message> {
    let event = group.changes.first().cloned().unwrap_or_default();
    Arc::new(Message::grouped(group.token, event, group.changes))
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
