//! Ends what clients left idle: cursors and change-stream readers past their timeout, and
//! transactions past their lifetime (`transactionLifetimeLimitSeconds`).

use std::sync::Arc;
use std::time::Duration;

use super::{Service, TICK};
use crate::{Shard, txn};

pub(super) struct Reapers;

impl Service for Reapers {
    const NAME: &'static str = "reapers";
    const AT_START: bool = true;

    fn period(&self, _: &Shard) -> Duration {
        TICK
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        let now = shard.state.now_millis();
        shard.cursors.reap(now);
        shard.change_streams.reap(now);
        shard.transactions.reap(now, txn::LIFETIME);
    }
}
