//! Multi-document transactions through the router: which transaction each session runs, and
//! on which shards.
//!
//! A driver's transaction is a `txnNumber` on a session (`lsid`) whose commands carry
//! `autocommit: false`, the first also `startTransaction: true`. The router keeps, per session,
//! the transaction's number, its `readConcern` and its participants (the shards its statements
//! were sent to, the first one first). The first statement sent to a shard starts the
//! transaction there (it carries `startTransaction` and the `readConcern`); later ones carry
//! neither. `commitTransaction` and `abortTransaction` go to the participants. Every `ok` reply
//! inside a transaction carries a `recoveryToken` naming the first participant, so a router
//! that never saw the transaction (another one, or this one restarted) can still finish the
//! commit from the token alone.
//!
//! Every participant reads as of the cluster time the transaction started at (the router's
//! time at `startTransaction`, sent as `readConcern.atClusterTime`). A commit with one
//! participant goes to it; with more, the first participant coordinates a two-phase commit
//! (`coordinateCommitTransaction`, see `shard::txn::coordinator`).
//!
//! Invariants: a transaction statement is never sent to a shard twice (no resend after a lost
//! connection: the shard would run it twice); a session has one transaction here, its newest.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use shard::sharding::ShardId;
use wire::raw::Body;
use wire::{ErrorCode, MongoError, Result};

use crate::kernel::services::Services;
use crate::kernel::shard_client::TransportError;
use crate::kernel::transport::{Resend, ShardTransport, Shards};

pub const OPERATION_NOT_SUPPORTED_IN_TRANSACTION: ErrorCode =
    ErrorCode::OPERATION_NOT_SUPPORTED_IN_TRANSACTION;

/// Codes whose failure inside a transaction leaves it safe to retry whole: conflicts, lock
/// and snapshot errors, a transaction the shard no longer has (aborted, or lost with a
/// restart), and a shard that could not be reached.
const TRANSIENT: &[i32] = &[
    6, 7, 24, 89, 91, 112, 189, 239, 246, 251, 262, 267, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Codes after which a commit's outcome is unknown.
const COMMIT_UNKNOWN: &[i32] = &[
    6, 7, 50, 64, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// A session's transaction, as the router knows it.
#[derive(Debug, Clone)]
struct RouterTxn {
    txn_number: i64,
    /// When a statement of it last came: a session idle for [`SESSION_TIMEOUT`] is forgotten.
    last_used: Instant,
    read_concern: Option<Document>,
    /// Shard indexes, in the order the transaction first reached them.
    participants: Vec<ShardId>,
}

/// How long a session's transaction is remembered without a statement
/// (`localLogicalSessionTimeoutMinutes`: 30). The shards abort a transaction long before (its
/// lifetime); what is left here is the session's last transaction number and participants.
const SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The transactions of a router's sessions.
///
/// Invariant: an entry unused for [`SESSION_TIMEOUT`] is dropped at the next transaction
/// start after it (at most one sweep a minute), so the map holds only live sessions.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<Vec<u8>, RouterTxn>>,
    /// When the map was last swept of idle sessions.
    swept: Mutex<Option<Instant>>,
}

/// The session key and `txnNumber` of a command (`None` without them).
fn session(cmd: &Document) -> Result<Option<(Vec<u8>, i64)>> {
    Ok(shard::session::Session::of(cmd)?.map(|s| (s.key, s.txn_number)))
}

pub(crate) use crate::kernel::transport::{in_transaction, is_retryable_write};

/// The shard transport as a command sees it: a statement of a transaction enlists its shard
/// before it leaves (the first one there starts the transaction on it, see
/// [`Sessions::enlist`]) and is never sent twice. Everything else passes through unchanged.
pub(crate) struct Enlisting {
    transport: Arc<ShardTransport>,
    sessions: Arc<Sessions>,
}

impl Enlisting {
    pub(crate) fn new(transport: Arc<ShardTransport>, sessions: Arc<Sessions>) -> Enlisting {
        Enlisting {
            transport,
            sessions,
        }
    }
}

impl Shards for Enlisting {
    fn send_body(
        &self,
        shard: ShardId,
        db: &str,
        mut cmd: Document,
        patience: Duration,
        mut resend: Resend,
    ) -> impl Future<Output = std::result::Result<Body, TransportError>> + Send {
        let finishing = matches!(
            cmd.keys().next().map(String::as_str),
            Some("commitTransaction" | "abortTransaction" | "coordinateCommitTransaction")
        );
        let enlisted = if in_transaction(&cmd) && !finishing {
            resend = Resend::Unsent;
            self.sessions.enlist(shard, &mut cmd)
        } else {
            Ok(())
        };
        async move {
            if let Err(error) = enlisted {
                return Err(TransportError::Unreachable { error, cmd });
            }
            self.transport
                .send_body(shard, db, cmd, patience, resend)
                .await
        }
    }

    fn connect_patience(&self) -> Duration {
        Shards::connect_patience(&*self.transport)
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, RouterTxn>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a command into its session's transaction before it runs: `startTransaction`
    /// starts a new one; any other statement must belong to the session's current one.
    pub fn admit(&self, name: &str, cmd: &Document, now: ClusterTime) -> Result<()> {
        if !cmd.contains_key("autocommit") {
            return Ok(());
        }
        if !in_transaction(cmd) {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "autocommit must be false when it is given",
            ));
        }
        let Some((key, n)) = session(cmd)? else {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "a transaction needs an lsid and a txnNumber",
            ));
        };
        // The transaction's write concern is its commit's (or abort's); a statement's own
        // would promise a durability the statement does not have.
        if cmd.contains_key("writeConcern")
            && !matches!(name, "commitTransaction" | "abortTransaction")
        {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "writeConcern is not allowed within a multi-statement transaction",
            ));
        }
        let mut map = self.lock();
        let current = map.get(&key).map(|t| t.txn_number);
        if matches!(cmd.get("startTransaction"), Some(Bson::Boolean(true))) {
            if current.is_some_and(|c| c >= n) {
                return Err(MongoError::new(
                    ErrorCode::CONFLICTING_OPERATION_IN_PROGRESS,
                    format!("transaction {n} on this session has already started"),
                ));
            }
            // Every shard the transaction reaches reads as of the same cluster time: now.
            let mut read_concern = cmd
                .get_document("readConcern")
                .ok()
                .cloned()
                .unwrap_or_default();
            if !read_concern.contains_key("atClusterTime") {
                read_concern.insert("atClusterTime", now.timestamp());
            }
            let read_concern = Some(read_concern);
            let now = Instant::now();
            self.sweep(&mut map, now);
            map.insert(
                key,
                RouterTxn {
                    txn_number: n,
                    last_used: now,
                    read_concern,
                    participants: Vec::new(),
                },
            );
            return Ok(());
        }
        if matches!(name, "commitTransaction" | "abortTransaction") || current == Some(n) {
            return Ok(());
        }
        Err(MongoError::new(
            ErrorCode::NO_SUCH_TRANSACTION,
            format!("Transaction with {{ txnNumber: {n} }} is not in progress on this session"),
        ))
    }

    /// Drops the sessions idle for [`SESSION_TIMEOUT`], at most once a minute.
    fn sweep(&self, map: &mut HashMap<Vec<u8>, RouterTxn>, now: Instant) {
        let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
        if swept.is_some_and(|t| now.duration_since(t) < Duration::from_secs(60)) {
            return;
        }
        *swept = Some(now);
        map.retain(|_, t| now.duration_since(t.last_used) < SESSION_TIMEOUT);
    }

    /// Counts the sessions `keys` as used now (`refreshSessions`).
    pub fn refresh(&self, keys: &[Vec<u8>]) {
        let mut map = self.lock();
        let now = Instant::now();
        for key in keys {
            if let Some(txn) = map.get_mut(key) {
                txn.last_used = now;
            }
        }
    }

    /// Forgets the transactions of the sessions `killed` names.
    pub fn forget(&self, killed: &shard::txn::SessionFilter) {
        self.lock().retain(|key, _| !killed.matches(key));
    }

    /// Makes `shard` a participant of the statement's transaction and fixes the statement's
    /// transaction fields for it: the first one sent to a shard starts the transaction there.
    pub fn enlist(&self, shard: ShardId, cmd: &mut Document) -> Result<()> {
        let Some((key, n)) = session(cmd)? else {
            return Ok(());
        };
        let mut map = self.lock();
        let Some(txn) = map.get_mut(&key).filter(|t| t.txn_number == n) else {
            return Err(MongoError::new(
                ErrorCode::NO_SUCH_TRANSACTION,
                format!("Transaction with {{ txnNumber: {n} }} is not in progress on this session"),
            ));
        };
        txn.last_used = Instant::now();
        if txn.participants.contains(&shard) {
            cmd.remove("startTransaction");
            cmd.remove("readConcern");
            return Ok(());
        }
        txn.participants.push(shard);
        cmd.insert("startTransaction", true);
        match &txn.read_concern {
            Some(rc) => cmd.insert("readConcern", rc.clone()),
            None => cmd.remove("readConcern"),
        };
        Ok(())
    }

    /// The participants of the session's transaction `n` (`None`: this router does not know
    /// it).
    fn participants(&self, key: &[u8], n: i64) -> Option<Vec<ShardId>> {
        self.lock()
            .get(key)
            .filter(|t| t.txn_number == n)
            .map(|t| t.participants.clone())
    }

    /// The first participant, for the reply's `recoveryToken`.
    fn recovery_shard(&self, cmd: &Document) -> Option<ShardId> {
        let (key, n) = session(cmd).ok()??;
        self.participants(&key, n)?.first().copied()
    }
}

/// Whom a `commitTransaction` or `abortTransaction` goes to.
enum Targets {
    /// The participants, as this router recorded them.
    Known(Vec<ShardId>),
    /// This router does not know the transaction: the shard its `recoveryToken` names.
    Recovery(ShardId),
}

/// The participants a `commitTransaction` or `abortTransaction` goes to: the router's own
/// record of the transaction, else the shard its `recoveryToken` names.
fn targets(shards: &Enlisting, cmd: &Document) -> Result<Targets> {
    let Some((key, n)) = session(cmd)? else {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "a transaction needs an lsid and a txnNumber",
        ));
    };
    if let Some(p) = shards.sessions.participants(&key, n) {
        return Ok(Targets::Known(p));
    }
    let recovery = cmd
        .get_document("recoveryToken")
        .ok()
        .and_then(|t| t.get_str("recoveryShardId").ok());
    match recovery {
        Some(name) => Ok(Targets::Recovery(shards.transport.id(name)?)),
        None => Err(MongoError::new(
            ErrorCode::NO_SUCH_TRANSACTION,
            format!("Transaction with {{ txnNumber: {n} }} is not known to this router"),
        )),
    }
}

/// The command sent to a participant to finish the transaction.
fn finishing(name: &str, cmd: &Document) -> Document {
    let mut out = doc! {name: 1};
    for field in [
        "lsid",
        "txnNumber",
        "autocommit",
        "writeConcern",
        "maxTimeMS",
    ] {
        if let Some(v) = cmd.get(field) {
            out.insert(field, v.clone());
        }
    }
    out
}

/// `commitTransaction`.
///
/// A router that does not know the transaction never commits it from the `recoveryToken`
/// alone (it would commit one shard's part of a transaction that spans more): it asks the
/// named shard for the outcome (`coordinateCommitTransaction` without participants, as mongos
/// does), which answers a coordinator's decision or that shard's own part.
pub(crate) async fn commit(shards: &Enlisting, cmd: &Document) -> Result<Document> {
    let participants = match targets(shards, cmd)? {
        Targets::Known(p) => p,
        Targets::Recovery(shard) => {
            let mut recover = finishing("coordinateCommitTransaction", cmd);
            recover.insert("participants", Vec::<Bson>::new());
            return shards.idempotent(shard, "admin", recover).await;
        }
    };
    match participants.as_slice() {
        [] => Ok(doc! {"ok": 1.0}),
        [shard] => {
            shards
                .idempotent(*shard, "admin", finishing("commitTransaction", cmd))
                .await
        }
        [coordinator, ..] => {
            // Two-phase commit, coordinated by the first participant.
            let participants: Vec<Bson> = participants
                .iter()
                .map(|&s| {
                    let mut p = doc! {"shardId": shards.transport.name(s).unwrap_or_default()};
                    if let Some(host) = shards.transport.host(s) {
                        p.insert("host", host);
                    }
                    Bson::Document(p)
                })
                .collect();
            let mut coordinate = finishing("coordinateCommitTransaction", cmd);
            coordinate.insert("participants", participants);
            shards.idempotent(*coordinator, "admin", coordinate).await
        }
    }
}

/// `abortTransaction`: aborts it on every participant.
pub(crate) async fn abort(shards: &Enlisting, cmd: &Document) -> Result<Document> {
    let participants = match targets(shards, cmd)? {
        Targets::Known(p) => p,
        Targets::Recovery(shard) => vec![shard],
    };
    if participants.is_empty() {
        return Err(MongoError::new(
            ErrorCode::NO_SUCH_TRANSACTION,
            "the transaction has not run a statement on any shard",
        ));
    }
    let abort = finishing("abortTransaction", cmd);
    let mut first_error = None;
    for r in shards.broadcast(&participants, "admin", &abort).await {
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(doc! {"ok": 1.0}),
    }
}

/// A refused statement aborts its transaction on the shards it reached, as a failed statement
/// does on a shard.
pub(crate) async fn abort_after_refusal(shards: &Enlisting, cmd: &Document) {
    if let Ok(Targets::Known(participants)) = targets(shards, cmd) {
        let abort = finishing("abortTransaction", cmd);
        let _ = shards.broadcast(&participants, "admin", &abort).await;
    }
}

/// `endSessions`, `killSessions`, `killAllSessions`: every shard aborts the named sessions'
/// running transactions (a prepared one is its coordinator's to decide), and this router
/// forgets them. `killSessions: []` names the caller's own sessions when the router has
/// authenticated users (`own`), every session otherwise.
pub(crate) async fn kill_sessions(
    shards: &Enlisting,
    ops: &crate::ops::Ops,
    services: &Services,
    name: &str,
    cmd: &Document,
    own: Option<Vec<Vec<u8>>>,
) -> Result<Document> {
    use shard::txn::SessionFilter;
    let mut killed = SessionFilter::of(name, cmd)?;
    let mut forward = doc! {name: cmd.get(name).cloned().unwrap_or(Bson::Array(Vec::new()))};
    if name == "killSessions"
        && killed == SessionFilter::All
        && let Some(ids) = own
    {
        let lsids: Vec<Bson> = ids
            .iter()
            .map(|id| Bson::Document(doc! {"id": bson::Binary {subtype: bson::spec::BinarySubtype::Uuid, bytes: id.clone()}}))
            .collect();
        forward = doc! {name: lsids};
        killed = SessionFilter::Ids(ids);
    }
    if killed == SessionFilter::Ids(Vec::new()) {
        return Ok(doc! {"ok": 1.0});
    }
    shards.sessions.forget(&killed);
    // Their operations in flight stop, here and on the shards.
    for key in ops.kill_sessions(&killed) {
        crate::ops::kill_on_shards(&shards.transport, services, key);
    }
    let all = shards.transport.all();
    for r in shards.broadcast(&all, "admin", &forward).await {
        r?;
    }
    Ok(doc! {"ok": 1.0})
}

/// The labels MongoDB puts on an error inside a transaction: `TransientTransactionError` when
/// the whole transaction may be retried, `UnknownTransactionCommitResult` when a commit may or
/// may not have happened.
pub(crate) fn label(name: &str, e: MongoError) -> MongoError {
    let commit = name == "commitTransaction";
    if commit && COMMIT_UNKNOWN.contains(&e.code) {
        return e.with_label("UnknownTransactionCommitResult");
    }
    if TRANSIENT.contains(&e.code) {
        return e.with_label("TransientTransactionError");
    }
    e
}

/// The `recoveryToken` of a reply to a command in a transaction.
pub(crate) fn recovery_token(shards: &Enlisting, cmd: &Document) -> Option<Document> {
    let shard = shards.sessions.recovery_shard(cmd)?;
    let name = shards.transport.name(shard)?;
    Some(doc! {"recoveryShardId": name})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn stmt(n: i64, start: bool) -> Document {
        let mut d = doc! {
            "insert": "c",
            "lsid": {"id": bson::Binary {subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16]}},
            "txnNumber": n,
            "autocommit": false,
        };
        if start {
            d.insert("startTransaction", true);
            d.insert("readConcern", doc! {"level": "snapshot"});
        }
        d
    }

    fn shard(i: usize) -> ShardId {
        ShardId::new(i).unwrap()
    }

    #[test]
    fn the_first_statement_to_a_shard_starts_the_transaction_there() {
        let s = Sessions::default();
        s.admit("insert", &stmt(1, true), ClusterTime::new(9, 1))
            .unwrap();
        let mut first = stmt(1, false);
        s.enlist(shard(2), &mut first).unwrap();
        assert!(first.get_bool("startTransaction").unwrap());
        assert_eq!(
            first.get_document("readConcern").unwrap(),
            &doc! {"level": "snapshot", "atClusterTime": ClusterTime::new(9, 1).timestamp()},
            "every participant reads as of the transaction's start"
        );
        let mut again = stmt(1, true);
        s.enlist(shard(2), &mut again).unwrap();
        assert!(!again.contains_key("startTransaction"));
        assert!(!again.contains_key("readConcern"));
        let mut other = stmt(1, false);
        s.enlist(shard(0), &mut other).unwrap();
        assert!(
            other.get_bool("startTransaction").unwrap(),
            "a second shard starts too"
        );
        let key = session(&other).unwrap().unwrap().0;
        assert_eq!(s.participants(&key, 1), Some(vec![shard(2), shard(0)]));
    }

    #[test]
    fn statements_must_belong_to_the_sessions_current_transaction() {
        let s = Sessions::default();
        let t = ClusterTime::new(9, 1);
        assert_eq!(s.admit("insert", &stmt(1, false), t).unwrap_err().code, 251);
        s.admit("insert", &stmt(1, true), t).unwrap();
        s.admit("find", &stmt(1, false), t).unwrap();
        assert_eq!(s.admit("insert", &stmt(1, true), t).unwrap_err().code, 117);
        s.admit("insert", &stmt(2, true), t).unwrap();
        assert_eq!(s.admit("insert", &stmt(1, false), t).unwrap_err().code, 251);
        s.admit("commitTransaction", &stmt(1, false), t).unwrap();
        assert!(is_retryable_write(
            &doc! {"insert": "c", "txnNumber": 1_i64}
        ));
        assert!(!is_retryable_write(&stmt(1, false)));
    }

    /// A session whose transaction was last used past the timeout ago (its key), then
    /// `refreshed` or not, and a sweep (a transaction on another session, a minute on).
    fn idle_session_then_sweep(refreshed: bool) -> (Sessions, Vec<u8>) {
        let s = Sessions::default();
        let t = ClusterTime::new(9, 1);
        s.admit("insert", &stmt(1, true), t).unwrap();
        let key = session(&stmt(1, false)).unwrap().unwrap().0;
        let long_ago = Instant::now() - SESSION_TIMEOUT - Duration::from_secs(1);
        if let Some(txn) = s.lock().get_mut(&key) {
            txn.last_used = long_ago;
        }
        if refreshed {
            s.refresh(std::slice::from_ref(&key));
        }
        *s.swept.lock().unwrap() = None;
        let mut other = stmt(1, true);
        other.insert(
            "lsid",
            doc! {"id": bson::Binary {subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![2; 16]}},
        );
        s.admit("insert", &other, t).unwrap();
        (s, key)
    }

    #[test]
    fn a_refreshed_session_is_not_idle() {
        let (s, key) = idle_session_then_sweep(true);
        assert!(s.lock().contains_key(&key), "the refreshed session stays");
    }

    #[test]
    fn idle_sessions_are_forgotten_after_the_session_timeout() {
        let (s, key) = idle_session_then_sweep(false);
        assert!(!s.lock().contains_key(&key), "the idle session is gone");
        assert_eq!(s.lock().len(), 1);
    }

    #[test]
    fn only_commit_and_abort_take_a_write_concern_in_a_transaction() {
        let s = Sessions::default();
        let t = ClusterTime::new(9, 1);
        let with_wc = |mut d: Document| {
            d.insert("writeConcern", doc! {"w": "majority"});
            d
        };
        let e = s
            .admit("insert", &with_wc(stmt(1, true)), t)
            .expect_err("a statement's write concern");
        assert_eq!((e.code, e.code_name.as_str()), (72, "InvalidOptions"));
        s.admit("insert", &stmt(1, true), t).unwrap();
        assert_eq!(
            s.admit("find", &with_wc(stmt(1, false)), t)
                .unwrap_err()
                .code,
            72
        );
        s.admit("commitTransaction", &with_wc(stmt(1, false)), t)
            .unwrap();
        s.admit("abortTransaction", &with_wc(stmt(1, false)), t)
            .unwrap();
    }

    #[test]
    fn errors_get_the_labels_drivers_retry_on() {
        let wc = label("insert", MongoError::new(ErrorCode::WRITE_CONFLICT, "x"));
        assert!(wc.has_label("TransientTransactionError"));
        let lost = label(
            "commitTransaction",
            MongoError::new(ErrorCode::HOST_UNREACHABLE, "x"),
        );
        assert!(lost.has_label("UnknownTransactionCommitResult"));
        assert!(!lost.has_label("TransientTransactionError"));
        let dup = label("insert", MongoError::new(ErrorCode::DUPLICATE_KEY, "x"));
        assert!(dup.labels.is_empty());
    }
}
