//! Change-stream pre-images kept by the shard (`Table::PreImages`, written by the writer with
//! each update, replace and delete of a collection that records them): their expiry and the
//! purge of expired ones, and the cluster parameter that sets it (`changeStreamOptions`, as
//! MongoDB's `setClusterParameter` / `getClusterParameter`).
//!
//! A pre-image expires once its write is older than the oldest oplog entry (no stream can
//! reach its event any more), or, with `preAndPostImages.expireAfterSeconds: N`, once its
//! write is more than N seconds old. The purge runs in the background every
//! [`PURGE_INTERVAL`] as a writer job of bounded size, so writers wait for it no longer than
//! for any other batch.
//!
//! Invariants: a pre-image whose event a stream can still read is kept unless its age passed
//! `expireAfterSeconds`; the parameter is durable (the `Meta` table) and answered as set.

use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::Shard;
use crate::storage::{KeyRange, Scan, StorageError, Table};
use crate::writer::{WriteCtx, WriteOutput};

/// How often the background purge runs (MongoDB's
/// `expiredChangeStreamPreImageRemovalJobSleepSecs`).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(10);

/// The most pre-images one purge job deletes (the next pass takes the rest).
const PURGE_BATCH: usize = 10_000;

/// `Meta` key of the `changeStreamOptions` cluster parameter.
const PARAMETER_KEY: &[u8] = b"clusterParameter.changeStreamOptions";

/// The parameter's name.
pub const CHANGE_STREAM_OPTIONS: &str = "changeStreamOptions";

/// `expireAfterSeconds` of a `changeStreamOptions` value: `Ok(None)` for `"off"` (or unset).
pub fn expire_after(options: &Document) -> Result<Option<u64>, MongoError> {
    let Some(images) = options.get("preAndPostImages") else {
        return Ok(None);
    };
    let Bson::Document(images) = images else {
        return Err(MongoError::type_mismatch(
            "changeStreamOptions.preAndPostImages must be an object",
        ));
    };
    match images.get("expireAfterSeconds") {
        None => Ok(None),
        Some(Bson::String(s)) if s == "off" => Ok(None),
        Some(v) => match pipeline::value::as_i64_exact(v) {
            Some(n) if n > 0 => Ok(u64::try_from(n).ok()),
            _ => Err(MongoError::bad_value(
                "changeStreamOptions.preAndPostImages.expireAfterSeconds must be \"off\" or a \
                 positive number of seconds",
            )),
        },
    }
}

/// Checks a `setClusterParameter` value of `changeStreamOptions` (only `preAndPostImages`).
pub fn validate(options: &Document) -> Result<(), MongoError> {
    if let Some(k) = options.keys().find(|k| k.as_str() != "preAndPostImages") {
        return Err(MongoError::with_code(
            40415,
            format!("BSON field 'changeStreamOptions.{k}' is an unknown field."),
        ));
    }
    expire_after(options).map(|_| ())
}

/// The stored `changeStreamOptions` (`expireAfterSeconds: "off"` when never set).
pub fn parameter(shard: &Shard) -> Result<Document, MongoError> {
    let read = shard.state().storage.begin_read().map_err(storage)?;
    let stored = read.get(Table::Meta, PARAMETER_KEY).map_err(storage)?;
    Ok(stored
        .and_then(|b| Document::from_reader(b.as_slice()).ok())
        .unwrap_or_else(|| {
            doc! {"_id": CHANGE_STREAM_OPTIONS, "preAndPostImages": {"expireAfterSeconds": "off"}}
        }))
}

/// Stores `changeStreamOptions` (already validated) durably, stamped with the time it was set.
pub async fn set_parameter(shard: &Shard, options: Document) -> Result<(), MongoError> {
    validate(&options)?;
    let job = move |w: &mut WriteCtx<'_>| {
        let time = w.state().cluster_time();
        let mut stored =
            doc! {"_id": CHANGE_STREAM_OPTIONS, "clusterParameterTime": time.timestamp()};
        stored.extend(options);
        let mut bytes = Vec::new();
        stored
            .to_writer(&mut bytes)
            .map_err(|e| StorageError::Engine(format!("a cluster parameter: {e}")))?;
        w.txn_mut().put(Table::Meta, PARAMETER_KEY, &bytes)?;
        Ok(WriteOutput {
            reply: doc! {"ok": 1.0},
            op_time: None,
        })
    };
    shard.writer().submit(Box::new(job)).await.map(|_| ())
}

/// Whether the pre-image under `key` (collection UUID ++ ts ++ index) has expired: its entry
/// is truncated, or it is older than `expire_after` and no retention pin holds it (its ts is
/// before `pinned_from`, the oldest live pin's).
pub fn expired(
    key: &[u8],
    oldest_needed: ClusterTime,
    expire_after: Option<u64>,
    now_secs: u64,
    pinned_from: Option<ClusterTime>,
) -> bool {
    let Some(ts) = key
        .get(16..24)
        .and_then(|b| b.try_into().ok())
        .map(|b: [u8; 8]| ClusterTime::from_u64(u64::from_be_bytes(b)))
    else {
        return true;
    };
    let pinned = pinned_from.is_some_and(|p| ts >= p);
    ts < oldest_needed
        || (!pinned
            && expire_after.is_some_and(|n| u64::from(ts.secs).saturating_add(n) < now_secs))
}

/// One purge pass: deletes up to [`PURGE_BATCH`] expired pre-images in one writer job.
/// Returns how many it deleted.
pub async fn purge(shard: &Shard) -> Result<usize, MongoError> {
    let state = shard.state();
    let expire = expire_after(&parameter(shard)?)?;
    // Entries at or before the truncation point are gone: their pre-images can never be read.
    let oldest_needed = state.oplog_truncated_through().next();
    let now_secs = state.now_millis() / 1000;
    // A subscription's consumer still needs the pre-images its pin holds: age alone does
    // not remove them (the oplog's truncation, which the pin holds too, does).
    let pinned_from = {
        let read = state.storage.begin_read().map_err(storage)?;
        crate::pins::Pins::load(&*read)
            .map_err(storage)?
            .keep_from()
    };
    // A pre-image's key never changes meaning: what looked expired still is.
    crate::expiry::purge_pass(
        state,
        shard.writer(),
        Table::PreImages,
        PURGE_BATCH,
        move |k, _| expired(k, oldest_needed, expire, now_secs, pinned_from),
        |_, _| Ok(true),
    )
    .await
}

/// How many pre-images the shard holds, and their bytes.
pub fn stats(shard: &Shard) -> Result<(u64, u64), MongoError> {
    let read = shard.state().storage.begin_read().map_err(storage)?;
    let (mut count, mut bytes) = (0u64, 0u64);
    read.scan(Table::PreImages, &KeyRange::all(), false, &mut |_, v| {
        count += 1;
        bytes += v.len() as u64;
        Scan::Continue
    })
    .map_err(storage)?;
    Ok((count, bytes))
}

fn storage(e: StorageError) -> MongoError {
    MongoError::new(ErrorCode::INTERNAL_ERROR, format!("storage: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(secs: u32, inc: u32) -> Vec<u8> {
        crate::keys::pre_image_key(
            &bson::Uuid::from_bytes([1; 16]),
            ClusterTime::new(secs, inc),
            0,
        )
    }

    #[test]
    fn a_pre_image_expires_past_the_oplog_or_past_its_age() {
        let oldest = ClusterTime::new(100, 5);
        assert!(expired(&key(100, 4), oldest, None, 1_000, None));
        assert!(!expired(&key(100, 5), oldest, None, 1_000, None));
        assert!(!expired(&key(900, 1), oldest, None, 1_000, None));
        assert!(expired(&key(900, 1), oldest, Some(60), 1_000, None));
        assert!(!expired(&key(950, 1), oldest, Some(60), 1_000, None));
        let pin = Some(ClusterTime::new(900, 1));
        assert!(
            !expired(&key(900, 1), oldest, Some(60), 1_000, pin),
            "a pinned pre-image outlives expireAfterSeconds"
        );
        assert!(
            expired(&key(899, 1), oldest, Some(60), 1_000, pin),
            "older than the pin"
        );
        assert!(
            expired(&key(100, 4), oldest, None, 1_000, pin),
            "truncated: gone whatever pins"
        );
        assert!(
            expired(b"short", oldest, None, 0, None),
            "a damaged key goes"
        );
    }

    #[test]
    fn the_parameter_is_off_or_a_positive_number() {
        let p = |v: Bson| doc! {"preAndPostImages": {"expireAfterSeconds": v}};
        assert_eq!(expire_after(&p(Bson::String("off".into()))).unwrap(), None);
        assert_eq!(expire_after(&p(Bson::Int64(30))).unwrap(), Some(30));
        assert_eq!(expire_after(&p(Bson::Int32(30))).unwrap(), Some(30));
        for bad in [
            Bson::Int32(0),
            Bson::Int64(-1),
            Bson::String("on".into()),
            Bson::Double(1.5),
        ] {
            assert!(expire_after(&p(bad.clone())).is_err(), "{bad}");
        }
        assert!(validate(&doc! {"other": 1}).is_err());
        assert!(validate(&doc! {}).is_ok());
    }
}
