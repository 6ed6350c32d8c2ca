//! The Tributary router: speaks the MongoDB wire protocol to drivers, routes CRUD to shards by
//! shard key, merges scattered reads, and keeps cluster time flowing between shards.
//!
//! Layers: [`server`] (bytes ↔ requests) → [`commands`] (one module per command family) →
//! the middle modules (change streams, transactions, cursors, auth, lineages) →
//! [`kernel`] (the shard transport, the config store, the clock), which imports nothing
//! above it. [`router::Router`] is the composition root: it builds the seams once, as one
//! `seams::Seams` value the commands share, and only the launcher (`server`, `launch`) holds
//! it. The pure shard-key and chunk logic is `shard::sharding`, shared with the shards.

pub mod auth;
mod command;
mod commands;
pub mod config_file;
pub mod cursors;
pub mod failpoint;
pub mod http;
pub mod kernel;
pub mod launch;
pub mod local_sessions;
pub mod log_buffer;
pub mod metrics;
pub mod ops;
pub mod options;
pub mod parameters;
pub mod router;
mod seams;
pub mod server;
mod snapshot;
pub mod stdout_log;
pub mod streams;
pub mod subscriptions;
mod txn;

pub use kernel::shard_client::{LocalShard, RemoteShard, ShardClient, TransportError};
pub use router::{Presentation, Router, RouterOptions, ShardPatience};
pub use streams::REPLIES_PER_SECOND;
