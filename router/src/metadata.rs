//! Cluster metadata as the router sees it: which shard is each database's primary, and which
//! collections are sharded (UUID, key, chunks). The source of truth is the `config` database
//! on the config shard (shard 0): `config.databases`, `config.collections`, `config.chunks`.
//! This module caches it.
//!
//! Invariants: cache entries are replaced whole, never edited in place, so a reader sees one
//! consistent version of a collection's routing. An entry older than [`MAX_AGE`] is reloaded
//! before use, so a change made by another router is seen within that time; a change made by
//! this router is applied to the cache at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

use crate::routing::{ChunkTable, ShardKey};

/// How long a cached metadata entry is trusted.
pub const MAX_AGE: Duration = Duration::from_millis(500);

pub const CONFIG_DB: &str = "config";

/// A database's entry in `config.databases`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseEntry {
    pub name: String,
    pub primary: String,
}

/// A sharded collection's entry in `config.collections` with its chunks.
#[derive(Debug, Clone)]
pub struct ShardedCollection {
    pub ns: String,
    pub uuid: bson::Binary,
    pub key: ShardKey,
    pub unique: bool,
    pub chunks: ChunkTable,
}

impl ShardedCollection {
    pub fn to_document(&self) -> Document {
        doc! {
            "_id": &self.ns,
            "uuid": self.uuid.clone(),
            "key": self.key.pattern(),
            "unique": self.unique,
        }
    }

    pub fn from_documents(coll: &Document, chunks: &[Document]) -> Result<ShardedCollection> {
        let bad = || {
            MongoError::new(
                ErrorCode::INCOMPATIBLE_SHARDING_METADATA,
                format!("malformed config.collections entry {coll}"),
            )
        };
        let ns = coll.get_str("_id").map_err(|_| bad())?.to_string();
        let uuid = match coll.get("uuid") {
            Some(Bson::Binary(b)) => b.clone(),
            _ => return Err(bad()),
        };
        let key = ShardKey::parse(coll.get_document("key").map_err(|_| bad())?)?;
        let unique = coll.get_bool("unique").unwrap_or(false);
        let chunks = ChunkTable::from_documents(&key, chunks)?;
        Ok(ShardedCollection {
            ns,
            uuid,
            key,
            unique,
            chunks,
        })
    }
}

/// Where the router routes a namespace.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Not sharded: all of it lives on the database's primary shard.
    Unsharded {
        primary: String,
    },
    Sharded(Arc<ShardedCollection>),
}

impl Placement {
    /// The `shardVersion` sent with a command routed by this placement, so a shard whose
    /// catalog disagrees answers `StaleConfig` instead of running it.
    pub fn version(&self) -> Document {
        match self {
            Placement::Unsharded { .. } => doc! {"sharded": false},
            Placement::Sharded(sc) => doc! {"sharded": true, "uuid": sc.uuid.clone()},
        }
    }
}

struct Cached<T> {
    loaded: Instant,
    value: T,
}

impl<T: Clone> Cached<T> {
    fn fresh(&self, now: Instant) -> Option<T> {
        (now.duration_since(self.loaded) < MAX_AGE).then(|| self.value.clone())
    }
}

/// The metadata cache. Loading and writing go through the router (it owns the shard clients),
/// so this type only stores what was loaded.
#[derive(Default)]
pub struct MetadataCache {
    databases: Mutex<HashMap<String, Cached<Option<DatabaseEntry>>>>,
    collections: Mutex<HashMap<String, Cached<Option<Arc<ShardedCollection>>>>>,
}

impl MetadataCache {
    pub fn database(&self, db: &str, now: Instant) -> Option<Option<DatabaseEntry>> {
        lock(&self.databases).get(db).and_then(|c| c.fresh(now))
    }

    pub fn set_database(&self, db: &str, entry: Option<DatabaseEntry>, now: Instant) {
        lock(&self.databases).insert(
            db.to_string(),
            Cached {
                loaded: now,
                value: entry,
            },
        );
    }

    pub fn collection(&self, ns: &str, now: Instant) -> Option<Option<Arc<ShardedCollection>>> {
        lock(&self.collections).get(ns).and_then(|c| c.fresh(now))
    }

    pub fn set_collection(&self, ns: &str, entry: Option<Arc<ShardedCollection>>, now: Instant) {
        lock(&self.collections).insert(
            ns.to_string(),
            Cached {
                loaded: now,
                value: entry,
            },
        );
    }

    /// Forgets everything about a database (after `dropDatabase`).
    pub fn forget_database(&self, db: &str) {
        lock(&self.databases).remove(db);
        let prefix = format!("{db}.");
        lock(&self.collections).retain(|ns, _| !ns.starts_with(&prefix));
    }
}

/// The cache's locks are never held across `.await` and never poisoned by our code; a poisoned
/// lock still holds a consistent map (entries are replaced whole), so recover it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
