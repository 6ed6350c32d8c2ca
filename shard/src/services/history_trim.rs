//! Drops the in-memory history of documents older than its window (`history::WINDOW`), which
//! snapshot reads at a past time use.

use std::sync::Arc;
use std::time::Duration;

use resume::ClusterTime;

use super::{Service, TICK};
use crate::{Shard, history};

pub(super) struct HistoryTrim;

impl Service for HistoryTrim {
    const NAME: &'static str = "history_trim";
    const AT_START: bool = true;

    fn period(&self, _: &Shard) -> Duration {
        TICK
    }

    async fn pass(&mut self, shard: &Arc<Shard>) {
        let now_secs = shard.state.now_millis() / 1000;
        let oldest = now_secs.saturating_sub(history::WINDOW.as_secs());
        let before = ClusterTime::new(u32::try_from(oldest).unwrap_or(u32::MAX), 0);
        shard.state.history.trim_before(before);
    }
}
