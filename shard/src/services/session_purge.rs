//! Deletes the records of retryable writes whose sessions expired (see `crate::retryable`).

use std::sync::Arc;
use std::time::Duration;

use super::Service;
use crate::{Shard, retryable};

pub(super) struct SessionPurge;

impl Service for SessionPurge {
    const NAME: &'static str = "session_purge";

    fn period(&self, _: &Shard) -> Duration {
        retryable::PURGE_INTERVAL
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        if let Err(e) = retryable::purge(shard.state(), shard.writer()).await {
            tracing::warn!(error = %e, "purging expired session records");
        }
    }
}
