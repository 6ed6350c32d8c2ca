//! `collStats` and `dbStats` on one shard: documents counted and measured by a scan of their
//! stored bytes (the shard keeps no running totals), indexes by their definitions.
//!
//! Invariants: sizes are the documents' BSON sizes as stored; `storageSize` and index sizes
//! are estimates (redb shares one file between every table), never below the data they
//! describe; a collection or database that does not exist reports zeros, as MongoDB 7.0's
//! commands do.

use bson::{Document, doc};
use wire::MongoError;

use super::{Ctx, Reply};
use crate::catalog::CollectionEntry;
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, Table};

/// What one collection holds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub count: i64,
    pub size: i64,
}

/// Counts and measures a collection's documents from their stored bytes.
pub fn usage(txn: &dyn ReadTxn, coll: &CollectionEntry) -> Result<Usage, MongoError> {
    let mut u = Usage::default();
    let range = KeyRange::prefix(&keys::collection_prefix(&coll.uuid));
    txn.scan(Table::Documents, &range, false, &mut |_, v| {
        u.count += 1;
        u.size += v.len() as i64;
        Scan::Continue
    })
    .map_err(|e| MongoError::internal(format!("storage: {e}")))?;
    Ok(u)
}

/// An index's estimated size: its share of the documents' keys (at least one page).
fn index_size(u: Usage) -> i64 {
    (u.count * 32).max(4096)
}

fn storage_size(u: Usage) -> i64 {
    u.size.max(4096)
}

fn scale_of(ctx: &Ctx<'_>) -> Result<i64, MongoError> {
    match ctx.cmd.get("scale").and_then(super::as_i64) {
        None => Ok(1),
        Some(s) if s >= 1 => Ok(s),
        Some(_) => Err(MongoError::bad_value("scale has to be >= 1")),
    }
}

/// `collStats: <collection>`.
pub fn coll_stats(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let scale = scale_of(ctx)?;
    let ns = format!("{}.{coll}", ctx.db);
    ctx.read(|txn, catalog| {
        let entry = catalog.lookup(&ctx.db, &coll);
        let u = match entry {
            Some(c) => usage(txn, c)?,
            None => Usage::default(),
        };
        let indexes: Vec<String> = entry.map_or_else(Vec::new, |c| {
            c.all_indexes()
                .iter()
                .filter_map(|i| i.get_str("name").ok().map(str::to_string))
                .collect()
        });
        let mut sizes = Document::new();
        for name in &indexes {
            sizes.insert(name, index_size(u) / scale);
        }
        let total_index = index_size(u) * indexes.len() as i64;
        Ok(Reply::read(doc! {
            "ns": ns,
            "size": u.size / scale,
            "count": u.count,
            "avgObjSize": if u.count > 0 { u.size / u.count } else { 0 },
            "storageSize": if entry.is_some() { storage_size(u) / scale } else { 0 },
            "nindexes": indexes.len() as i32,
            "totalIndexSize": total_index / scale,
            "totalSize": (if entry.is_some() { storage_size(u) } else { 0 } + total_index) / scale,
            "indexSizes": sizes,
            "scaleFactor": scale,
            "ok": 1.0,
        }))
    })
}

/// `dbStats: 1`.
pub fn db_stats(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let scale = scale_of(ctx)?;
    ctx.read(|txn, catalog| {
        let (mut collections, mut views, mut objects, mut data, mut storage) = (0, 0, 0, 0, 0);
        let (mut indexes, mut index_bytes) = (0i64, 0i64);
        for c in catalog.collections_in(&ctx.db) {
            if c.options.contains_key("viewOn") {
                views += 1;
                continue;
            }
            collections += 1;
            let u = usage(txn, c)?;
            objects += u.count;
            data += u.size;
            storage += storage_size(u);
            let n = c.all_indexes().len() as i64;
            indexes += n;
            index_bytes += index_size(u) * n;
        }
        Ok(Reply::read(doc! {
            "db": &ctx.db,
            "collections": collections,
            "views": views,
            "objects": objects,
            "avgObjSize": if objects > 0 { data as f64 / objects as f64 } else { 0.0 },
            "dataSize": data as f64 / scale as f64,
            "storageSize": storage as f64 / scale as f64,
            "indexes": indexes,
            "indexSize": index_bytes as f64 / scale as f64,
            "totalSize": (storage + index_bytes) as f64 / scale as f64,
            "scaleFactor": scale,
            "ok": 1.0,
        }))
    })
}
