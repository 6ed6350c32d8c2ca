//! The router's kernel: the seams everything above is built on, importing nothing of the
//! router outside this directory (checked by `tests/tests/layering.rs`).
//!
//! * [`shard_client`]: one shard's wire, in process or over TCP;
//! * [`replica_set`]: a replicated shard's wire: its primary's, following its elections;
//! * [`transport`]: the shards by `ShardId`, with retries, clock gossip and the caller's
//!   operation key ([`transport::ShardTransport`]), and the [`transport::Shards`] conveniences
//!   that a transaction's statements share through `txn::Enlisting`;
//! * [`config`]: the config shard's collections as a store ([`config::ConfigStore`]);
//! * [`catalog`]: where data lives (databases' primaries, sharded collections' chunks) and so
//!   which shards a command reaches ([`catalog::Catalog`]);
//! * [`services`]: background work, started, named, traced and stopped one way;
//! * [`clock`]: the cluster time this router has seen, and its signing.

pub mod catalog;
pub mod clock;
pub mod config;
pub mod lineages;
pub mod replica_set;
pub mod services;
pub mod shard_client;
pub mod transport;
