//! Snapshot reads outside transactions (`readConcern: {level: "snapshot"}` on `find`,
//! `aggregate` and `distinct`): the router fixes the cluster time every shard reads at, so a
//! read that spans shards sees one consistent cut of the cluster, and tells the client which
//! time it was (`atClusterTime` in the cursor, as mongos does), so it can, for example, watch
//! the changes after exactly that point (`startAtOperationTime`).
//!
//! Invariant: every shard a snapshot read reaches reads as of the same `atClusterTime`, given
//! by the client or chosen here as the router's current cluster time (everything the client can
//! have seen is at or before it).

use bson::raw::{RawBsonRef, RawDocument, RawDocumentBuf, cstr};
use bson::{Bson, Document, Timestamp};
use wire::raw::Body;
use wire::{ErrorCode, MongoError, Result};

/// The commands that take `readConcern: snapshot` outside a transaction.
const SNAPSHOT_READS: &[&str] = &["find", "aggregate", "distinct"];

/// For a snapshot read: the command with its `atClusterTime` fixed (the client's, else
/// `now()`, the router's cluster time), and that time.
pub(crate) fn pin(
    name: &str,
    cmd: &Document,
    now: impl FnOnce() -> Timestamp,
) -> Result<Option<(Document, Timestamp)>> {
    if crate::txn::in_transaction(cmd) {
        return Ok(None);
    }
    let Ok(rc) = cmd.get_document("readConcern") else {
        return Ok(None);
    };
    if !rc.get_str("level").is_ok_and(|l| l == "snapshot") {
        return Ok(None);
    }
    if !SNAPSHOT_READS.contains(&name) {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            format!("readConcern level snapshot is not supported for {name} outside a transaction"),
        ));
    }
    let at = match rc.get("atClusterTime") {
        Some(Bson::Timestamp(t)) => *t,
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "BSON field 'readConcern.atClusterTime' is the wrong type, expected type 'timestamp'",
            ));
        }
        None => now(),
    };
    let mut pinned = cmd.clone();
    let mut rc = rc.clone();
    rc.insert("atClusterTime", at);
    pinned.insert("readConcern", rc);
    Ok(Some((pinned, at)))
}

/// The reply with the read's `atClusterTime` in its cursor (an encoded reply is copied
/// element by element with it added, its batch not decoded).
pub(crate) fn stamp(reply: Body, at: Timestamp) -> Body {
    match reply {
        Body::Document(mut d) => {
            if let Ok(c) = d.get_document_mut("cursor") {
                c.insert("atClusterTime", at);
            }
            Body::Document(d)
        }
        Body::Raw(raw) => match stamp_raw(&raw, at) {
            Ok(stamped) => Body::Raw(stamped),
            Err(_) => Body::Raw(raw),
        },
        other => other,
    }
}

fn stamp_raw(reply: &RawDocument, at: Timestamp) -> bson::error::Result<RawDocumentBuf> {
    let mut out = RawDocumentBuf::new();
    for element in reply {
        let (key, value) = element?;
        match value {
            RawBsonRef::Document(cursor) if key.as_str() == "cursor" => {
                let mut stamped = RawDocumentBuf::new();
                for field in cursor {
                    let (k, v) = field?;
                    stamped.append(k, v);
                }
                stamped.append(cstr!("atClusterTime"), at);
                out.append(key, stamped);
            }
            _ => out.append(key, value),
        }
    }
    Ok(out)
}
