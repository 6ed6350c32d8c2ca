//! A replicated shard as the router reaches it: over TCP (`--shard NAME/h1:p1,h2:p2,h3:p3`), a
//! [`RemoteShard`] per member and a [`SetMonitor`] that follows the set's elections, every
//! command going to the member the monitor takes for the primary ([`ReplicaSetShard`]); in
//! process (`--replicas N`), the member that serves as primary now ([`LocalSet`]).
//!
//! What a member answers decides whether the transport may send the command again
//! (`design/replication.md`, "Router"), and the answer comes back to the transport as the
//! [`TransportError`] that says so:
//! * 10107, 13435, 13436 (not the primary): the member refused the command before running it,
//!   so it is [`TransportError::Unreachable`], sent again to the new primary whatever it is;
//! * 11602, 189, 91, 11600 (stepped down or shut down while running it): it may have run, so
//!   it is [`TransportError::Lost`], sent again only when it may run twice (reads, retryable
//!   writes); otherwise the client gets the member's error with its labels;
//! * a command still waiting on a member when another is elected was sent to a deposed (paused
//!   or cut-off) primary: it is given up as lost at once, not after the liveness check.
//!
//! A read whose command carries a `$readPreference` other than `primary` (the router keeps the
//! client's on the reads it forwards) goes to the members that mode names, in turn
//! ([`ReadMode::candidates`]): a member that cannot be reached or no longer serves reads is
//! passed over for the next, and when none is left the read is not sent
//! (`FailedToSatisfyReadPreference`, which the transport waits out within its patience). The
//! cursor such a read opens stays on its member: its `getMore`s and `killCursors` go there
//! ([`Pins`]).
//!
//! Invariants: a command is sent to one member at a time, and, unless its read preference or
//! its cursor names others, only to the one believed primary when it is sent; a member that
//! refuses or cannot be reached is reported to the monitor, which looks again at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use wire::raw::Body;
use wire::replset::{
    NOT_PRIMARY_MAYBE_RUN, NOT_PRIMARY_UNRUN, PerMember, SetMonitor, SetSpec, reply_code,
};
use wire::{ErrorCode, MongoError};

use shard::replica_set::ReplicaSetMember;

use super::shard_client::{Failed, RemoteShard, ShardClient, TransportError};

/// How long a command waits for the set to have a known primary before it counts as not
/// sent (the transport then decides, within its patience, whether to try again): about one
/// election.
const ELECTION_WAIT: Duration = Duration::from_millis(1500);

/// One replicated shard (see the module header).
pub struct ReplicaSetShard {
    monitor: Arc<SetMonitor>,
    /// A connection pool per member, by its position in the monitor (members added to the
    /// set are found by the monitor).
    members: PerMember<RemoteShard>,
    pins: Pins,
    /// Where the next read on secondaries starts among them.
    turn: AtomicUsize,
}

impl ReplicaSetShard {
    /// Follows the set `spec`, over TLS and with the cluster's key when given.
    pub fn start(
        spec: SetSpec,
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> ReplicaSetShard {
        let monitor = SetMonitor::start(spec, tls.clone(), key.clone());
        let members = PerMember::new(move |h: &str| {
            RemoteShard::secured(h.to_string(), tls.clone(), key.clone())
        });
        ReplicaSetShard {
            monitor,
            members,
            pins: Pins::default(),
            turn: AtomicUsize::new(0),
        }
    }
}

impl Routes for ReplicaSetShard {
    fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Sends `cmd` to the member at `position`, as a read on it: its refusal or silence is the
    /// transport's error, and the monitor hears of it.
    async fn on_member(
        &self,
        position: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Body, TransportError> {
        let Some(member) = self.members.get(&self.monitor, position) else {
            let error = MongoError::internal(format!("no member {position}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        match member.send(db, &cmd).await {
            Ok(reply) => match refusal(&reply) {
                Some(_) => {
                    self.monitor.suspect_secondary(position);
                    Err(TransportError::Unreachable {
                        error: member_error(reply),
                        cmd,
                    })
                }
                None => Ok(reply),
            },
            Err(failed) => {
                self.monitor.suspect_secondary(position);
                Err(failed.with(cmd))
            }
        }
    }

    /// A read with a `$readPreference` other than `primary` (see the module header).
    async fn read(&self, mode: ReadMode, db: &str, cmd: Document) -> Result<Body, TransportError> {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let order = mode.candidates(self.monitor.primary(), &self.monitor.secondaries(), turn);
        let set = self.monitor.spec().to_string();
        read_in_turn(mode, &set, order, &self.pins, cmd, |m, cmd| {
            self.on_member(m, db, cmd)
        })
        .await
    }

    /// The command on the primary, as every command but reads elsewhere.
    async fn on_primary(&self, db: &str, cmd: Document) -> Result<Body, TransportError> {
        let Some(primary) = self.monitor.wait_primary(ELECTION_WAIT).await else {
            let error = MongoError::new(
                ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
                format!(
                    "no primary found for replica set {} within {ELECTION_WAIT:?}",
                    self.monitor.spec()
                ),
            );
            return Err(TransportError::Unreachable { error, cmd });
        };
        let Some(member) = self.members.get(&self.monitor, primary) else {
            let error = MongoError::internal(format!("no member {primary}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        let reply = tokio::select! {
            reply = member.send(db, &cmd) => reply,
            () = self.monitor.deposed(primary) => {
                let error = MongoError::new(
                    ErrorCode::NETWORK_TIMEOUT,
                    format!("{} was deposed while the command waited on it", member.describe()),
                );
                return Err(TransportError::Lost { error, cmd });
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(failed) => {
                if !matches!(failed, Failed::Refused(_)) {
                    self.monitor.suspect(primary);
                }
                return Err(failed.with(cmd));
            }
        };
        let judged = judge(reply, cmd);
        if judged.is_err() {
            self.monitor.suspect(primary);
        }
        judged
    }
}

#[async_trait]
impl ShardClient for ReplicaSetShard {
    async fn command(&self, db: &str, cmd: Document) -> Result<Body, TransportError> {
        route(self, db, cmd).await
    }

    fn describe(&self) -> String {
        self.monitor.spec().to_string()
    }

    fn members(&self) -> usize {
        self.monitor.size()
    }
}

/// A replicated shard whose members run in this process.
pub struct LocalSet {
    name: String,
    members: Vec<Arc<ReplicaSetMember>>,
    pins: Pins,
    /// Where the next read on secondaries starts among them.
    turn: AtomicUsize,
}

impl LocalSet {
    pub fn new(name: String, members: Vec<Arc<ReplicaSetMember>>) -> LocalSet {
        LocalSet {
            name,
            members,
            pins: Pins::default(),
            turn: AtomicUsize::new(0),
        }
    }

    /// The member serving as primary, waiting up to [`ELECTION_WAIT`] for one.
    async fn primary(&self) -> Option<&ReplicaSetMember> {
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        loop {
            if let Some(m) = self.members.iter().find(|m| m.primary().is_some()) {
                return Some(m);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl LocalSet {}

impl Routes for LocalSet {
    fn pins(&self) -> &Pins {
        &self.pins
    }

    /// `cmd` on the member at `position`, as a read on it (refused: the transport's error).
    async fn on_member(
        &self,
        position: usize,
        db: &str,
        mut cmd: Document,
    ) -> Result<Body, TransportError> {
        let Some(member) = self.members.get(position) else {
            let error = MongoError::internal(format!("no member {position}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        cmd.insert("$db", db);
        let reply = member.run_command_body(cmd.clone()).await;
        cmd.remove("$db");
        match refusal(&reply) {
            Some(_) => Err(TransportError::Unreachable {
                error: member_error(reply),
                cmd,
            }),
            None => Ok(reply),
        }
    }

    /// A read with a `$readPreference` other than `primary` (see the module header).
    async fn read(&self, mode: ReadMode, db: &str, cmd: Document) -> Result<Body, TransportError> {
        let primary = self.members.iter().position(|m| m.primary().is_some());
        let secondaries: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].secondary().is_some())
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let order = mode.candidates(primary, &secondaries, turn);
        read_in_turn(mode, &self.name, order, &self.pins, cmd, |m, cmd| {
            self.on_member(m, db, cmd)
        })
        .await
    }

    /// The command on the primary, as every command but reads elsewhere.
    async fn on_primary(&self, db: &str, mut cmd: Document) -> Result<Body, TransportError> {
        let Some(member) = self.primary().await else {
            let error = MongoError::new(
                ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
                format!(
                    "no primary found for replica set {} within {ELECTION_WAIT:?}",
                    self.name
                ),
            );
            return Err(TransportError::Unreachable { error, cmd });
        };
        cmd.insert("$db", db);
        let reply = member.run_command_body(cmd.clone()).await;
        cmd.remove("$db");
        judge(reply, cmd)
    }
}

#[async_trait]
impl ShardClient for LocalSet {
    async fn command(&self, db: &str, cmd: Document) -> Result<Body, TransportError> {
        route(self, db, cmd).await
    }

    fn describe(&self) -> String {
        format!("in-process replica set {}", self.name)
    }

    fn members(&self) -> usize {
        self.members.len()
    }
}

/// The client's `$readPreference` when it accepts a secondary's answer: the router's commands
/// for the shards carry it on, and a replicated shard serves them from the members it names.
pub fn secondary_ok(cmd: &Document) -> Option<Bson> {
    let preference = cmd.get("$readPreference")?;
    let mode = preference.as_document()?.get_str("mode").ok()?;
    (mode != "primary").then(|| preference.clone())
}

/// How a replicated shard's client reaches its members: the one command path both kinds share
/// ([`route`]).
trait Routes {
    fn pins(&self) -> &Pins;

    /// `cmd` on the member at `position`, as a read on it (refused: the transport's error).
    async fn on_member(
        &self,
        position: usize,
        db: &str,
        cmd: Document,
    ) -> Result<Body, TransportError>;

    /// A read with a `$readPreference` other than `primary` (see the module header).
    async fn read(&self, mode: ReadMode, db: &str, cmd: Document) -> Result<Body, TransportError>;

    /// The command on the primary, as every command but reads elsewhere.
    async fn on_primary(&self, db: &str, cmd: Document) -> Result<Body, TransportError>;
}

/// A command for a replicated shard: a pinned cursor's to its member, a read that accepts
/// secondaries to the members its mode names, anything else to the primary.
async fn route<S: Routes>(set: &S, db: &str, cmd: Document) -> Result<Body, TransportError> {
    if let Some(pinned) = set.pins().route(&cmd) {
        let reply = set.on_member(pinned.member, db, cmd).await;
        set.pins().answered(&pinned, &reply);
        return reply;
    }
    match ReadMode::of(&cmd) {
        ReadMode::Primary => set.on_primary(db, cmd).await,
        mode => set.read(mode, db, cmd).await,
    }
}

/// A read's `$readPreference` mode, as the command the router forwards carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Primary,
    PrimaryPreferred,
    Secondary,
    SecondaryPreferred,
    Nearest,
}

impl ReadMode {
    /// The mode `cmd`'s `$readPreference` names (`primary` when it names none).
    pub fn of(cmd: &Document) -> ReadMode {
        let mode = cmd
            .get_document("$readPreference")
            .ok()
            .and_then(|p| p.get_str("mode").ok());
        match mode {
            Some("primaryPreferred") => ReadMode::PrimaryPreferred,
            Some("secondary") => ReadMode::Secondary,
            Some("secondaryPreferred") => ReadMode::SecondaryPreferred,
            Some("nearest") => ReadMode::Nearest,
            _ => ReadMode::Primary,
        }
    }

    /// The members a read of this mode tries, in order: the primary (when known) and the
    /// members serving as secondaries, these starting at `turn` (reads spread over them).
    /// Every member is equally near here, so `nearest` spreads over all of them.
    pub fn candidates(
        self,
        primary: Option<usize>,
        secondaries: &[usize],
        turn: usize,
    ) -> Vec<usize> {
        let mut others: Vec<usize> = secondaries
            .iter()
            .copied()
            .filter(|&s| Some(s) != primary)
            .collect();
        if !others.is_empty() {
            let at = turn % others.len();
            others.rotate_left(at);
        }
        let primary: Vec<usize> = primary.into_iter().collect();
        match self {
            ReadMode::Primary => primary,
            ReadMode::PrimaryPreferred => [primary, others].concat(),
            ReadMode::Secondary => others,
            ReadMode::SecondaryPreferred => [others, primary].concat(),
            ReadMode::Nearest => {
                let mut all = [primary, others].concat();
                if !all.is_empty() {
                    let at = turn % all.len();
                    all.rotate_left(at);
                }
                all
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            ReadMode::Primary => "primary",
            ReadMode::PrimaryPreferred => "primaryPreferred",
            ReadMode::Secondary => "secondary",
            ReadMode::SecondaryPreferred => "secondaryPreferred",
            ReadMode::Nearest => "nearest",
        }
    }
}

/// Sends the read `cmd` to the members of `order` in turn, through `on_member`, until one
/// serves it, and pins the cursor it opens there; when none does, the read was not sent
/// ([`unsatisfied`]).
async fn read_in_turn<F, Fut>(
    mode: ReadMode,
    set: &str,
    order: Vec<usize>,
    pins: &Pins,
    mut cmd: Document,
    on_member: F,
) -> Result<Body, TransportError>
where
    F: Fn(usize, Document) -> Fut,
    Fut: std::future::Future<Output = Result<Body, TransportError>>,
{
    let mut last = None;
    for position in order {
        match on_member(position, cmd).await {
            Ok(reply) => {
                pins.opened(position, &reply);
                return Ok(reply);
            }
            Err(e) => {
                let (error, back) = e.into_parts();
                last = Some(error);
                cmd = back;
            }
        }
    }
    Err(TransportError::Unreachable {
        error: unsatisfied(mode, set, last),
        cmd,
    })
}

/// The error of a read no member could serve: 133 `FailedToSatisfyReadPreference`, with the
/// last member's reason.
fn unsatisfied(mode: ReadMode, set: &str, last: Option<MongoError>) -> MongoError {
    let why = last.map_or_else(
        || "no member serves it now".to_string(),
        |e| format!("the last member tried said: {}", e.errmsg),
    );
    MongoError::new(
        ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
        format!(
            "could not find a member of replica set {set} for readPreference {}: {why}",
            mode.name()
        ),
    )
}

/// A member's refusal of a command it did not run because of its role (10107, 13435, 13436).
fn refusal(reply: &Body) -> Option<i32> {
    reply_error_code(reply).filter(|c| NOT_PRIMARY_UNRUN.contains(c))
}

fn reply_error_code(reply: &Body) -> Option<i32> {
    match reply {
        Body::Raw(raw) => reply_code(raw),
        Body::Document(d) => MongoError::from_reply(d).map(|e| e.code),
        Body::Cursor(_) => None,
    }
}

/// The cursor a reply leaves open (its `cursor.id`, when not 0).
fn open_cursor(reply: &Body) -> Option<i64> {
    let id = match reply {
        Body::Cursor(c) => Some(c.id),
        Body::Raw(raw) => raw
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_i64("id").ok()),
        Body::Document(d) => d
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_i64("id").ok()),
    };
    id.filter(|&id| id != 0)
}

/// The most cursors kept pinned to the members that opened them; past it the oldest pins go
/// (a getMore of such a cursor reaches the primary and finds no cursor: 43, as after a
/// failover).
const MAX_PINS: usize = 65_536;

/// Which member holds each cursor opened by a read away from the primary (see the module
/// header). Bounded by [`MAX_PINS`].
#[derive(Default)]
struct Pins {
    inner: Mutex<PinsInner>,
}

#[derive(Default)]
struct PinsInner {
    member: HashMap<i64, usize>,
    /// Pinned ids, oldest first (some may be unpinned already).
    order: VecDeque<i64>,
}

/// A command for a pinned cursor: the member holding it.
struct Pinned {
    member: usize,
    /// The cursors the command names (a getMore's one, or killCursors' list).
    cursors: Vec<i64>,
    /// It ends them (`killCursors`).
    kills: bool,
}

impl Pins {
    fn lock(&self) -> std::sync::MutexGuard<'_, PinsInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A read on `member` answered `reply`: the cursor it opened stays there.
    fn opened(&self, member: usize, reply: &Body) {
        let Some(id) = open_cursor(reply) else { return };
        let mut pins = self.lock();
        pins.member.insert(id, member);
        pins.order.push_back(id);
        if pins.order.len() > 2 * pins.member.len() + 64 {
            // Mostly cursors unpinned since: drop them, so only live pins are ever evicted.
            let PinsInner { member, order } = &mut *pins;
            order.retain(|id| member.contains_key(id));
        }
        while pins.order.len() > MAX_PINS {
            if let Some(old) = pins.order.pop_front() {
                pins.member.remove(&old);
            }
        }
    }

    /// Where `cmd` goes when it is a `getMore` or `killCursors` of a pinned cursor.
    fn route(&self, cmd: &Document) -> Option<Pinned> {
        let (cursors, kills) = match cmd.keys().next().map(String::as_str) {
            Some("getMore") => (vec![cmd.get_i64("getMore").ok()?], false),
            Some("killCursors") => (
                cmd.get_array("cursors")
                    .ok()?
                    .iter()
                    .filter_map(Bson::as_i64)
                    .collect(),
                true,
            ),
            _ => return None,
        };
        let pins = self.lock();
        let member = cursors.iter().find_map(|id| pins.member.get(id).copied())?;
        Some(Pinned {
            member,
            cursors,
            kills,
        })
    }

    /// The pinned command got `reply`: cursors it killed, exhausted or lost are unpinned.
    fn answered(&self, pinned: &Pinned, reply: &Result<Body, TransportError>) {
        let ended = pinned.kills
            || match reply {
                Ok(body) => reply_error_code(body).is_some() || open_cursor(body).is_none(),
                Err(_) => true,
            };
        if ended {
            let mut pins = self.lock();
            for id in &pinned.cursors {
                pins.member.remove(id);
            }
        }
    }
}

/// A member's reply as the transport takes it: an error that says the member is not (or no
/// longer) the primary becomes the [`TransportError`] that says whether it may have run.
// The error is what `ShardClient::command` returns, the command handed back whole.
#[allow(clippy::result_large_err)]
fn judge(reply: Body, cmd: Document) -> Result<Body, TransportError> {
    let code = match &reply {
        Body::Raw(raw) => reply_code(raw),
        Body::Document(d) => MongoError::from_reply(d).map(|e| e.code),
        Body::Cursor(_) => None,
    };
    match code {
        Some(code) if NOT_PRIMARY_UNRUN.contains(&code) => Err(TransportError::Unreachable {
            error: member_error(reply),
            cmd,
        }),
        Some(code) if NOT_PRIMARY_MAYBE_RUN.contains(&code) => Err(TransportError::Lost {
            error: member_error(reply),
            cmd,
        }),
        _ => Ok(reply),
    }
}

/// A member's error reply as the error a client sees (its code, message and labels).
fn member_error(reply: Body) -> MongoError {
    match reply.into_document() {
        Ok(d) => MongoError::from_reply(&d)
            .unwrap_or_else(|| MongoError::internal("a member's error reply without an error")),
        Err(e) => e,
    }
}

#[cfg(test)]
// The replies the tests hand the pins are the transport's results, whose error is large.
#[allow(clippy::result_large_err)]
mod tests {
    use bson::doc;

    use super::*;

    #[test]
    fn each_mode_tries_the_members_it_names_in_its_order() {
        let (primary, secondaries) = (Some(0), [1, 2]);
        let order = |mode: ReadMode, turn| mode.candidates(primary, &secondaries, turn);
        assert_eq!(order(ReadMode::Primary, 0), vec![0]);
        assert_eq!(order(ReadMode::Secondary, 0), vec![1, 2]);
        // Reads spread over the secondaries, turn by turn.
        assert_eq!(order(ReadMode::Secondary, 1), vec![2, 1]);
        assert_eq!(order(ReadMode::SecondaryPreferred, 1), vec![2, 1, 0]);
        assert_eq!(order(ReadMode::PrimaryPreferred, 0), vec![0, 1, 2]);
        assert_eq!(order(ReadMode::Nearest, 2), vec![2, 0, 1]);
        // No primary known, or none serving reads.
        assert_eq!(
            ReadMode::PrimaryPreferred.candidates(None, &[2], 0),
            vec![2]
        );
        assert_eq!(
            ReadMode::Secondary.candidates(Some(0), &[], 0),
            Vec::<usize>::new()
        );
        // A member that is the primary now is not taken for a secondary.
        assert_eq!(ReadMode::Secondary.candidates(Some(1), &[1, 2], 0), vec![2]);
    }

    #[test]
    fn the_mode_is_the_read_preferences_and_primary_without_one() {
        let with = |mode: &str| doc! {"find": "c", "$readPreference": {"mode": mode}};
        assert_eq!(ReadMode::of(&doc! {"find": "c"}), ReadMode::Primary);
        assert_eq!(ReadMode::of(&with("nearest")), ReadMode::Nearest);
        assert_eq!(ReadMode::of(&with("bogus")), ReadMode::Primary);
        assert_eq!(secondary_ok(&with("primary")), None);
        assert!(secondary_ok(&with("secondaryPreferred")).is_some());
    }

    #[test]
    fn a_cursor_stays_on_its_member_until_exhausted_killed_or_lost() {
        let pins = Pins::default();
        let open =
            |id: i64| Body::Document(doc! {"cursor": {"id": id, "firstBatch": []}, "ok": 1.0});
        pins.opened(2, &open(7));
        pins.opened(1, &open(0));
        let get_more = |id: i64| doc! {"getMore": id, "collection": "c"};
        let pinned = pins.route(&get_more(7)).expect("pinned");
        assert_eq!(pinned.member, 2);
        assert!(
            pins.route(&get_more(8)).is_none(),
            "not a cursor of a secondary"
        );
        assert!(pins.route(&doc! {"find": "c"}).is_none());
        // A batch that leaves it open keeps it there; the last one unpins it.
        let more = |id: i64| {
            Ok(Body::Document(
                doc! {"cursor": {"id": id, "nextBatch": []}, "ok": 1.0},
            ))
        };
        pins.answered(&pinned, &more(7));
        assert!(pins.route(&get_more(7)).is_some());
        pins.answered(&pinned, &more(0));
        assert!(pins.route(&get_more(7)).is_none());
        // killCursors goes to the member and unpins.
        pins.opened(1, &open(9));
        let kill = doc! {"killCursors": "c", "cursors": [9_i64]};
        let pinned = pins.route(&kill).expect("pinned");
        assert_eq!(pinned.member, 1);
        pins.answered(&pinned, &Ok(Body::Document(doc! {"ok": 1.0})));
        assert!(pins.route(&kill).is_none());
        // An error (the member lost the cursor) unpins too.
        pins.opened(1, &open(11));
        let pinned = pins.route(&get_more(11)).expect("pinned");
        let lost = Body::Document(doc! {"ok": 0.0, "code": 43, "errmsg": "cursor not found"});
        pins.answered(&pinned, &Ok(lost));
        assert!(pins.route(&get_more(11)).is_none());
    }

    #[test]
    fn pins_are_bounded_and_evict_only_live_ones() {
        let pins = Pins::default();
        let open =
            |id: i64| Body::Document(doc! {"cursor": {"id": id, "firstBatch": []}, "ok": 1.0});
        let done = Ok(Body::Document(
            doc! {"cursor": {"id": 0_i64, "nextBatch": []}, "ok": 1.0},
        ));
        pins.opened(1, &open(-1));
        for id in 1..=(3 * MAX_PINS as i64) {
            pins.opened(1, &open(id));
            let pinned = pins.route(&doc! {"getMore": id}).expect("pinned");
            pins.answered(&pinned, &done);
        }
        assert!(
            pins.route(&doc! {"getMore": -1_i64}).is_some(),
            "the long-lived pin stays"
        );
        let inner = pins.lock();
        assert!(inner.order.len() <= MAX_PINS, "{}", inner.order.len());
        assert_eq!(inner.member.len(), 1);
    }
}
