//! The state every part of a shard shares: storage, clocks, the published catalog and the oplog
//! tail window.
//!
//! Concurrency: the `std` mutex and rwlock here are held only for short, non-async critical
//! sections (never across `.await`), so they never block the runtime for long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use resume::ClusterTime;

use crate::catalog::Catalog;
use crate::clock::{Clock, Hlc};
use crate::history::{self, History};
use crate::log::Log;
use crate::oplog::TailWindow;
use crate::retention::{OplogStats, Retention};
use crate::storage::Storage;

pub struct ShardState {
    pub name: String,
    pub storage: Arc<dyn Storage>,
    /// Where each batch's write set is made durable before it is applied.
    pub log: Arc<dyn Log>,
    pub clock: Arc<dyn Clock>,
    hlc: Mutex<Hlc>,
    catalog: RwLock<Arc<Catalog>>,
    pub tail: TailWindow,
    commits: AtomicU64,
    /// Committed oplog size and truncation point (the writer updates it after each commit).
    oplog_stats: Mutex<OplogStats>,
    retention: Mutex<Retention>,
    /// What the documents held before recent writes: reads as of a cluster time.
    pub history: Arc<History>,
    /// The keys prepared transactions hold: no other write may touch them until decided.
    pub prepared: crate::holds::PreparedKeys,
    /// The keys ordered batches hold between their validation and their commit.
    pub reservations: crate::reservations::Reservations,
    /// Counters `serverStatus` shows under `metrics.changeStreams`.
    pub stream_metrics: StreamMetrics,
    /// Which history the oplog belongs to (`lineage`); set when the shard opens.
    lineage: Mutex<Option<crate::lineage::Lineage>>,
    /// On a replica-set member that does not lead (`follower`): its high-water mark, derived
    /// from what it applied ([`ClusterTime::as_u64`]). It writes nothing and never ticks.
    follower: std::sync::OnceLock<AtomicU64>,
    /// On a follower: the catalog's rows as it last loaded them (`follower`), so a catch-up
    /// that finds the same rows keeps the catalog it has.
    pub(crate) follower_catalog: Mutex<Vec<u8>>,
}

/// Change-stream counters of a shard (`serverStatus.metrics.changeStreams`).
#[derive(Debug, Default)]
pub struct StreamMetrics {
    /// Events split into fragments by `$changeStreamSplitLargeEvent`.
    pub large_events_split: AtomicU64,
    /// Events over 16 MiB that failed their stream (10334).
    pub large_events_failed: AtomicU64,
    /// Streams opened with `showExpandedEvents`.
    pub show_expanded_events: AtomicU64,
}

impl StreamMetrics {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn to_document(&self) -> bson::Document {
        let get = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed) as i64;
        bson::doc! {
            "largeEventsSplit": get(&self.large_events_split),
            "largeEventsFailed": get(&self.large_events_failed),
            "showExpandedEvents": get(&self.show_expanded_events),
        }
    }
}

/// What opening a shard recovered from its storage: the state its in-memory parts start from.
pub struct Recovered {
    pub hlc: Hlc,
    pub catalog: Catalog,
    pub tail: TailWindow,
    pub oplog_stats: OplogStats,
}

impl ShardState {
    pub fn new(
        name: String,
        storage: Arc<dyn Storage>,
        log: Arc<dyn Log>,
        clock: Arc<dyn Clock>,
        recovered: Recovered,
    ) -> Self {
        let Recovered {
            hlc,
            catalog,
            tail,
            oplog_stats,
        } = recovered;
        let history = Arc::new(History::new(tail.visible(), history::DEFAULT_MAX_BYTES));
        ShardState {
            name,
            storage,
            log,
            clock,
            hlc: Mutex::new(hlc),
            catalog: RwLock::new(Arc::new(catalog)),
            tail,
            commits: AtomicU64::new(0),
            oplog_stats: Mutex::new(oplog_stats),
            retention: Mutex::new(Retention::default()),
            history,
            prepared: Default::default(),
            reservations: Default::default(),
            stream_metrics: StreamMetrics::default(),
            lineage: Mutex::new(None),
            follower: std::sync::OnceLock::new(),
            follower_catalog: Mutex::new(Vec::new()),
        }
    }

    /// The shard's lineage (`None` only before it has opened).
    pub fn lineage(&self) -> Option<crate::lineage::Lineage> {
        self.lineage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_lineage(&self, lineage: crate::lineage::Lineage) {
        *self.lineage.lock().unwrap_or_else(|e| e.into_inner()) = Some(lineage);
    }

    pub fn hlc(&self) -> MutexGuard<'_, Hlc> {
        // A poisoned lock only means another thread panicked while holding it; the clock state
        // is still consistent (every update is a single assignment).
        self.hlc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many batches of write jobs the writer has committed (for tests and benches; a commit
    /// that only renews the clock reservation does not count).
    pub fn commit_count(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    pub(crate) fn count_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// The committed oplog size and truncation point.
    pub fn oplog_stats(&self) -> OplogStats {
        *self.oplog_stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every oplog entry with `ts <=` this has been truncated; reading after an earlier
    /// position has lost history.
    pub fn oplog_truncated_through(&self) -> ClusterTime {
        self.oplog_stats().truncated_through
    }

    pub(crate) fn set_oplog_stats(&self, s: OplogStats) {
        *self.oplog_stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn retention(&self) -> Retention {
        *self.retention.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_retention(&self, r: Retention) {
        *self.retention.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }

    pub fn now_millis(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The current cluster time (never below anything observed or handed out).
    pub fn cluster_time(&self) -> ClusterTime {
        let wall = self.now_millis();
        self.hlc().now(wall)
    }

    pub fn observe(&self, t: ClusterTime) {
        self.hlc().observe(t);
    }

    /// `H`: every oplog entry made visible from now on has `ts > H`. A follower's is what its
    /// applied entries let it promise (`follower`), never its clock's.
    pub fn high_water_mark(&self) -> ClusterTime {
        if let Some(mark) = self.follower.get() {
            return ClusterTime::from_u64(mark.load(Ordering::Acquire));
        }
        let wall = self.now_millis();
        self.hlc().high_water_mark(wall)
    }

    /// Whether this is a follower's read-only state (`follower`).
    pub fn follows(&self) -> bool {
        self.follower.get().is_some()
    }

    /// Makes this a follower's state, whose high-water mark starts at `mark`.
    pub(crate) fn make_follower(&self, mark: ClusterTime) {
        let _ = self.follower.set(AtomicU64::new(mark.as_u64()));
    }

    /// A follower's high-water mark moves up to `mark` (never down: a promise given stays).
    pub(crate) fn raise_follower_mark(&self, mark: ClusterTime) {
        if let Some(m) = self.follower.get() {
            m.fetch_max(mark.as_u64(), Ordering::AcqRel);
        }
    }

    /// The catalog of the last committed state.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn publish_catalog(&self, c: Arc<Catalog>) {
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = c;
    }
}
