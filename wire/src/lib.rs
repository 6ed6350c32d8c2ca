//! MongoDB wire protocol: message framing (OP_MSG, OP_QUERY/OP_REPLY, OP_COMPRESSED) as pure
//! `decode`/`encode` functions, and the error documents every client-visible failure becomes.
//!
//! The framing never allocates more than a message's declared length, and only after checking
//! that length against [`MAX_MESSAGE_SIZE`]. The tokio codec (feature `codec`) is a thin shell.

pub mod error;

pub use error::{ErrorCode, MongoError, Result};

/// `maxMessageSizeBytes` advertised in the handshake; larger frames are rejected before allocation.
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;
/// `maxBsonObjectSize` for user documents.
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;
/// Internal BSON limit (user limit + 16 KiB), used for replies and events.
pub const MAX_INTERNAL_BSON_SIZE: usize = MAX_BSON_OBJECT_SIZE + 16 * 1024;
