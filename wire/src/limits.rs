//! What a server bounds for its clients, and the live count of its connections (what
//! `serverStatus` shows under `connections`).
//!
//! Owns: [`Limits`] (`--maxConns`, the frame timeout) and [`Connections`], the counters of one
//! listener.
//!
//! Invariants:
//! * `current` never exceeds [`Connections::max`]: a connection is counted ([`Connections::admit`])
//!   before anything is read from it, and one that would go past the limit is refused (closed
//!   at once, counted in `rejected`, never in `totalCreated`), as mongod's service entry point;
//! * every admitted connection is uncounted exactly once, when its [`Admitted`] is dropped,
//!   however its task ends; likewise `active` (a request in flight) with [`Busy`];
//! * at most [`LARGE_AT_ONCE`] large messages (past [`LARGE_MESSAGE`] bytes) are turned into
//!   requests and handled at once on a listener; the others wait their turn, whole but not yet
//!   parsed, so what their parsed forms hold together stays bounded;
//! * the effective limit is mongod's on Linux: the configured one, but at most 80 % of the
//!   process's soft limit on open files (the rest is left for data files and the connections to
//!   the shards), so the limit is reached before `accept` starts failing for want of file
//!   descriptors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// mongod's default `net.maxIncomingConnections` (`--maxConns`).
pub const DEFAULT_MAX_CONNECTIONS: u64 = 1_000_000;
/// How long a frame may take to arrive whole once its first byte has (and a reply to go out).
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// A message past this many bytes is large: parsed aside from the worker's other tasks, and
/// admitted only [`LARGE_AT_ONCE`] at a time.
pub const LARGE_MESSAGE: usize = 1 << 20;
/// How many large messages a listener parses and handles at once. A command parsed into a
/// `Document` takes several times its wire size (up to about a hundred times for a 16 MiB
/// command of a million tiny elements), so without this a few hundred clients sending such
/// commands together would hold hundreds of gigabytes; with it, at most this many of them.
pub const LARGE_AT_ONCE: usize = 2;
/// Refusals are logged at most this often (a flood would otherwise flood the log too).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The bounds a server puts on its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most connections open at once (`--maxConns`); see [`effective_max`].
    pub max_connections: u64,
    /// Once a frame's first byte has arrived, the whole frame must arrive within this, and a
    /// reply must go out within it; a TLS handshake gets at most this too. Idle time between
    /// frames is not bounded.
    pub frame_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            frame_timeout: DEFAULT_FRAME_TIMEOUT,
        }
    }
}

/// The connection limit in force: `requested`, capped at 80 % of the soft limit on open files
/// when it is known (mongod's `getSupportedMax`).
pub fn effective_max(requested: u64, open_files: Option<u64>) -> u64 {
    match open_files {
        Some(n) => requested.min(n.saturating_mul(8) / 10),
        None => requested,
    }
}

/// The process's soft limit on open files, when the OS tells it.
#[cfg(unix)]
#[allow(unsafe_code)]
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through the pointer, which points at a live,
    // properly aligned local of exactly that type; nothing else is touched.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // `rlim_t` is `u64` on Linux but not on every Unix.
    #[allow(clippy::unnecessary_cast)]
    let soft = limit.rlim_cur as u64;
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

#[cfg(not(unix))]
pub fn open_files_limit() -> Option<u64> {
    None
}

/// The figures of `serverStatus.connections`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections open now (counted from `accept`, TLS handshakes included).
    pub current: u64,
    /// How many more may open: the effective limit minus `current`.
    pub available: u64,
    /// Connections accepted (and not refused) since the server started.
    pub total_created: u64,
    /// Connections refused because the limit was reached.
    pub rejected: u64,
    /// Connections with a request in flight (a change stream's awaiting `getMore` included).
    pub active: u64,
}

/// The connections of one listener: its limits and live counters.
#[derive(Debug)]
pub struct Connections {
    limits: Limits,
    max: u64,
    current: AtomicU64,
    total_created: AtomicU64,
    rejected: AtomicU64,
    active: AtomicU64,
    /// When a refusal was last logged.
    last_refusal_log: Mutex<Option<tokio::time::Instant>>,
    /// Turns of the large messages ([`LARGE_AT_ONCE`]).
    large: tokio::sync::Semaphore,
}

impl Connections {
    /// Counters for a listener with `limits`, capped by this process's open-files limit.
    pub fn new(limits: Limits) -> Connections {
        let open_files = open_files_limit();
        let max = effective_max(limits.max_connections, open_files);
        if max < limits.max_connections && limits.max_connections != DEFAULT_MAX_CONNECTIONS {
            tracing::warn!(
                requested = limits.max_connections,
                limit = max,
                ?open_files,
                "--maxConns too high: 80% of the open-files limit is the most this process can serve"
            );
        }
        Connections::with_max(limits, max)
    }

    /// Counters with the effective limit given (tests).
    pub fn with_max(limits: Limits, max: u64) -> Connections {
        Connections {
            limits,
            max,
            current: AtomicU64::new(0),
            total_created: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            active: AtomicU64::new(0),
            last_refusal_log: Mutex::new(None),
            large: tokio::sync::Semaphore::new(LARGE_AT_ONCE),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The connection limit in force.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Counts a new connection in, or refuses it (`None`: close it) when the limit is reached.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let before = self.current.fetch_add(1, Ordering::AcqRel);
        if before >= self.max {
            self.current.fetch_sub(1, Ordering::AcqRel);
            self.rejected.fetch_add(1, Ordering::Relaxed);
            self.log_refusal(before);
            return None;
        }
        self.total_created.fetch_add(1, Ordering::Relaxed);
        Some(Admitted {
            connections: Arc::clone(self),
        })
    }

    fn log_refusal(&self, current: u64) {
        let now = tokio::time::Instant::now();
        let mut last = self
            .last_refusal_log
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_INTERVAL) {
            return;
        }
        *last = Some(now);
        tracing::info!(
            connection_count = current,
            limit = self.max,
            rejected = self.rejected.load(Ordering::Relaxed),
            "Connection refused because there are too many open connections"
        );
    }

    /// The figures now.
    pub fn counts(&self) -> ConnectionCounts {
        let current = self.current.load(Ordering::Acquire);
        ConnectionCounts {
            current,
            available: self.max.saturating_sub(current),
            total_created: self.total_created.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
        }
    }
}

/// An admitted connection; dropping it counts the connection out.
#[derive(Debug)]
pub struct Admitted {
    connections: Arc<Connections>,
}

impl Admitted {
    pub fn limits(&self) -> Limits {
        self.connections.limits
    }

    /// The turn of a message of `bytes`: none needed for a small one; a large one waits until
    /// fewer than [`LARGE_AT_ONCE`] are in hand, and holds its turn until the guard is dropped
    /// (once its reply is out).
    pub async fn turn(&self, bytes: usize) -> Option<tokio::sync::SemaphorePermit<'_>> {
        if bytes <= LARGE_MESSAGE {
            return None;
        }
        // The semaphore is never closed.
        self.connections.large.acquire().await.ok()
    }

    /// Marks a request in flight on this connection until the guard is dropped.
    pub fn busy(&self) -> Busy<'_> {
        self.connections.active.fetch_add(1, Ordering::Relaxed);
        Busy {
            connections: &self.connections,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.current.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request in flight; see [`Admitted::busy`].
#[derive(Debug)]
pub struct Busy<'a> {
    connections: &'a Connections,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.connections.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_capped_at_eighty_percent_of_the_open_files_limit() {
        assert_eq!(effective_max(DEFAULT_MAX_CONNECTIONS, Some(1024)), 819);
        assert_eq!(effective_max(100, Some(1024)), 100);
        assert_eq!(effective_max(100, None), 100);
        assert_eq!(effective_max(u64::MAX, Some(u64::MAX)), u64::MAX / 10);
    }

    #[test]
    fn current_never_exceeds_the_limit_and_every_connection_is_counted_out_once() {
        let connections = Arc::new(Connections::with_max(Limits::default(), 2));
        let a = connections.admit().expect("first");
        let b = connections.admit().expect("second");
        assert!(connections.admit().is_none(), "third refused");
        let counts = connections.counts();
        assert_eq!(
            (counts.current, counts.available, counts.total_created),
            (2, 0, 2)
        );
        assert_eq!(counts.rejected, 1);
        {
            let _busy = a.busy();
            assert_eq!(connections.counts().active, 1);
        }
        assert_eq!(connections.counts().active, 0);
        drop(a);
        let c = connections.admit().expect("room again");
        drop((b, c));
        let counts = connections.counts();
        assert_eq!(
            (counts.current, counts.available, counts.total_created),
            (0, 2, 3)
        );
        assert_eq!(counts.rejected, 1);
    }
}
