//! One shard's feed into a router change stream: a task that keeps one awaitData getMore
//! outstanding on the shard's change-stream cursor and hands the replies to the stream through
//! a bounded channel, so a client that stops reading stops its feeds too.
//!
//! A lost shard does not end the stream. When the shard cannot be reached, or answers that
//! the cursor is gone (it restarted) or that it is shutting down, the feed re-opens the
//! shard's stream from the last post-batch resume token it handed over, the shard's own
//! position, and carries on. Meanwhile the merge holds at that promise, so the client's
//! getMores answer empty batches whose post-batch resume token does not pass anything the
//! lost shard may still return: the stream pauses, and never skips or repeats an event.
//! Past [`ShardPatience::stream_outage`] the feed hands over the error
//! (resumable: the driver resumes) and stops.
//!
//! Invariants:
//! * the feed re-opens from the latest post-batch resume token it forwarded, which is the
//!   merge's promise for this shard, so the new cursor starts exactly where the merge stands
//!   (the shard re-delivers the event of an event token; the stream drops it, see
//!   `ShardCursor::resumed_after`);
//! * the feed owns its shard cursor: it kills the cursor it holds when cancelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bson::{Bson, Document, doc};
use shard::sharding::ShardId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::{ErrorCode, MongoError, Result};

use super::batch::ShardBatch;
use crate::kernel::lineages::Lineages;
use crate::kernel::transport::{Resend, ShardPatience, ShardTransport, backoff, sleep_before};

/// awaitData wait of one shard getMore (mongos caps it at 1 s with several shards).
const SHARD_AWAIT: Duration = Duration::from_millis(1000);
/// The most events per shard getMore: with the replies a feed may queue, this bounds what one
/// stream holds in memory on the router (a shard batch may otherwise be 16 MiB). A reader of
/// smaller batches gets shard batches of its size ([`Feed::demand`]).
pub(super) const SHARD_BATCH: i64 = 1000;
/// How long past its awaitData wait a shard getMore may take before the shard counts as lost.
const SILENT_SHARD: Duration = Duration::from_secs(10);
/// The first pause before re-opening a lost shard's stream.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// Codes with which a shard says that its cursor, or the shard itself, is gone for now: the
/// stream is re-opened from its position. CursorNotFound: the shard restarted (or dropped the
/// cursor); the rest: shutting down, or not (or no longer) the primary.
const LOST_CODES: &[i32] = &[43, 91, 189, 10107, 11600, 11602, 13435, 13436];

/// One shard's reply, as a feed hands it over.
pub(super) struct FeedReply {
    /// The shard's index in the stream.
    pub idx: usize,
    pub reply: Result<ShardBatch>,
    /// The reply opens a new shard cursor (the stream was re-opened after a loss): its batch
    /// is `firstBatch`, its `cursor.id` the new cursor.
    pub reopened: bool,
}

/// What a feed needs to read one shard.
pub(super) struct Feed {
    pub transport: Arc<ShardTransport>,
    /// The shards' histories, judged before a re-open.
    pub lineages: Arc<Lineages>,
    pub patience: ShardPatience,
    /// The shard's index in the stream, and the shard.
    pub idx: usize,
    pub shard: ShardId,
    pub db: String,
    /// The `collection` of getMores: the collection, or `$cmd.aggregate`.
    pub collection: String,
    /// The shard `aggregate` that opened the stream; re-opening changes only its start.
    pub open: Document,
    pub cursor_id: i64,
    /// The latest post-batch resume token handed over: where a re-opened cursor starts.
    pub position: Document,
    pub tx: mpsc::Sender<FeedReply>,
    pub cancel: CancellationToken,
    /// Events per shard getMore (1 to [`SHARD_BATCH`]): the reader's batch size, so that a
    /// reader of small batches far behind does not have every feed read a full batch ahead.
    pub demand: Arc<AtomicI64>,
}

impl Feed {
    /// Runs until the shard cursor closes, the stream is cancelled, or the shard stays lost
    /// for longer than the router's patience.
    pub async fn run(mut self) {
        let cancel = self.cancel.clone();
        tokio::select! {
            _ = self.feed() => {}
            _ = cancel.cancelled() => {}
        }
        if self.cursor_id != 0 {
            let kill = doc! {"killCursors": &self.collection, "cursors": [self.cursor_id]};
            // Best effort: a shard that is down has dropped the cursor already.
            let _ = self
                .transport
                .send_body(self.shard, &self.db, kill, Duration::ZERO, Resend::Unsent)
                .await;
        }
    }

    async fn feed(&mut self) {
        loop {
            let get_more = doc! {
                "getMore": self.cursor_id,
                "collection": &self.collection,
                "maxTimeMS": SHARD_AWAIT.as_millis() as i64,
                "batchSize": self.demand.load(Ordering::Relaxed),
            };
            // No waiting for a connection here: a lost shard is the re-open's business. A shard
            // that does not answer well past the awaitData wait is lost too (a partition sends
            // no reset); dropping the request drops its connection.
            let sent = tokio::time::timeout(
                SHARD_AWAIT + SILENT_SHARD,
                self.transport.send_body(
                    self.shard,
                    &self.db,
                    get_more,
                    Duration::ZERO,
                    Resend::Unsent,
                ),
            )
            .await;
            let lost = match sent {
                Err(_) => MongoError::new(
                    ErrorCode::NETWORK_TIMEOUT,
                    format!(
                        "{} did not answer a getMore within {:?}",
                        self.shard,
                        SHARD_AWAIT + SILENT_SHARD
                    ),
                ),
                Ok(Err(e)) => e.into_error(),
                Ok(Ok(reply)) => match ShardBatch::parse(reply) {
                    Err(e) if LOST_CODES.contains(&e.code) => e,
                    Err(e) => {
                        self.hand_over(Err(e), false).await;
                        return;
                    }
                    Ok(batch) => {
                        let done = batch.cursor_id == 0;
                        if done {
                            self.cursor_id = 0;
                        }
                        if !self.hand_over(Ok(batch), false).await || done {
                            return;
                        }
                        continue;
                    }
                },
            };
            tracing::info!(shard = %self.shard, error = %lost, "change stream lost its shard; re-opening");
            if !self.reopen(lost).await {
                return;
            }
        }
    }

    /// Re-opens the shard's stream at `position`, waiting for the shard within the router's
    /// patience. Returns whether the feed goes on.
    async fn reopen(&mut self, mut error: MongoError) -> bool {
        self.cursor_id = 0;
        let cmd = resume_command(&self.open, &self.position);
        let patience = self.patience;
        let deadline = tokio::time::Instant::now() + patience.stream_outage;
        let mut pause = FIRST_PAUSE;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                error.errmsg = format!(
                    "{} has been unreachable for {}s: {}",
                    self.shard,
                    patience.stream_outage.as_secs(),
                    error.errmsg
                );
                self.hand_over(Err(error), false).await;
                return false;
            }
            if let Err(e) = self.lineages.verify_now().await {
                tracing::debug!(error = %e, "shard lineages not verified before a re-open");
            }
            let attempt = self
                .transport
                .send_body(
                    self.shard,
                    &self.db,
                    cmd.clone(),
                    left.min(patience.connect),
                    Resend::Lost,
                )
                .await;
            match attempt {
                Ok(reply) => match ShardBatch::parse(reply) {
                    Ok(batch) => {
                        self.cursor_id = batch.cursor_id;
                        let done = self.cursor_id == 0;
                        tracing::info!(shard = %self.shard, "change stream re-opened on its shard");
                        return self.hand_over(Ok(batch), true).await && !done;
                    }
                    Err(e) if LOST_CODES.contains(&e.code) => error = e,
                    Err(e) => {
                        self.hand_over(Err(e), false).await;
                        return false;
                    }
                },
                Err(e) => error = e.into_error(),
            }
            sleep_before(pause, deadline).await;
            pause = backoff(pause);
        }
    }

    /// Hands a reply to the stream, remembering its promise. False when the stream is gone.
    async fn hand_over(&mut self, reply: Result<ShardBatch>, reopened: bool) -> bool {
        if let Ok(batch) = &reply {
            self.position = batch.post_batch_resume_token.to_document();
        }
        let msg = FeedReply {
            idx: self.idx,
            reply,
            reopened,
        };
        self.tx.send(msg).await.is_ok()
    }
}

/// The shard aggregate `open` with its start replaced by `resumeAfter: position`.
pub(super) fn resume_command(open: &Document, position: &Document) -> Document {
    let mut cmd = open.clone();
    if let Ok(stages) = cmd.get_array_mut("pipeline")
        && let Some(Bson::Document(first)) = stages.first_mut()
        && let Ok(spec) = first.get_document_mut("$changeStream")
    {
        for start in ["resumeAfter", "startAfter", "startAtOperationTime"] {
            spec.remove(start);
        }
        spec.insert("resumeAfter", position.clone());
    }
    cmd.insert("cursor", Document::new());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_command_changes_only_the_start() {
        let open = doc! {
            "aggregate": 1,
            "pipeline": [
                {"$changeStream": {"startAtOperationTime": Bson::Timestamp(bson::Timestamp {time: 5, increment: 1}), "showExpandedEvents": true}},
                {"$match": {"operationType": "insert"}},
            ],
            "cursor": {"batchSize": 0},
        };
        let at = doc! {"_data": "8200000005"};
        let cmd = resume_command(&open, &at);
        assert_eq!(
            cmd,
            doc! {
                "aggregate": 1,
                "pipeline": [
                    {"$changeStream": {"showExpandedEvents": true, "resumeAfter": {"_data": "8200000005"}}},
                    {"$match": {"operationType": "insert"}},
                ],
                "cursor": {},
            }
        );
    }
}
