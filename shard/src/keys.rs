//! Storage keys of documents: collection UUID bytes followed by the KeyString of `_id`; and of
//! change-stream pre-images: collection UUID, `ts`, `applyOpsIndex`.
//!
//! Invariants: two `_id` values MongoDB considers equal (int32 1, int64 1, double 1.0) give the
//! same key, and key byte order is BSON order within a collection; pre-image keys of one
//! collection sort by `(ts, applyOpsIndex)`.

use bson::{Bson, Uuid};

/// The storage key of the document with this `_id` in the collection `uuid`.
pub fn doc_key(uuid: &Uuid, id: &Bson) -> Vec<u8> {
    let mut k = collection_prefix(uuid);
    k.extend_from_slice(&id_bytes(id));
    k
}

/// The key prefix of every document of a collection.
pub fn collection_prefix(uuid: &Uuid) -> Vec<u8> {
    uuid.bytes().to_vec()
}

/// The storage key of the pre-image of the write at `(ts, apply_ops_index)` in collection
/// `uuid` (`apply_ops_index` is the op's index in its `applyOps` entry, 0 outside one).
pub fn pre_image_key(uuid: &Uuid, ts: resume::ClusterTime, apply_ops_index: u64) -> Vec<u8> {
    let mut k = collection_prefix(uuid);
    k.extend_from_slice(&ts.as_u64().to_be_bytes());
    k.extend_from_slice(&apply_ops_index.to_be_bytes());
    k
}

fn id_bytes(id: &Bson) -> Vec<u8> {
    resume::keystring::key_bytes(id)
}
