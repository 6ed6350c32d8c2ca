//! Deletes pre-images past their collection's expiry, or older than the oplog (see
//! `crate::preimages`).

use std::sync::Arc;
use std::time::Duration;

use super::Service;
use crate::{Shard, preimages};

pub(super) struct PreImagePurge;

impl Service for PreImagePurge {
    const NAME: &'static str = "preimage_purge";

    fn period(&self, _: &Shard) -> Duration {
        preimages::PURGE_INTERVAL
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        if let Err(e) = preimages::purge(shard).await {
            tracing::warn!(error = %e, "purging expired pre-images");
        }
    }
}
