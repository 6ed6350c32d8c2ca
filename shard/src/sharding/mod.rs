//! Sharding's pure vocabulary, shared by the router (which routes by it) and the shards
//! (which will check ownership by it): which shard ([`ShardId`]), by which key
//! ([`ShardKey`]), in which key ranges ([`ChunkTable`]), as of which version
//! ([`ChunkVersion`]).
//!
//! A leaf: nothing here does I/O or imports the rest of the shard (checked by
//! `tests/tests/layering.rs`).

mod chunks;
mod id;
mod key;
mod version;

pub use chunks::{Chunk, ChunkTable};
pub use id::ShardId;
pub use key::{KeyKind, ShardKey, hash_value};
pub use version::ChunkVersion;
