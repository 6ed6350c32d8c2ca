//! MongoDB wire protocol: message framing (OP_MSG, OP_QUERY/OP_REPLY, OP_COMPRESSED) as pure
//! `decode`/`encode` functions, and the error documents every client-visible failure becomes.
//!
//! The framing never allocates more than a message's declared length, and only after checking
//! that length against [`MAX_MESSAGE_SIZE`]. The tokio codec (feature `codec`) is a thin shell.
//!
//! Layers, bottom up: [`message`] (types) → [`compression`] → [`frame`] (pure bytes ⇄ messages)
//! → `codec` (tokio-util `Decoder`/`Encoder`; the read buffer grows only with bytes that
//! arrived) → `connection` (a socket of whole frames, with a frame timeout) → `server`
//! (connection loop shared by the router and the shards, admitting connections up to the
//! `limits`) and `client` (pooled command client to a remote shard).

// `MongoError` (the project-wide client-visible error) is ~170 bytes; errors are the cold path
// here and boxing them would change the shared API, so the size lint is allowed crate-wide.
#![allow(clippy::result_large_err)]

pub mod capped;
pub mod compression;
pub mod error;
pub mod frame;
pub mod message;
pub mod raw;
pub mod registry;

#[cfg(feature = "codec")]
pub mod client;
#[cfg(feature = "codec")]
pub mod codec;
#[cfg(feature = "codec")]
pub mod connection;
#[cfg(feature = "codec")]
pub mod keyfile;
#[cfg(feature = "codec")]
pub mod limits;
#[cfg(feature = "codec")]
pub mod replset;
#[cfg(feature = "scram")]
pub mod sasl;
#[cfg(feature = "scram")]
pub mod scram;
#[cfg(feature = "codec")]
pub mod server;
#[cfg(feature = "codec")]
pub mod tls;

pub use error::{ErrorCode, MongoError, Result};
pub use frame::{FrameError, decode, encode};
pub use message::{Compressor, DocumentSequence, Message, MsgFlags, Op, OpMsg, OpQuery, OpReply};

#[cfg(feature = "codec")]
pub use async_trait::async_trait;
#[cfg(feature = "codec")]
pub use client::{Client, ClientError};
#[cfg(feature = "codec")]
pub use codec::MessageCodec;
#[cfg(feature = "codec")]
pub use server::{ConnectionInfo, Handler, Reply, Request, serve, serve_connection};

/// `maxMessageSizeBytes` advertised in the handshake; larger frames are rejected before allocation.
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;
/// `maxBsonObjectSize` for user documents.
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;
/// The newest wire version a Tributary server speaks (MongoDB 7.0's), in every `hello`.
pub const MAX_WIRE_VERSION: i32 = 21;
/// Internal BSON limit (user limit + 16 KiB), used for replies and events.
pub const MAX_INTERNAL_BSON_SIZE: usize = MAX_BSON_OBJECT_SIZE + 16 * 1024;
