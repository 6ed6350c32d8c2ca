//! What the stages that read other collections (`$lookup`, `$unionWith`, `$graphLookup`) see of
//! them: each collection's documents, by name, read beforehand by a caller that sees the whole
//! cluster (the router). A trait, so the run environment ([`crate::expr::Env::foreign`])
//! carries them without naming the stages' own type ([`crate::agg::lookup::Foreign`], the one
//! implementation): expressions sit below the stages.
//!
//! Invariants: a collection the source does not hold was not read, which is not the same as one
//! read empty (the stage fails rather than join nothing); a stage looks its collection up when
//! it starts a run, never while an expression evaluates, so the dynamic call is off the
//! per-document path.

use bson::Document;

/// The documents of the other collections a pipeline reads, by collection name (same database).
pub trait ForeignSource: Send + Sync + std::fmt::Debug {
    /// A collection's documents, if they were read.
    fn documents(&self, collection: &str) -> Option<&[Document]>;
}
