//! Cluster time and change-stream resume tokens (MongoDB KeyString V1 encoding).
//!
//! Pure: no I/O. Invariant: comparing two tokens' `_data` bytes gives their logical order.
//!
//! * [`ClusterTime`]: the `(secs, inc)` timestamp newtype.
//! * [`ResumeTokenData`]: a token's logical content (§5.1 of the reference), built with
//!   [`ResumeTokenData::high_water_mark`] / [`ResumeTokenData::event`], encoded with
//!   [`ResumeTokenData::encode`] into a wire [`ResumeToken`] (`{_data, _typeBits?}`).
//! * [`compare_against_client_token`]: the resumability check (§5.7).
//! * [`keystring`]: the KeyString V1 value encoding, including [`keystring::key_bytes`], an
//!   order-preserving storage key for any BSON value.

mod decimal;
pub mod keystring;
pub mod time;
pub mod token;

pub use time::ClusterTime;
pub use token::{
    MAX_TXN_OP_INDEX, ResumeStatus, ResumeToken, ResumeTokenData, TokenError, TokenType,
    TokenVersion, compare_against_client_token, compare_tokens, event_identifier,
};
