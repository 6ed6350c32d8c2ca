//! The shard's background work. Each job is a [`Service`] in a file of its own, started the
//! same way by [`start_all`] when the shard opens: on the shard's task tracker, in a span
//! named after it, passing whenever its period has gone by (checked every [`TICK`], so a
//! period changed at run time, `ttlMonitorSleepSecs` say, takes effect within a tick), and
//! stopped by the shard's shutdown. One-off background work (a decision delivered to the
//! participants of a transaction) runs through [`spawn`] the same way.
//!
//! Invariants: a service holds its shard weakly between passes, so a dropped shard ends its
//! services; a pass runs to its end once started (shutdown waits for it), and each service's
//! passes never overlap; a slow pass of one service delays no other.

mod asks;
mod history_trim;
mod preimage_purge;
mod reapers;
mod renew;
mod session_purge;
mod ttl;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::Shard;

/// How often every service checks whether its period has gone by.
pub const TICK: Duration = Duration::from_millis(200);

/// A background job of the shard.
pub(crate) trait Service: Send + 'static {
    /// The service's name: its span's, and its logs'.
    const NAME: &'static str;

    /// Whether the first pass runs as the service starts (else a period later).
    const AT_START: bool = false;

    /// How long from the start of one pass to the next (read before each check).
    fn period(&self, shard: &Shard) -> Duration;

    /// One pass.
    fn pass(&mut self, shard: &Arc<Shard>) -> impl Future<Output = ()> + Send;
}

/// Starts every service of `shard`.
pub(crate) fn start_all(shard: &Arc<Shard>) {
    start(shard, renew::Renew);
    start(shard, reapers::Reapers);
    start(shard, history_trim::HistoryTrim);
    start(shard, asks::CoordinatorAsks);
    start(shard, ttl::Ttl);
    start(shard, session_purge::SessionPurge);
    start(shard, preimage_purge::PreImagePurge);
}

/// Starts the services of a read-only follower (`follower`): only the reapers of what its
/// clients leave idle; every other service writes, which is the primary's to do.
pub(crate) fn start_follower(shard: &Arc<Shard>) {
    start(shard, reapers::Reapers);
}

/// Runs `service` on `shard` until the shard stops.
fn start<S: Service>(shard: &Arc<Shard>, mut service: S) {
    let weak = Arc::downgrade(shard);
    let cancel = shard.cancel.clone();
    let span = tracing::info_span!("service", name = S::NAME, shard = %shard.name());
    let run = async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = (!S::AT_START).then(tokio::time::Instant::now);
        loop {
            // The first tick is at once.
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            let Some(shard) = weak.upgrade() else { break };
            if last.is_some_and(|l| l.elapsed() < service.period(&shard)) {
                continue;
            }
            last = Some(tokio::time::Instant::now());
            service.pass(&shard).await;
        }
    };
    shard.tasks.spawn(run.instrument(span));
}

/// Runs one-off background work of `shard`, named `name`, until it ends or the shard stops.
pub(crate) fn spawn(
    shard: &Shard,
    name: &'static str,
    task: impl Future<Output = ()> + Send + 'static,
) {
    let cancel = shard.cancel.clone();
    let span = tracing::info_span!("task", name, shard = %shard.name());
    let run = async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = task => {}
        }
    };
    shard.tasks.spawn(run.instrument(span));
}
