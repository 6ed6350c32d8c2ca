//! A Tributary shard: a mongod-like store of documents, catalog and oplog in redb, with a
//! hybrid logical clock and a single group-committing writer.
//!
//! The router talks to a shard only through MongoDB command documents
//! ([`Shard::run_command`]); [`server`] serves the same documents over the wire protocol.
//!
//! Layout:
//! * [`storage`]: the engine seam (trait + redb + fault injection); [`log`]: where each batch's
//!   write set becomes durable before it is applied (the write-ahead log).
//! * [`catalog`], [`keys`], [`indexes`]: collections, document keys, unique index entries.
//! * [`clock`]: injected wall clock and the hybrid logical clock (high-water mark, reservation).
//! * [`oplog`]: entry format and the tail window; [`writer`]: the group-commit thread, which
//!   runs the write path (execute, log, apply: `apply` commits and runs the observers).
//! * [`retryable`]: retryable-write records; [`cursor`]: cursor registry.
//! * [`commands`]: one file per command family; [`update`]: pure update operators and diffs.
//! * [`validation`]: collection validators (`validator`, `validationLevel`,
//!   `validationAction`) enforced on the write path.
//!
//! Invariants (details in each module): every acknowledged write is durable; a document change
//! and its oplog entry are one atomic commit; oplog `ts` strictly increases; after a restart the
//! clock starts above every high-water mark given out before.

mod apply;
mod args;
pub mod background;
pub mod capped;
pub mod catalog;
pub mod changestream;
pub mod clock;
pub mod command;
pub mod commands;
pub mod cursor;
pub mod documents;
mod expiry;
mod follower;
pub mod handshake;
pub mod history;
pub mod holds;
pub mod indexes;
pub mod keys;
pub mod lineage;
pub mod log;
pub mod operations;
pub mod oplog;
pub mod pins;
pub mod preimages;
pub mod query;
pub mod repl;
pub mod replica_set;
pub mod reservations;
pub mod retention;
pub mod retryable;
pub mod server;
mod services;
pub mod session;
pub mod sharding;
pub mod shown;
pub mod state;
pub mod storage;
pub mod ttl;
pub mod txn;
pub mod update;
pub mod validation;
pub mod views;
mod write;
pub mod writer;

use std::path::PathBuf;
use std::sync::Arc;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use wire::raw::Body;

pub use clock::{Clock, ManualClock, SystemClock};

use crate::catalog::{Catalog, CollectionEntry};
use crate::changestream::ChangeStreams;
use crate::clock::Hlc;
use crate::cursor::CursorRegistry;
use crate::log::{LocalLog, Log};
use crate::oplog::TailWindow;
use crate::state::{Recovered, ShardState};
use crate::storage::{KeyRange, RedbStorage, Scan, Storage, StorageError, StorageResult, Table};
use crate::writer::{RESERVATION_KEY, WriteCtx, WriteOutput, Writer};

/// Bytes of recent oplog entries kept in memory for tailing readers.
pub const TAIL_WINDOW_BYTES: usize = 64 * 1024 * 1024;

/// The shard's fail points: `hangAfterCommitDecision` holds a two-phase commit's coordinator
/// after its decision is durable and before it tells the participants (to kill it there);
/// `failCoordinatorDelivery` makes every delivery of a decision fail as if no participant
/// answered.
pub const FAIL_POINTS: &[&str] = &["hangAfterCommitDecision", "failCoordinatorDelivery"];

/// How to open a shard.
#[derive(Clone)]
pub struct ShardOptions {
    pub dbpath: PathBuf,
    /// e.g. "shard0"; also the data file's name.
    pub name: String,
    pub clock: Arc<dyn Clock>,
}

/// Why a shard could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    #[error("creating data directory: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("corrupt {0} in storage")]
    Corrupt(&'static str),
}

/// One shard.
pub struct Shard {
    state: Arc<ShardState>,
    writer: Writer,
    cursors: CursorRegistry,
    change_streams: Arc<ChangeStreams>,
    transactions: txn::Transactions,
    operations: operations::Operations,
    peers: txn::coordinator::Peers,
    /// `configureFailPoint` is accepted (tests only: see [`Shard::enable_test_commands`]).
    test_commands: std::sync::atomic::AtomicBool,
    /// The fail points switched on.
    fail_points: std::sync::Mutex<std::collections::HashSet<String>>,
    /// `ttlMonitorSleepSecs`: how often expired TTL documents are deleted.
    ttl_sleep: ttl::SleepSecs,
    /// Held by [`Shard::mark_lineage_lost`] from its writer job to setting the lineage in
    /// memory: one mark at a time, so the in-memory lineage a job starts from is the stored one
    /// and marks are set in memory in the order the writer stored them.
    lineage_marks: tokio::sync::Mutex<()>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// This shard, for background tasks that outlive the call that starts them.
    me: std::sync::Weak<Shard>,
}

/// What a shard's in-memory state starts from, as one read of its storage finds it.
struct Stored {
    catalog: Catalog,
    /// The clock reservation.
    reserved: ClusterTime,
    /// The last oplog entry's `ts`.
    last: ClusterTime,
    oplog_stats: retention::OplogStats,
    lineage: Option<lineage::Lineage>,
}

impl Stored {
    fn load(read: &dyn storage::ReadTxn) -> Result<Stored, ShardError> {
        let reserved = match read.get(Table::Meta, RESERVATION_KEY)? {
            Some(b) => {
                let arr: [u8; 8] = b
                    .as_slice()
                    .try_into()
                    .map_err(|_| ShardError::Corrupt("clock reservation"))?;
                ClusterTime::from_u64(u64::from_be_bytes(arr))
            }
            None => ClusterTime::ZERO,
        };
        Ok(Stored {
            catalog: load_catalog(read)?,
            reserved,
            last: oplog::last_ts_in_storage(read)?.unwrap_or(ClusterTime::ZERO),
            oplog_stats: retention::OplogStats::load(read)?,
            lineage: lineage::Lineage::load(read)?,
        })
    }
}

/// The catalog as `read` sees it.
fn load_catalog(read: &dyn storage::ReadTxn) -> Result<Catalog, ShardError> {
    let mut catalog = Catalog::default();
    let mut bad = false;
    read.scan(Table::Catalog, &KeyRange::all(), false, &mut |_, v| {
        match Document::from_reader(v)
            .ok()
            .and_then(|d| CollectionEntry::from_document(&d))
        {
            Some(e) => catalog.put(e),
            None => bad = true,
        }
        Scan::Continue
    })?;
    if bad {
        return Err(ShardError::Corrupt("catalog entry"));
    }
    Ok(catalog)
}

impl Shard {
    /// Opens (or creates) the shard's data file `<dbpath>/<name>.redb` and its write-ahead log
    /// `<name>.redb.wal`, replaying the log.
    pub async fn open(opts: ShardOptions) -> Result<Arc<Shard>, ShardError> {
        std::fs::create_dir_all(&opts.dbpath)?;
        let path = opts.dbpath.join(format!("{}.redb", opts.name));
        let engine = tokio::task::spawn_blocking(move || {
            let redb = Arc::new(RedbStorage::open_behind_log(&path)?);
            let log = LocalLog::open(&path, redb.clone())?;
            Ok::<_, StorageError>((redb, log))
        });
        let (redb, log) = engine
            .await
            .map_err(|e| StorageError::Engine(e.to_string()))??;
        Shard::open_with_storage(opts, redb, Arc::new(log)).await
    }

    /// Opens a shard on a given engine and log (tests inject faulty engines; an engine whose
    /// commits are durable needs no log: [`log::Unlogged`]).
    pub async fn open_with_storage(
        opts: ShardOptions,
        storage: Arc<dyn Storage>,
        log: Arc<dyn Log>,
    ) -> Result<Arc<Shard>, ShardError> {
        let Stored {
            catalog,
            reserved,
            last,
            oplog_stats,
            lineage: previous,
        } = Stored::load(&*storage.begin_read()?)?;
        let had_data = last > ClusterTime::ZERO || catalog.collections().next().is_some();
        let hlc = Hlc::recover(reserved, last);
        // This run's boot: the last run may have handed out anything up to `from`; this one's
        // clock starts at `to`.
        let from = reserved.max(last);
        let wall_secs = u32::try_from(opts.clock.now_millis() / 1000).unwrap_or(u32::MAX);
        let to = from.max(ClusterTime::new(wall_secs, 0));
        let mut lineage = lineage::Lineage::started(previous, had_data, from, to);
        lineage.prune(oplog_stats.truncated_through.next());
        let state = Arc::new(ShardState::new(
            opts.name.clone(),
            storage,
            log,
            opts.clock.clone(),
            Recovered {
                hlc,
                catalog,
                tail: TailWindow::new(last, TAIL_WINDOW_BYTES),
                oplog_stats,
            },
        ));
        state.set_lineage(lineage.clone());
        let writer = Writer::start(state.clone());
        // This run's lineage is the writer's first job: stored before anything else is written.
        let saved = writer
            .submit(Box::new(move |w: &mut WriteCtx<'_>| {
                lineage.save(w.txn_mut())?;
                Ok(WriteOutput {
                    reply: Document::new(),
                    op_time: None,
                })
            }))
            .await;
        if let Err(e) = saved {
            if let Some(thread) = writer.stop() {
                let _ = thread.join();
            }
            return Err(ShardError::Storage(StorageError::Engine(e.errmsg)));
        }
        writer.renew();
        let shard = Shard::assemble(state, writer);
        // Transactions prepared before a restart wait for their decision again; decisions this
        // shard coordinated are delivered again. Then the background services start.
        let prepared = shard
            .transactions
            .recover(&shard)
            .map_err(|e| ShardError::Storage(StorageError::Engine(e.errmsg)))?;
        let coordinated = txn::coordinator::recover(&shard)
            .map_err(|e| ShardError::Storage(StorageError::Engine(e.errmsg)))?;
        if prepared + coordinated > 0 {
            tracing::info!(prepared, coordinated, "recovered distributed transactions");
        }
        services::start_all(&shard);
        Ok(shard)
    }

    /// A shard over `state`, written by `writer`, with nothing running yet.
    fn assemble(state: Arc<ShardState>, writer: Writer) -> Arc<Shard> {
        Arc::new_cyclic(|me| Shard {
            me: me.clone(),
            state,
            writer,
            cursors: CursorRegistry::default(),
            change_streams: Arc::default(),
            transactions: txn::Transactions::default(),
            operations: Default::default(),
            peers: Default::default(),
            test_commands: Default::default(),
            fail_points: Default::default(),
            ttl_sleep: Default::default(),
            lineage_marks: Default::default(),
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Runs one command document and returns the reply (always with `$clusterTime` and
    /// `operationTime`).
    pub async fn run_command(&self, cmd: Document) -> Document {
        match self.run_command_body(cmd).await.into_document() {
            Ok(reply) => reply,
            Err(e) => e.to_document(),
        }
    }

    /// [`Shard::run_command`], with the reply as the command made it: change-stream batches
    /// come encoded (their events are written into the reply as bytes, once), the rest as
    /// documents.
    pub async fn run_command_body(&self, cmd: Document) -> Body {
        commands::run(self, cmd).await
    }

    /// The shard's current cluster time.
    pub fn cluster_time(&self) -> ClusterTime {
        self.state.cluster_time()
    }

    /// A time `H` such that every oplog entry made visible after this call has `ts > H`.
    pub fn high_water_mark(&self) -> ClusterTime {
        self.state.high_water_mark()
    }

    /// Sets how much oplog the shard keeps (applied by the next commits, lazily).
    pub fn set_oplog_retention(&self, r: retention::Retention) {
        self.state.set_retention(r);
    }

    /// The `ts` of the last visible oplog entry.
    pub fn last_visible(&self) -> ClusterTime {
        self.state.tail.visible()
    }

    /// The shared state (storage, tail window, catalog) for the change-stream machinery.
    pub fn state(&self) -> &Arc<ShardState> {
        &self.state
    }

    /// Stops background tasks and the writer (after the queued writes).
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        if let Some(h) = self.writer.stop() {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }

    /// `ttlMonitorSleepSecs`.
    pub fn ttl_sleep(&self) -> &ttl::SleepSecs {
        &self.ttl_sleep
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    pub(crate) fn cursors(&self) -> &CursorRegistry {
        &self.cursors
    }

    /// The commands running here for routers' client operations (`killOp` reaches them).
    pub fn operations(&self) -> &operations::Operations {
        &self.operations
    }

    pub fn transactions(&self) -> &txn::Transactions {
        &self.transactions
    }

    /// Accepts `configureFailPoint` from now on (MongoDB's `enableTestCommands`).
    pub fn enable_test_commands(&self) {
        self.test_commands
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// `configureFailPoint {configureFailPoint: name, mode: "alwaysOn" | "off"}` for the shard's
    /// fail points ([`FAIL_POINTS`]), with test commands enabled.
    pub(crate) fn configure_fail_point(&self, cmd: &Document) -> Result<(), wire::MongoError> {
        if !self
            .test_commands
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(wire::MongoError::new(
                wire::ErrorCode::COMMAND_NOT_FOUND,
                "no such command: 'configureFailPoint' (test commands are not enabled)",
            ));
        }
        let name = cmd.get_str("configureFailPoint").map_err(|_| {
            wire::MongoError::failed_to_parse("configureFailPoint needs a fail point name")
        })?;
        if !FAIL_POINTS.contains(&name) {
            return Err(wire::MongoError::bad_value(format!(
                "unknown fail point {name}"
            )));
        }
        let on = match cmd.get("mode") {
            Some(Bson::String(m)) if m == "alwaysOn" => true,
            Some(Bson::String(m)) if m == "off" => false,
            _ => {
                return Err(wire::MongoError::bad_value(
                    "mode must be \"alwaysOn\" or \"off\"",
                ));
            }
        };
        let mut fps = self.fail_points.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            fps.insert(name.to_string());
        } else {
            fps.remove(name);
        }
        Ok(())
    }

    /// Whether a fail point is on.
    pub(crate) fn fail_point(&self, name: &str) -> bool {
        self.fail_points
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// What `serverStatus` shows of this shard: its oplog (size, entries, oldest and newest
    /// `ts`, and the point it was truncated through), high-water mark, pre-images and
    /// change-stream counters.
    pub fn status(&self) -> Result<bson::Document, wire::MongoError> {
        let state = &self.state;
        let stats = state.oplog_stats();
        let storage = |e: StorageError| wire::MongoError::internal(format!("storage: {e}"));
        let read = state.storage.begin_read().map_err(storage)?;
        let ts = |t: Option<ClusterTime>| t.map_or(bson::Bson::Null, |t| t.timestamp().into());
        let oldest = oplog::first_ts_in_storage(&*read).map_err(storage)?;
        let newest = oplog::last_ts_in_storage(&*read).map_err(storage)?;
        drop(read);
        let (images, image_bytes) = preimages::stats(self)?;
        Ok(bson::doc! {
            "shard": &state.name,
            "oplog": {
                "sizeBytes": stats.bytes as i64,
                "entries": stats.entries as i64,
                "oldest": ts(oldest),
                "newest": ts(newest),
                // Every entry at or before it is gone (zero: none ever was).
                "truncatedThrough": stats.truncated_through.timestamp(),
                // The earliest point a stream can start from here: after what truncation
                // removed, within this history, past any stretch it lost.
                "resumableFrom": state
                    .lineage()
                    .map_or(ClusterTime::ZERO, |l| l.resumable_from())
                    .max(stats.truncated_through.next())
                    .timestamp(),
            },
            "highWaterMark": state.high_water_mark().timestamp(),
            "lineage": state.lineage().map(|l| l.to_document()),
            "preImages": {"count": images as i64, "bytes": image_bytes as i64},
            // The shard's bounded in-memory caches, and their bounds.
            "memory": {
                "tailWindowBytes": state.tail.bytes() as i64,
                "tailWindowBound": TAIL_WINDOW_BYTES as i64,
                "historyBytes": state.history.bytes() as i64,
                "historyBound": history::DEFAULT_MAX_BYTES as i64,
                "pageCacheBytes": state.storage.cache_bytes() as i64,
                "pageCacheBound": storage::PAGE_CACHE_BYTES as i64,
            },
            "metrics": {
                // MongoDB's `metrics.cursor.open.total`: find and aggregate cursors, change
                // streams included.
                "cursor": {"open": {
                    "total": (self.cursors.len() + self.change_streams.len()) as i64,
                }},
                "changeStreams": state.stream_metrics.to_document(),
                // The process's: in the embedded default, every shard's and the router's.
                "query": pipeline::agg::spill::counters().to_document(),
            },
            "clientOperations": self.operations.running_commands(),
        })
    }

    /// Marks this shard's boot that ended at `to` lost (the cluster's registry shows its
    /// history had gone past the boot's start: the data came back from an older copy) and
    /// stores it; whether anything changed. A writer job decides and stores the mark, so it is
    /// ordered with every other write and durable as they are; the lineage is set in memory
    /// once it is.
    pub async fn mark_lineage_lost(
        &self,
        to: ClusterTime,
        reached: Option<ClusterTime>,
    ) -> Result<bool, wire::MongoError> {
        let _one_at_a_time = self.lineage_marks.lock().await;
        let (decided, marked) = tokio::sync::oneshot::channel();
        let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
            if let Some(mut lineage) = w.state().lineage()
                && let Some(end) = lineage.mark_lost(to, reached)
            {
                // Fence: nothing written after this job shares a time with the lost history.
                w.state().observe(end);
                lineage.save(w.txn_mut())?;
                let _ = decided.send(lineage);
            }
            Ok(WriteOutput {
                reply: doc! {"ok": 1.0},
                op_time: None,
            })
        };
        self.writer.submit(Box::new(job)).await.map_err(|e| {
            wire::MongoError::internal(format!("storing the lineage: {}", e.errmsg))
        })?;
        // The job has run (and dropped its sender): a lineage came only if it marked one.
        let Ok(lineage) = marked.await else {
            return Ok(false);
        };
        tracing::warn!(shard = %self.state.name, %to, "history lost: this shard's data was restored from an older copy");
        self.state.set_lineage(lineage);
        Ok(true)
    }

    /// Sets and drops retention pins (`pins`), in one writer batch; returns the pins `ids`
    /// name as they are now (a pin set at or below the truncation point comes back expired).
    pub async fn change_pins(
        &self,
        set: Vec<(String, pins::Pin)>,
        drop: Vec<String>,
        ids: Vec<String>,
    ) -> Result<Vec<(String, pins::Pin)>, wire::MongoError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
            let mut pins = pins::Pins::load(w.txn_mut())?;
            for id in &drop {
                pins.0.remove(id);
            }
            let truncated = w.state().oplog_truncated_through();
            for (id, mut pin) in set {
                pin.expired = pin.from <= truncated;
                if pins.0.len() < pins::MAX_PINS || pins.0.contains_key(&id) {
                    pins.0.insert(id, pin);
                }
            }
            pins.save(w.txn_mut())?;
            let now: Vec<(String, pins::Pin)> = ids
                .iter()
                .filter_map(|id| pins.0.get(id).map(|p| (id.clone(), *p)))
                .collect();
            let _ = tx.send(now);
            Ok(WriteOutput {
                reply: doc! {"ok": 1.0},
                op_time: None,
            })
        };
        self.writer.submit(Box::new(job)).await.map_err(|mut e| {
            // Its code stays (OutOfDiskSpace is not an internal error).
            e.errmsg = format!("storing retention pins: {}", e.errmsg);
            e
        })?;
        rx.await
            .map_err(|_| wire::MongoError::internal("the pins job did not answer"))
    }

    /// Runs one purge of expired change-stream pre-images now (it also runs every
    /// [`preimages::PURGE_INTERVAL`]); returns how many it removed.
    pub async fn purge_expired_pre_images(&self) -> Result<usize, wire::MongoError> {
        preimages::purge(self).await
    }

    /// How this shard reaches the other participants of a transaction it coordinates.
    pub fn peers(&self) -> &txn::coordinator::Peers {
        &self.peers
    }

    /// This shard, shared (`None` only while it is being dropped).
    pub(crate) fn shared(&self) -> Option<Arc<Shard>> {
        self.me.upgrade()
    }

    pub(crate) fn change_streams(&self) -> &Arc<ChangeStreams> {
        &self.change_streams
    }

    /// The change-stream readers alive now: cursors with the same shard-side spec share one.
    pub fn change_stream_readers(&self) -> usize {
        self.change_streams.shared_readers()
    }
}

/// `{clusterTime, signature: {hash: 20 zero bytes, keyId: 0}}`.
pub fn cluster_time_doc(t: ClusterTime) -> Document {
    doc! {
        "clusterTime": t.timestamp(),
        "signature": {
            "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0u8; 20] },
            "keyId": 0_i64,
        }
    }
}
