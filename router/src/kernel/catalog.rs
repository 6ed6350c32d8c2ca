//! The catalog: where the cluster's data lives, as the router sees it. Which shard is each
//! database's primary, which collections are sharded (UUID, key, chunks), and so which shards
//! a command on a namespace must reach ([`Catalog::targets`]). The source of truth is the
//! `config` database on the config shard: `config.databases`, `config.collections`,
//! `config.chunks`, read and written through the [`ConfigStore`]; this module caches it.
//!
//! Invariants: cache entries are replaced whole, never edited in place, so a reader sees one
//! consistent version of a collection's routing. An entry older than [`MAX_AGE`] is reloaded
//! before use, so a change made by another router is seen within that time; a change made by
//! this router is applied to the cache at once. The cache holds at most [`MAX_ENTRIES`] names
//! of each kind (clients choose them): past it, stale entries go first, then all. A
//! database's primary is created once, by whichever router's insert lands first; every router
//! then routes to that one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use shard::sharding::{ChunkTable, ShardId, ShardKey};
use wire::{ErrorCode, MongoError, Result};

use super::config::ConfigStore;

/// The most databases, and the most collections, the cache holds.
pub const MAX_ENTRIES: usize = 10_000;

/// How long a cached metadata entry is trusted.
pub const MAX_AGE: Duration = Duration::from_millis(500);

pub const CONFIG_DB: &str = "config";

/// A database's entry in `config.databases`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseEntry {
    pub name: String,
    pub primary: ShardId,
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
    /// Not sharded: all of it lives on the database's primary shard (`None`: the database
    /// does not exist, so there is nothing to read).
    Unsharded {
        primary: Option<ShardId>,
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

/// The catalog: the cache above, loaded from and written to the config shard.
pub struct Catalog {
    config: ConfigStore,
    /// How many shards the cluster has.
    shards: usize,
    cache: MetadataCache,
}

impl Catalog {
    pub fn new(config: ConfigStore, shards: usize) -> Catalog {
        Catalog {
            config,
            shards,
            cache: MetadataCache::default(),
        }
    }

    /// The database's entry, if it exists.
    pub async fn database(&self, db: &str) -> Result<Option<DatabaseEntry>> {
        if let Some(entry) = self.cache.database(db, Instant::now()) {
            return Ok(entry);
        }
        self.load_database(db).await
    }

    async fn load_database(&self, db: &str) -> Result<Option<DatabaseEntry>> {
        let now = Instant::now();
        let found = self
            .config
            .find_one(CONFIG_DB, "databases", doc! {"_id": db})
            .await?;
        let entry = found.map(|d| database_entry(db, &d)).transpose()?;
        self.cache.set_database(db, entry.clone(), now);
        Ok(entry)
    }

    /// The database's entry, creating it (with the least-loaded shard as primary) if needed.
    pub async fn ensure_database(&self, db: &str) -> Result<DatabaseEntry> {
        self.ensure_database_with(db, None).await
    }

    /// The database's entry, creating it with `primary` as its primary if needed (an existing
    /// database keeps its own).
    pub async fn ensure_database_on(&self, db: &str, primary: ShardId) -> Result<DatabaseEntry> {
        self.ensure_database_with(db, Some(primary)).await
    }

    async fn ensure_database_with(
        &self,
        db: &str,
        primary: Option<ShardId>,
    ) -> Result<DatabaseEntry> {
        if let Some(entry) = self.database(db).await? {
            return Ok(entry);
        }
        validate_db_name(db)?;
        let primary = match primary {
            _ if db == CONFIG_DB || db == "admin" => ShardId::CONFIG,
            Some(p) => p,
            None => self.least_loaded_shard().await?,
        };
        // A concurrent router may win the race; its choice stands.
        let ours = doc! {"_id": db, "primary": primary.to_string()};
        let stored = self
            .config
            .get_or_insert(CONFIG_DB, "databases", ours)
            .await?;
        let entry = database_entry(db, &stored)?;
        self.cache
            .set_database(db, Some(entry.clone()), Instant::now());
        Ok(entry)
    }

    /// The shard named `name` (`shard0`, …), if the cluster has it.
    pub fn shard_named(&self, name: &str) -> Option<ShardId> {
        ShardId::parse(name).filter(|s| s.index() < self.shards)
    }

    /// The shard that is the primary of the fewest databases (the first of those).
    async fn least_loaded_shard(&self) -> Result<ShardId> {
        let mut counts = vec![0usize; self.shards];
        for d in self.config.find(CONFIG_DB, "databases", doc! {}).await? {
            let primary = d.get_str("primary").ok().and_then(ShardId::parse);
            if let Some(count) = primary.and_then(|p| counts.get_mut(p.index())) {
                *count += 1;
            }
        }
        let best = (0..self.shards)
            .min_by_key(|&i| (counts[i], i))
            .unwrap_or(0);
        ShardId::new(best)
            .ok_or_else(|| MongoError::internal("more shards than a cluster may have"))
    }

    /// The sharded collection `ns`, if it is sharded.
    pub async fn sharded_collection(&self, ns: &str) -> Result<Option<Arc<ShardedCollection>>> {
        let now = Instant::now();
        if let Some(entry) = self.cache.collection(ns, now) {
            return Ok(entry);
        }
        let entry = match self
            .config
            .find_one(CONFIG_DB, "collections", doc! {"_id": ns})
            .await?
        {
            None => None,
            Some(coll) => {
                let chunks = self
                    .config
                    .find(CONFIG_DB, "chunks", doc! {"ns": ns})
                    .await?;
                Some(Arc::new(ShardedCollection::from_documents(&coll, &chunks)?))
            }
        };
        self.cache.set_collection(ns, entry.clone(), now);
        Ok(entry)
    }

    /// Where `db.coll` lives. A database that does not exist yet is created when `create` is
    /// set (writes); else there is nothing to read (`admin` and `config` live on the config
    /// shard).
    pub async fn placement(&self, db: &str, coll: &str, create: bool) -> Result<Placement> {
        let ns = format!("{db}.{coll}");
        if let Some(sharded) = self.sharded_collection(&ns).await? {
            return Ok(Placement::Sharded(sharded));
        }
        let primary = if create {
            Some(self.ensure_database(db).await?.primary)
        } else {
            match self.database(db).await? {
                Some(entry) => Some(entry.primary),
                None if db == CONFIG_DB || db == "admin" => Some(ShardId::CONFIG),
                None => None,
            }
        };
        Ok(Placement::Unsharded { primary })
    }

    /// The shards a command on a namespace placed at `placement` must reach to see every
    /// document matching `filter`: the primary of an unsharded one (none when its database
    /// does not exist); for a sharded one, the owner of the chunk the filter pins the shard key
    /// to, or every shard that owns a chunk. Under a non-simple `collation` a string in the
    /// filter pins nothing (string keys route by their binary value).
    pub fn targets(
        placement: &Placement,
        filter: &Document,
        collation: Option<&Bson>,
    ) -> Result<Vec<ShardId>> {
        match placement {
            Placement::Unsharded { primary } => Ok(primary.iter().copied().collect()),
            Placement::Sharded(sc) => Catalog::sharded_targets(sc, filter, collation),
        }
    }

    /// [`Catalog::targets`] of a sharded collection.
    pub fn sharded_targets(
        sc: &ShardedCollection,
        filter: &Document,
        collation: Option<&Bson>,
    ) -> Result<Vec<ShardId>> {
        let collated = collation
            .map(pipeline::collation::Collation::parse)
            .transpose()?
            .flatten()
            .is_some();
        // (Conservatively: a string anywhere in the filter; a hashed key no longer shows it.)
        let key = sc.key.key_of_query(filter).filter(|_| {
            !collated || !pipeline::collation::has_string(&Bson::Document(filter.clone()))
        });
        Ok(match key {
            Some(key) => vec![sc.chunks.shard_for(&key)],
            None => sc.chunks.shards(),
        })
    }

    pub fn remember_collection(&self, ns: &str, entry: Option<Arc<ShardedCollection>>) {
        self.cache.set_collection(ns, entry, Instant::now());
    }

    pub fn forget_database(&self, db: &str) {
        self.cache.forget_database(db);
    }
}

/// A `config.databases` document as an entry.
fn database_entry(db: &str, stored: &Document) -> Result<DatabaseEntry> {
    let primary = stored
        .get_str("primary")
        .ok()
        .and_then(ShardId::parse)
        .ok_or_else(|| {
            MongoError::new(
                ErrorCode::INCOMPATIBLE_SHARDING_METADATA,
                format!("malformed config.databases entry {stored}"),
            )
        })?;
    Ok(DatabaseEntry {
        name: db.to_string(),
        primary,
    })
}

/// A database name as MongoDB allows it (InvalidNamespace otherwise).
pub fn validate_db_name(db: &str) -> Result<()> {
    let bad = db.is_empty() || db.len() > 63 || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']);
    if bad {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid database name: '{db}'"),
        ));
    }
    Ok(())
}

/// What the catalog has loaded.
#[derive(Default)]
struct MetadataCache {
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
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
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

#[cfg(test)]
mod target_tests {
    use super::*;

    fn shard(i: usize) -> ShardId {
        ShardId::new(i).unwrap()
    }

    fn sharded() -> Placement {
        let key = ShardKey::parse(&doc! {"k": 1}).unwrap();
        let chunks = vec![
            doc! {"ns": "d.c", "min": {"k": Bson::MinKey}, "max": {"k": "m"}, "shard": "shard1", "lastmod": 0_i64},
            doc! {"ns": "d.c", "min": {"k": "m"}, "max": {"k": Bson::MaxKey}, "shard": "shard2", "lastmod": 1_i64},
        ];
        let coll = doc! {
            "_id": "d.c",
            "uuid": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] },
            "key": key.pattern(),
        };
        Placement::Sharded(Arc::new(
            ShardedCollection::from_documents(&coll, &chunks).unwrap(),
        ))
    }

    #[test]
    fn an_unsharded_namespace_is_on_its_primary_or_nowhere() {
        let none = Placement::Unsharded { primary: None };
        assert_eq!(Catalog::targets(&none, &doc! {}, None).unwrap(), vec![]);
        let on = Placement::Unsharded {
            primary: Some(shard(3)),
        };
        assert_eq!(
            Catalog::targets(&on, &doc! {"x": 1}, None).unwrap(),
            vec![shard(3)]
        );
    }

    #[test]
    fn a_query_that_pins_the_shard_key_reaches_one_shard_else_every_owner() {
        let p = sharded();
        assert_eq!(
            Catalog::targets(&p, &doc! {"k": "a"}, None).unwrap(),
            vec![shard(1)]
        );
        assert_eq!(
            Catalog::targets(&p, &doc! {"k": "z"}, None).unwrap(),
            vec![shard(2)]
        );
        assert_eq!(
            Catalog::targets(&p, &doc! {"k": {"$gt": "a"}}, None).unwrap(),
            vec![shard(1), shard(2)]
        );
    }

    #[test]
    fn under_a_collation_a_string_key_pins_nothing() {
        let p = sharded();
        let collation = Bson::Document(doc! {"locale": "en", "strength": 2});
        assert_eq!(
            Catalog::targets(&p, &doc! {"k": "a"}, Some(&collation)).unwrap(),
            vec![shard(1), shard(2)]
        );
        let simple = Bson::Document(doc! {"locale": "simple"});
        assert_eq!(
            Catalog::targets(&p, &doc! {"k": "a"}, Some(&simple)).unwrap(),
            vec![shard(1)]
        );
    }
}
