//! The background lane: the work of serving change streams (reading the oplog, making events,
//! feeding the router's merges) runs on a runtime of its own, whose threads the kernel
//! schedules behind the client-facing ones.
//!
//! A far-behind watcher can ask for events far faster than writers make them; on a machine
//! whose cores are busy, that reading would take CPU from the writers. On this lane it takes
//! what the writers leave, in two ways:
//! * share: the lane's threads run at nice [`NICE`], so when writers want every core the
//!   kernel gives each lane thread about 1.5 % of a writer's share (weights 15 : 1024):
//!   streams lag instead of writers slowing, yet never stop; when the cores are idle the lane
//!   runs at full speed;
//! * latency: a writer is mostly asleep (on the network, on a disk sync), and what it loses
//!   to a busy lane is the wait, once woken, for the lane's thread to leave the core. The
//!   lane's threads ask the kernel for a long slice ([`SLICE_NS`]); Linux's EEVDF scheduler
//!   (6.12 and later) lets a waking thread with a shorter slice, which every default thread
//!   has, take the core at once. (A kernel without per-thread slices ignores the request and
//!   keeps only the share.)
//!
//! Measured with `tests::hostile_clients` on 2 cores (a debug build, whose writers keep both
//! cores busy): at nice 10 with the default slice the writers kept 0.84–0.89x of their
//! throughput while 100 far-behind streams read; at nice 10 with the long slice 0.92–1.00x,
//! at nice 19 with it 0.95–0.98x (BENCHMARKS.md). `SCHED_IDLE` does as well for the writers
//! but gives the lane a weight of 3, so a saturated machine would all but stop its streams.
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
pub const NICE: i32 = 19;

/// The slice the lane's threads ask for, in nanoseconds: the longest Linux grants (100 ms),
/// so that every thread with the default slice preempts them when it wakes.
pub const SLICE_NS: u64 = 100_000_000;

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
            .on_thread_start(yield_to_other_threads)
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

/// `struct sched_attr` of `sched_setattr(2)` (its first version, 56 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

const _: () = assert!(std::mem::size_of::<SchedAttr>() == 56);

/// Puts the calling thread (on Linux a thread has its own scheduling attributes) at nice
/// [`NICE`] with a slice of [`SLICE_NS`]; where the kernel refuses the slice, at nice [`NICE`]
/// alone.
#[allow(unsafe_code)]
fn yield_to_other_threads() {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: NICE,
        priority: 0,
        runtime: SLICE_NS,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: `sched_setattr(0, attr, 0)` reads one live, aligned `sched_attr` whose `size`
    // says how much to read, and changes only the calling thread's scheduling attributes
    // (lowering a priority needs no privilege). `setpriority` on a thread id likewise.
    let failed = unsafe {
        libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) != 0 && {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE) != 0
        }
    };
    if failed {
        tracing::debug!("could not lower a background thread's priority");
    }
}
