//! TTL indexes: a background pass deletes the documents whose indexed date (the earliest, for
//! an array of dates) is more than the index's `expireAfterSeconds` in the past, as MongoDB's
//! TTL monitor does. Every `ttlMonitorSleepSecs` (60 by default, a runtime parameter).
//!
//! The deletes are ordinary deletes through the writer, so they write oplog entries and reach
//! change streams as `delete` events (with pre-images where the collection records them).
//!
//! Invariants: a document is deleted only if, at the moment of the delete (inside the writer's
//! job), it still matches the expiry filter; documents whose indexed field is not a date (or
//! an array holding one) never expire; one pass deletes at most [`MAX_PER_PASS`] documents
//! (the next pass takes the rest), in writer jobs of at most [`BATCH`], so writers wait for
//! it no longer than for one batch and it never holds more than a batch in memory.

use std::sync::atomic::{AtomicU64, Ordering};

use bson::{Bson, Document, doc};
use wire::MongoError;

use crate::Shard;
use crate::catalog::CollectionEntry;
use crate::query::Filter;
use crate::write::batches::{BATCH, Cursor};
use crate::writer::{OpError, WriteCtx, WriteOutput};

/// The most documents one pass deletes.
pub const MAX_PER_PASS: usize = 10_000;

/// MongoDB's default `ttlMonitorSleepSecs`.
pub const DEFAULT_SLEEP_SECS: u64 = 60;

/// The pass interval, in seconds (`ttlMonitorSleepSecs`).
#[derive(Debug)]
pub struct SleepSecs(AtomicU64);

impl Default for SleepSecs {
    fn default() -> Self {
        SleepSecs(AtomicU64::new(DEFAULT_SLEEP_SECS))
    }
}

impl SleepSecs {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, secs: u64) -> u64 {
        self.0.swap(secs, Ordering::Relaxed)
    }
}

/// The filter selecting a TTL index's expired documents at `now_ms`, if `spec` is a TTL
/// index (one key field and `expireAfterSeconds`).
pub fn expiry_filter(spec: &Document, now_ms: i64) -> Option<Document> {
    let key = spec.get_document("key").ok()?;
    if key.len() != 1 {
        return None;
    }
    let field = key.keys().next()?;
    let secs = pipeline::value::as_f64(spec.get("expireAfterSeconds")?)?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    let cutoff = now_ms.saturating_sub((secs * 1000.0) as i64);
    // `$lt` on a date matches only dates (type bracketing), and an array when any element,
    // so its earliest, is before the cutoff.
    let expired = doc! {field: {"$lt": bson::DateTime::from_millis(cutoff)}};
    Some(match spec.get_document("partialFilterExpression") {
        Ok(pfe) => doc! {"$and": [pfe.clone(), expired]},
        Err(_) => expired,
    })
}

/// One TTL pass over every collection of the shard; returns how many documents it deleted.
pub async fn run(shard: &Shard) -> Result<usize, MongoError> {
    let now_ms = shard.state().now_millis() as i64;
    let work: Vec<(String, String, Document)> = shard
        .state()
        .catalog()
        .collections()
        .flat_map(|c| {
            c.indexes
                .iter()
                .filter_map(|spec| expiry_filter(spec, now_ms))
                .map(|f| (c.db.clone(), c.name.clone(), f))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut deleted = 0;
    for (db, name, filter) in work {
        let Ok(filter) = Filter::parse(&filter) else {
            continue;
        };
        let filter = std::sync::Arc::new(filter);
        // A job per batch, so writers wait for the pass no longer than for one batch. A
        // batch that deletes nothing (its documents are held) ends the collection's pass.
        while deleted < MAX_PER_PASS {
            let (db, name, filter) = (db.clone(), name.clone(), filter.clone());
            let max = BATCH.min(MAX_PER_PASS - deleted);
            let job = move |w: &mut WriteCtx<'_>| {
                let n = match w.catalog().lookup(&db, &name).cloned() {
                    Some(coll) => expire(w, &coll, &filter, max)?,
                    None => 0,
                };
                Ok(WriteOutput {
                    reply: doc! {"n": n as i64, "ok": 1.0},
                    op_time: None,
                })
            };
            let out = shard.writer().submit(Box::new(job)).await?;
            let n = out.reply.get_i64("n").unwrap_or(0) as usize;
            deleted += n;
            if n < max {
                break;
            }
        }
    }
    Ok(deleted)
}

/// Deletes up to `max` expired documents of one collection.
fn expire(
    w: &mut WriteCtx<'_>,
    coll: &CollectionEntry,
    filter: &Filter,
    max: usize,
) -> crate::storage::StorageResult<usize> {
    let batch = match Cursor::default().next_batch(w.txn(), coll, filter, max) {
        Ok(b) => b,
        Err(OpError::Storage(e)) => return Err(e),
        Err(OpError::Mongo(_)) => return Ok(0),
    };
    let mut n = 0;
    for (_, d) in &batch.docs {
        match crate::write::ops::delete_one(w, coll, d, None, 0) {
            Ok(_) => n += 1,
            Err(OpError::Storage(e)) => return Err(e),
            // Held by a prepared transaction: the next pass tries again.
            Err(OpError::Mongo(_)) => {}
        }
    }
    Ok(n)
}

/// `setParameter: {ttlMonitorSleepSecs: n}` on a shard: the previous value.
pub fn set_sleep(shard: &Shard, v: &Bson) -> Result<u64, MongoError> {
    match pipeline::value::as_i64_exact(v) {
        Some(n) if n > 0 => Ok(shard.ttl_sleep().set(n as u64)),
        _ => Err(MongoError::bad_value(
            "ttlMonitorSleepSecs must be a positive integer",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_field_indexes_with_expire_after_seconds_are_ttl() {
        let ttl = doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 10};
        assert_eq!(
            expiry_filter(&ttl, 60_000),
            Some(doc! {"at": {"$lt": bson::DateTime::from_millis(50_000)}})
        );
        assert_eq!(
            expiry_filter(&doc! {"key": {"at": 1}, "name": "at_1"}, 0),
            None
        );
        let compound = doc! {"key": {"a": 1, "b": 1}, "name": "ab", "expireAfterSeconds": 1};
        assert_eq!(expiry_filter(&compound, 0), None);
        let partial = doc! {"key": {"at": 1}, "name": "p", "expireAfterSeconds": 0, "partialFilterExpression": {"kind": "tmp"}};
        assert_eq!(
            expiry_filter(&partial, 5),
            Some(doc! {"$and": [{"kind": "tmp"}, {"at": {"$lt": bson::DateTime::from_millis(5)}}]})
        );
    }

    #[test]
    fn the_filter_matches_dates_and_arrays_by_their_earliest_date_only() {
        let spec = doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 0};
        let f = pipeline::Matcher::parse(&expiry_filter(&spec, 1_000).unwrap()).unwrap();
        let d = |ms| Bson::DateTime(bson::DateTime::from_millis(ms));
        assert!(f.matches(&doc! {"at": d(999)}));
        assert!(!f.matches(&doc! {"at": d(1_000)}));
        assert!(f.matches(&doc! {"at": [d(5_000), d(10)]}));
        assert!(!f.matches(&doc! {"at": "yesterday"}));
        assert!(!f.matches(&doc! {"at": 5}));
        assert!(!f.matches(&doc! {}));
    }
}
