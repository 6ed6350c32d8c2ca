//! The router's background work, in one shape: periodic jobs are [`Service`]s started by
//! [`Services::start`]; one-off work (a shared merge's reader, an idle shard's nudge, a
//! killed operation's broadcast) runs through [`Services::spawn`]; a stream's shard feeds run
//! on the background lane through [`Services::spawn_background`]. Each runs in a span named
//! after it, on one task tracker, and ends with the router's shutdown, which waits for it.
//!
//! Invariants: a periodic service checks for shutdown only between passes (a pass in progress
//! runs to its end, and shutdown waits for it); its passes never overlap; its period is read
//! before each wait, so a period that follows a setting takes effect at the next pass.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// A periodic background job of the router.
pub trait Service: Send + 'static {
    /// The service's name: its span's, and its logs'.
    const NAME: &'static str;

    /// How long to wait before the next pass.
    fn period(&self) -> Duration;

    /// One pass.
    fn pass(&mut self) -> impl Future<Output = ()> + Send;
}

/// The router's task tracker and shutdown.
#[derive(Clone, Default)]
pub struct Services {
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Services {
    /// The token whose cancellation shuts the router down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Runs `service` until shutdown.
    pub fn start<S: Service>(&self, mut service: S) {
        let shutdown = self.shutdown.clone();
        let run = async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(service.period()) => {}
                }
                service.pass().await;
            }
        };
        self.tasks
            .spawn(run.instrument(tracing::info_span!("service", name = S::NAME)));
    }

    /// Runs `task` until it ends or the router shuts down.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let shutdown = self.shutdown.clone();
        let run = async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task => {}
            }
        };
        self.tasks
            .spawn(run.instrument(tracing::info_span!("task", name)));
    }

    /// Runs `task` on the background lane (`shard::background`: the CPU writers leave) until
    /// it ends; the caller stops it (a stream's feeds end with their stream), and shutdown
    /// waits for it.
    pub fn spawn_background<F>(&self, name: &'static str, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = task.instrument(tracing::info_span!("task", name));
        shard::background::spawn(&self.tasks, task)
    }

    /// After [`Services::shutdown`] fired: waits until every task has ended.
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}
