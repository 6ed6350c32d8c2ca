//! Deletes expired documents of TTL indexes every `ttlMonitorSleepSecs` (see `crate::ttl`).

use std::sync::Arc;
use std::time::Duration;

use super::Service;
use crate::Shard;

pub(super) struct Ttl;

impl Service for Ttl {
    const NAME: &'static str = "ttl";

    fn period(&self, shard: &Shard) -> Duration {
        Duration::from_secs(shard.ttl_sleep.get())
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        if let Err(e) = crate::ttl::run(shard).await {
            tracing::warn!(error = %e, "deleting expired TTL documents");
        }
    }
}
