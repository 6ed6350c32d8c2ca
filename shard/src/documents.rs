//! A collection's stored documents, read through any transaction: decoding one and visiting
//! them all in `_id` order.

use bson::Document;

use crate::catalog::CollectionEntry;
use crate::keys;
use crate::storage::{KeyRange, ReadTxn, Scan, StorageError, StorageResult, Table};

pub fn decode_doc(bytes: &[u8]) -> Option<Document> {
    Document::from_reader(bytes).ok()
}

/// Visits a collection's documents in `_id` order through any transaction.
pub fn scan_collection(
    txn: &dyn ReadTxn,
    coll: &CollectionEntry,
    visit: &mut dyn FnMut(Document) -> Scan,
) -> StorageResult<()> {
    let range = KeyRange::prefix(&keys::collection_prefix(&coll.uuid));
    let mut result = Ok(());
    txn.scan(
        Table::Documents,
        &range,
        false,
        &mut |_, v| match decode_doc(v) {
            Some(d) => visit(d),
            None => {
                result = Err(StorageError::Engine(
                    "undecodable document in storage".into(),
                ));
                Scan::Stop
            }
        },
    )?;
    result
}
