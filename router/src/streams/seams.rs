//! What change streams run on: [`Streams`], built once by the router from the kernel's
//! transport and the seams beside it, and handed to every stream, hub and feed, which hold
//! it instead of the router.
//!
//! Invariant: nothing a stream holds reaches back into the router or the command layer; a
//! stream's background work runs as the router's services and ends with its shutdown.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use super::hub::Hubs;
use crate::kernel::lineages::Lineages;
use crate::kernel::services::Services;
use crate::kernel::transport::{ShardPatience, ShardTransport};

/// The seams of the router's change streams.
pub struct Streams {
    pub(crate) transport: Arc<ShardTransport>,
    /// The shards' histories: a resume, and a re-open of a lost shard's stream, are judged
    /// against them.
    pub(crate) lineages: Arc<Lineages>,
    /// The shared merges, by shard-side spec.
    pub(crate) hubs: Hubs,
    pub(crate) patience: ShardPatience,
    /// The most bytes of events a hub keeps for its clients (`streamBufferBytes`).
    pub(crate) buffer_bytes: usize,
    /// How many replies per second a client of a hub gets at most while events trickle in.
    pub(crate) replies_per_second: u32,
    /// The router's background work: every stream's tasks end with its shutdown.
    pub(crate) services: Services,
    /// Counted each time a stream asks an idle shard for its time.
    pub(crate) idle_shard_nudges: Counter,
}
