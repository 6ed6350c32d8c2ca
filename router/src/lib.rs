//! The Tributary router: speaks the MongoDB wire protocol to drivers, routes CRUD to shards by
//! shard key, merges scattered reads, and keeps cluster time flowing between shards.
//!
//! Layers: [`server`] (bytes ↔ requests) → [`commands`] (one module per command family) →
//! [`router::Router`] (shared state: shard clients, clock, metadata cache, cursors) →
//! [`shard_client::ShardClient`] (in-process or TCP). [`routing`] is the pure shard-key and
//! chunk logic.

pub mod auth;
pub mod changestream;
pub mod clock;
mod commands;
pub mod config_file;
pub mod cursors;
pub mod failpoint;
pub mod launch;
pub mod lineages;
pub mod local_sessions;
pub mod log_buffer;
pub mod metadata;
pub mod metrics;
pub mod ops;
pub mod parameters;
pub mod router;
pub mod routing;
pub mod server;
pub mod shard_client;
mod snapshot;
pub mod stdout_log;
mod txn;

pub use changestream::REPLIES_PER_SECOND;
pub use router::{Presentation, Router, RouterOptions, ShardPatience};
pub use shard_client::{LocalShard, RemoteShard, ShardClient, TransportError};
