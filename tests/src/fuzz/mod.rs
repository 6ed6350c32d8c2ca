//! The wire-level fuzzer behind the `fuzz` binary: seeded, structured generation of every
//! command the router lists, a raw OP_MSG mutator, and a shell that sends them to a real
//! `tributary` process and checks it after each one.
//!
//! Layers: [`value`] (compact values and their iterative BSON encoding) → [`generate`]
//! (templates and argument mutations, pure and seeded) and [`raw`] (byte-level mutations, pure)
//! → [`frame`] (frames through the `wire` crate, reply verdicts; pure) → [`server`] (the child
//! process, RSS sampling, output scanning, blocking connections) → [`run`] (the loop and the
//! report).
//!
//! Invariants: a case is a function of the seed and the iteration number alone, so any failure
//! replays with `--seed S --only-iteration K`; nothing generated may legitimately stop the server
//! (no `shutdown`, no writes to `admin` / `config` / `local`); and the harness itself never
//! recurses over generated depth, so a 100,000-level document cannot overflow its stack.

pub mod frame;
pub mod generate;
pub mod raw;
pub mod run;
pub mod server;
pub mod value;
