//! The background lane: the work of serving change streams (reading the oplog, making events,
//! feeding the router's merges) runs on a runtime of its own, whose threads the kernel
//! schedules at a lower priority than the client-facing ones (nice [`NICE`]).
//!
//! A far-behind watcher can ask for events far faster than writers make them; on a machine
//! whose cores are busy, that reading would take its share of CPU from the writers. On this
//! lane it takes only what the writers leave: when the cores are idle the lane runs at full
//! speed, and when writers want them the kernel gives the lane about a tenth
//! (CFS weights 110 : 1024). Streams then lag instead of writers slowing, which is the
//! promise: a slow watcher never slows writers.
//!
//! Invariants: the lane is one process-wide runtime, started on first use and never shut down
//! (its tasks end with their owners' cancellation); when it cannot be started (no threads) the
//! caller's runtime is used, at normal priority, and that is logged once.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use wire::MongoError;

/// The lane's threads' nice value (0 is normal, 19 the lowest).
pub const NICE: i32 = 10;

/// The lane's worker threads: as many as the machine has cores, at most four.
fn workers() -> usize {
    std::thread::available_parallelism()
        .map(std::num::NonZeroUsize::get)
        .unwrap_or(1)
        .min(4)
}

static LANE: OnceLock<Option<Runtime>> = OnceLock::new();

fn lane() -> Option<&'static Runtime> {
    LANE.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers())
            .thread_name("background")
            .on_thread_start(|| lower_this_threads_priority(NICE))
            .enable_all()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!(error = %e, "the background lane did not start; change streams run at normal priority");
                None
            }
        }
    })
    .as_ref()
}

/// The lane's runtime handle (the current runtime's when the lane cannot start).
pub fn handle() -> Handle {
    lane().map_or_else(Handle::current, |rt| rt.handle().clone())
}

/// Spawns `task` on the lane, tracked by `tracker`.
pub fn spawn<F>(tracker: &TaskTracker, task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tracker.spawn_on(task, &handle())
}

/// Runs `work` on the lane and waits for it (inline when already on the lane, or when there is
/// no lane). A caller that stops waiting (a killed operation, a closed connection) stops
/// `work` with it. A panic in `work` is an `InternalError`. Task-locals do not follow `work`
/// onto the lane: the caller scopes them inside it.
pub async fn run<F>(work: F) -> Result<F::Output, MongoError>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(rt) = lane() else {
        return Ok(work.await);
    };
    if Handle::try_current().is_ok_and(|h| h.id() == rt.handle().id()) {
        return Ok(work.await);
    }
    AbortOnDropHandle::new(rt.spawn(work))
        .await
        .map_err(|e| MongoError::internal(format!("a change-stream task failed: {e}")))
}

/// Sets the calling thread's nice value (on Linux a thread has its own).
#[allow(unsafe_code)]
fn lower_this_threads_priority(nice: i32) {
    // SAFETY: `gettid` has no preconditions; `setpriority` on a thread id changes only that
    // thread's scheduling priority (raising the nice value needs no privilege).
    let failed = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) != 0
    };
    if failed {
        tracing::debug!("could not lower a background thread's priority");
    }
}
