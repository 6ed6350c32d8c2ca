//! Cluster time and change-stream resume tokens (MongoDB KeyString V1 encoding).
//!
//! Pure: no I/O. Invariant: comparing two tokens' `_data` bytes gives their logical order.

mod decimal;
pub mod keystring;
pub mod time;

pub use time::ClusterTime;
