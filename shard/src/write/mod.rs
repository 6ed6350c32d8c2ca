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
