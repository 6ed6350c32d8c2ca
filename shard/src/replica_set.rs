//! A member of a replicated shard: its Raft replica and storage, and the [`Shard`] it serves
//! while it leads its set (`design/replication.md`).
//!
//! Every member applies committed entries to its storage (`repl`); the member that becomes
//! leader opens a `Shard` over that storage, which recovers the catalog, the clock, the tail
//! window and the prepared transactions exactly as at a restart, from the committed state, and
//! writes through [`RaftLog`]. It closes the shard when it stops leading.
//!
//! Invariants:
//! * A member serves a shard only while it leads, and only once it has applied the first entry
//!   of its term: every entry of earlier terms is then applied, so the recovered clock starts
//!   above every `ts` and every reservation in the log (no `ts` is ever handed out twice), and
//!   the shard's first write (its boot lineage record) is the term's first batch.
//! * A shard whose log lost track of a write (its outcome unknown) is closed and opened again
//!   from storage once everything in the member's log is applied: its in-memory state never
//!   lags what its storage holds while it takes writes.
//! * A member that does not lead answers every command but `hello` and its peers' Raft
//!   messages with 10107 `NotWritablePrimary` (until secondaries serve reads): a client
//!   retries on the primary. `hello` names the set, its hosts, the primary and this member,
//!   and the primary's `electionId` (`7fffffff` + term), as a replica-set member's does.

use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wire::raw::Body;
use wire::{ErrorCode, MongoError};

use crate::repl::{MemberId, PEER_COMMANDS, RaftLog, Replica};
use crate::storage::Storage;
use crate::{Shard, ShardOptions};

/// Who a member is in its set, as `hello` reports it.
#[derive(Debug, Clone)]
pub struct SetInfo {
    /// `--replSet`.
    pub name: String,
    /// Every member's `host:port`, in `--peers` order: a member's id is its position.
    pub hosts: Vec<String>,
    /// This member's id.
    pub me: MemberId,
}

/// One member of a replica set (see the module header).
pub struct ReplicaSetMember {
    set: SetInfo,
    replica: Arc<Replica>,
    primary: watch::Receiver<Option<Arc<Shard>>>,
    /// Whether each shard this member opens takes test commands.
    test_commands: Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ReplicaSetMember {
    /// Starts following `replica`'s leadership: while it leads, a shard named by `opts` runs
    /// over `storage`, appending through the replica with `patience` for a majority.
    pub fn start(
        opts: ShardOptions,
        set: SetInfo,
        replica: Arc<Replica>,
        storage: Arc<dyn Storage>,
        patience: Duration,
    ) -> Arc<ReplicaSetMember> {
        let (tx, rx) = watch::channel(None);
        let cancel = CancellationToken::new();
        let test_commands = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn(lead(
            opts,
            replica.clone(),
            storage,
            patience,
            tx,
            test_commands.clone(),
            cancel.clone(),
        ));
        Arc::new(ReplicaSetMember {
            set,
            replica,
            primary: rx,
            test_commands,
            cancel,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// Every shard this member opens from now on takes test commands (`configureFailPoint`).
    pub fn enable_test_commands(&self) {
        self.test_commands
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(shard) = self.primary() {
            shard.enable_test_commands();
        }
    }

    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The shard this member serves as primary now, if it leads.
    pub fn primary(&self) -> Option<Arc<Shard>> {
        self.primary.borrow().clone()
    }

    /// Waits until this member serves as primary, for at most `patience`.
    pub async fn wait_primary(&self, patience: Duration) -> Option<Arc<Shard>> {
        let mut rx = self.primary.clone();
        tokio::time::timeout(patience, async move {
            loop {
                if let Some(shard) = rx.borrow_and_update().clone() {
                    return Some(shard);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// Runs a command on the primary's shard; on any other member, 10107.
    pub async fn run_command(&self, cmd: Document) -> Document {
        match self.run_command_body(cmd).await.into_document() {
            Ok(reply) => reply,
            Err(e) => e.to_document(),
        }
    }

    /// [`ReplicaSetMember::run_command`] as the server sends it: a peer's Raft message goes to
    /// the replica, `hello` says where this member stands in its set, anything else runs on
    /// the primary's shard or is refused with 10107.
    pub async fn run_command_body(&self, cmd: Document) -> Body {
        let name = cmd.keys().next().cloned().unwrap_or_default();
        if PEER_COMMANDS.contains(&name.as_str()) {
            return Body::Document(match self.replica.answer(&name, &cmd).await {
                Ok(reply) => reply,
                Err(e) => e.to_document(),
            });
        }
        let primary = self.primary();
        if matches!(name.as_str(), "hello" | "isMaster" | "ismaster") {
            let base = match &primary {
                Some(shard) => shard.run_command(cmd).await,
                None => standalone_hello(&name, &cmd),
            };
            return Body::Document(self.hello(base, primary.is_some()));
        }
        match primary {
            Some(shard) => shard.run_command_body(cmd).await,
            None => Body::Document(not_primary(self.replica.leader()).to_document()),
        }
    }

    /// `base` (a server's `hello`) with this member's place in its set.
    fn hello(&self, mut base: Document, primary: bool) -> Document {
        if base.get("ok") != Some(&Bson::Double(1.0)) {
            return base;
        }
        let term = self.replica.term();
        let writable = if base.contains_key("isWritablePrimary") {
            "isWritablePrimary"
        } else {
            "ismaster"
        };
        base.insert(writable, primary);
        base.insert("secondary", !primary);
        base.insert("setName", self.set.name.clone());
        base.insert("setVersion", 1_i32);
        base.insert("hosts", self.set.hosts.clone());
        if let Some(leader) = self.replica.leader()
            && let Some(host) = usize::try_from(leader)
                .ok()
                .and_then(|l| self.set.hosts.get(l))
        {
            base.insert("primary", host.clone());
        }
        if let Some(me) = usize::try_from(self.set.me)
            .ok()
            .and_then(|m| self.set.hosts.get(m))
        {
            base.insert("me", me.clone());
        }
        if primary {
            base.insert("electionId", election_id(term));
        }
        base
    }

    /// Stops serving (closing the shard if open) and stops the replica.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
        self.replica.shutdown().await;
    }
}

/// MongoDB's `electionId` for a term: `7fffffff` then the term, big-endian.
fn election_id(term: u64) -> bson::oid::ObjectId {
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&0x7fff_ffff_u32.to_be_bytes());
    bytes[4..].copy_from_slice(&term.to_be_bytes());
    bson::oid::ObjectId::from_bytes(bytes)
}

/// What a server without a shard to ask answers to `hello` (the handshake facts a driver
/// needs before the set's fields).
fn standalone_hello(name: &str, cmd: &Document) -> Document {
    let hello_ok = cmd.get_bool("helloOk").unwrap_or(false);
    let now = u64::try_from(bson::DateTime::now().timestamp_millis()).unwrap_or(0);
    crate::handshake::hello(name, hello_ok, false, now)
}

fn not_primary(leader: Option<u64>) -> MongoError {
    let known = leader.map_or_else(|| "not known".to_string(), |l| format!("member {l}"));
    MongoError::new(
        ErrorCode::NOT_WRITABLE_PRIMARY,
        format!("not primary: this member does not lead its replica set (the primary is {known})"),
    )
    .with_label("RetryableWriteError")
}

/// While `replica` leads, serves a shard over `storage` and publishes it on `tx`.
async fn lead(
    opts: ShardOptions,
    replica: Arc<Replica>,
    storage: Arc<dyn Storage>,
    patience: Duration,
    tx: watch::Sender<Option<Arc<Shard>>>,
    test_commands: Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
) {
    const LOOK: Duration = Duration::from_millis(500);
    while !cancel.is_cancelled() {
        if !replica.wait_leading(LOOK).await {
            continue;
        }
        let Some(term) = replica.leading_term() else {
            continue;
        };
        let log = Arc::new(RaftLog::new(
            replica.clone(),
            tokio::runtime::Handle::current(),
            patience,
        ));
        let shard = match Shard::open_with_storage(opts.clone(), storage.clone(), log.clone()).await
        {
            Ok(shard) => shard,
            Err(e) => {
                tracing::warn!(error = %e, term, "the new primary could not open its shard");
                tokio::time::sleep(LOOK).await;
                continue;
            }
        };
        if test_commands.load(std::sync::atomic::Ordering::Acquire) {
            shard.enable_test_commands();
        }
        tracing::info!(term, member = replica.id(), "primary: serving the shard");
        tx.send_replace(Some(shard.clone()));
        tokio::select! {
            () = replica.wait_not_leading(term) => {}
            () = log.poisoned() => {
                tracing::warn!(term, "a write's outcome is unknown: the shard reopens from storage");
            }
            () = cancel.cancelled() => {}
        }
        tx.send_replace(None);
        tracing::info!(
            term,
            member = replica.id(),
            "no longer primary: the shard closes"
        );
        shard.shutdown().await;
    }
}
