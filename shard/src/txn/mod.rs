//! Multi-document transactions on a shard: the participant side.
//!
//! A session's transaction starts here with its first statement (`autocommit: false` and a
//! `txnNumber` newer than the session's), on a snapshot of the shard's storage. Every statement
//! reads and writes that snapshot with the transaction's own writes laid over it
//! ([`store::TxnStore`]); nothing reaches storage, the oplog or another reader before the
//! commit. The commit is one job of the writer: it checks that no key the transaction wrote
//! changed since its snapshot, applies the write set and writes one `applyOps` oplog entry
//! carrying the session's `lsid` and `txnNumber`, all in one storage commit, so reads and
//! change streams see the transaction whole or not at all.
//!
//! Conflicts: a key written by one running transaction cannot be written by another (that
//! statement fails with `WriteConflict` and its transaction aborts), nor by a transaction
//! after someone else committed a change to it since its snapshot. A write outside any
//! transaction never waits on one: it goes ahead, and a transaction that wrote the same key
//! fails its commit with `WriteConflict`. The router labels these `TransientTransactionError`.
//!
//! A failed statement aborts its transaction, as in MongoDB; a transaction older than
//! [`LIFETIME`] (`transactionLifetimeLimitSeconds`) is aborted by the shard's reaper.
//!
//! Invariants:
//! * a session has at most one transaction here, its newest `txnNumber`; a statement for an
//!   older one is refused with `TransactionTooOld`;
//! * only a statement with `startTransaction` starts one: a later statement of a transaction
//!   this shard does not have (lost with a restart) is refused with `NoSuchTransaction`, so a
//!   commit here covers every statement this shard acknowledged;
//! * the lock table holds exactly the keys written by running transactions, each owned by one;
//! * a commit's outcome is durable in the session's record, written in the same storage commit
//!   as the transaction's writes, so a retried `commitTransaction` answers the same after a
//!   restart.

pub mod coordinator;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::Shard;
use crate::catalog::{Catalog, CollectionEntry};
use crate::command::Command;
use crate::history::AsOf;
use crate::oplog::{EntrySpec, SessionFields};
use crate::retryable::{self, RetryInfo};
use crate::storage::{ReadTxn, StorageError, Table};
use crate::writer::{TxnOp, WriteCtx, WriteFn, WriteOutput};
use coordinator::Peer;
use store::TxnStore;

/// `transactionLifetimeLimitSeconds`: a transaction running longer is aborted.
pub const LIFETIME: Duration = Duration::from_secs(60);

/// A key of one table.
type Key = (Table, Vec<u8>);

/// A key and its value.
type KeyValue = (Vec<u8>, Vec<u8>);

/// A write to one table: the key and its new value (`None`: deleted).
type TableWrite = (Table, Vec<u8>, Option<Vec<u8>>);

/// The tables whose keys a transaction locks and the commit checks.
const CHECKED: [Table; 3] = [Table::Documents, Table::Indexes, Table::Catalog];

/// The transaction fields of a command inside a multi-document transaction.
#[derive(Debug, Clone)]
pub struct TxnArgs {
    /// The session's storage key (as a retryable write's).
    pub key: Vec<u8>,
    pub lsid: Document,
    pub txn_number: i64,
    pub start: bool,
    /// `readConcern.atClusterTime` of the first statement: the time the transaction reads at.
    pub at_cluster_time: Option<ClusterTime>,
    /// `commitTimestamp` of a `commitTransaction` that decides a prepared transaction.
    pub commit_timestamp: Option<ClusterTime>,
    /// Sent by a two-phase commit's coordinator: only it may abort a prepared transaction.
    pub from_coordinator: bool,
    /// `prepareTransaction`'s `coordinator`: whom to ask for the decision.
    pub coordinator: Option<Peer>,
    /// The commit's metadata (who, from where, with which comment), recorded in the entry
    /// that commits the transaction.
    pub commit_metadata: Option<Document>,
}

impl TxnArgs {
    /// `Some` for a command with `autocommit: false`; other commands are not in a transaction.
    pub fn from_command(
        command: Option<Command>,
        name: &str,
        cmd: &Document,
    ) -> Result<Option<TxnArgs>, MongoError> {
        match cmd.get("autocommit") {
            None => {
                if matches!(name, "commitTransaction" | "abortTransaction") {
                    return Err(MongoError::new(
                        ErrorCode::INVALID_OPTIONS,
                        format!("{name} must be run within a transaction"),
                    ));
                }
                return Ok(None);
            }
            Some(Bson::Boolean(false)) => {}
            Some(Bson::Boolean(true)) => {
                return Err(MongoError::new(
                    ErrorCode::INVALID_OPTIONS,
                    "autocommit must be false inside a transaction",
                ));
            }
            Some(_) => {
                return Err(MongoError::type_mismatch(
                    "BSON field 'autocommit' is the wrong type, expected type 'bool'",
                ));
            }
        }
        let Some(info) = RetryInfo::session_of(cmd)? else {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "a transaction needs an lsid and a txnNumber",
            ));
        };
        if !command.is_some_and(Command::in_transaction) {
            return Err(MongoError::new(
                OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                format!("Cannot run '{name}' in a multi-document transaction."),
            ));
        }
        Ok(Some(TxnArgs {
            key: info.key,
            lsid: info.lsid,
            txn_number: info.txn_number,
            start: matches!(cmd.get("startTransaction"), Some(Bson::Boolean(true))),
            at_cluster_time: cmd
                .get_document("readConcern")
                .ok()
                .and_then(|rc| rc.get_timestamp("atClusterTime").ok())
                .map(ClusterTime::from),
            commit_timestamp: cmd
                .get_timestamp("commitTimestamp")
                .ok()
                .map(ClusterTime::from),
            from_coordinator: cmd.get_bool("fromCoordinator").unwrap_or(false),
            coordinator: cmd
                .get_document("coordinator")
                .ok()
                .and_then(Peer::from_document),
            commit_metadata: cmd
                .get_document(crate::writer::COMMIT_METADATA_FIELD)
                .ok()
                .cloned(),
        }))
    }
}

pub const OPERATION_NOT_SUPPORTED_IN_TRANSACTION: ErrorCode =
    ErrorCode::OPERATION_NOT_SUPPORTED_IN_TRANSACTION;

enum State {
    Active(Box<Active>),
    /// Handed to the writer; the commit's outcome is not known yet.
    Committing,
    /// Prepared for a two-phase commit: it can no longer fail, and waits for the decision.
    Prepared(Box<PreparedTxn>),
    Committed,
    Aborted,
}

/// What a prepared transaction will write when it commits, when it was prepared, and who
/// decides it.
#[derive(Clone)]
struct PreparedTxn {
    writes: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
    prepare_ts: ClusterTime,
    /// Whom to ask for the decision when it is long in coming
    /// ([`Transactions::ask_coordinators`]); `None` for a prepare that named no coordinator.
    decider: Option<Decider>,
}

/// A prepared transaction's coordinator, and the session to name when asking it.
#[derive(Clone)]
struct Decider {
    coordinator: Peer,
    lsid: Document,
}

impl Decider {
    fn of(args: &TxnArgs) -> Option<Decider> {
        Some(Decider {
            coordinator: args.coordinator.clone()?,
            lsid: args.lsid.clone(),
        })
    }
}

pub use crate::holds::PreparedKeys;

pub const PREPARED_TRANSACTION_IN_PROGRESS: ErrorCode = ErrorCode::PREPARED_TRANSACTION_IN_PROGRESS;

/// A running transaction.
struct Active {
    store: TxnStore<'static>,
    catalog: Arc<Catalog>,
    ops: Vec<TxnOp>,
    /// The shard's time when the snapshot was taken.
    read_time: ClusterTime,
    started_ms: u64,
}

/// A session's transaction on this shard.
struct Participant {
    txn_number: i64,
    state: State,
    /// When this shard first saw the transaction (wall-clock milliseconds).
    since_ms: u64,
}

/// The transactions of a shard, by session.
#[derive(Default)]
pub struct Transactions {
    sessions: Mutex<HashMap<Vec<u8>, Arc<Mutex<Participant>>>>,
    /// Keys written by running transactions, and the session that wrote each.
    locks: Mutex<HashMap<Key, Vec<u8>>>,
    /// Asking coordinators for decisions long in coming ([`Transactions::ask_coordinators`]).
    asks: Mutex<Asks>,
    /// `askCoordinatorAfterSecs` (0: [`ASK_AFTER`]).
    ask_after_secs: AtomicU64,
}

/// How long a transaction stays prepared here, by default, before this shard asks its
/// coordinator for the decision, and how often it asks again. The coordinator's own delivery
/// normally comes first; asking covers a coordinator that stopped delivering.
pub const ASK_AFTER: Duration = Duration::from_secs(30);

/// What the rounds of asking remember.
#[derive(Default)]
struct Asks {
    /// The transactions prepared at the last round (session, `txnNumber`): still prepared at
    /// the next, they are asked about.
    seen: HashSet<(Vec<u8>, i64)>,
    /// A round is running (it may wait on a coordinator for [`PEER_REPLY_TIMEOUT`]).
    ///
    /// [`PEER_REPLY_TIMEOUT`]: coordinator::PEER_REPLY_TIMEOUT
    running: bool,
}

impl Transactions {
    /// The session's participant for `args`, started on a fresh snapshot when `args` names a
    /// newer transaction than the session's.
    fn participant(
        &self,
        shard: &Shard,
        args: &TxnArgs,
    ) -> Result<Arc<Mutex<Participant>>, MongoError> {
        let existing = lock(&self.sessions).get(&args.key).cloned();
        if let Some(p) = existing {
            let mut g = lock(&p);
            if g.txn_number > args.txn_number {
                return Err(too_old(args, g.txn_number));
            }
            if g.txn_number == args.txn_number {
                drop(g);
                return Ok(p);
            }
            // A newer transaction replaces the session's last one (aborting it if it runs),
            // unless that one is prepared: only its coordinator decides it.
            if matches!(g.state, State::Prepared(_)) {
                return Err(MongoError::new(
                    PREPARED_TRANSACTION_IN_PROGRESS,
                    "the session's previous transaction is prepared and not yet decided",
                ));
            }
            if matches!(g.state, State::Active(_)) {
                g.state = State::Aborted;
                self.release(&args.key);
            }
        }
        let durable = durable_record(shard, &args.key)?;
        if durable.txn_number > args.txn_number {
            return Err(too_old(args, durable.txn_number));
        }
        if durable.txn_number == args.txn_number && durable.committed_txn {
            let p = Arc::new(Mutex::new(Participant {
                txn_number: args.txn_number,
                state: State::Committed,
                since_ms: shard.state().now_millis(),
            }));
            lock(&self.sessions).insert(args.key.clone(), p.clone());
            return Ok(p);
        }
        // Only `startTransaction` starts one. A later statement of a transaction this shard
        // does not have (it restarted since, and lost the statements before) must not start
        // it afresh: the commit would then commit the later statements without the earlier.
        if !args.start {
            return Err(not_in_progress(args, durable.txn_number));
        }
        let state = shard.state();
        // The transaction reads as of one cluster time: the one it was given (every shard it
        // touches reads at the same), else everything committed here so far.
        let read_time = args
            .at_cluster_time
            .unwrap_or_else(|| state.high_water_mark());
        let snapshot = state.storage.begin_read().map_err(storage_error)?;
        let snapshot = AsOf::new(snapshot, state.history.clone(), read_time)?;
        let active = Active {
            store: TxnStore::new(Box::new(snapshot)),
            catalog: state.catalog(),
            ops: Vec::new(),
            read_time,
            started_ms: state.now_millis(),
        };
        let p = Arc::new(Mutex::new(Participant {
            txn_number: args.txn_number,
            state: State::Active(Box::new(active)),
            since_ms: state.now_millis(),
        }));
        lock(&self.sessions).insert(args.key.clone(), p.clone());
        Ok(p)
    }

    /// Runs a write statement of the transaction on its store; a statement that fails (or
    /// conflicts) aborts the transaction.
    pub fn write(
        &self,
        shard: &Shard,
        args: &TxnArgs,
        job: WriteFn,
    ) -> Result<WriteOutput, MongoError> {
        let p = self.participant(shard, args)?;
        let mut g = lock(&p);
        let active = running(&mut g, args)?;
        let Active {
            store,
            catalog,
            ops,
            read_time,
            ..
        } = &mut **active;
        let mut ctx = WriteCtx::in_transaction(store, catalog, shard.state(), ops, *read_time);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut ctx)))
            .unwrap_or_else(|_| Err(StorageError::Engine("write job panicked".into())));
        let outcome = match ran {
            Ok(out) => {
                let fresh = store.take_fresh();
                self.claim(shard, &args.key, store, fresh).map(|()| out)
            }
            Err(e) => Err(storage_error(e)),
        };
        let failed = match &outcome {
            Ok(out) => {
                out.reply
                    .get_array("writeErrors")
                    .is_ok_and(|e| !e.is_empty())
                    || MongoError::from_reply(&out.reply).is_some()
            }
            Err(_) => true,
        };
        if failed {
            g.state = State::Aborted;
            self.release(&args.key);
        }
        outcome
    }

    /// Runs a read of the transaction on its store and catalog; a failed read aborts it.
    pub fn read<R>(
        &self,
        shard: &Shard,
        args: &TxnArgs,
        f: impl FnOnce(&dyn ReadTxn, &Catalog) -> Result<R, MongoError>,
    ) -> Result<R, MongoError> {
        let p = self.participant(shard, args)?;
        let mut g = lock(&p);
        let active = running(&mut g, args)?;
        let result = f(&active.store, &active.catalog);
        if result.is_err() {
            g.state = State::Aborted;
            self.release(&args.key);
        }
        result
    }

    /// Takes the locks of the keys a statement wrote for the first time, checking that no
    /// other transaction holds them and that nobody committed a change to them since the
    /// snapshot.
    fn claim(
        &self,
        shard: &Shard,
        session: &[u8],
        store: &TxnStore<'_>,
        fresh: Vec<Key>,
    ) -> Result<(), MongoError> {
        let fresh: Vec<Key> = fresh
            .into_iter()
            .filter(|(t, _)| CHECKED.contains(t))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        {
            let mut locks = lock(&self.locks);
            if fresh
                .iter()
                .any(|k| locks.get(k).is_some_and(|owner| owner != session))
            {
                return Err(write_conflict());
            }
            for k in &fresh {
                locks.insert(k.clone(), session.to_vec());
            }
        }
        let now = shard.state().storage.begin_read().map_err(storage_error)?;
        for (t, k) in &fresh {
            let seen = store
                .writes()
                .get(&(*t, k.clone()))
                .and_then(|w| w.seen.as_deref());
            if now.get(*t, k).map_err(storage_error)?.as_deref() != seen {
                return Err(write_conflict());
            }
        }
        Ok(())
    }

    /// Drops every lock `session` holds.
    fn release(&self, session: &[u8]) {
        lock(&self.locks).retain(|_, owner| owner != session);
    }

    /// `commitTransaction`: commits the transaction in one writer job; retried, it answers as
    /// the first time did.
    pub async fn commit(&self, shard: &Shard, args: &TxnArgs) -> Result<WriteOutput, MongoError> {
        let p = self.existing(shard, args)?;
        if let Some(prepared) = take_prepared(&p) {
            return self.commit_prepared(shard, &p, args, prepared).await;
        }
        let active = {
            let mut g = lock(&p);
            match std::mem::replace(&mut g.state, State::Committing) {
                State::Active(a) => a,
                State::Prepared(prepared) => {
                    g.state = State::Prepared(prepared);
                    return Err(MongoError::new(
                        ErrorCode::CONFLICTING_OPERATION_IN_PROGRESS,
                        "the transaction was prepared meanwhile",
                    ));
                }
                State::Committed => {
                    g.state = State::Committed;
                    return Ok(ok_output(None));
                }
                State::Committing => {
                    return Err(MongoError::new(
                        ErrorCode::CONFLICTING_OPERATION_IN_PROGRESS,
                        "the transaction is being committed",
                    ));
                }
                State::Aborted => {
                    g.state = State::Aborted;
                    return Err(no_such_transaction(args));
                }
            }
        };
        let outcome = if active.store.writes().is_empty() && active.ops.is_empty() {
            Ok(ok_output(None))
        } else {
            shard
                .writer()
                .submit(commit_job(*active, args.clone()))
                .await
                .and_then(|out| match MongoError::from_reply(&out.reply) {
                    Some(e) => Err(e),
                    None => Ok(out),
                })
        };
        let mut g = lock(&p);
        g.state = if outcome.is_ok() {
            State::Committed
        } else {
            State::Aborted
        };
        self.release(&args.key);
        outcome
    }

    /// `abortTransaction`.
    pub async fn abort(&self, shard: &Shard, args: &TxnArgs) -> Result<(), MongoError> {
        let p = self.existing(shard, args)?;
        if let Some(prepared) = take_prepared(&p) {
            if !args.from_coordinator {
                lock(&p).state = State::Prepared(prepared);
                return Err(MongoError::new(
                    PREPARED_TRANSACTION_IN_PROGRESS,
                    "the transaction is prepared: only its coordinator decides it",
                ));
            }
            let aborted = shard
                .writer()
                .submit(abort_prepared_job(args.clone(), prepared.prepare_ts))
                .await;
            if let Err(e) = aborted {
                lock(&p).state = State::Prepared(prepared);
                return Err(e);
            }
            self.decided(shard, &p, args, &prepared, State::Aborted);
            return Ok(());
        }
        let mut g = lock(&p);
        match &g.state {
            State::Active(_) => {
                g.state = State::Aborted;
                self.release(&args.key);
                Ok(())
            }
            State::Prepared(_) => Err(MongoError::new(
                ErrorCode::CONFLICTING_OPERATION_IN_PROGRESS,
                "the transaction was prepared meanwhile",
            )),
            State::Committed | State::Committing => Err(MongoError::new(
                ErrorCode::TRANSACTION_COMMITTED,
                format!(
                    "Transaction with {{ txnNumber: {} }} has been committed.",
                    args.txn_number
                ),
            )),
            State::Aborted => Err(no_such_transaction(args)),
        }
    }

    /// `prepareTransaction` (from the coordinator): checks the transaction's writes and makes
    /// them durable with a `prepare` oplog entry; from then on it can only be decided. Returns
    /// the prepare timestamp. Prepared again, it answers the same.
    pub async fn prepare(&self, shard: &Shard, args: &TxnArgs) -> Result<ClusterTime, MongoError> {
        let p = self.existing(shard, args)?;
        let active = {
            let mut g = lock(&p);
            match std::mem::replace(&mut g.state, State::Committing) {
                State::Active(a) => a,
                State::Prepared(prepared) => {
                    let ts = prepared.prepare_ts;
                    g.state = State::Prepared(prepared);
                    return Ok(ts);
                }
                other => {
                    let committed = matches!(other, State::Committed);
                    g.state = other;
                    return Err(if committed {
                        MongoError::new(
                            ErrorCode::TRANSACTION_COMMITTED,
                            "the transaction has been committed",
                        )
                    } else {
                        no_such_transaction(args)
                    });
                }
            }
        };
        let mut writes: Vec<(Table, Vec<u8>, Option<Vec<u8>>)> = active
            .store
            .writes()
            .iter()
            .map(|((t, k), w)| (*t, k.clone(), w.value.clone()))
            .collect();
        let pre_images = Arc::new(Mutex::new(Vec::new()));
        let outcome = shard
            .writer()
            .submit(prepare_job(
                *active,
                args.clone(),
                writes.clone(),
                pre_images.clone(),
            ))
            .await
            .and_then(|out| match MongoError::from_reply(&out.reply) {
                Some(e) => Err(e),
                None => out
                    .op_time
                    .ok_or_else(|| MongoError::internal("a prepare without its timestamp")),
            });
        let mut g = lock(&p);
        match outcome {
            Ok(prepare_ts) => {
                // The job listed these keys already (see `prepare_job`).
                writes.append(&mut lock(&pre_images));
                g.state = State::Prepared(Box::new(PreparedTxn {
                    writes,
                    prepare_ts,
                    decider: Decider::of(args),
                }));
                Ok(prepare_ts)
            }
            Err(e) => {
                g.state = State::Aborted;
                self.release(&args.key);
                Err(e)
            }
        }
    }

    /// Commits a prepared transaction at the coordinator's `commitTimestamp`.
    /// Commits a prepared transaction at the coordinator's `commitTimestamp`; `prepared` was
    /// taken from the participant ([`take_prepared`]) and goes back when the commit fails.
    async fn commit_prepared(
        &self,
        shard: &Shard,
        p: &Arc<Mutex<Participant>>,
        args: &TxnArgs,
        prepared: Box<PreparedTxn>,
    ) -> Result<WriteOutput, MongoError> {
        let refused = match args.commit_timestamp {
            None => Some("commitTransaction of a prepared transaction needs a commitTimestamp"),
            Some(ts) if ts < prepared.prepare_ts => {
                Some("commitTimestamp is before the transaction's prepare timestamp")
            }
            Some(_) => None,
        };
        let (Some(commit_ts), None) = (args.commit_timestamp, refused) else {
            lock(p).state = State::Prepared(prepared);
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                refused.unwrap_or_default(),
            ));
        };
        let committed = shard
            .writer()
            .submit(commit_prepared_job(
                args.clone(),
                (*prepared).clone(),
                commit_ts,
            ))
            .await;
        match committed {
            Ok(out) => {
                self.decided(shard, p, args, &prepared, State::Committed);
                Ok(out)
            }
            Err(e) => {
                lock(p).state = State::Prepared(prepared);
                Err(e)
            }
        }
    }

    /// A prepared transaction is decided (and its outcome durable): its keys, locks and hold on
    /// the high-water mark go.
    fn decided(
        &self,
        shard: &Shard,
        p: &Arc<Mutex<Participant>>,
        args: &TxnArgs,
        prepared: &PreparedTxn,
        outcome: State,
    ) {
        lock(p).state = outcome;
        let state = shard.state();
        state
            .prepared
            .remove(prepared.writes.iter().map(|(t, k, _)| (*t, k.clone())));
        state.reservations.holds_moved();
        state.hlc().release(prepared.prepare_ts);
        self.release(&args.key);
    }

    /// After a restart: the prepared transactions recorded in storage wait for their
    /// decision again, holding their keys and the high-water mark as before.
    pub fn recover(&self, shard: &Shard) -> Result<usize, MongoError> {
        let state = shard.state();
        let read = state.storage.begin_read().map_err(storage_error)?;
        let mut found = Vec::new();
        read.scan(
            Table::Transactions,
            &crate::storage::KeyRange::prefix(PARTICIPANT_PREFIX),
            false,
            &mut |k, v| {
                found.push((k[PARTICIPANT_PREFIX.len()..].to_vec(), v.to_vec()));
                crate::storage::Scan::Continue
            },
        )
        .map_err(storage_error)?;
        let n = found.len();
        for (session, bytes) in found {
            let Some((txn_number, prepared)) = decode_prepared(&bytes) else {
                return Err(MongoError::internal(
                    "a corrupt prepared transaction record",
                ));
            };
            state.hlc().hold(prepared.prepare_ts);
            state
                .prepared
                .add(prepared.writes.iter().map(|(t, k, _)| (*t, k.clone())));
            {
                let mut locks = lock(&self.locks);
                for (t, k, _) in &prepared.writes {
                    locks.insert((*t, k.clone()), session.clone());
                }
            }
            lock(&self.sessions).insert(
                session,
                Arc::new(Mutex::new(Participant {
                    txn_number,
                    state: State::Prepared(Box::new(prepared)),
                    since_ms: state.now_millis(),
                })),
            );
        }
        Ok(n)
    }

    /// How the session's transaction `args` ended here: `Some(true)` committed, `Some(false)`
    /// aborted, `None` when it is still running or this shard does not know it.
    pub fn outcome(&self, shard: &Shard, args: &TxnArgs) -> Option<bool> {
        let p = self.existing(shard, args).ok()?;
        let g = lock(&p);
        match g.state {
            State::Committed => Some(true),
            State::Aborted => Some(false),
            _ => None,
        }
    }

    /// For a router recovering a commit's outcome with only the `recoveryToken` (no
    /// coordinator here knows the transaction): `Some(true)` when this shard committed it,
    /// `Some(false)` when it did not and never will (a running transaction is aborted here
    /// first: its router is gone, so nothing can commit it whole any more), `None` while its
    /// commit or prepare is still being decided.
    pub fn settle_for_recovery(
        &self,
        shard: &Shard,
        args: &TxnArgs,
    ) -> Result<Option<bool>, MongoError> {
        let p = match self.existing(shard, args) {
            Ok(p) => p,
            Err(e) if e.code == ErrorCode::NO_SUCH_TRANSACTION.code => return Ok(Some(false)),
            Err(e) => return Err(e),
        };
        let mut g = lock(&p);
        Ok(match g.state {
            State::Committed => Some(true),
            State::Aborted => Some(false),
            State::Active(_) => {
                g.state = State::Aborted;
                self.release(&args.key);
                Some(false)
            }
            State::Committing | State::Prepared(_) => None,
        })
    }

    /// Whether a prepared transaction is undecided here (reads of the latest state wait).
    pub fn any_prepared(&self, shard: &Shard) -> bool {
        shard.state().prepared.any() || shard.state().hlc().has_holds()
    }

    /// The session's participant for exactly `args`' transaction (commit and abort never
    /// start one).
    fn existing(
        &self,
        shard: &Shard,
        args: &TxnArgs,
    ) -> Result<Arc<Mutex<Participant>>, MongoError> {
        let found = lock(&self.sessions).get(&args.key).cloned();
        match found {
            Some(p) => {
                let n = lock(&p).txn_number;
                if n == args.txn_number {
                    Ok(p)
                } else if n > args.txn_number {
                    Err(too_old(args, n))
                } else {
                    Err(no_such_transaction(args))
                }
            }
            None => {
                // Not in memory (the shard restarted): the session's record says whether it
                // committed.
                let durable = durable_record(shard, &args.key)?;
                if durable.txn_number == args.txn_number && durable.committed_txn {
                    Ok(Arc::new(Mutex::new(Participant {
                        txn_number: args.txn_number,
                        state: State::Committed,
                        since_ms: shard.state().now_millis(),
                    })))
                } else if durable.txn_number > args.txn_number {
                    Err(too_old(args, durable.txn_number))
                } else {
                    Err(no_such_transaction(args))
                }
            }
        }
    }

    /// Aborts the running transactions older than `lifetime`; forgets finished ones once
    /// their session could have expired ([`SESSION_TIMEOUT`] after the transaction began: a
    /// late statement or retry of it finds its outcome until then, and the durable session
    /// record says whether it committed after).
    ///
    /// [`SESSION_TIMEOUT`]: crate::retryable::SESSION_TIMEOUT
    pub fn reap(&self, now_ms: u64, lifetime: Duration) {
        let forget_after =
            u64::try_from(crate::retryable::SESSION_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        lock(&self.sessions).retain(|_, p| {
            let g = lock(p);
            let finished = matches!(g.state, State::Committed | State::Aborted);
            !(finished && now_ms.saturating_sub(g.since_ms) > forget_after)
        });
        let limit = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX);
        let sessions: Vec<(Vec<u8>, Arc<Mutex<Participant>>)> = lock(&self.sessions)
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        for (key, p) in sessions {
            let mut g = lock(&p);
            if let State::Active(a) = &g.state
                && now_ms.saturating_sub(a.started_ms) > limit
            {
                tracing::info!(
                    txn_number = g.txn_number,
                    "aborting a transaction past its lifetime"
                );
                g.state = State::Aborted;
                self.release(&key);
            }
        }
    }

    /// Aborts the running transactions of the sessions `killed` picks (by session key:
    /// `lsid.id`, then `lsid.uid` when there is one), for `killSessions`, `killAllSessions`
    /// and `endSessions`. A prepared transaction is its coordinator's to decide, as in
    /// MongoDB, and stays. Returns how many were aborted.
    pub fn kill_sessions(&self, killed: &SessionFilter) -> usize {
        let sessions: Vec<(Vec<u8>, Arc<Mutex<Participant>>)> = lock(&self.sessions)
            .iter()
            .filter(|(k, _)| killed.matches(k))
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        let mut aborted = 0;
        for (key, p) in sessions {
            let mut g = lock(&p);
            if let State::Active(_) = &g.state {
                tracing::info!(
                    txn_number = g.txn_number,
                    "aborting a killed session's transaction"
                );
                g.state = State::Aborted;
                self.release(&key);
                aborted += 1;
            }
        }
        aborted
    }

    /// How long a transaction stays prepared before its coordinator is asked
    /// (`askCoordinatorAfterSecs`).
    pub fn ask_after(&self) -> Duration {
        match self.ask_after_secs.load(Ordering::Relaxed) {
            0 => ASK_AFTER,
            n => Duration::from_secs(n),
        }
    }

    /// `setParameter: {askCoordinatorAfterSecs: n}`: the previous value.
    pub fn set_ask_after(&self, v: &Bson) -> Result<u64, MongoError> {
        match pipeline::value::as_i64_exact(v) {
            Some(n) if (1..=86_400).contains(&n) => {
                let was = self.ask_after().as_secs();
                self.ask_after_secs.store(n as u64, Ordering::Relaxed);
                Ok(was)
            }
            _ => Err(MongoError::bad_value(
                "askCoordinatorAfterSecs must be an integer from 1 to 86400",
            )),
        }
    }

    /// One round of asking (every [`Transactions::ask_after`]): the coordinator of each
    /// transaction that was prepared here at the last round too is asked for its decision,
    /// and the decision it answers is applied as if the coordinator had delivered it. A
    /// coordinator that has no decision yet, or no record of the transaction, decides
    /// nothing here: the transaction stays prepared and is asked about again.
    pub async fn ask_coordinators(&self, shard: &Shard) {
        let waiting: Vec<(Vec<u8>, i64, Decider)> = {
            let sessions = lock(&self.sessions);
            sessions
                .iter()
                .filter_map(|(key, p)| {
                    let g = lock(p);
                    match &g.state {
                        State::Prepared(prepared) => prepared
                            .decider
                            .clone()
                            .map(|d| (key.clone(), g.txn_number, d)),
                        _ => None,
                    }
                })
                .collect()
        };
        let ask: Vec<(Vec<u8>, i64, Decider)> = {
            let mut asks = lock(&self.asks);
            if asks.running {
                return;
            }
            let now: HashSet<(Vec<u8>, i64)> =
                waiting.iter().map(|(k, n, _)| (k.clone(), *n)).collect();
            let ask = waiting
                .into_iter()
                .filter(|(k, n, _)| asks.seen.contains(&(k.clone(), *n)))
                .collect();
            asks.seen = now;
            asks.running = true;
            ask
        };
        futures::future::join_all(
            ask.into_iter()
                .map(|(key, n, decider)| self.ask_coordinator(shard, key, n, decider)),
        )
        .await;
        lock(&self.asks).running = false;
    }

    /// Asks one transaction's coordinator for its decision, and applies it.
    async fn ask_coordinator(&self, shard: &Shard, key: Vec<u8>, txn_number: i64, d: Decider) {
        let question = doc! {
            "coordinateCommitTransaction": 1,
            "lsid": d.lsid.clone(),
            "txnNumber": txn_number,
            "autocommit": false,
            "participants": [],
            "fromParticipant": true,
        };
        let answer = match coordinator::exchange(shard, &d.coordinator, question).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::info!(coordinator = %d.coordinator.name, txn_number, error = %e,
                    "asking a coordinator for a decision");
                return;
            }
        };
        let mut args = TxnArgs {
            key,
            lsid: d.lsid,
            txn_number,
            start: false,
            at_cluster_time: None,
            commit_timestamp: None,
            from_coordinator: true,
            coordinator: None,
            commit_metadata: answer
                .get_document(crate::writer::COMMIT_METADATA_FIELD)
                .ok()
                .cloned(),
        };
        let applied = match answer.get("decision") {
            Some(Bson::Document(c)) => match c.get_timestamp("commit") {
                Ok(ts) => {
                    args.commit_timestamp = Some(ClusterTime::from(ts));
                    self.commit(shard, &args).await.map(|_| ())
                }
                Err(_) => Ok(()),
            },
            Some(Bson::String(s)) if s == "abort" => self.abort(shard, &args).await,
            other => {
                tracing::info!(coordinator = %d.coordinator.name, txn_number, answer = ?other,
                    "the coordinator has no decision to give yet");
                Ok(())
            }
        };
        match applied {
            Ok(()) => tracing::info!(coordinator = %d.coordinator.name, txn_number,
                "applied a decision asked of the coordinator"),
            Err(e) => tracing::info!(txn_number, error = %e,
                "applying a decision asked of the coordinator"),
        }
    }

    /// How many sessions this shard keeps a transaction of, running or finished.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// How many transactions are running (for `serverStatus` and tests).
    pub fn running(&self) -> usize {
        lock(&self.sessions)
            .values()
            .filter(|p| matches!(lock(p).state, State::Active(_)))
            .count()
    }
}

/// Which sessions a `killSessions`, `killAllSessions` or `endSessions` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionFilter {
    /// Every session.
    All,
    /// The sessions with these `lsid.id`s.
    Ids(Vec<Vec<u8>>),
    /// The sessions of these users (`lsid.uid`, the SHA-256 of `user@db`).
    Users(Vec<Vec<u8>>),
}

impl SessionFilter {
    /// The filter a command's argument names: `endSessions` / `killSessions` list `lsid`s
    /// (an empty `killSessions` list is every session the caller may kill, which the router
    /// has narrowed to the caller's when it runs with `--auth`); `killAllSessions` lists
    /// `{user, db}` patterns, or nothing for every session.
    pub fn of(name: &str, cmd: &Document) -> Result<SessionFilter, MongoError> {
        let Ok(items) = cmd.get_array(name) else {
            return Err(MongoError::type_mismatch(format!(
                "BSON field '{name}.{name}' is the wrong type, expected type 'array'"
            )));
        };
        if items.is_empty() {
            return Ok(SessionFilter::All);
        }
        let mut ids = Vec::new();
        let mut users = Vec::new();
        for item in items {
            let Bson::Document(d) = item else {
                return Err(MongoError::type_mismatch(format!(
                    "BSON field '{name}' elements must be objects"
                )));
            };
            if let Some(Bson::Binary(id)) = d.get("id") {
                ids.push(id.bytes.clone());
            } else if let Some(Bson::Binary(uid)) = d.get("uid") {
                users.push(uid.bytes.clone());
            } else if let (Ok(user), Ok(db)) = (d.get_str("user"), d.get_str("db")) {
                users.push(user_uid(user, db));
            } else if let Ok(list) = d.get_array("users") {
                for u in list.iter().filter_map(Bson::as_document) {
                    if let (Ok(user), Ok(db)) = (u.get_str("user"), u.get_str("db")) {
                        users.push(user_uid(user, db));
                    }
                }
            } else {
                return Err(MongoError::new(
                    ErrorCode::NO_SUCH_KEY,
                    format!("BSON field '{name}.id' is missing but a required field"),
                ));
            }
        }
        Ok(if users.is_empty() {
            SessionFilter::Ids(ids)
        } else {
            SessionFilter::Users(users)
        })
    }

    /// Whether the session with this key is one of them.
    pub fn matches(&self, key: &[u8]) -> bool {
        match self {
            SessionFilter::All => true,
            SessionFilter::Ids(ids) => ids.iter().any(|id| key.starts_with(id)),
            SessionFilter::Users(uids) => uids
                .iter()
                .any(|uid| key.len() > uid.len() && key.ends_with(uid)),
        }
    }
}

/// A user's `uid` in session ids: the SHA-256 of `user@db`, as MongoDB's.
fn user_uid(user: &str, db: &str) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(format!("{user}@{db}").as_bytes()).to_vec()
}

/// The writer job that commits `active`: checks, applies, logs the `applyOps`, records the
/// outcome in the session's record.
fn commit_job(active: Active, args: TxnArgs) -> WriteFn {
    Box::new(move |w: &mut WriteCtx<'_>| {
        w.commit_metadata = args
            .commit_metadata
            .as_ref()
            .map(crate::writer::CommitMetadata::new);
        let Active { store, mut ops, .. } = active;
        mark_no_net_change(&mut ops, &store);
        if conflicts(w, &store)? {
            return Ok(WriteOutput {
                reply: write_conflict().to_document(),
                op_time: None,
            });
        }
        apply_writes(
            w,
            store
                .into_writes()
                .into_iter()
                .map(|((t, k), written)| (t, k, written.value)),
        )?;
        let (ts, pre_images) = log_apply_ops(w, &args, ops, Document::new())?;
        for (key, before) in pre_images {
            w.txn_mut().put(Table::PreImages, &key, &before)?;
        }
        let wall = w.wall_ms;
        retryable::save_committed_transaction(w.txn_mut(), &args.key, args.txn_number, ts, wall)?;
        Ok(ok_output(Some(ts)))
    })
}

/// The most bytes of operations one `applyOps` entry carries; a larger transaction is a chain
/// of entries (MongoDB's limit is the 16 MB document size; this leaves room for the rest).
pub const APPLY_OPS_BYTES: usize = 15 * 1024 * 1024;

/// How a transaction's operations are split into `applyOps` entries of at most `limit` bytes
/// each (an operation larger than `limit` gets an entry of its own).
fn chunks(ops: Vec<TxnOp>, limit: usize) -> Vec<Vec<TxnOp>> {
    let mut out: Vec<Vec<TxnOp>> = Vec::new();
    let mut size = 0;
    for op in ops {
        let n = pipeline::changestream::split::document_size(&op.entry);
        match out.last_mut() {
            Some(last) if size + n <= limit => last.push(op),
            _ => {
                out.push(vec![op]);
                size = 0;
            }
        }
        size += n;
    }
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

/// Marks the ops of each document the transaction leaves as it found it (its value when the
/// transaction first wrote it is its value at the end: changed and changed back, or inserted
/// and deleted) with `noNetChange`, which change streams with `transactionNetEffect` fold into
/// nothing (`pipeline::changestream::net_effect`). Only the commit can tell: it has both values.
fn mark_no_net_change(ops: &mut [TxnOp], store: &TxnStore<'_>) {
    let unchanged: HashSet<&[u8]> = store
        .writes()
        .iter()
        .filter(|((table, _), w)| *table == Table::Documents && w.seen == w.value)
        .map(|((_, key), _)| key.as_slice())
        .collect();
    if unchanged.is_empty() {
        return;
    }
    for op in ops {
        let e = &op.entry;
        let ui = match e.get("ui") {
            Some(Bson::Binary(b)) => b
                .bytes
                .as_slice()
                .try_into()
                .ok()
                .map(bson::Uuid::from_bytes),
            _ => None,
        };
        let id = match e.get_str("op") {
            Ok("d") => e.get_document("o").ok().and_then(|o| o.get("_id")),
            Ok("i" | "u") => e.get_document("o2").ok().and_then(|o| o.get("_id")),
            _ => None,
        };
        if let (Some(ui), Some(id)) = (ui, id)
            && unchanged.contains(crate::keys::doc_key(&ui, id).as_slice())
        {
            op.entry
                .insert(pipeline::changestream::net_effect::NO_NET_CHANGE, true);
        }
    }
}

/// Writes a transaction's operations as its `applyOps` entries, all in the writer's storage
/// transaction: one entry when they fit, else a chain, each entry but the last marked
/// `partialTxn` and each pointing at the one before (`prevOpTime`); `last` adds fields to the
/// final entry (`prepare: true`). Returns the final entry's `ts`, and the operations'
/// pre-images as `Table::PreImages` writes (keyed by the `ts` of the entry holding each op and
/// its index there), for the caller to write with the commit.
fn log_apply_ops(
    w: &mut WriteCtx<'_>,
    args: &TxnArgs,
    ops: Vec<TxnOp>,
    last: Document,
) -> Result<(ClusterTime, Vec<KeyValue>), StorageError> {
    let count = ops.len();
    let parts = chunks(ops, APPLY_OPS_BYTES);
    let n = parts.len();
    let mut prev = None;
    let mut ts = ClusterTime::ZERO;
    let mut pre_images = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        let (entries, befores): (Vec<Document>, Vec<_>) =
            part.into_iter().map(|op| (op.entry, op.pre_image)).unzip();
        let mut o = doc! {"applyOps": entries};
        if i + 1 < n {
            o.insert("partialTxn", true);
        } else {
            if n > 1 {
                o.insert("count", count as i64);
            }
            o.extend(last.clone());
        }
        ts = w.log(EntrySpec {
            op: "c",
            ns: "admin.$cmd".into(),
            ui: None,
            o,
            o2: None,
            pre_image: None,
            session: Some(SessionFields {
                lsid: args.lsid.clone(),
                txn_number: args.txn_number,
                stmt_id: None,
                prev_op_time: prev,
            }),
        })?;
        prev = Some(ts);
        for (index, before) in befores.into_iter().enumerate() {
            if let Some((ui, before)) = before {
                let mut bytes = Vec::new();
                before
                    .to_writer(&mut bytes)
                    .map_err(|e| StorageError::Engine(format!("serializing a pre-image: {e}")))?;
                pre_images.push((crate::keys::pre_image_key(&ui, ts, index as u64), bytes));
            }
        }
    }
    Ok((ts, pre_images))
}

/// Takes a prepared transaction out of its participant for its decision, leaving `Committing`
/// until the decision is durable: a second decision arriving meanwhile (a coordinator's
/// redelivery racing its first delivery, or the participant's own question answered) is told
/// to try again instead of writing the transaction twice.
fn take_prepared(p: &Mutex<Participant>) -> Option<Box<PreparedTxn>> {
    let mut g = lock(p);
    match std::mem::replace(&mut g.state, State::Committing) {
        State::Prepared(prepared) => Some(prepared),
        other => {
            g.state = other;
            None
        }
    }
}

/// Storage key prefix of a prepared participant's record in [`Table::Transactions`].
const PARTICIPANT_PREFIX: &[u8] = b"p";

/// The lowest prepare timestamp of the undecided prepared transactions `read` holds (a
/// follower's high-water mark stays below it); `Err` for a record that does not decode.
pub(crate) fn lowest_prepare(read: &dyn ReadTxn) -> Result<Option<ClusterTime>, MongoError> {
    let mut lowest: Option<ClusterTime> = None;
    let mut corrupt = false;
    read.scan(
        Table::Transactions,
        &crate::storage::KeyRange::prefix(PARTICIPANT_PREFIX),
        false,
        &mut |_, v| {
            match decode_prepared(v) {
                Some((_, p)) => lowest = Some(lowest.map_or(p.prepare_ts, |l| l.min(p.prepare_ts))),
                None => corrupt = true,
            }
            crate::storage::Scan::Continue
        },
    )
    .map_err(storage_error)?;
    if corrupt {
        return Err(MongoError::internal(
            "a corrupt prepared transaction record",
        ));
    }
    Ok(lowest)
}

fn participant_key(session: &[u8]) -> Vec<u8> {
    let mut k = PARTICIPANT_PREFIX.to_vec();
    k.extend_from_slice(session);
    k
}

fn encode_prepared(txn_number: i64, p: &PreparedTxn) -> Result<Vec<u8>, StorageError> {
    let writes: Vec<Bson> = p
        .writes
        .iter()
        .map(|(t, k, v)| {
            let bin = |b: &[u8]| {
                Bson::Binary(bson::Binary {
                    subtype: bson::spec::BinarySubtype::Generic,
                    bytes: b.to_vec(),
                })
            };
            Bson::Document(doc! {
                "t": t.name(),
                "k": bin(k),
                "v": v.as_deref().map(bin).unwrap_or(Bson::Null),
            })
        })
        .collect();
    let mut d = doc! {
        "txnNumber": txn_number,
        "prepareTs": p.prepare_ts.timestamp(),
        "writes": writes,
    };
    if let Some(decider) = &p.decider {
        d.insert("coordinator", decider.coordinator.to_document());
        d.insert("lsid", decider.lsid.clone());
    }
    let mut buf = Vec::new();
    d.to_writer(&mut buf)
        .map_err(|e| StorageError::Engine(format!("a prepared transaction record: {e}")))?;
    Ok(buf)
}

fn decode_prepared(bytes: &[u8]) -> Option<(i64, PreparedTxn)> {
    let d = Document::from_reader(bytes).ok()?;
    let mut writes = Vec::new();
    for w in d.get_array("writes").ok()? {
        let w = w.as_document()?;
        let t = Table::from_name(w.get_str("t").ok()?)?;
        let k = w.get_binary_generic("k").ok()?.clone();
        let v = match w.get("v") {
            Some(Bson::Binary(b)) => Some(b.bytes.clone()),
            _ => None,
        };
        writes.push((t, k, v));
    }
    Some((
        d.get_i64("txnNumber").ok()?,
        PreparedTxn {
            writes,
            prepare_ts: ClusterTime::from(d.get_timestamp("prepareTs").ok()?),
            decider: d
                .get_document("coordinator")
                .ok()
                .and_then(Peer::from_document)
                .zip(d.get_document("lsid").ok())
                .map(|(coordinator, lsid)| Decider {
                    coordinator,
                    lsid: lsid.clone(),
                }),
        },
    ))
}

/// The writer job that prepares `active`: checks its writes as a commit would, writes the
/// `prepare` entry and the durable record, holds the high-water mark below the entry and lists
/// the keys no other write may touch until the decision.
/// The operations' pre-images join `writes` (in the record, and in `pre_images` for the
/// caller): they are written when the transaction commits.
fn prepare_job(
    active: Active,
    args: TxnArgs,
    mut writes: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
    pre_images: Arc<Mutex<Vec<TableWrite>>>,
) -> WriteFn {
    Box::new(move |w: &mut WriteCtx<'_>| {
        let Active { store, mut ops, .. } = active;
        if conflicts(w, &store)? {
            return Ok(WriteOutput {
                reply: write_conflict().to_document(),
                op_time: None,
            });
        }
        mark_no_net_change(&mut ops, &store);
        drop(store);
        let (ts, befores) = log_apply_ops(w, &args, ops, doc! {"prepare": true})?;
        let befores: Vec<_> = befores
            .into_iter()
            .map(|(k, v)| (Table::PreImages, k, Some(v)))
            .collect();
        writes.extend(befores.iter().cloned());
        *lock(&pre_images) = befores;
        let keys = writes.iter().map(|(t, k, _)| (*t, k.clone())).collect();
        let record = encode_prepared(
            args.txn_number,
            &PreparedTxn {
                writes,
                prepare_ts: ts,
                decider: Decider::of(&args),
            },
        )?;
        w.txn_mut()
            .put(Table::Transactions, &participant_key(&args.key), &record)?;
        // Held from this job on: the next write, in this batch or the next, finds the keys.
        w.state().hlc().hold_in_batch(ts);
        w.state().prepared.add_in_batch(keys);
        Ok(WriteOutput {
            reply: doc! {"prepareTimestamp": ts.timestamp(), "ok": 1.0},
            op_time: Some(ts),
        })
    })
}

/// Whether a transaction can no longer commit its write set: a key it wrote changed since its
/// snapshot, or an ordered batch holds a key it would create.
fn conflicts(w: &WriteCtx<'_>, store: &TxnStore<'_>) -> Result<bool, StorageError> {
    let reservations = &w.state().reservations;
    for ((t, k), written) in store.writes() {
        if CHECKED.contains(t) && w.txn().get(*t, k)? != written.seen {
            return Ok(true);
        }
        if written.value.is_some() && reservations.holder(*t, k).is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Applies a transaction's writes in the writer's storage transaction (catalog entries
/// through the catalog).
fn apply_writes(
    w: &mut WriteCtx<'_>,
    writes: impl IntoIterator<Item = (Table, Vec<u8>, Option<Vec<u8>>)>,
) -> Result<(), StorageError> {
    for (t, k, value) in writes {
        match (t, value) {
            (Table::Catalog, Some(v)) => {
                let entry = Document::from_reader(v.as_slice())
                    .ok()
                    .and_then(|d| CollectionEntry::from_document(&d))
                    .ok_or_else(|| StorageError::Engine("a bad catalog entry".into()))?;
                w.save_collection(entry)?;
            }
            (Table::Catalog, None) => {
                w.remove_collection(&String::from_utf8_lossy(&k))?;
            }
            (t, Some(v)) => w.txn_mut().put(t, &k, &v)?,
            (t, None) => {
                w.txn_mut().delete(t, &k)?;
            }
        }
    }
    Ok(())
}

/// The writer job that commits a prepared transaction at `commit_ts`: its writes (as of
/// `commit_ts` for reads at a cluster time), the `commitTransaction` entry pointing at the
/// prepare entry, the session's record.
///
/// `commit_ts` is the highest prepare time of all participants, so this shard's clock may not
/// have reached it yet: it is moved past it first, so the commit entry comes after
/// `commit_ts`. Otherwise the entry (and this shard's high-water mark) could sit below the
/// time its writes belong to, and a read as of a time between the two would see them here
/// while the other participants, rightly, do not.
fn commit_prepared_job(args: TxnArgs, prepared: PreparedTxn, commit_ts: ClusterTime) -> WriteFn {
    Box::new(move |w: &mut WriteCtx<'_>| {
        w.commit_metadata = args
            .commit_metadata
            .as_ref()
            .map(crate::writer::CommitMetadata::new);
        w.state().observe(commit_ts);
        apply_writes(w, prepared.writes)?;
        w.writes_belong_to(commit_ts);
        let ts = w.log(EntrySpec {
            op: "c",
            ns: "admin.$cmd".into(),
            ui: None,
            o: doc! {"commitTransaction": 1, "commitTimestamp": commit_ts.timestamp()},
            o2: None,
            pre_image: None,
            session: Some(SessionFields {
                lsid: args.lsid.clone(),
                txn_number: args.txn_number,
                stmt_id: None,
                prev_op_time: Some(prepared.prepare_ts),
            }),
        })?;
        w.txn_mut()
            .delete(Table::Transactions, &participant_key(&args.key))?;
        let wall = w.wall_ms;
        retryable::save_committed_transaction(w.txn_mut(), &args.key, args.txn_number, ts, wall)?;
        Ok(ok_output(Some(ts)))
    })
}

/// The writer job that aborts a prepared transaction: the `abortTransaction` entry, and the
/// record gone.
fn abort_prepared_job(args: TxnArgs, prepare_ts: ClusterTime) -> WriteFn {
    Box::new(move |w: &mut WriteCtx<'_>| {
        let ts = w.log(EntrySpec {
            op: "c",
            ns: "admin.$cmd".into(),
            ui: None,
            o: doc! {"abortTransaction": 1},
            o2: None,
            pre_image: None,
            session: Some(SessionFields {
                lsid: args.lsid.clone(),
                txn_number: args.txn_number,
                stmt_id: None,
                prev_op_time: Some(prepare_ts),
            }),
        })?;
        w.txn_mut()
            .delete(Table::Transactions, &participant_key(&args.key))?;
        Ok(ok_output(Some(ts)))
    })
}

fn ok_output(op_time: Option<ClusterTime>) -> WriteOutput {
    WriteOutput {
        reply: doc! {"ok": 1.0},
        op_time,
    }
}

fn running<'a>(
    g: &'a mut MutexGuard<'_, Participant>,
    args: &TxnArgs,
) -> Result<&'a mut Box<Active>, MongoError> {
    match &mut g.state {
        State::Active(a) => Ok(a),
        State::Prepared(_) => Err(MongoError::new(
            PREPARED_TRANSACTION_IN_PROGRESS,
            "the transaction is prepared: it takes no more statements",
        )),
        State::Committed | State::Committing => Err(MongoError::new(
            ErrorCode::TRANSACTION_COMMITTED,
            format!(
                "Transaction with {{ txnNumber: {} }} has been committed.",
                args.txn_number
            ),
        )),
        State::Aborted => Err(no_such_transaction(args)),
    }
}

fn durable_record(shard: &Shard, key: &[u8]) -> Result<retryable::Record, MongoError> {
    let read = shard.state().storage.begin_read().map_err(storage_error)?;
    retryable::Record::load(&*read, key).map_err(storage_error)
}

pub fn write_conflict() -> MongoError {
    MongoError::new(
        ErrorCode::WRITE_CONFLICT,
        "Write conflict during plan execution and yielding is disabled. :: Please retry your \
         operation or multi-document transaction.",
    )
}

fn no_such_transaction(args: &TxnArgs) -> MongoError {
    MongoError::new(
        ErrorCode::NO_SUCH_TRANSACTION,
        format!(
            "Transaction with {{ txnNumber: {} }} has been aborted.",
            args.txn_number
        ),
    )
}

/// A statement, without `startTransaction`, of a transaction this shard does not have.
fn not_in_progress(args: &TxnArgs, active: i64) -> MongoError {
    MongoError::new(
        ErrorCode::NO_SUCH_TRANSACTION,
        format!(
            "Given transaction number {} does not match any in-progress transactions. The \
             active transaction number is {active}",
            args.txn_number
        ),
    )
}

fn too_old(args: &TxnArgs, newest: i64) -> MongoError {
    MongoError::new(
        ErrorCode::TRANSACTION_TOO_OLD,
        format!(
            "Cannot start transaction {} on session because a newer transaction {newest} has \
             already started.",
            args.txn_number
        ),
    )
}

fn storage_error(e: StorageError) -> MongoError {
    match e {
        StorageError::Interrupted(e) => e,
        e => MongoError::internal(format!("storage: {e}")),
    }
}

/// Never held across `.await`; a poisoned participant is still consistent (updates are whole).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_transaction_is_split_into_entries_of_at_most_the_limit() {
        let op = |n: usize| TxnOp {
            entry: doc! {"op": "i", "o": {"pad": "x".repeat(n)}},
            pre_image: None,
        };
        let size = pipeline::changestream::split::document_size(&op(100).entry);
        let parts = chunks((0..10).map(|_| op(100)).collect(), size * 3);
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![3, 3, 3, 1]
        );
        let one = chunks(vec![op(1000)], size);
        assert_eq!(
            one.len(),
            1,
            "an operation over the limit gets an entry of its own"
        );
        assert_eq!(
            chunks(Vec::new(), size).len(),
            1,
            "no operations: one empty entry"
        );
    }
}
