//! Storage keys of documents: collection UUID bytes followed by the KeyString of `_id`.
//!
//! Invariant: two `_id` values MongoDB considers equal (int32 1, int64 1, double 1.0) give the
//! same key, and key byte order is BSON order within a collection.

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

fn id_bytes(id: &Bson) -> Vec<u8> {
    resume::keystring::key_bytes(id)
}
