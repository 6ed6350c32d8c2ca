//! Replication: one shard as a replica set of 1, 3 or 5 members on openraft
//! (`design/replication.md`). This module owns the consensus half: the Raft log on disk, the
//! state machine that applies committed write sets to a member's storage, and the peers'
//! transport; the writer (which executes batches on the leader) proposes through [`Replica`].
//!
//! Invariants:
//! * One Raft entry is one writer batch: its [`Proposal`] carries the batch's write set (the
//!   physical redo record, `log::WriteSet`) and the term it was executed under. Only results
//!   replicate, never commands: a follower replays bytes, it never re-executes a job.
//! * Every member, the leader included, applies only committed entries, in log order, by
//!   physical redo (`log::replay`), or on the leader by committing the transaction its writer
//!   executed the entry's batch in, which holds exactly those writes (`handover`); the applied
//!   log id is written in the same storage transaction as the entry's writes, so after a crash
//!   an entry is applied again or not at all, never half.
//! * A proposal whose term is not its entry's term was executed by a leader that lost its term
//!   before the entry was appended under it: every member skips its writes (the term fence),
//!   and its jobs fail as not executed.
//! * One leader per term (`leader_id_std`): the oplog's `t` names a single primary.
//! * A log-store error (read or write) stops the member: openraft treats storage errors as
//!   fatal, and so do we (a leader that read garbage must not send it: openraft #1795).
//! * No openraft type leaves this module: the 0.10 alphas still move them.

mod codec;
mod handover;
mod log_store;
mod network;
mod raft_log;
mod segments;
mod snapshot;
mod state_machine;
mod wire_net;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};

pub use handover::Handover;
pub use network::{LocalNet, Net};
pub use raft_log::RaftLog;
pub use state_machine::applied_promise;
pub use wire_net::{COMMANDS as PEER_COMMANDS, WireNet};

use crate::storage::Storage;

/// A member's id within its replica set (its position in `--peers`, from 0).
pub type MemberId = u64;

/// What one Raft entry asks every member to apply: one writer batch.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The term of the leader that executed the batch (the term fence).
    pub term: u64,
    /// The leader's high-water mark when the batch started ([`ClusterTime::as_u64`]): every
    /// entry after this one in the log has a greater `ts`, so a member that applied it may
    /// promise as much (`follower`).
    ///
    /// [`ClusterTime::as_u64`]: resume::ClusterTime::as_u64
    pub promise: u64,
    /// The batch's write set ([`crate::log::WriteSet::encoded`]).
    #[serde(with = "serde_bytes")]
    pub ops: Vec<u8>,
}

impl fmt::Debug for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Proposal(term {}, promise {}, {} bytes)",
            self.term,
            resume::ClusterTime::from_u64(self.promise),
            self.ops.len()
        )
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What applying an entry did, as the proposer learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's position in the log.
    pub index: u64,
    /// The term the entry was appended under.
    pub term: u64,
    /// Whether its writes were applied (false: the term fence skipped them).
    pub executed: bool,
}

/// How a member is reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the member's shard server.
    pub addr: String,
}

openraft::declare_raft_types!(
    /// Tributary's Raft: write sets in, application results out, one leader per term.
    pub TypeConfig:
        D = Proposal,
        R = Applied,
        NodeId = MemberId,
        Node = Member,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, MemberId>,
);

type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;

/// Why a proposal did not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplError {
    /// This member is not the leader; the leader, when known. Nothing was appended.
    #[error("not the primary (the primary is {leader:?})")]
    NotLeader { leader: Option<MemberId> },
    /// The entry was appended but leadership changed before it was known to commit: it may
    /// or may not apply.
    #[error("the primary changed while the write was replicating: its outcome is unknown")]
    Unknown,
    /// No majority answered in time: the entry may still commit.
    #[error("no majority acknowledged the write within {0:?}")]
    TimedOut(Duration),
    /// The member stopped (a storage error, or shutdown).
    #[error("the replica stopped: {0}")]
    Stopped(String),
    /// A change of the set's members that cannot be made now (another is under way) or at
    /// all; `busy` says which.
    #[error("{reason}")]
    Reconfig { busy: bool, reason: String },
}

/// Timings of the set: how fast a dead leader is replaced.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat: Duration,
    /// A follower that heard no leader for a random time in this range stands for election.
    pub election: (Duration, Duration),
}

impl Default for Timing {
    /// Heartbeats at 150 ms, elections after 0.6–0.9 s of silence (MongoDB's default is 10 s;
    /// the goal is a new primary within 2 s at p50). A voter refuses to elect anyone
    /// while its leader's lease (the longest election timeout) runs, so the first candidate
    /// after a leader dies usually stands twice: a new leader 1.2–1.8 s after the last
    /// heartbeat.
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_millis(150),
            election: (Duration::from_millis(600), Duration::from_millis(900)),
        }
    }
}

/// What a member plays in its set now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Stopped,
}

/// One member as [`Replica::status`] sees it.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub id: MemberId,
    pub addr: String,
    pub voter: bool,
    /// On the leader: the last entry (index, term) this member is known to hold.
    pub matched: Option<(u64, u64)>,
    /// On the leader: how long ago this member last answered a heartbeat.
    pub heard: Option<Duration>,
}

/// How a wait for `w: N` members ended ([`Replica::wait_replicated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    Held,
    TimedOut,
    NotLeading,
}

/// A member's view of its set (see [`Replica::status`]); positions are (index, term).
#[derive(Debug, Clone)]
pub struct SetStatus {
    pub me: MemberId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<MemberId>,
    /// The index of the last entry in this member's log (durable once there).
    pub last_log: Option<u64>,
    pub applied: Option<(u64, u64)>,
    pub committed: Option<(u64, u64)>,
    /// The last entry this member's snapshot covers, and the last it purged from its log.
    pub snapshot: Option<(u64, u64)>,
    pub purged: Option<(u64, u64)>,
    pub members: Vec<MemberStatus>,
}

/// One member of the set's configuration (`replSetGetConfig`'s `members`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMember {
    pub id: MemberId,
    pub addr: String,
    /// A voter, or a learner (MongoDB's `votes: 0, priority: 0`): it holds every entry but
    /// neither votes nor counts toward a majority.
    pub voter: bool,
}

/// The set's configuration as this member knows it: its members, and its version (the log
/// index of the entry that made it, so it only grows, on every member alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetConfig {
    pub version: u64,
    pub members: Vec<ConfigMember>,
}

impl SetConfig {
    /// The address of member `id`, if it is one.
    pub fn addr(&self, id: MemberId) -> Option<&str> {
        self.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.addr.as_str())
    }
}

/// [`Replica::rejoin`]'s states: not rejoining, asking the leader, catching up; and before it,
/// [`Replica::hold`]'s: an empty member finding out whether its set has history.
const REJOIN_DONE: u8 = 0;
const REJOIN_ASKING: u8 = 1;
const REJOIN_CATCHING_UP: u8 = 2;
const REJOIN_DECIDING: u8 = 3;

/// How often a leader's quorum acknowledgement is looked at when nothing else changes.
const QUORUM_LOOK: Duration = Duration::from_millis(100);

/// One member of a replica set: its Raft node over its log file and its storage.
pub struct Replica {
    id: MemberId,
    raft: Raft,
    /// Until when this member does not stand for election (`replSetFreeze`, a step-down).
    frozen_until: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    /// Where a member that came back without its data stands (see [`Replica::rejoin`]).
    rejoin: Arc<std::sync::atomic::AtomicU8>,
    /// The pieces of a snapshot a peer is sending (`wire_net`).
    incoming: std::sync::Mutex<wire_net::Incoming>,
    /// The leader's batch transactions on their way to its state machine.
    handover: Arc<Handover>,
    /// How long a leader's quorum acknowledgement stays good (openraft's leader lease: the
    /// longest election timeout).
    lease: Duration,
}

impl Replica {
    /// Opens (or creates) the member `id`'s Raft log at `log_path` over `storage`, talking to
    /// its peers through `net`.
    pub async fn open(
        id: MemberId,
        log_path: &Path,
        storage: Arc<dyn Storage>,
        net: Net,
        timing: Timing,
    ) -> Result<Replica, ReplError> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let config = openraft::Config {
            cluster_name: "tributary".into(),
            heartbeat_interval: ms(timing.heartbeat),
            election_timeout_min: ms(timing.election.0),
            election_timeout_max: ms(timing.election.1),
            // A member that cannot win (cut off, restarted, behind) asks first, so it never
            // raises the term and deposes a healthy primary when it comes back.
            enable_pre_vote: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| ReplError::Stopped(format!("replication settings: {e}")))?;
        let log = log_store::LogStore::open(log_path)
            .map_err(|e| ReplError::Stopped(format!("opening the Raft log: {e}")))?;
        let handover = Handover::new();
        let sm = state_machine::StateMachine::open(storage, handover.clone())
            .await
            .map_err(|e| ReplError::Stopped(format!("reading the applied state: {e}")))?;
        let raft = Raft::new(id, Arc::new(config), net.factory(id), log, sm)
            .await
            .map_err(|e| ReplError::Stopped(e.to_string()))?;
        if let Net::Local(local) = &net {
            local.register(id, raft.clone());
        }
        Ok(Replica {
            id,
            raft,
            frozen_until: Arc::default(),
            rejoin: Arc::default(),
            incoming: std::sync::Mutex::new(wire_net::Incoming::new(
                log_path.parent().unwrap_or(Path::new(".")),
            )),
            handover,
            lease: timing.election.1,
        })
    }

    /// [`Replica::open`] for a member whose data lives in `dir`: its storage in
    /// `dir/member.redb`, its Raft log in `dir/raft.redb` (vote, purge point) and
    /// `dir/raft.segments/` (entries). Returns the storage too (the member's shard runs over
    /// it while it leads). The storage sits behind the Raft log: its
    /// commits are not durable by themselves (see `state_machine`'s checkpoints).
    pub async fn open_in(
        dir: &Path,
        id: MemberId,
        net: Net,
        timing: Timing,
    ) -> Result<(Replica, Arc<dyn Storage>), ReplError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ReplError::Stopped(format!("creating {}: {e}", dir.display())))?;
        let storage: Arc<dyn Storage> = Arc::new(
            crate::storage::RedbStorage::open_behind_log(&dir.join("member.redb"))
                .map_err(|e| ReplError::Stopped(format!("opening {}: {e}", dir.display())))?,
        );
        let replica =
            Replica::open(id, &dir.join("raft.redb"), storage.clone(), net, timing).await?;
        Ok((replica, storage))
    }

    pub fn id(&self) -> MemberId {
        self.id
    }

    /// Where this member's writer hands its batches' transactions to its state machine.
    pub fn handover(&self) -> &Arc<Handover> {
        &self.handover
    }

    /// Makes a new set of `members` (this one among them) with this member as the first
    /// leader candidate. Once per set, on one member; a member already part of a set refuses.
    pub async fn initialize(&self, members: BTreeMap<MemberId, Member>) -> Result<(), ReplError> {
        self.raft
            .initialize(members)
            .await
            .map_err(|e| ReplError::Stopped(format!("initialising the set: {e}")))
    }

    /// Answers a peer's message (`_repl*`, see `wire_net`). A member rejoining without its
    /// data takes nothing until the leader agreed to take it back, and votes for nobody until
    /// it caught up (see [`Replica::rejoin`]).
    pub async fn answer(
        &self,
        name: &str,
        body: &bson::Document,
    ) -> Result<bson::Document, wire::MongoError> {
        use std::sync::atomic::Ordering;
        let refuse = match self.rejoin.load(Ordering::Acquire) {
            REJOIN_DECIDING => {
                return Err(wire::MongoError::new(
                    wire::ErrorCode::NOT_PRIMARY_OR_SECONDARY,
                    format!(
                        "member {} has an empty log and is finding out whether its set has \
                         history: it takes no part in the set until it knows",
                        self.id
                    ),
                ));
            }
            REJOIN_ASKING => name != "_replRejoin",
            REJOIN_CATCHING_UP => matches!(name, "_replVote" | "_replPreVote"),
            _ => false,
        };
        if refuse {
            return Err(wire::MongoError::new(
                wire::ErrorCode::NOT_PRIMARY_OR_SECONDARY,
                format!(
                    "member {} lost its data and is rejoining its set: it neither takes entries \
                     before the leader agrees nor votes before it caught up",
                    self.id
                ),
            ));
        }
        if name == "_replRejoin" {
            let member = body
                .get("member")
                .and_then(|m| match m {
                    bson::Bson::Int64(n) => u64::try_from(*n).ok(),
                    bson::Bson::Int32(n) => u64::try_from(*n).ok(),
                    _ => None,
                })
                .ok_or_else(|| {
                    wire::MongoError::new(wire::ErrorCode::BAD_VALUE, "_replRejoin needs member")
                })?;
            return self
                .take_back(member)
                .await
                .map(|()| bson::doc! {"ok": 1.0});
        }
        wire_net::answer(&self.raft, &self.incoming, name, body).await
    }

    /// Whether this member's log belongs to no set yet (a new member, or one whose data was
    /// lost).
    pub async fn is_new(&self) -> Result<bool, ReplError> {
        self.raft
            .is_initialized()
            .await
            .map(|initialized| !initialized)
            .map_err(|e| ReplError::Stopped(e.to_string()))
    }

    /// Holds this member out of its set (it answers no vote and takes no entry) while it finds
    /// out whether its empty log is new or lost (`launch` asks its peers); [`Replica::rejoin`]
    /// or [`Replica::release`] ends the hold. Granting a vote with a lost log could elect a
    /// member that lacks a write this one had acknowledged.
    pub fn hold(&self) {
        self.rejoin
            .store(REJOIN_DECIDING, std::sync::atomic::Ordering::Release);
    }

    /// Ends [`Replica::hold`]: the set is new, so this member's empty log lost nothing.
    pub fn release(&self) {
        self.rejoin
            .store(REJOIN_DONE, std::sync::atomic::Ordering::Release);
    }

    /// This member came back without its data to a set that has committed entries (its
    /// peers say so): its log is empty where the leader's record says it held entries, and
    /// Raft's safety rests on a voter never forgetting what it acknowledged. So it asks the
    /// leader (through `ask`, until one agrees) to replicate to it from the start, taking
    /// nothing before; and it votes for nobody until it holds everything the leader had
    /// committed when it first heard from it, so it never helps elect a member that lacks a
    /// write it once acknowledged.
    pub fn rejoin<F, Fut>(&self, ask: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        use std::sync::atomic::Ordering;
        self.rejoin.store(REJOIN_ASKING, Ordering::Release);
        let state = self.rejoin.clone();
        let mut metrics = self.raft.metrics();
        tokio::spawn(async move {
            while !ask().await {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            state.store(REJOIN_CATCHING_UP, Ordering::Release);
            let mut wanted = None;
            loop {
                {
                    let m = metrics.borrow_watched();
                    let applied = m.last_applied.as_ref().map(|id| id.index);
                    if m.current_leader.is_some()
                        && let Some(committed) = m.local_committed.as_ref().map(|id| id.index)
                    {
                        let target = *wanted.get_or_insert(committed);
                        if applied >= Some(target) {
                            state.store(REJOIN_DONE, Ordering::Release);
                            tracing::info!(applied = ?applied, "rejoined the set: voting again");
                            return;
                        }
                    }
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// On the leader: replication to `member`, which lost its data, starts over from its empty
    /// log (Raft otherwise takes a log that went back for a fault and stops).
    async fn take_back(&self, member: MemberId) -> Result<(), wire::MongoError> {
        if !self.is_leader() {
            return Err(wire::MongoError::new(
                wire::ErrorCode::NOT_WRITABLE_PRIMARY,
                "not the primary: only the leader takes a member back",
            ));
        }
        match self.raft.trigger().allow_next_revert(&member, true).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(wire::MongoError::new(
                wire::ErrorCode::NOT_WRITABLE_PRIMARY,
                format!("cannot take member {member} back: {e}"),
            )),
            Err(e) => Err(wire::MongoError::internal(e.to_string())),
        }
    }

    /// [`Replica::initialize`] unless this member's log already belongs to a set (after a
    /// restart).
    pub async fn initialize_if_new(
        &self,
        members: BTreeMap<MemberId, Member>,
    ) -> Result<(), ReplError> {
        if self
            .raft
            .is_initialized()
            .await
            .map_err(|e| ReplError::Stopped(e.to_string()))?
        {
            return Ok(());
        }
        self.initialize(members).await
    }

    /// Whether this member may serve reads as a secondary: it does not lead, is a member of
    /// the set (a voter or a learner), and holds the set's data (it is not rejoining after
    /// losing it).
    pub fn serves_reads(&self) -> bool {
        use std::sync::atomic::Ordering;
        let state = self.raft.metrics().borrow_watched().state;
        let member = matches!(
            state,
            openraft::ServerState::Follower
                | openraft::ServerState::Candidate
                | openraft::ServerState::Learner
        );
        member
            && self.rejoin.load(Ordering::Acquire) == REJOIN_DONE
            && self.applied_index().is_some()
    }

    /// The leader this member knows of now.
    pub fn leader(&self) -> Option<MemberId> {
        self.raft.metrics().borrow_watched().current_leader
    }

    /// Whether this member leads its set now.
    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.id)
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// The index of the last entry applied to this member's storage.
    pub fn applied_index(&self) -> Option<u64> {
        self.raft
            .metrics()
            .borrow_watched()
            .last_applied
            .as_ref()
            .map(|id| id.index)
    }

    /// On the leader: waits until `members` members, itself included, hold every entry up to
    /// `index` in their logs (what `w: N` asks), or `patience` passed, or it stopped leading.
    pub async fn wait_replicated(
        &self,
        index: u64,
        members: usize,
        patience: Duration,
    ) -> Replicated {
        let mut metrics = self.raft.metrics();
        let waited = tokio::time::timeout(patience, async {
            loop {
                {
                    let m = metrics.borrow_watched();
                    if m.current_leader != Some(self.id) {
                        return Replicated::NotLeading;
                    }
                    // The leader's progress of every member, its own (its log's durable end)
                    // included.
                    let holding = m.replication.as_ref().map_or(0, |progress| {
                        progress
                            .values()
                            .filter(|p| p.as_ref().is_some_and(|id| id.index >= index))
                            .count()
                    });
                    if holding >= members {
                        return Replicated::Held;
                    }
                }
                if metrics.changed().await.is_err() {
                    return Replicated::NotLeading;
                }
            }
        })
        .await;
        waited.unwrap_or(Replicated::TimedOut)
    }

    /// The index of the last entry in this member's log.
    pub fn last_log_index(&self) -> Option<u64> {
        self.raft.metrics().borrow_watched().last_log_index
    }

    /// Replicates `proposal` and returns once a majority has it durably and this member has
    /// applied it, or `patience` passed.
    pub async fn propose(
        &self,
        proposal: Proposal,
        patience: Duration,
    ) -> Result<Applied, ReplError> {
        use openraft::error::{ClientWriteError, RaftError};
        let term = proposal.term;
        let write = tokio::time::timeout(patience, self.raft.client_write(proposal));
        // A leader that loses its majority (or its term) while the entry waits for one does not
        // know whether it will commit (a new leader may have it): it says so at once rather
        // than at the end of its patience. (A member that does not lead is told so by Raft.)
        let written = if self.leading_term() == Some(term) {
            tokio::select! {
                written = write => written,
                () = self.wait_quorum_lost(term) => return Err(ReplError::Unknown),
            }
        } else {
            write.await
        };
        match written {
            Err(_) => Err(ReplError::TimedOut(patience)),
            Ok(Ok(response)) => Ok(response.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ReplError::NotLeader {
                    leader: f.leader_id,
                })
            }
            Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)))) => {
                Err(ReplError::Unknown)
            }
            Ok(Err(RaftError::APIError(e))) => Err(ReplError::Stopped(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => Err(ReplError::Stopped(e.to_string())),
        }
    }

    /// Waits until this member leads its set and has applied every entry of its log, the first
    /// of its term included (from then on it takes writes); false when `patience` passed first.
    pub async fn wait_leading(&self, patience: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        tokio::time::timeout(patience, async {
            loop {
                {
                    let m = metrics.borrow_watched();
                    let applied = m.last_applied.as_ref();
                    let leading = m.state == openraft::ServerState::Leader
                        && applied.is_some_and(|id| id.leader_id.term == m.current_term)
                        && applied.map(|id| id.index) >= m.last_log_index
                        && self.quorum_heard(&m);
                    if leading {
                        return;
                    }
                }
                // The quorum's acknowledgement ages without a change of metrics: look again.
                let changed = tokio::time::timeout(QUORUM_LOOK, metrics.changed()).await;
                if matches!(changed, Ok(Err(_))) {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Whether a majority acknowledged this leader within its lease (always, for a set of one):
    /// a leader that cannot reach a majority takes no writes (openraft refuses its proposals)
    /// and stops serving as primary, as a MongoDB primary steps down.
    fn quorum_heard(&self, m: &openraft::RaftMetrics<TypeConfig>) -> bool {
        let voters = m.membership_config.membership().voter_ids().count();
        voters <= 1
            || m.last_quorum_acked
                .is_some_and(|t| openraft::Instant::elapsed(&t.into_inner()) < self.lease)
    }

    /// Waits until this member has applied past `seen` (the applied index it last saw), or
    /// stopped; returns the index applied now.
    pub async fn wait_applied_past(&self, seen: Option<u64>) -> Option<u64> {
        let mut metrics = self.raft.metrics();
        loop {
            let applied = metrics
                .borrow_watched()
                .last_applied
                .as_ref()
                .map(|id| id.index);
            if applied > seen || metrics.changed().await.is_err() {
                return applied;
            }
        }
    }

    /// Waits until this member no longer leads in `term`, or no longer hears from a majority
    /// (see [`Replica::quorum_heard`]), or stopped.
    pub async fn wait_quorum_lost(&self, term: u64) {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_watched();
                let leading = m.state == openraft::ServerState::Leader && m.current_term == term;
                if !leading || !self.quorum_heard(&m) {
                    return;
                }
            }
            let changed = tokio::time::timeout(QUORUM_LOOK, metrics.changed()).await;
            if matches!(changed, Ok(Err(_))) {
                return;
            }
        }
    }

    /// The term this member leads now, if it does.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.raft.metrics().borrow_watched().clone();
        (m.state == openraft::ServerState::Leader).then_some(m.current_term)
    }

    /// Waits until this member no longer leads in `term` (it stepped down, or a later term
    /// began), or stopped.
    pub async fn wait_not_leading(&self, term: u64) {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_watched();
                if m.state != openraft::ServerState::Leader || m.current_term != term {
                    return;
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until the leader this member knows of, or the term, is no longer `leader` in
    /// `term` (or the member stopped).
    pub async fn wait_leader_change(&self, leader: Option<MemberId>, term: u64) {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_watched();
                if m.current_leader != leader || m.current_term != term {
                    return;
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until the configuration's version is no longer `version` (or the member stopped).
    pub async fn wait_config_change(&self, version: u64) {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_watched();
                let now = m
                    .membership_config
                    .log_id()
                    .as_ref()
                    .map_or(0, |id| id.index);
                if now != version {
                    return;
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until this member has applied the entry at `index` (or `patience` passed).
    pub async fn wait_applied(&self, index: u64, patience: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        tokio::time::timeout(patience, async {
            loop {
                if metrics
                    .borrow_watched()
                    .last_applied
                    .as_ref()
                    .is_some_and(|id| id.index >= index)
                {
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Takes a snapshot of this member's storage and drops the log up to it: a member that
    /// needs what was dropped is sent the snapshot instead.
    pub async fn compact(&self, patience: Duration) -> Result<(), ReplError> {
        let stopped = |e: openraft::error::Fatal<TypeConfig>| ReplError::Stopped(e.to_string());
        let applied = self.applied_index();
        self.raft.trigger().snapshot().await.map_err(stopped)?;
        let mut metrics = self.raft.metrics();
        let taken = tokio::time::timeout(patience, async {
            loop {
                let snapshot = metrics
                    .borrow_watched()
                    .snapshot
                    .as_ref()
                    .map(|id| id.index);
                if snapshot.is_some() && snapshot >= applied {
                    return snapshot;
                }
                if metrics.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await
        .map_err(|_| ReplError::TimedOut(patience))?;
        match taken {
            Some(upto) => self.raft.trigger().purge_log(upto).await.map_err(stopped),
            None => Err(ReplError::Stopped("the member stopped".into())),
        }
    }

    /// Where this member and, as far as it knows, the others stand (`replSetGetStatus`).
    pub fn status(&self) -> SetStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let position = |id: &Option<openraft::type_config::alias::LogIdOf<TypeConfig>>| {
            id.as_ref().map(|id| (id.index, id.leader_id.term))
        };
        let membership = m.membership_config.membership();
        let voters: Vec<MemberId> = membership.voter_ids().collect();
        let matched = m.replication.clone().unwrap_or_default();
        let heard = m.heartbeat.clone().unwrap_or_default();
        let members = membership
            .nodes()
            .map(|(&id, node)| MemberStatus {
                id,
                addr: node.addr.clone(),
                voter: voters.contains(&id),
                matched: matched.get(&id).and_then(&position),
                heard: heard
                    .get(&id)
                    .and_then(|t| t.map(|t| openraft::Instant::elapsed(&t.into_inner()))),
            })
            .collect();
        let role = match m.state {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Follower => Role::Follower,
            openraft::ServerState::Candidate => Role::Candidate,
            openraft::ServerState::Learner => Role::Learner,
            openraft::ServerState::Shutdown => Role::Stopped,
        };
        SetStatus {
            me: self.id,
            role,
            term: m.current_term,
            leader: m.current_leader,
            last_log: m.last_log_index,
            applied: position(&m.last_applied),
            committed: position(&m.local_committed),
            snapshot: position(&m.snapshot),
            purged: position(&m.purged),
            members,
        }
    }

    /// The set's configuration as this member knows it now (the latest it holds, committed or
    /// not, as Raft uses it).
    pub fn config(&self) -> SetConfig {
        let m = self.raft.metrics().borrow_watched().clone();
        let stored = &m.membership_config;
        let membership = stored.membership();
        let voters: Vec<MemberId> = membership.voter_ids().collect();
        SetConfig {
            version: stored.log_id().as_ref().map_or(0, |id| id.index),
            members: membership
                .nodes()
                .map(|(&id, node)| ConfigMember {
                    id,
                    addr: node.addr.clone(),
                    voter: voters.contains(&id),
                })
                .collect(),
        }
    }

    /// On the leader: makes `wanted` the set's members, as MongoDB's `replSetReconfig` does
    /// with `newlyAdded` members. A new member joins as a learner first and becomes a voter
    /// only once it holds the leader's log (or `patience` passes: then nothing else changes);
    /// the voters change through joint consensus, so a majority of the old and of the new
    /// voters agree; members left out go last. A member keeps its address: one that moves is
    /// removed and added under a new id.
    pub async fn reconfigure(
        &self,
        wanted: &[ConfigMember],
        patience: Duration,
    ) -> Result<(), ReplError> {
        use openraft::ChangeMembers;
        use std::collections::BTreeSet;
        let now = self.config();
        for m in wanted {
            match now.addr(m.id) {
                Some(addr) if addr == m.addr => {}
                Some(addr) => {
                    return Err(ReplError::Reconfig {
                        busy: false,
                        reason: format!(
                            "member {} is at {addr}: a member cannot move (remove it, and add \
                             the new address under a new _id)",
                            m.id
                        ),
                    });
                }
                None => {
                    let addr = m.addr.clone();
                    membership_change(patience, self.raft.add_learner(m.id, Member { addr }, true))
                        .await?;
                }
            }
        }
        let voters: BTreeSet<MemberId> = wanted.iter().filter(|m| m.voter).map(|m| m.id).collect();
        let voting_now: BTreeSet<MemberId> = now
            .members
            .iter()
            .filter(|m| m.voter)
            .map(|m| m.id)
            .collect();
        if voters != voting_now {
            let changed = self
                .raft
                .change_membership(ChangeMembers::ReplaceAllVoters(voters), true);
            membership_change(patience, changed).await?;
        }
        let gone: BTreeSet<MemberId> = self
            .config()
            .members
            .iter()
            .map(|m| m.id)
            .filter(|id| !wanted.iter().any(|w| w.id == *id))
            .collect();
        if !gone.is_empty() {
            let removed = self
                .raft
                .change_membership(ChangeMembers::RemoveNodes(gone), false);
            membership_change(patience, removed).await?;
        }
        Ok(())
    }

    /// Keeps this member from standing for election for `period` (zero: it may stand again at
    /// once); a later freeze replaces an earlier one. A frozen member still votes, and takes a
    /// leadership handed to it.
    pub fn freeze(&self, period: Duration) {
        let until = (!period.is_zero()).then(|| tokio::time::Instant::now() + period);
        *lock(&self.frozen_until) = until;
        self.raft.runtime_config().elect(until.is_none());
        if let Some(until) = until {
            let raft = self.raft.clone();
            let frozen = self.frozen_until.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(until).await;
                let mut frozen = lock(&frozen);
                if *frozen == Some(until) {
                    *frozen = None;
                    raft.runtime_config().elect(true);
                }
            });
        }
    }

    /// Hands leadership to `to` (a caught-up voter): this member stops leading once `to` has
    /// been elected, which the caller waits for ([`Replica::wait_not_leading`]).
    pub async fn transfer_leadership(&self, to: MemberId) -> Result<(), ReplError> {
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| ReplError::Stopped(e.to_string()))
    }

    /// Stops the member (its log and storage stay as they are on disk).
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, member = self.id, "the Raft node did not stop cleanly");
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why openraft refused a write or a membership change.
type WriteRefused =
    openraft::error::RaftError<TypeConfig, openraft::error::ClientWriteError<TypeConfig>>;

/// Waits up to `patience` for one step of a membership change.
async fn membership_change<R>(
    patience: Duration,
    change: impl std::future::Future<Output = Result<R, WriteRefused>>,
) -> Result<R, ReplError> {
    match tokio::time::timeout(patience, change).await {
        Ok(done) => done.map_err(write_error),
        Err(_) => Err(ReplError::TimedOut(patience)),
    }
}

/// A refused membership change as a [`ReplError`].
fn write_error(e: WriteRefused) -> ReplError {
    use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ReplError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ReplError::Unknown,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => ReplError::Reconfig {
            busy: matches!(c, ChangeMembershipError::InProgress(_)),
            reason: c.to_string(),
        },
        RaftError::APIError(e) => ReplError::Reconfig {
            busy: false,
            reason: e.to_string(),
        },
        RaftError::Fatal(e) => ReplError::Stopped(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
