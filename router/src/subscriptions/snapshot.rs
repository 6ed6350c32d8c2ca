//! `start: "snapshot"`: every document in the subscription's scope as of one cluster time
//! `T`, then the changes after `T`, with no gap and no overlap.
//!
//! The copy is taken once, when the subscription is created (or reset for all consumers to a
//! snapshot): every shard is read at the same `atClusterTime: T`, inside the shards' history
//! window, and each document is stored as a message in `config.subscriptionSnapshots`. Every
//! consumer then reads the copy at its own pace, however long it takes, and follows the
//! stream from just after `T` (the subscription's pin holds every shard's oplog from `T`).
//!
//! A snapshot message is an `insert` event of the document as of `T` (`fullDocument`, with
//! `snapshot: true`), and its token an event token at `T` whose `txnOpIndex` is the message's
//! place in the copy: snapshot messages sort after the start (`T`'s high-water mark), in copy
//! order, and before every change after `T`.
//!
//! Invariants: one `T` for every shard and collection; the copy is complete before the
//! subscription that names it is stored (a failed or losing copy is deleted); a copy holds at
//! most [`MAX_DOCUMENTS`] documents; a position at `T` is inside the copy, anything later is
//! in the stream.

use std::sync::Arc;

use bson::{Bson, Document, Timestamp, doc};
use bytes::Bytes;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion, event_identifier};
use wire::{ErrorCode, MongoError, Result};

use super::Subscriptions;
use super::delivery::Message;
#[cfg(test)]
use super::spec::at_time;
use super::spec::{Definition, SNAPSHOTS, STATE_DB, Snapshot};
use crate::kernel::config::ConfigStore;
use crate::kernel::transport::{Shards, cursor_id, first_batch, next_batch};

/// The most documents one snapshot copies (a token's `txnOpIndex` numbers them).
pub const MAX_DOCUMENTS: u32 = resume::token::MAX_TXN_OP_INDEX;

/// Documents per write into the copy, and their bytes.
const WRITE_BATCH: usize = 1000;
const WRITE_BYTES: usize = 8 << 20;

/// Up to `n` messages of `sub`'s snapshot from place `from` on, in copy order.
pub async fn page(
    config: &ConfigStore,
    sub: &str,
    snapshot: Snapshot,
    from: u32,
    n: usize,
) -> Result<Vec<Arc<Message>>> {
    let to = i64::from(from).saturating_add(n as i64);
    let mut docs = config
        .find(
            STATE_DB,
            SNAPSHOTS,
            doc! {"_id.s": sub, "_id.at": snapshot.at, "_id.n": {"$gte": i64::from(from), "$lt": to}},
        )
        .await?;
    docs.sort_by_key(|d| {
        d.get_document("_id")
            .and_then(|id| id.get_i64("n"))
            .unwrap_or(0)
    });
    let mut out = Vec::with_capacity(docs.len());
    for d in docs {
        let event = d
            .get_document("event")
            .map_err(|_| MongoError::internal("a snapshot message without its event"))?;
        let token = ResumeToken::from_document(
            event
                .get_document("_id")
                .map_err(|_| MongoError::internal("a snapshot event without its token"))?,
        )?;
        let bytes = event
            .to_vec()
            .map_err(|e| MongoError::internal(format!("a snapshot event: {e}")))?;
        out.push(Arc::new(Message::new(token, Bytes::from(bytes))));
    }
    if out.len() < n && from.saturating_add(out.len() as u32) < snapshot.count {
        return Err(MongoError::internal(format!(
            "the snapshot of {sub} lacks messages from {}",
            from as usize + out.len()
        )));
    }
    Ok(out)
}

/// The `n`-th snapshot message: the document as an `insert` event at `at`.
fn event(at: Timestamp, n: u32, db: &str, coll: &str, doc: Document) -> Result<Document> {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let key = doc! {"_id": id};
    let token = ResumeTokenData::event(
        at.into(),
        TokenVersion::V2,
        n,
        None,
        Some(event_identifier(
            "insert",
            Some(("documentKey", key.clone())),
        )),
    )
    .map_err(|e| MongoError::internal(format!("a snapshot token: {e}")))?
    .encode();
    Ok(doc! {
        "_id": token.to_document(),
        "operationType": "insert",
        "clusterTime": at,
        "fullDocument": doc,
        "ns": {"db": db, "coll": coll},
        "documentKey": key,
        "snapshot": true,
    })
}

impl Subscriptions {
    /// Takes a snapshot of `def`'s scope as of now: stored, then returned.
    pub(super) async fn take_snapshot(&self, def: &Definition) -> Result<Snapshot> {
        let at = self.transport.clock().now().timestamp();
        let sub = def.id();
        match self.copy(def, &sub, at).await {
            Ok(count) => Ok(Snapshot { at, count }),
            Err(e) => {
                let _ = self.discard_snapshot(&sub, Some(at), true).await;
                Err(e)
            }
        }
    }

    async fn copy(&self, def: &Definition, sub: &str, at: Timestamp) -> Result<u32> {
        let mut n: u32 = 0;
        let mut batch: Vec<Document> = Vec::new();
        let mut bytes = 0usize;
        for (db, coll) in self.namespaces(def).await? {
            for shard in self.transport.all() {
                let find = doc! {
                    "find": &coll, "filter": {}, "sort": {"_id": 1},
                    "readConcern": {"level": "snapshot", "atClusterTime": at},
                };
                let mut reply = self.transport.read(shard, &db, find).await?;
                let mut docs = first_batch(&reply)?;
                loop {
                    for doc in docs {
                        if n >= MAX_DOCUMENTS {
                            return Err(MongoError::new(
                                ErrorCode::EXCEEDED_MEMORY_LIMIT,
                                format!("a snapshot copies at most {MAX_DOCUMENTS} documents"),
                            ));
                        }
                        let e = event(at, n, &db, &coll, doc)?;
                        bytes += e.to_vec().map_or(0, |v| v.len());
                        batch.push(
                            doc! {"_id": {"s": sub, "at": at, "n": i64::from(n)}, "event": e},
                        );
                        n += 1;
                        if batch.len() >= WRITE_BATCH || bytes >= WRITE_BYTES {
                            self.write_copy(std::mem::take(&mut batch)).await?;
                            bytes = 0;
                        }
                    }
                    let id = cursor_id(&reply);
                    if id == 0 {
                        break;
                    }
                    reply = self
                        .transport
                        .command(shard, &db, doc! {"getMore": id, "collection": &coll})
                        .await?;
                    docs = next_batch(&reply)?;
                }
            }
        }
        if !batch.is_empty() {
            self.write_copy(batch).await?;
        }
        Ok(n)
    }

    async fn write_copy(&self, docs: Vec<Document>) -> Result<()> {
        self.config_write(SNAPSHOTS, "insert", "documents", docs)
            .await
            .map(|_| ())
    }

    /// The collections a snapshot of `def` copies, in the order it copies them.
    async fn namespaces(&self, def: &Definition) -> Result<Vec<(String, String)>> {
        if let Some(c) = &def.collection {
            return Ok(vec![(def.db.clone(), c.clone())]);
        }
        let mut dbs = vec![def.db.clone()];
        if def.db == "admin" {
            dbs.clear();
            for shard in self.transport.all() {
                let reply = self
                    .transport
                    .read(shard, "admin", doc! {"listDatabases": 1, "nameOnly": true})
                    .await?;
                for d in reply.get_array("databases").into_iter().flatten() {
                    if let Some(name) = d.as_document().and_then(|d| d.get_str("name").ok())
                        && !["admin", "config", "local"].contains(&name)
                    {
                        dbs.push(name.to_string());
                    }
                }
            }
        }
        let mut out = Vec::new();
        for db in dbs {
            for shard in self.transport.all() {
                let reply = self
                    .transport
                    .read(
                        shard,
                        &db,
                        doc! {"listCollections": 1, "filter": {"type": "collection"}, "nameOnly": true},
                    )
                    .await?;
                for c in first_batch(&reply)? {
                    if let Ok(name) = c.get_str("name")
                        && !name.starts_with("system.")
                    {
                        out.push((db.clone(), name.to_string()));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Deletes `sub`'s snapshots: all of them, or (`only`) the one at `at`, or all but it.
    pub(super) async fn discard_snapshot(
        &self,
        sub: &str,
        at: Option<Timestamp>,
        only: bool,
    ) -> Result<()> {
        let filter = match at {
            None => doc! {"_id.s": sub},
            Some(at) if only => doc! {"_id.s": sub, "_id.at": at},
            Some(at) => doc! {"_id.s": sub, "_id.at": {"$ne": at}},
        };
        self.config_delete(SNAPSHOTS, filter).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_messages_sort_after_the_start_in_copy_order_and_before_what_follows() {
        let at = Timestamp {
            time: 100,
            increment: 7,
        };
        let snap = Snapshot { at, count: 3 };
        let tokens: Vec<ResumeToken> = (0..3)
            .map(|n| {
                ResumeToken::from_document(
                    event(at, n, "d", "c", doc! {"_id": 10 - n as i32})
                        .expect("event")
                        .get_document("_id")
                        .expect("token"),
                )
                .expect("token")
            })
            .collect();
        let start = at_time(at);
        assert!(start < tokens[0] && tokens[0] < tokens[1] && tokens[1] < tokens[2]);
        assert!(tokens[2] < snap.follow());
        assert_eq!(snap.next(&start), Some(0));
        assert_eq!(snap.next(&tokens[1]), Some(2));
        assert_eq!(snap.next(&tokens[2]), None, "the copy is read");
        assert_eq!(snap.next(&snap.follow()), None);
        assert!(snap.covers(&tokens[2]) && !snap.covers(&snap.follow()));
    }
}
