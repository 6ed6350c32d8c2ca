//! Asks the coordinators of transactions prepared here, and undecided for long, for their
//! decision (`askCoordinatorAfterSecs`).

use std::sync::Arc;
use std::time::Duration;

use super::Service;
use crate::Shard;

pub(super) struct CoordinatorAsks;

impl Service for CoordinatorAsks {
    const NAME: &'static str = "coordinator_asks";

    fn period(&self, shard: &Shard) -> Duration {
        shard.transactions.ask_after()
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        shard.transactions.ask_coordinators(shard).await;
    }
}
