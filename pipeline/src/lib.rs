//! Pure query machinery shared by the shards and the router: BSON comparison, the
//! match-expression language, aggregation expressions and stages, find projections and sorts.
//! Change-stream stages come here too (shard part and merge part). `$jsonSchema` lives in
//! [`schema`]; collection validators (parsing, restrictions, `errInfo` details) in [`validator`].
//!
//! Errors are [`wire::MongoError`] with MongoDB's codes (`BadValue`, `FailedToParse`, ...).

// `MongoError` is the workspace's one client-visible error type; it is large (code, name,
// message, labels, extra document) but boxing it is not this crate's decision.
#![allow(clippy::result_large_err)]

pub mod agg;
pub mod changestream;
pub mod collation;
pub mod expr;
pub mod foreign;
pub mod interrupt;
pub mod matcher;
pub mod projection;
pub mod re;
pub mod schema;
pub mod sort;
pub mod validator;
pub mod value;

pub use matcher::Matcher;
pub use wire::{MongoError, Result};
