//! Keeps the clock reservation ahead of the clock: the writer renews it when the clock has
//! come within its margin (a write past the reservation would otherwise wait for it).

use std::sync::Arc;
use std::time::Duration;

use super::{Service, TICK};
use crate::Shard;

pub(super) struct Renew;

impl Service for Renew {
    const NAME: &'static str = "renew";
    const AT_START: bool = true;

    fn period(&self, _: &Shard) -> Duration {
        TICK
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        shard.writer.renew();
    }
}
