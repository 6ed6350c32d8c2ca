//! The write path's statements: how one document is inserted, updated or deleted with its
//! indexes, validation and capped-collection bounds kept ([`ops`]), and how a multi statement
//! runs in bounded batches across writer jobs ([`batches`]); what a transaction wrote, in order,
//! as the write-ahead log records it ([`write_set`]).
//!
//! Everything here runs inside a writer job (`writer::WriteCtx`); commands parse and reply,
//! background jobs (TTL, capped trimming) write through the same functions.

pub(crate) mod batches;
pub(crate) mod ops;
pub(crate) mod write_set;

use wire::MongoError;

use crate::storage::StorageError;

/// An error inside a write statement: client-visible, or a storage failure that dooms the batch.
#[derive(Debug)]
pub enum OpError {
    Mongo(MongoError),
    Storage(StorageError),
}

impl From<MongoError> for OpError {
    fn from(e: MongoError) -> Self {
        OpError::Mongo(e)
    }
}

impl From<StorageError> for OpError {
    fn from(e: StorageError) -> Self {
        match e {
            // An interrupted scan is the operation's own end, not a storage failure.
            StorageError::Interrupted(e) => OpError::Mongo(e),
            e => OpError::Storage(e),
        }
    }
}

pub type OpResult<T> = Result<T, OpError>;
