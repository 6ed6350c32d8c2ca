//! The config shard's collections as a store: the cluster's metadata (databases, sharded
//! collections, chunks, lineages), its signing key and its id live there, and every router
//! reads and changes them through [`ConfigStore`].
//!
//! Invariants: the store is shard 0 of the transport; reads are sent again if it restarts
//! under them; [`ConfigStore::get_or_insert`] returns what is stored (a racing router's
//! document wins over ours, never both); [`ConfigStore::cas`] changes a document only while
//! it still matches what the caller last read (one shard's single-document update is
//! atomic), so two routers deciding the same change cannot both win.

use std::sync::Arc;

use bson::{Bson, Document, doc};
use shard::sharding::ShardId;
use wire::{ErrorCode, MongoError, Result};

use super::transport::{ShardTransport, Shards, cursor_id, first_batch, next_batch};

/// The config shard's index in the transport.
const CONFIG_SHARD: ShardId = ShardId::CONFIG;

/// The config shard's collections, over the transport.
pub struct ConfigStore {
    transport: Arc<ShardTransport>,
}

impl ConfigStore {
    pub fn new(transport: Arc<ShardTransport>) -> ConfigStore {
        ConfigStore { transport }
    }

    /// Every document of `db.coll` matching `filter`, read to its end.
    pub async fn find(&self, db: &str, coll: &str, filter: Document) -> Result<Vec<Document>> {
        let find = doc! {"find": coll, "filter": filter, "batchSize": i32::MAX};
        let reply = self.transport.read(CONFIG_SHARD, db, find).await?;
        let mut docs = first_batch(&reply)?;
        let mut id = cursor_id(&reply);
        while id != 0 {
            let more = doc! {"getMore": id, "collection": coll};
            let more = self.transport.command(CONFIG_SHARD, db, more).await?;
            docs.extend(next_batch(&more)?);
            id = cursor_id(&more);
        }
        Ok(docs)
    }

    /// The first document of `db.coll` matching `filter`, if any.
    pub async fn find_one(
        &self,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<Option<Document>> {
        let find = doc! {"find": coll, "filter": filter, "limit": 1};
        let reply = self.transport.read(CONFIG_SHARD, db, find).await?;
        Ok(first_batch(&reply)?.into_iter().next())
    }

    /// The document of `db.coll` with `doc`'s `_id`: the stored one, or `doc` once inserted.
    /// When another router inserts its own first, that one is returned (ours is refused as a
    /// duplicate), so every caller agrees on one document.
    pub async fn get_or_insert(&self, db: &str, coll: &str, doc: Document) -> Result<Document> {
        let id = doc
            .get("_id")
            .cloned()
            .ok_or_else(|| MongoError::internal("get_or_insert of a document without _id"))?;
        if let Some(found) = self.find_one(db, coll, doc! {"_id": id.clone()}).await? {
            return Ok(found);
        }
        let insert = doc! {"insert": coll, "documents": [doc.clone()]};
        let reply = self.transport.command(CONFIG_SHARD, db, insert).await?;
        match first_write_error(&reply) {
            None => Ok(doc),
            Some(e) if e.code == ErrorCode::DUPLICATE_KEY.code => self
                .find_one(db, coll, doc! {"_id": id})
                .await?
                .ok_or_else(|| {
                    MongoError::internal(format!("{db}.{coll}: a racing insert vanished"))
                }),
            Some(e) => Err(e),
        }
    }

    /// Applies `update` to the document of `db.coll` matching `expected` (its `_id` and the
    /// fields the caller read), if one still does; returns whether it did. A `false` means
    /// another writer changed the document first: read it again and decide again.
    pub async fn cas(
        &self,
        db: &str,
        coll: &str,
        expected: Document,
        update: Document,
    ) -> Result<bool> {
        let cmd = doc! {"update": coll, "updates": [{"q": expected, "u": update}]};
        let reply = self.transport.command(CONFIG_SHARD, db, cmd).await?;
        if let Some(e) = first_write_error(&reply) {
            return Err(e);
        }
        Ok(matches!(reply.get("n"), Some(Bson::Int32(n)) if *n > 0)
            || matches!(reply.get("n"), Some(Bson::Int64(n)) if *n > 0))
    }
}

/// The first `writeErrors` entry of a write's reply, as an error.
fn first_write_error(reply: &Document) -> Option<MongoError> {
    let first = reply
        .get_array("writeErrors")
        .ok()?
        .first()?
        .as_document()?;
    let code = first
        .get_i32("code")
        .unwrap_or(ErrorCode::INTERNAL_ERROR.code);
    let message = first.get_str("errmsg").unwrap_or_default();
    Some(MongoError::with_code(code, message))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kernel::clock::ClusterClock;
    use crate::kernel::shard_client::{LocalShard, ShardClient};

    /// A config shard on disk, and a transport to it.
    async fn config_shard(dir: &std::path::Path) -> Arc<ShardTransport> {
        let shard = shard::Shard::open(shard::ShardOptions {
            dbpath: dir.to_path_buf(),
            name: "shard0".into(),
            clock: Arc::new(shard::SystemClock),
        })
        .await
        .expect("a shard opens");
        let client: Arc<dyn ShardClient> = Arc::new(LocalShard::new(shard));
        Arc::new(ShardTransport::new(
            vec![client],
            Arc::new(ClusterClock::new()),
            Duration::from_secs(5),
        ))
    }

    #[tokio::test]
    async fn racing_get_or_insert_callers_all_get_the_one_stored_document() {
        let dir = tempfile::tempdir().unwrap();
        let transport = config_shard(dir.path()).await;
        // Two routers' stores over the same config shard, each with a document of its own.
        let stores: Vec<ConfigStore> = (0..2)
            .map(|_| ConfigStore::new(transport.clone()))
            .collect();
        let got = futures::future::join_all(stores.iter().enumerate().map(|(i, store)| {
            store.get_or_insert("config", "version", doc! {"_id": 1, "by": i as i32})
        }))
        .await;
        let got: Vec<Document> = got.into_iter().map(|r| r.expect("get_or_insert")).collect();
        assert_eq!(got[0], got[1], "both callers agree");
        let stored = stores[0]
            .find("config", "version", doc! {})
            .await
            .expect("find");
        assert_eq!(stored, vec![got[0].clone()], "one document was stored");
        let again = stores[1]
            .get_or_insert("config", "version", doc! {"_id": 1, "by": 7})
            .await
            .expect("get_or_insert");
        assert_eq!(again, got[0], "a later caller gets the stored one too");
    }

    #[tokio::test]
    async fn cas_changes_a_document_only_while_it_still_matches() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConfigStore::new(config_shard(dir.path()).await);
        store
            .get_or_insert(
                "config",
                "leases",
                doc! {"_id": "a", "owner": "r1", "epoch": 1},
            )
            .await
            .expect("insert");
        let read = doc! {"_id": "a", "epoch": 1};
        let take = doc! {"$set": {"owner": "r2", "epoch": 2}};
        assert!(
            store
                .cas("config", "leases", read.clone(), take)
                .await
                .unwrap()
        );
        let stale = doc! {"$set": {"owner": "r3", "epoch": 2}};
        assert!(
            !store.cas("config", "leases", read, stale).await.unwrap(),
            "a decision made on what was read before the change loses"
        );
        let now = store
            .find_one("config", "leases", doc! {"_id": "a"})
            .await
            .unwrap()
            .expect("the document");
        assert_eq!(now.get_str("owner").unwrap(), "r2");
        let missing = store
            .cas(
                "config",
                "leases",
                doc! {"_id": "b"},
                doc! {"$set": {"x": 1}},
            )
            .await
            .unwrap();
        assert!(!missing, "no document, no change (and none made)");
        assert!(
            store
                .find_one("config", "leases", doc! {"_id": "b"})
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_failed_write_is_an_error_not_a_missed_compare() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConfigStore::new(config_shard(dir.path()).await);
        store
            .get_or_insert("config", "leases", doc! {"_id": "a", "n": 1})
            .await
            .unwrap();
        // `$inc` of a string field fails on the shard: the caller learns why.
        store
            .cas(
                "config",
                "leases",
                doc! {"_id": "a"},
                doc! {"$set": {"n": "x"}},
            )
            .await
            .unwrap();
        let err = store
            .cas(
                "config",
                "leases",
                doc! {"_id": "a"},
                doc! {"$inc": {"n": 1}},
            )
            .await
            .expect_err("a type error");
        assert_eq!(err.code, ErrorCode::TYPE_MISMATCH.code);
    }
}
