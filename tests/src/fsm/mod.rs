//! Resmoke-style FSM suites for change streams: a framework in the shape of MongoDB's
//! concurrency framework ([`framework`]), a reference model of the expected events and its
//! verifier ([`model`]), watchers in three modes ([`watch`]), fixtures and fault hooks
//! ([`fixture`]), the workloads ([`workloads`]) and the YAML suite runner ([`suite`]).
//!
//! Run a suite: `cargo run -p tests --bin resmoke -- --suite change_stream_fsm`; a failing run
//! prints its seed and the command that replays it.

pub mod fixture;
pub mod framework;
pub mod model;
pub mod suite;
pub mod watch;
pub mod workloads;
