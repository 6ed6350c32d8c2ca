//! Cluster metadata as the router sees it: which shard is each database's primary, and which
//! collections are sharded (UUID, key, chunks). The source of truth is the `config` database
//! on the config shard (shard 0): `config.databases`, `config.collections`, `config.chunks`.
//! This module caches it.
//!
//! Invariants: cache entries are replaced whole, never edited in place, so a reader sees one
//! consistent version of a collection's routing. An entry older than [`MAX_AGE`] is reloaded
//! before use, so a change made by another router is seen within that time; a change made by
//! this router is applied to the cache at once. The cache holds at most [`MAX_ENTRIES`] names
//! of each kind (clients choose them): past it, stale entries go first, then all.

/// The most databases, and the most collections, the cache holds.
pub const MAX_ENTRIES: usize = 10_000;

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
        insert_bounded(&mut lock(&self.databases), db, entry, now);
    }

    pub fn collection(&self, ns: &str, now: Instant) -> Option<Option<Arc<ShardedCollection>>> {
        lock(&self.collections).get(ns).and_then(|c| c.fresh(now))
    }

    pub fn set_collection(&self, ns: &str, entry: Option<Arc<ShardedCollection>>, now: Instant) {
        insert_bounded(&mut lock(&self.collections), ns, entry, now);
    }

    /// How many databases and collections the cache holds.
    pub fn len(&self) -> (usize, usize) {
        (lock(&self.databases).len(), lock(&self.collections).len())
    }

    /// Forgets everything about a database (after `dropDatabase`).
    pub fn forget_database(&self, db: &str) {
        lock(&self.databases).remove(db);
        let prefix = format!("{db}.");
        lock(&self.collections).retain(|ns, _| !ns.starts_with(&prefix));
    }
}

/// Caches `value` under `name`; a full map first drops its stale entries, then (all fresh:
/// a client naming thousands a second) everything.
fn insert_bounded<T: Clone>(
    map: &mut HashMap<String, Cached<T>>,
    name: &str,
    value: T,
    now: Instant,
) {
    if map.len() >= MAX_ENTRIES && !map.contains_key(name) {
        map.retain(|_, c| c.fresh(now).is_some());
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
    }
    map.insert(name.to_string(), Cached { loaded: now, value });
}

/// The cache's locks are never held across `.await` and never poisoned by our code; a poisoned
/// lock still holds a consistent map (entries are replaced whole), so recover it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    #[test]
    fn the_cache_holds_at_most_its_bound_of_names() {
        let cache = MetadataCache::default();
        let now = Instant::now();
        for i in 0..MAX_ENTRIES + 5 {
            cache.set_collection(&format!("d.c{i}"), None, now);
            cache.set_database(&format!("d{i}"), None, now);
        }
        let (dbs, colls) = cache.len();
        assert!(dbs <= MAX_ENTRIES && colls <= MAX_ENTRIES, "{dbs} {colls}");
        // The newest entry is always kept.
        let last = MAX_ENTRIES + 4;
        assert!(cache.collection(&format!("d.c{last}"), now).is_some());
        // Stale entries go first: one fresh entry survives a fill of stale ones.
        let cache = MetadataCache::default();
        let old = now - MAX_AGE * 2;
        for i in 0..MAX_ENTRIES - 1 {
            cache.set_collection(&format!("d.old{i}"), None, old);
        }
        cache.set_collection("d.fresh", None, now);
        cache.set_collection("d.newer", None, now);
        assert_eq!(cache.len().1, 2);
        assert!(cache.collection("d.fresh", now).is_some());
    }
}
