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
//! * A member that does not lead serves reads as a secondary, on a read-only shard over its
//!   storage that catches up after every apply (`follower`): the commands any member runs,
//!   and reads from clients whose `$readPreference` accepts a secondary (13435
//!   `NotPrimaryNoSecondaryOk` otherwise). Writes, transactions and everything else get 10107
//!   `NotWritablePrimary`: a client retries them on the primary. A member that rejoins or has
//!   not caught up once serves nothing until it has. `hello` names the set, its hosts, the
//!   primary and this member, and the primary's `electionId` (`7fffffff` + term), as a
//!   replica-set member's does; `secondary` is true while it serves reads.
//! * The set's members are its Raft configuration's (`replSetReconfig`, `config`), not the
//!   `--peers` it started with: `hello` names them, and `w: N` counts them.
//! * A write with `w: N` is answered once N members hold every entry the primary's log had
//!   when the write returned (a majority holds it already), or with a `writeConcernError`.

use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{Bson, Document, doc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wire::raw::Body;
use wire::{ErrorCode, MongoError};

use crate::command::{Command, OnSecondary};
use crate::repl::{
    MemberId, PEER_COMMANDS, RaftLog, ReplError, Replica, Replicated, Role, SetStatus,
};
use crate::storage::{KeyRange, Scan, Storage, Table};
use crate::{Shard, ShardOptions};

mod config;

/// Who a member is in its set, as `hello` reports it.
#[derive(Debug, Clone)]
pub struct SetInfo {
    /// `--replSet`.
    pub name: String,
    /// Every member's `host:port`, in `--peers` order: a member's id is its position. The
    /// set's members are its Raft configuration's from then on (`replSetReconfig`).
    pub hosts: Vec<String>,
    /// This member's id.
    pub me: MemberId,
}

/// One member of a replica set (see the module header).
pub struct ReplicaSetMember {
    set: SetInfo,
    replica: Arc<Replica>,
    /// What it applies committed entries to (its `hello` reads its last write there).
    storage: Arc<dyn Storage>,
    primary: watch::Receiver<Option<Arc<Shard>>>,
    /// The read-only shard it serves as a secondary, while it does not lead (`follower`).
    secondary: watch::Receiver<Option<Arc<Shard>>>,
    /// What is done to each shard this member opens, before it serves (test commands, oplog
    /// retention, how it reaches its transactions' other participants).
    on_open: Arc<std::sync::Mutex<Vec<OnOpen>>>,
    /// `topologyVersion`: this process's id, and how often the member's place changed.
    process_id: ObjectId,
    topology: watch::Sender<i64>,
    cancel: CancellationToken,
    tasks: tokio::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Something done to each shard a member opens ([`ReplicaSetMember::on_open`]).
pub type OnOpen = Arc<dyn Fn(&Arc<Shard>) + Send + Sync>;

/// The longest an awaitable `hello` waits (drivers ask for 10 s).
const MAX_AWAIT: Duration = Duration::from_secs(600);
/// How long `replSetStepDown` waits, by default, for a secondary to catch up.
const CATCH_UP: Duration = Duration::from_secs(10);
/// How long a primary that stepped down is not electable, by default (MongoDB's 60 s).
const STEP_DOWN_FREEZE: Duration = Duration::from_secs(60);
/// How long a step-down waits for the new leader's election.
const HAND_OVER: Duration = Duration::from_secs(10);
/// How long a write waits for `w: N` members without a `wtimeout` (MongoDB waits for ever;
/// nothing here waits without a deadline).
const MEMBERS_WAIT: Duration = Duration::from_secs(60);

/// A write concern's `w: N` (N > 1) and `wtimeout`: the members a write must reach.
#[derive(Debug, Clone, Copy, PartialEq)]
struct MembersWanted {
    members: usize,
    /// `wtimeout`, when positive.
    timeout: Option<Duration>,
}

impl MembersWanted {
    /// What `cmd`'s `writeConcern` asks beyond the majority every write gets: `None` for no
    /// write concern, `w` of 0 or 1, `majority` or a tag.
    fn of(cmd: &Document) -> Option<MembersWanted> {
        let wc = cmd.get_document("writeConcern").ok()?;
        let number = |v: &Bson| match v {
            Bson::Int32(n) => Some(f64::from(*n)),
            Bson::Int64(n) => Some(*n as f64),
            Bson::Double(n) => Some(*n),
            _ => None,
        };
        let w = number(wc.get("w")?)?;
        if w.is_nan() || w <= 1.0 {
            return None;
        }
        let timeout = wc
            .get("wtimeout")
            .and_then(number)
            .filter(|ms| *ms >= 1.0)
            .map(|ms| Duration::from_millis(ms.min(u64::MAX as f64) as u64));
        Some(MembersWanted {
            members: w.min(usize::MAX as f64) as usize,
            timeout,
        })
    }

    fn as_document(&self) -> Document {
        let mut d = doc! {"w": i64::try_from(self.members).unwrap_or(i64::MAX)};
        if let Some(t) = self.timeout {
            d.insert("wtimeout", i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
        }
        d.insert("provenance", "clientSupplied");
        d
    }
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
        let on_open = Arc::new(std::sync::Mutex::new(Vec::new()));
        let topology = watch::channel(0).0;
        let lead = tokio::spawn(lead(
            opts.clone(),
            replica.clone(),
            storage.clone(),
            patience,
            tx,
            on_open.clone(),
            cancel.clone(),
        ));
        let (secondary_tx, secondary) = watch::channel(None);
        let serve_reads = tokio::spawn(serve_reads(
            opts,
            replica.clone(),
            storage.clone(),
            secondary_tx,
            cancel.clone(),
        ));
        let follow = tokio::spawn(follow_topology(
            replica.clone(),
            rx.clone(),
            topology.clone(),
            cancel.clone(),
        ));
        Arc::new(ReplicaSetMember {
            set,
            replica,
            storage,
            primary: rx,
            secondary,
            on_open,
            process_id: ObjectId::new(),
            topology,
            cancel,
            tasks: tokio::sync::Mutex::new(vec![lead, serve_reads, follow]),
        })
    }

    /// Does `f` to the shard this member serves now, if any, and to each it opens from now on.
    pub fn on_open(&self, f: impl Fn(&Arc<Shard>) + Send + Sync + 'static) {
        let f: OnOpen = Arc::new(f);
        lock(&self.on_open).push(f.clone());
        if let Some(shard) = self.primary() {
            f(&shard);
        }
    }

    /// Every shard this member opens from now on takes test commands (`configureFailPoint`).
    pub fn enable_test_commands(&self) {
        self.on_open(|shard| shard.enable_test_commands());
    }

    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The shard this member serves as primary now, if it leads.
    pub fn primary(&self) -> Option<Arc<Shard>> {
        self.primary.borrow().clone()
    }

    /// The read-only shard this member serves as a secondary now, if it does.
    pub fn secondary(&self) -> Option<Arc<Shard>> {
        self.secondary.borrow().clone()
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
        if matches!(name.as_str(), "hello" | "isMaster" | "ismaster") {
            if let Err(e) = self.await_topology(&cmd).await {
                return Body::Document(e.to_document());
            }
            let primary = self.primary();
            let base = match &primary {
                Some(shard) => shard.run_command(cmd).await,
                None => standalone_hello(&name, &cmd),
            };
            return Body::Document(self.hello(base, primary.is_some()));
        }
        let reply = match name.as_str() {
            "replSetGetStatus" => Some(Ok(self.status())),
            "replSetGetConfig" => Some(Ok(doc! {
                "config": config::document(&self.set.name, &self.replica.config(), self.replica.term()),
                "ok": 1.0,
            })),
            "replSetReconfig" => Some(self.reconfigure(&cmd).await),
            "replSetStepDown" => Some(self.step_down(&cmd).await),
            "replSetFreeze" => Some(self.freeze(&cmd)),
            _ => None,
        };
        if let Some(reply) = reply {
            return Body::Document(reply.unwrap_or_else(|e| e.to_document()));
        }
        if let Some(shard) = self.primary() {
            let wanted = MembersWanted::of(&cmd);
            let body = shard.run_command_body(cmd).await;
            return match wanted {
                Some(wanted) => self.await_members(body, wanted).await,
                None => body,
            };
        }
        let refused = match self.secondary() {
            Some(shard) => match secondary_runs(&cmd) {
                Ok(()) => return shard.run_command_body(cmd).await,
                Err(refused) => refused,
            },
            None => Refused::NotPrimary,
        };
        Body::Document(refused.error(self.replica.leader()).to_document())
    }

    /// A command's reply once `w: N` members hold what it wrote: every entry of the log at the
    /// time it returned (its own are among them). A write is acknowledged once a majority
    /// holds it, which meets any `N` up to a majority at once; a larger `N` waits for more,
    /// up to `wtimeout` (else [`MEMBERS_WAIT`]), and the reply gets MongoDB's
    /// `writeConcernError` when they do not come: 64 `WriteConcernFailed` at the deadline,
    /// 189 `PrimarySteppedDown` when this member stops leading, 100
    /// `UnsatisfiableWriteConcern` when the set has fewer members than `N`.
    async fn await_members(&self, body: Body, wanted: MembersWanted) -> Body {
        let error = if wanted.members > self.replica.config().members.len() {
            Some(MongoError::new(
                ErrorCode::UNSATISFIABLE_WRITE_CONCERN,
                "Not enough data-bearing nodes",
            ))
        } else {
            let Some(index) = self.replica.last_log_index() else {
                return body;
            };
            let patience = wanted.timeout.unwrap_or(MEMBERS_WAIT);
            match self
                .replica
                .wait_replicated(index, wanted.members, patience)
                .await
            {
                Replicated::Held => None,
                Replicated::TimedOut => Some(
                    MongoError::new(
                        ErrorCode::WRITE_CONCERN_FAILED,
                        "waiting for replication timed out",
                    )
                    .with_extra(
                        doc! {"errInfo": {"wtimeout": true, "writeConcern": wanted.as_document()}},
                    ),
                ),
                Replicated::NotLeading => Some(MongoError::new(
                    ErrorCode::PRIMARY_STEPPED_DOWN,
                    "Primary stepped down while waiting for replication",
                )),
            }
        };
        let Some(error) = error else { return body };
        let Ok(mut reply) = body.into_document() else {
            return Body::Document(error.to_document());
        };
        if reply.get("ok") == Some(&Bson::Double(1.0)) {
            let mut wce =
                doc! {"code": error.code, "codeName": &error.code_name, "errmsg": &error.errmsg};
            if let Some(extra) = &error.extra {
                wce.extend(extra.clone());
            }
            reply.insert("writeConcernError", wce);
        }
        Body::Document(reply)
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
        base.insert("secondary", !primary && self.secondary().is_some());
        base.insert("setName", self.set.name.clone());
        let config = self.replica.config();
        base.insert(
            "setVersion",
            i64::try_from(config.version).unwrap_or(i64::MAX),
        );
        let hosts = |voter: bool| -> Vec<String> {
            config
                .members
                .iter()
                .filter(|m| m.voter == voter)
                .map(|m| m.addr.clone())
                .collect()
        };
        base.insert("hosts", hosts(true));
        let passives = hosts(false);
        if !passives.is_empty() {
            base.insert("passives", passives);
        }
        if let Some(host) = self.replica.leader().and_then(|l| config.addr(l)) {
            base.insert("primary", host);
        }
        let me = config.addr(self.set.me).or_else(|| {
            usize::try_from(self.set.me)
                .ok()
                .and_then(|m| self.set.hosts.get(m))
                .map(String::as_str)
        });
        if let Some(me) = me {
            base.insert("me", me);
        }
        if config
            .members
            .iter()
            .any(|m| m.id == self.set.me && !m.voter)
        {
            base.insert("passive", true);
        }
        if primary {
            base.insert("electionId", election_id(term));
        }
        if let Some(last_write) = self.last_write() {
            base.insert("lastWrite", last_write);
        }
        base.insert(
            "topologyVersion",
            doc! {"processId": self.process_id, "counter": *self.topology.borrow()},
        );
        base
    }

    /// `hello`'s `lastWrite`: the op time and wall time of the last oplog entry this member
    /// applied. A member applies only committed entries, so its majority op time is the same
    /// (drivers read `lastWriteDate` for `maxStalenessSeconds`).
    fn last_write(&self) -> Option<Document> {
        let read = self.storage.begin_read().ok()?;
        let mut last = None;
        read.scan(Table::Oplog, &KeyRange::all(), true, &mut |_, entry| {
            last = Some(entry.to_vec());
            Scan::Stop
        })
        .ok()?;
        let last = last?;
        let entry = bson::RawDocument::from_bytes(&last).ok()?;
        let op_time = doc! {"ts": entry.get_timestamp("ts").ok()?, "t": entry.get_i64("t").ok()?};
        let wall = entry.get_datetime("wall").ok()?;
        Some(doc! {
            "opTime": op_time.clone(),
            "lastWriteDate": wall,
            "majorityOpTime": op_time,
            "majorityWriteDate": wall,
        })
    }

    /// For an awaitable `hello`: waits until the topology differs from the client's, or its
    /// `maxAwaitTimeMS` passed (MongoDB's checks and codes).
    async fn await_topology(&self, cmd: &Document) -> Result<(), MongoError> {
        let theirs = cmd.get("topologyVersion");
        let wait = cmd.get("maxAwaitTimeMS");
        let (theirs, wait) = match (theirs, wait) {
            (None, None) => return Ok(()),
            (Some(Bson::Document(t)), Some(w)) => (t, w),
            (Some(_), Some(_)) => {
                return Err(MongoError::new(
                    ErrorCode::TYPE_MISMATCH,
                    "topologyVersion must be an object",
                ));
            }
            (t, _) => {
                let why = if t.is_some() {
                    "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'"
                } else {
                    "A request with 'maxAwaitTimeMS' must include a 'topologyVersion'"
                };
                return Err(MongoError::with_code(31368, why));
            }
        };
        let wait = config::whole(wait).ok_or_else(|| {
            MongoError::new(
                ErrorCode::TYPE_MISMATCH,
                "maxAwaitTimeMS must be an integer",
            )
        })?;
        if wait < 0 {
            return Err(MongoError::with_code(
                31373,
                "maxAwaitTimeMS must be a non-negative integer",
            ));
        }
        let counter = match theirs.get("counter") {
            Some(Bson::Int64(c)) => *c,
            Some(Bson::Int32(c)) => i64::from(*c),
            _ => -1,
        };
        if theirs.get_object_id("processId").ok() != Some(self.process_id) {
            return Ok(());
        }
        let mut rx = self.topology.subscribe();
        let ours = *rx.borrow_and_update();
        if counter > ours {
            return Err(MongoError::with_code(
                31382,
                format!(
                    "Received a topology version with the same process ID and a higher counter \
                     ({counter}) than this member's ({ours})"
                ),
            ));
        }
        if counter < ours {
            return Ok(());
        }
        let wait = Duration::from_millis(wait.unsigned_abs()).min(MAX_AWAIT);
        let _ = tokio::time::timeout(wait, async {
            tokio::select! {
                _ = rx.changed() => {}
                () = self.cancel.cancelled() => {}
            }
        })
        .await;
        Ok(())
    }

    /// `replSetGetStatus`: each member's state, term, and positions in the log as this member
    /// knows them (the primary knows every member's; a secondary its own and the primary's).
    fn status(&self) -> Document {
        let status = self.replica.status();
        let members: Vec<Bson> = status
            .members
            .iter()
            .map(|m| Bson::Document(member_status(&status, m)))
            .collect();
        let voters = status.members.iter().filter(|m| m.voter).count();
        let majority = i32::try_from(voters / 2 + 1).unwrap_or(i32::MAX);
        let (state, _) = state_of(&status, status.me);
        let mut optimes = Document::new();
        optimes.insert("lastCommittedOpTime", position(status.committed));
        optimes.insert("appliedOpTime", position(status.applied));
        // Tributary's: the index of the last entry in its log, durable once there (an empty
        // member's peers tell by it whether their set has history).
        let last = status
            .last_log
            .map_or(0, |i| i64::try_from(i).unwrap_or(i64::MAX));
        optimes.insert("lastLogIndex", last);
        // Tributary's: what this member's snapshot covers and what its log no longer holds (a
        // member that needs a purged entry is sent the snapshot).
        if status.snapshot.is_some() {
            optimes.insert("snapshotOpTime", position(status.snapshot));
        }
        if status.purged.is_some() {
            optimes.insert("purgedOpTime", position(status.purged));
        }
        doc! {
            "set": &self.set.name,
            "date": bson::DateTime::now(),
            "myState": state,
            "term": i64::try_from(status.term).unwrap_or(i64::MAX),
            "heartbeatIntervalMillis": 200_i64,
            "majorityVoteCount": majority,
            "writeMajorityCount": majority,
            "votingMembersCount": i32::try_from(voters).unwrap_or(i32::MAX),
            "optimes": optimes,
            "members": members,
            "ok": 1.0,
        }
    }

    /// `replSetReconfig`: on the primary, makes the set's members the configuration's (see
    /// `config` for what it checks). New members join as learners and vote once they hold the
    /// primary's log (`newlyAdded`); the voters change by joint consensus, so, unlike
    /// MongoDB, any number of them may change at once. Answers once the configuration is
    /// committed, or when a new member has not caught up within `maxTimeMS` (else 60 s; it
    /// stays a member without a vote). `force` (a set that lost its majority) is refused:
    /// Raft cannot safely change a configuration without one.
    async fn reconfigure(&self, cmd: &Document) -> Result<Document, MongoError> {
        if cmd.get_bool("force").unwrap_or(false) {
            return Err(MongoError::new(
                ErrorCode::BAD_VALUE,
                "a forced reconfig is not supported: a set that lost its majority cannot change \
                 its members safely",
            ));
        }
        if self.replica.leading_term().is_none() {
            return Err(MongoError::new(
                ErrorCode::NOT_WRITABLE_PRIMARY,
                "replSetReconfig should only be run on a writable PRIMARY",
            ));
        }
        let members = config::parse(
            cmd.get("replSetReconfig"),
            &self.set.name,
            &self.replica.config(),
            self.set.me,
        )?;
        let patience = match cmd.get("maxTimeMS") {
            Some(Bson::Int32(n)) if *n > 0 => Duration::from_millis(n.unsigned_abs().into()),
            Some(Bson::Int64(n)) if *n > 0 => Duration::from_millis(n.unsigned_abs()),
            _ => MEMBERS_WAIT,
        };
        match self.replica.reconfigure(&members, patience).await {
            Ok(()) => Ok(doc! {"ok": 1.0}),
            Err(ReplError::NotLeader { .. }) => Err(MongoError::new(
                ErrorCode::NOT_WRITABLE_PRIMARY,
                "this member stopped being primary during the reconfig",
            )),
            Err(ReplError::Reconfig { busy: true, reason }) => Err(MongoError::new(
                ErrorCode::CONFIGURATION_IN_PROGRESS,
                format!("a reconfig is already in progress: {reason}"),
            )),
            Err(ReplError::Reconfig {
                busy: false,
                reason,
            }) => Err(MongoError::new(
                ErrorCode::NEW_REPLICA_SET_CONFIGURATION_INCOMPATIBLE,
                reason,
            )),
            Err(ReplError::TimedOut(t)) => Err(MongoError::new(
                ErrorCode::EXCEEDED_TIME_LIMIT,
                format!(
                    "the new configuration was not in force within {t:?} (a new member that has \
                     not caught up stays without a vote)"
                ),
            )),
            Err(e @ (ReplError::Unknown | ReplError::Stopped(_))) => Err(MongoError::new(
                ErrorCode::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
                e.to_string(),
            )),
        }
    }

    /// `replSetStepDown`: hands leadership to the most caught-up voter once it holds every
    /// entry of this member's log (within `secondaryCatchUpPeriodSecs`, 10 by default; with
    /// `force`, to the most caught-up one whatever it holds), then waits for its election.
    async fn step_down(&self, cmd: &Document) -> Result<Document, MongoError> {
        let Some(term) = self.replica.leading_term() else {
            return Err(MongoError::new(
                ErrorCode::NOT_WRITABLE_PRIMARY,
                "not primary so can't step down",
            ));
        };
        let force = cmd.get_bool("force").unwrap_or(false);
        let frozen_for = match cmd.get("replSetStepDown") {
            Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => seconds(v)?,
            _ => STEP_DOWN_FREEZE,
        };
        let catch_up = match cmd.get("secondaryCatchUpPeriodSecs") {
            None => CATCH_UP,
            Some(v) => seconds(v)?.min(MAX_AWAIT),
        };
        if frozen_for < catch_up {
            return Err(MongoError::new(
                ErrorCode::BAD_VALUE,
                "stepdown period must be longer than secondaryCatchUpPeriodSecs",
            ));
        }
        let deadline = tokio::time::Instant::now() + catch_up;
        let successor = loop {
            let status = self.replica.status();
            let best = status
                .members
                .iter()
                .filter(|m| m.voter && m.id != status.me)
                .max_by_key(|m| m.matched);
            let caught_up = best.filter(|m| m.matched.map(|(i, _)| i) >= status.last_log);
            if let Some(m) = caught_up.or(best.filter(|_| force)) {
                break m.id;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(MongoError::new(
                    ErrorCode::EXCEEDED_TIME_LIMIT,
                    "No electable secondaries caught up as of the step-down deadline",
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.replica
            .transfer_leadership(successor)
            .await
            .map_err(|e| MongoError::internal(format!("handing over leadership: {e}")))?;
        let stepped = tokio::time::timeout(HAND_OVER, self.replica.wait_not_leading(term)).await;
        if stepped.is_err() {
            return Err(MongoError::new(
                ErrorCode::EXCEEDED_TIME_LIMIT,
                format!("member {successor} was not elected within {HAND_OVER:?}"),
            ));
        }
        // Not electable again for the step-down period, as MongoDB's stepped-down primary.
        self.replica.freeze(frozen_for);
        Ok(doc! {"ok": 1.0})
    }

    /// `replSetFreeze: <seconds>`: a secondary does not stand for election for that long
    /// (0 lifts a freeze). It still votes, and a primary's step-down may still hand it the
    /// role.
    fn freeze(&self, cmd: &Document) -> Result<Document, MongoError> {
        let period = match cmd.get("replSetFreeze") {
            Some(v) => seconds(v)?,
            None => Duration::ZERO,
        };
        if self.replica.leading_term().is_some() {
            return Err(MongoError::new(
                ErrorCode::NOT_SECONDARY,
                "cannot freeze node when primary or running for election. state: Primary",
            ));
        }
        self.replica.freeze(period);
        if period.is_zero() {
            return Ok(doc! {"info": "unfreezing", "ok": 1.0});
        }
        Ok(doc! {"ok": 1.0})
    }

    /// Stops serving (closing the shard if open) and stops the replica.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        for task in std::mem::take(&mut *self.tasks.lock().await) {
            let _ = task.await;
        }
        self.replica.shutdown().await;
    }
}

/// Counts each change of the leader, the term, the configuration, or whether this member
/// serves, in `topology`.
async fn follow_topology(
    replica: Arc<Replica>,
    mut primary: watch::Receiver<Option<Arc<Shard>>>,
    topology: watch::Sender<i64>,
    cancel: CancellationToken,
) {
    loop {
        let (leader, term) = (replica.leader(), replica.term());
        let version = replica.config().version;
        tokio::select! {
            () = replica.wait_leader_change(leader, term) => {}
            () = replica.wait_config_change(version) => {}
            changed = primary.changed() => if changed.is_err() { return },
            () = cancel.cancelled() => return,
        }
        topology.send_modify(|c| *c += 1);
    }
}

/// MongoDB's member state and its name for member `id` in `status` (as `id` is seen from the
/// member that made it).
fn state_of(status: &SetStatus, id: MemberId) -> (i32, &'static str) {
    if id == status.me {
        return match status.role {
            Role::Leader => (1, "PRIMARY"),
            Role::Follower => (2, "SECONDARY"),
            Role::Candidate => (2, "SECONDARY"),
            Role::Learner => (5, "STARTUP2"),
            Role::Stopped => (8, "DOWN"),
        };
    }
    let voter = status.members.iter().any(|m| m.id == id && m.voter);
    match (status.leader == Some(id), status.role, voter) {
        (true, _, _) => (1, "PRIMARY"),
        (false, Role::Leader, true) => (2, "SECONDARY"),
        (false, Role::Leader, false) => (5, "STARTUP2"),
        _ => (6, "UNKNOWN"),
    }
}

/// A log position as `{index, t}` (a Raft index stands for MongoDB's `ts`).
fn position(p: Option<(u64, u64)>) -> Document {
    let (index, term) = p.unwrap_or((0, 0));
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    doc! {"index": n(index), "t": n(term)}
}

/// One entry of `replSetGetStatus.members`.
fn member_status(status: &SetStatus, m: &crate::repl::MemberStatus) -> Document {
    let (state, state_str) = state_of(status, m.id);
    let me = m.id == status.me;
    let mut d = doc! {
        "_id": i64::try_from(m.id).unwrap_or(i64::MAX),
        "name": &m.addr,
        "health": if me || m.heard.is_some() || state == 1 { 1.0 } else { 0.0 },
        "state": state,
        "stateStr": state_str,
        "votingMember": m.voter,
    };
    let held = if me { status.applied } else { m.matched };
    if me || held.is_some() {
        d.insert("optime", position(held));
    }
    if let (Some((held, _)), Some((committed, _))) = (held, status.committed) {
        d.insert(
            "lagEntries",
            i64::try_from(committed.saturating_sub(held)).unwrap_or(i64::MAX),
        );
    }
    if let Some(heard) = m.heard {
        d.insert(
            "lastHeartbeatMillisAgo",
            i64::try_from(heard.as_millis()).unwrap_or(i64::MAX),
        );
    }
    if me {
        d.insert("self", true);
    }
    d
}

/// A number of seconds (`replSetFreeze`, `replSetStepDown`): not negative, at most a day.
fn seconds(v: &Bson) -> Result<Duration, MongoError> {
    const MOST: f64 = 86_400.0;
    let secs = match v {
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        Bson::Double(f) if f.is_finite() => *f,
        _ => {
            return Err(MongoError::new(
                ErrorCode::TYPE_MISMATCH,
                "a number of seconds is expected",
            ));
        }
    };
    if secs < 0.0 {
        return Err(MongoError::new(
            ErrorCode::BAD_VALUE,
            "the number of seconds must not be negative",
        ));
    }
    Ok(Duration::from_secs_f64(secs.min(MOST)))
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Why a member that does not lead refuses a command ([`secondary_runs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The primary's: a write, a transaction, a change to the server's state.
    NotPrimary,
    /// A read from a client that asked for the primary.
    NoSecondaryOk,
    /// A read as of a cluster time (`snapshot`): secondaries keep no history to serve it yet.
    Snapshot,
}

impl Refused {
    fn error(self, leader: Option<u64>) -> MongoError {
        match self {
            Refused::NotPrimary => not_primary(leader),
            Refused::NoSecondaryOk => MongoError::new(
                ErrorCode::NOT_PRIMARY_NO_SECONDARY_OK,
                "not primary and secondaryOk=false: this read asks for the primary",
            ),
            Refused::Snapshot => MongoError::new(
                ErrorCode::SNAPSHOT_UNAVAILABLE,
                "readConcern snapshot is served by the primary only: a secondary keeps no \
                 history of the documents to read as of a cluster time",
            ),
        }
    }
}

/// Whether a member that does not lead runs `cmd` on its read-only shard, as a MongoDB
/// secondary would: commands any member runs ([`OnSecondary::Always`]), and reads from a client
/// whose `$readPreference` accepts a secondary, outside transactions, writing nowhere
/// (`$out`, `$merge`) and not as of a cluster time. Pure.
fn secondary_runs(cmd: &Document) -> Result<(), Refused> {
    let name = cmd.keys().next().map_or("", String::as_str);
    let Some(command) = Command::named(name) else {
        // Its follower answers CommandNotFound, as any member would.
        return Ok(());
    };
    if cmd.contains_key("autocommit") || cmd.contains_key("startTransaction") {
        return Err(Refused::NotPrimary);
    }
    match command.on_secondary() {
        OnSecondary::Always => return Ok(()),
        OnSecondary::Never => return Err(Refused::NotPrimary),
        OnSecondary::SecondaryOk => {}
    }
    let writes = cmd.get_array("pipeline").is_ok_and(|stages| {
        stages.iter().any(|s| {
            s.as_document()
                .and_then(|s| s.keys().next())
                .is_some_and(|k| k == "$out" || k == "$merge")
        })
    });
    if writes {
        return Err(Refused::NotPrimary);
    }
    let mode = cmd
        .get_document("$readPreference")
        .ok()
        .and_then(|p| p.get_str("mode").ok())
        .unwrap_or("primary");
    if mode == "primary" {
        return Err(Refused::NoSecondaryOk);
    }
    match cmd
        .get_document("readConcern")
        .ok()
        .and_then(|rc| rc.get_str("level").ok())
    {
        Some("snapshot") => Err(Refused::Snapshot),
        Some("linearizable") => Err(Refused::NotPrimary),
        _ => Ok(()),
    }
}

fn not_primary(leader: Option<u64>) -> MongoError {
    let known = leader.map_or_else(|| "not known".to_string(), |l| format!("member {l}"));
    MongoError::new(
        ErrorCode::NOT_WRITABLE_PRIMARY,
        format!("not primary: this member does not lead its replica set (the primary is {known})"),
    )
    .with_label("RetryableWriteError")
}

/// While `replica` does not lead (and holds the set's data: it is not rejoining), serves a
/// read-only shard over `storage`, caught up after every apply, and publishes it on `tx`.
async fn serve_reads(
    opts: ShardOptions,
    replica: Arc<Replica>,
    storage: Arc<dyn Storage>,
    tx: watch::Sender<Option<Arc<Shard>>>,
    cancel: CancellationToken,
) {
    // How often the member's role is looked at when nothing is applied.
    const LOOK: Duration = Duration::from_millis(100);
    let mut seen = None;
    while !cancel.is_cancelled() {
        let serves = replica.serves_reads();
        let open = tx.borrow().clone();
        match (serves, open) {
            (true, None) => match Shard::open_follower(opts.clone(), storage.clone()).await {
                Ok(shard) => {
                    tracing::info!(member = replica.id(), "secondary: serving reads");
                    tx.send_replace(Some(shard));
                }
                Err(e) => tracing::warn!(error = %e, "the secondary could not open its shard"),
            },
            (false, Some(shard)) => {
                tx.send_replace(None);
                shard.shutdown().await;
            }
            (true, Some(shard)) => {
                if let Err(e) = shard.catch_up() {
                    tracing::warn!(error = %e, "the secondary could not catch up with its storage");
                    tx.send_replace(None);
                    shard.shutdown().await;
                }
            }
            (false, None) => {}
        }
        tokio::select! {
            applied = replica.wait_applied_past(seen) => seen = applied,
            () = tokio::time::sleep(LOOK) => {}
            () = cancel.cancelled() => {}
        }
    }
    if let Some(shard) = tx.send_replace(None) {
        shard.shutdown().await;
    }
}

/// While `replica` leads, serves a shard over `storage` and publishes it on `tx`.
async fn lead(
    opts: ShardOptions,
    replica: Arc<Replica>,
    storage: Arc<dyn Storage>,
    patience: Duration,
    tx: watch::Sender<Option<Arc<Shard>>>,
    on_open: Arc<std::sync::Mutex<Vec<OnOpen>>>,
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
        let hooks = lock(&on_open).clone();
        for f in hooks {
            f(&shard);
        }
        tracing::info!(term, member = replica.id(), "primary: serving the shard");
        tx.send_replace(Some(shard.clone()));
        tokio::select! {
            () = replica.wait_quorum_lost(term) => {
                if replica.leading_term() == Some(term) {
                    tracing::warn!(term, "no majority within the leader lease: stepping down");
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(wc: Document) -> Option<MembersWanted> {
        MembersWanted::of(&doc! {"insert": "c", "writeConcern": wc})
    }

    #[test]
    fn a_secondary_runs_what_a_mongodb_secondary_runs() {
        let secondary = doc! {"mode": "secondaryPreferred"};
        let read = |mut cmd: Document| {
            cmd.insert("$readPreference", secondary.clone());
            secondary_runs(&cmd)
        };
        assert_eq!(secondary_runs(&doc! {"ping": 1}), Ok(()));
        assert_eq!(secondary_runs(&doc! {"getMore": 5_i64}), Ok(()));
        assert_eq!(secondary_runs(&doc! {"noSuchCommand": 1}), Ok(()));
        assert_eq!(read(doc! {"find": "c"}), Ok(()));
        assert_eq!(
            read(doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}]}),
            Ok(())
        );
        assert_eq!(
            secondary_runs(&doc! {"find": "c"}),
            Err(Refused::NoSecondaryOk)
        );
        let primary = doc! {"find": "c", "$readPreference": {"mode": "primary"}};
        assert_eq!(secondary_runs(&primary), Err(Refused::NoSecondaryOk));
        assert_eq!(read(doc! {"insert": "c"}), Err(Refused::NotPrimary));
        assert_eq!(
            read(doc! {"aggregate": "c", "pipeline": [{"$merge": "d"}]}),
            Err(Refused::NotPrimary)
        );
        assert_eq!(
            read(doc! {"find": "c", "autocommit": false}),
            Err(Refused::NotPrimary)
        );
        assert_eq!(
            read(doc! {"find": "c", "readConcern": {"level": "snapshot"}}),
            Err(Refused::Snapshot)
        );
        assert_eq!(
            read(doc! {"find": "c", "readConcern": {"level": "linearizable"}}),
            Err(Refused::NotPrimary)
        );
        assert_eq!(
            read(doc! {"find": "c", "readConcern": {"level": "majority"}}),
            Ok(())
        );
    }

    #[test]
    fn only_a_number_of_members_above_one_is_waited_for() {
        assert_eq!(MembersWanted::of(&doc! {"insert": "c"}), None);
        for w in [
            Bson::Int32(0),
            Bson::Int32(1),
            Bson::Double(1.0),
            "majority".into(),
            "tag".into(),
        ] {
            assert_eq!(wanted(doc! {"w": w.clone()}), None, "w: {w}");
        }
        assert_eq!(wanted(doc! {"w": f64::NAN}), None);
        assert_eq!(
            wanted(doc! {"w": 3_i64, "wtimeout": 250}),
            Some(MembersWanted {
                members: 3,
                timeout: Some(Duration::from_millis(250))
            })
        );
        // wtimeout 0 (or none) is MongoDB's "no timeout": the member's own deadline then.
        assert_eq!(
            wanted(doc! {"w": 2.0, "wtimeout": 0}),
            Some(MembersWanted {
                members: 2,
                timeout: None
            })
        );
        assert_eq!(
            wanted(doc! {"w": 2, "wtimeout": 100})
                .map(|w| w.as_document())
                .as_ref()
                .map(Document::to_string),
            Some(
                doc! {"w": 2_i64, "wtimeout": 100_i64, "provenance": "clientSupplied"}.to_string()
            )
        );
    }
}
