//! The two-phase commit coordinator of a transaction that spans shards. It runs on a
//! participant shard, as MongoDB's does, not on the router: the router hands it the
//! participants (`coordinateCommitTransaction`), and from then on the outcome is the shard's.
//!
//! 1. The participant list is made durable (a record in `Table::Transactions`, key `c` ++
//!    session), so a coordinator that restarts knows whom to tell.
//! 2. Every participant prepares (`prepareTransaction`) and answers its prepare timestamp.
//! 3. The decision, commit at the highest prepare timestamp or abort if any participant could
//!    not prepare, is made durable in the record. This is the commit point.
//! 4. Every participant is told (`commitTransaction` with `commitTimestamp`, or
//!    `abortTransaction`), again until each has answered; then the record goes. The router
//!    hears the outcome after [`DELIVERY_PATIENCE`] at most; delivery goes on in the
//!    background, with backoff, until every participant has the decision (a prepared
//!    participant holds its keys and every change stream of the cluster until then).
//!
//! Every message to a participant has a deadline ([`PEER_REPLY_TIMEOUT`]): a participant that
//! does not answer a prepare in time votes abort, one that does not answer a decision is told
//! again.
//!
//! Recovery: at startup a record without a decision is decided abort (no participant can have
//! committed), and every recorded decision is delivered again, in the background, until each
//! participant has it. Participants keep a prepared transaction (and its locks and hold on the
//! high-water mark) across their own restarts until told, so a `kill -9` of the coordinator or
//! of any participant between prepare and commit resolves the same way everywhere.
//!
//! Asking: a participant also asks for the decision itself. The prepare names the coordinator
//! (`coordinator: {shardId, host}`, kept in the participant's durable record); a transaction
//! still prepared after `askCoordinatorAfterSecs` (30) is asked about
//! (`coordinateCommitTransaction` with `fromParticipant: true`), and a decision answered is
//! applied as if delivered. Asking never decides: a coordinator without a decision answers
//! so, and the participant waits.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use super::{TxnArgs, lock, no_such_transaction, storage_error};
use crate::Shard;
use crate::storage::{KeyRange, Scan, Table};
use crate::writer::{WriteCtx, WriteFn, WriteOutput};

/// Storage key prefix of a coordinator's record in [`Table::Transactions`].
const COORDINATOR_PREFIX: &[u8] = b"c";

/// How long a coordinator keeps delivering its decision before it answers the router anyway
/// (the decision is durable; recovery delivers the rest).
const DELIVERY_PATIENCE: Duration = Duration::from_secs(30);

/// How long a participant has to answer one message.
pub const PEER_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest pause between two rounds of background delivery.
const REDELIVERY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A participant: its name, and its address when it runs in another process.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub name: String,
    pub host: Option<String>,
}

impl Peer {
    pub(crate) fn to_document(&self) -> Document {
        let mut d = doc! {"shardId": &self.name};
        if let Some(h) = &self.host {
            d.insert("host", h);
        }
        d
    }

    pub(crate) fn from_document(d: &Document) -> Option<Peer> {
        Some(Peer {
            name: d.get_str("shardId").ok()?.to_string(),
            host: d.get_str("host").ok().map(str::to_string),
        })
    }
}

type Reply<'a> = Pin<Box<dyn Future<Output = Result<Document, MongoError>> + Send + 'a>>;

/// Finds a replica set's primary shard in this process.
pub type PrimaryOf = Arc<dyn Fn() -> Option<Arc<Shard>> + Send + Sync>;

/// How a shard reaches the other participants: shards in this process by name, others over
/// TCP at their host, a replicated one (`NAME/h1:p1,h2:p2,...`) at its primary.
#[derive(Default)]
pub struct Peers {
    local: Mutex<HashMap<String, Weak<Shard>>>,
    /// Replicated participants in this process: their current primary's shard, if any.
    local_sets: Mutex<HashMap<String, PrimaryOf>>,
    remote: Mutex<HashMap<String, Arc<wire::Client>>>,
    sets: Mutex<HashMap<String, Arc<SetPeer>>>,
    /// TLS to remote peers, when the cluster speaks it.
    tls: Mutex<Option<wire::tls::ClientTls>>,
    /// The cluster's key, when the peers want a key file login.
    key: Mutex<Option<Arc<wire::keyfile::KeyFile>>>,
}

impl Peers {
    /// Reaches remote peers over TLS from now on.
    pub fn use_tls(&self, tls: wire::tls::ClientTls) {
        *lock(&self.tls) = Some(tls);
    }

    /// Logs in to remote peers with the cluster's key from now on.
    pub fn use_key(&self, key: Arc<wire::keyfile::KeyFile>) {
        *lock(&self.key) = Some(key);
    }

    /// Makes the replica set `name` in this process reachable at its primary, which `primary`
    /// finds (`None` while it has none).
    pub fn register_set(&self, name: &str, primary: PrimaryOf) {
        lock(&self.local_sets).insert(name.to_string(), primary);
    }

    /// Makes `shard` reachable by `name` from this process.
    pub fn register(&self, name: &str, shard: &Arc<Shard>) {
        lock(&self.local).insert(name.to_string(), Arc::downgrade(shard));
    }

    /// Runs `cmd` on `admin` at `peer`; an `ok: 0` reply is an `Err`, and so is no reply
    /// within [`PEER_REPLY_TIMEOUT`] (`NetworkTimeout`).
    pub fn command<'a>(&'a self, peer: &'a Peer, cmd: Document) -> Reply<'a> {
        Box::pin(async move {
            let name = cmd.keys().next().cloned().unwrap_or_default();
            match tokio::time::timeout(PEER_REPLY_TIMEOUT, self.command_once(peer, cmd)).await {
                Ok(reply) => reply,
                Err(_) => Err(MongoError::new(
                    ErrorCode::NETWORK_TIMEOUT,
                    format!(
                        "participant {} did not answer {name} within {} s",
                        peer.name,
                        PEER_REPLY_TIMEOUT.as_secs()
                    ),
                )),
            }
        })
    }

    fn command_once<'a>(&'a self, peer: &'a Peer, mut cmd: Document) -> Reply<'a> {
        Box::pin(async move {
            let set = lock(&self.local_sets).get(&peer.name).cloned();
            if let Some(primary) = set {
                return local_set_command(&primary, cmd).await;
            }
            let local = lock(&self.local).get(&peer.name).and_then(Weak::upgrade);
            let reply = match local {
                Some(shard) => {
                    cmd.insert("$db", "admin");
                    shard.run_command(cmd).await
                }
                None => {
                    let Some(host) = &peer.host else {
                        return Err(MongoError::new(
                            ErrorCode::SHARD_NOT_FOUND,
                            format!("no address for participant {}", peer.name),
                        ));
                    };
                    if let Some(spec) = wire::replset::SetSpec::parse(host) {
                        let set = lock(&self.sets)
                            .entry(host.clone())
                            .or_insert_with(|| {
                                Arc::new(SetPeer::start(
                                    spec,
                                    lock(&self.tls).clone(),
                                    lock(&self.key).clone(),
                                ))
                            })
                            .clone();
                        return set.command(&cmd).await;
                    }
                    let client = lock(&self.remote)
                        .entry(host.clone())
                        .or_insert_with(|| {
                            let tls = lock(&self.tls).clone();
                            let key = lock(&self.key).clone();
                            Arc::new(wire::Client::with_tls(host.clone(), tls).with_key(key))
                        })
                        .clone();
                    client
                        .command("admin", &cmd)
                        .await
                        .map_err(|e| e.to_mongo_error())?
                }
            };
            match MongoError::from_reply(&reply) {
                Some(e) => Err(e),
                None => Ok(reply),
            }
        })
    }
}

/// Runs `cmd` on `admin` at the primary `primary` finds, following elections (the caller's
/// deadline bounds the whole).
async fn local_set_command(primary: &PrimaryOf, mut cmd: Document) -> Result<Document, MongoError> {
    const PAUSE: Duration = Duration::from_millis(20);
    cmd.insert("$db", "admin");
    loop {
        let Some(shard) = primary() else {
            tokio::time::sleep(PAUSE).await;
            continue;
        };
        let reply = shard.run_command(cmd.clone()).await;
        match MongoError::from_reply(&reply) {
            None => return Ok(reply),
            Some(e) if wire::replset::NOT_PRIMARY_UNRUN.contains(&e.code) => {
                tokio::time::sleep(PAUSE).await;
            }
            Some(e) => return Err(e),
        }
    }
}

/// A participant that is a replica set: its members, and which of them is primary.
struct SetPeer {
    monitor: Arc<wire::replset::SetMonitor>,
    members: wire::replset::PerMember<wire::Client>,
}

impl SetPeer {
    fn start(
        spec: wire::replset::SetSpec,
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> SetPeer {
        let monitor = wire::replset::SetMonitor::start(spec, tls.clone(), key.clone());
        let members = wire::replset::PerMember::new(move |h: &str| {
            wire::Client::with_tls(h.to_string(), tls.clone()).with_key(key.clone())
        });
        SetPeer { monitor, members }
    }

    /// Runs `cmd` on `admin` at the set's primary, following elections: a member that is not
    /// the primary refuses before running anything, so the command goes to the next one (the
    /// caller's deadline bounds the whole).
    async fn command(&self, cmd: &Document) -> Result<Document, MongoError> {
        const PAUSE: Duration = Duration::from_millis(100);
        loop {
            let Some(primary) = self.monitor.wait_primary(PEER_REPLY_TIMEOUT).await else {
                return Err(MongoError::new(
                    ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
                    format!("no primary for replica set {}", self.monitor.spec()),
                ));
            };
            let Some(member) = self.members.get(&self.monitor, primary) else {
                return Err(MongoError::internal(format!("no member {primary}")));
            };
            let reply = match member.command("admin", cmd).await {
                Ok(reply) => reply,
                Err(e) if e.is_unsent() => {
                    self.monitor.suspect(primary);
                    tokio::time::sleep(PAUSE).await;
                    continue;
                }
                Err(e) => {
                    self.monitor.suspect(primary);
                    return Err(e.to_mongo_error());
                }
            };
            match MongoError::from_reply(&reply) {
                None => return Ok(reply),
                Some(e) if wire::replset::NOT_PRIMARY_UNRUN.contains(&e.code) => {
                    self.monitor.suspect(primary);
                    tokio::time::sleep(PAUSE).await;
                }
                Some(e) => return Err(e),
            }
        }
    }
}

/// Runs `cmd` at `peer` as any message between shards goes: it carries this shard's cluster
/// time, and the reply's moves this shard's clock. So the coordinator's answer to the router
/// is stamped past every participant's commit entry, and the client's next write, which
/// carries that time, comes after all of them in every change stream (a participant's clock
/// may be ahead of the coordinator's: its commit entry's time is its own).
pub(crate) async fn exchange(
    shard: &Shard,
    peer: &Peer,
    mut cmd: Document,
) -> Result<Document, MongoError> {
    cmd.insert(
        "$clusterTime",
        crate::cluster_time_doc(shard.state().cluster_time()),
    );
    let reply = shard.peers().command(peer, cmd).await;
    if let Ok(reply) = &reply
        && let Ok(t) = reply
            .get_document("$clusterTime")
            .and_then(|c| c.get_timestamp("clusterTime"))
    {
        shard.state().observe(ClusterTime::from(t));
    }
    reply
}

/// A coordinator's decision.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decision {
    Commit(ClusterTime),
    Abort,
}

/// The durable state of one coordinated transaction.
#[derive(Debug, Clone)]
struct Record {
    lsid: Document,
    txn_number: i64,
    participants: Vec<Peer>,
    decision: Option<Decision>,
    /// The `commitTransaction`'s commit metadata, delivered with the decision so that each
    /// participant's commit entry records it.
    commit_metadata: Option<Document>,
}

impl Record {
    fn encode(&self) -> Result<Vec<u8>, crate::storage::StorageError> {
        let participants: Vec<Bson> = self
            .participants
            .iter()
            .map(|p| Bson::Document(p.to_document()))
            .collect();
        let mut d = doc! {
            "lsid": self.lsid.clone(),
            "txnNumber": self.txn_number,
            "participants": participants,
        };
        match self.decision {
            Some(Decision::Commit(ts)) => d.insert("decision", doc! {"commit": ts.timestamp()}),
            Some(Decision::Abort) => d.insert("decision", "abort"),
            None => None,
        };
        if let Some(m) = &self.commit_metadata {
            d.insert(crate::writer::COMMIT_METADATA_FIELD, m.clone());
        }
        let mut buf = Vec::new();
        d.to_writer(&mut buf).map_err(|e| {
            crate::storage::StorageError::Engine(format!("a coordinator record: {e}"))
        })?;
        Ok(buf)
    }

    fn decode(bytes: &[u8]) -> Option<Record> {
        let d = Document::from_reader(bytes).ok()?;
        let participants = d
            .get_array("participants")
            .ok()?
            .iter()
            .filter_map(|p| p.as_document().and_then(Peer::from_document))
            .collect();
        let decision = match d.get("decision") {
            Some(Bson::String(s)) if s == "abort" => Some(Decision::Abort),
            Some(Bson::Document(c)) => Some(Decision::Commit(ClusterTime::from(
                c.get_timestamp("commit").ok()?,
            ))),
            _ => None,
        };
        Some(Record {
            lsid: d.get_document("lsid").ok()?.clone(),
            txn_number: d.get_i64("txnNumber").ok()?,
            participants,
            decision,
            commit_metadata: d
                .get_document(crate::writer::COMMIT_METADATA_FIELD)
                .ok()
                .cloned(),
        })
    }
}

fn record_key(session: &[u8]) -> Vec<u8> {
    let mut k = COORDINATOR_PREFIX.to_vec();
    k.extend_from_slice(session);
    k
}

/// A writer job that stores (or, for `None`, removes) the coordinator's record.
fn save_job(session: Vec<u8>, record: Option<Record>) -> WriteFn {
    Box::new(move |w: &mut WriteCtx<'_>| {
        let key = record_key(&session);
        match record {
            Some(r) => w.txn_mut().put(Table::Transactions, &key, &r.encode()?)?,
            None => {
                w.txn_mut().delete(Table::Transactions, &key)?;
            }
        }
        Ok(WriteOutput {
            reply: doc! {"ok": 1.0},
            op_time: None,
        })
    })
}

/// The session fields every message to a participant carries.
fn session_command(name: &str, r: &Record) -> Document {
    doc! {
        name: 1,
        "lsid": r.lsid.clone(),
        "txnNumber": r.txn_number,
        "autocommit": false,
    }
}

/// `coordinateCommitTransaction {participants: [{shardId, host}]}`: runs the two-phase
/// commit and answers its outcome (`NoSuchTransaction` when it aborted).
pub async fn coordinate(
    shard: &Shard,
    args: &TxnArgs,
    cmd: &Document,
) -> Result<Document, MongoError> {
    let participants: Vec<Peer> = cmd
        .get_array("participants")
        .map_err(|_| MongoError::failed_to_parse("coordinateCommitTransaction needs participants"))?
        .iter()
        .map(|p| {
            p.as_document()
                .and_then(Peer::from_document)
                .ok_or_else(|| MongoError::failed_to_parse("a participant is {shardId, host}"))
        })
        .collect::<Result<_, _>>()?;
    if participants.is_empty() {
        if cmd.get_bool("fromParticipant").unwrap_or(false) {
            return decision_for_participant(shard, args);
        }
        return recover_outcome(shard, args).await;
    }
    // A retried coordinate: deliver and answer the decision made. One not made yet is being
    // made, by the coordinate still running here or by the recovery of a record left from
    // before a restart (which decides abort): wait for it. Starting over would let two
    // coordinators decide differently, and commit the transaction on some shards only.
    if let Some(existing) = load(shard, &args.key)?
        && existing.txn_number == args.txn_number
    {
        let Some(decision) = existing.decision else {
            return recover_outcome(shard, args).await;
        };
        deliver(shard, &args.key, existing, decision).await;
        return answer(args, decision);
    }
    // A retried coordinate after the decision was delivered everywhere (the record is gone):
    // this shard, a participant too, knows the outcome.
    if let Some(committed) = shard.transactions().outcome(shard, args) {
        return answer(
            args,
            if committed {
                Decision::Commit(ClusterTime::ZERO)
            } else {
                Decision::Abort
            },
        );
    }
    let mut record = Record {
        lsid: args.lsid.clone(),
        txn_number: args.txn_number,
        participants,
        decision: None,
        commit_metadata: args.commit_metadata.clone(),
    };
    shard
        .writer()
        .submit(save_job(args.key.clone(), Some(record.clone())))
        .await?;
    let mut prepare = session_command("prepareTransaction", &record);
    // Whom a participant asks when the decision is long in coming: this shard, as the
    // participants know it.
    if let Some(me) = record.participants.iter().find(|p| p.name == shard.name()) {
        prepare.insert("coordinator", me.to_document());
    }
    let votes = futures::future::join_all(
        record
            .participants
            .iter()
            .map(|p| exchange(shard, p, prepare.clone())),
    )
    .await;
    let mut decision = Decision::Commit(ClusterTime::ZERO);
    for vote in votes {
        match vote.and_then(|reply| {
            reply
                .get_timestamp("prepareTimestamp")
                .map(ClusterTime::from)
                .map_err(|_| MongoError::internal("a prepare reply without prepareTimestamp"))
        }) {
            Ok(ts) => {
                if let Decision::Commit(max) = decision {
                    decision = Decision::Commit(max.max(ts));
                }
            }
            Err(e) => {
                tracing::info!(error = %e, "a participant could not prepare: aborting");
                decision = Decision::Abort;
            }
        }
    }
    record.decision = Some(decision);
    shard
        .writer()
        .submit(save_job(args.key.clone(), Some(record.clone())))
        .await?;
    while shard.fail_point("hangAfterCommitDecision") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    deliver(shard, &args.key, record, decision).await;
    answer(args, decision)
}

/// `coordinateCommitTransaction {participants: [], fromParticipant: true}`: a prepared
/// participant asks for the decision it has not been told. The answer's `decision` is
/// `{commit: <commitTimestamp>}` or `"abort"` once made, `"pending"` while it is being made,
/// and `"unknown"` when this shard has no record of the transaction (its record is kept until
/// every participant has the decision, so only a lost history gets here). Nothing is decided
/// by asking: the participant applies a decision, and waits otherwise.
fn decision_for_participant(shard: &Shard, args: &TxnArgs) -> Result<Document, MongoError> {
    let mut metadata = None;
    let decision = match load(shard, &args.key)? {
        Some(record) if record.txn_number == args.txn_number => match record.decision {
            Some(Decision::Commit(ts)) => {
                metadata = record.commit_metadata;
                Bson::Document(doc! {"commit": ts.timestamp()})
            }
            Some(Decision::Abort) => Bson::String("abort".into()),
            None => Bson::String("pending".into()),
        },
        _ => Bson::String("unknown".into()),
    };
    let mut reply = doc! {"decision": decision, "ok": 1.0};
    if let Some(m) = metadata {
        reply.insert(crate::writer::COMMIT_METADATA_FIELD, m);
    }
    Ok(reply)
}

/// `coordinateCommitTransaction` without participants: a router that does not know the
/// transaction (another router's, or its own before a restart) recovers its outcome from the
/// shard its `recoveryToken` names, as mongos does. It never starts a commit: a coordinator's
/// decision is delivered and answered (once made); without one, this shard's own part tells, and a part
/// still running is aborted (its router is gone, so it can no longer commit whole), so the
/// answer is `NoSuchTransaction` unless it committed.
async fn recover_outcome(shard: &Shard, args: &TxnArgs) -> Result<Document, MongoError> {
    let deadline = tokio::time::Instant::now() + DELIVERY_PATIENCE;
    loop {
        let settled = match load(shard, &args.key)? {
            Some(record) if record.txn_number == args.txn_number => match record.decision {
                // Made, perhaps not yet delivered: delivered first, as the coordinator's own
                // answer is, so a commit acknowledged here is one the participants have (its
                // client's next write comes after it in every stream), unless a participant
                // stays out of reach for all of DELIVERY_PATIENCE.
                Some(decision) => {
                    deliver(shard, &args.key, record, decision).await;
                    return answer(args, decision);
                }
                None => None,
            },
            _ => shard
                .transactions()
                .settle_for_recovery(shard, args)?
                .map(|committed| {
                    if committed {
                        Decision::Commit(ClusterTime::ZERO)
                    } else {
                        Decision::Abort
                    }
                }),
        };
        if let Some(decision) = settled {
            return answer(args, decision);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(MongoError::new(
                ErrorCode::EXCEEDED_TIME_LIMIT,
                "timed out waiting for the transaction's commit to be decided",
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn answer(args: &TxnArgs, decision: Decision) -> Result<Document, MongoError> {
    match decision {
        Decision::Commit(_) => Ok(doc! {"ok": 1.0}),
        Decision::Abort => Err(no_such_transaction(args)),
    }
}

/// Tells every participant the decision, each until it answers (for up to
/// [`DELIVERY_PATIENCE`]); forgets the record once all have, and hands what is left to
/// [`deliver_in_background`] otherwise.
async fn deliver(shard: &Shard, session: &[u8], record: Record, decision: Decision) {
    if !deliver_for_a_while(shard, session, &record, decision).await
        && let Some(shard) = shard.shared()
    {
        deliver_in_background(&shard, session.to_vec(), record);
    }
}

/// One stretch of delivery (up to [`DELIVERY_PATIENCE`]): whether every participant has the
/// decision now (and the record is gone).
async fn deliver_for_a_while(
    shard: &Shard,
    session: &[u8],
    record: &Record,
    decision: Decision,
) -> bool {
    let message = match decision {
        Decision::Commit(ts) => {
            let mut m = session_command("commitTransaction", record);
            m.insert("commitTimestamp", ts.timestamp());
            if let Some(meta) = &record.commit_metadata {
                m.insert(crate::writer::COMMIT_METADATA_FIELD, meta.clone());
            }
            m
        }
        Decision::Abort => {
            let mut m = session_command("abortTransaction", record);
            m.insert("fromCoordinator", true);
            m
        }
    };
    let deadline = tokio::time::Instant::now() + DELIVERY_PATIENCE;
    let mut pending: Vec<&Peer> = record.participants.iter().collect();
    if shard.fail_point("failCoordinatorDelivery") {
        // As if no participant answered (tests: delivery must go on in the background).
        return false;
    }
    while !pending.is_empty() {
        let replies =
            futures::future::join_all(pending.iter().map(|p| exchange(shard, p, message.clone())))
                .await;
        let mut left = Vec::new();
        for (p, r) in pending.into_iter().zip(replies) {
            match r {
                Ok(_) => {}
                // A participant that has already forgotten an aborted transaction agrees.
                Err(e)
                    if decision == Decision::Abort
                        && e.code == ErrorCode::NO_SUCH_TRANSACTION.code => {}
                Err(e) => {
                    tracing::debug!(participant = %p.name, error = %e, "delivering a decision again");
                    left.push(p);
                }
            }
        }
        pending = left;
        if pending.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pending.is_empty()
        && shard
            .writer()
            .submit(save_job(session.to_vec(), None))
            .await
            .is_ok()
}

/// Delivers `record`'s decision (deciding abort first when it has none: after a restart, no
/// participant can have committed) until every participant has it, with backoff, for as
/// long as the shard runs; a restart's [`recover`] takes over from there.
fn deliver_in_background(shard: &Arc<Shard>, session: Vec<u8>, record: Record) {
    let weak = Arc::downgrade(shard);
    crate::services::spawn(shard, "deliver_decision", async move {
        let mut pause = Duration::from_millis(500);
        loop {
            let Some(shard) = weak.upgrade() else { return };
            let mut record = record.clone();
            let decision = match record.decision {
                Some(d) => Some(d),
                None => {
                    record.decision = Some(Decision::Abort);
                    shard
                        .writer()
                        .submit(save_job(session.clone(), Some(record.clone())))
                        .await
                        .ok()
                        .map(|_| Decision::Abort)
                }
            };
            if let Some(decision) = decision
                && deliver_for_a_while(&shard, &session, &record, decision).await
            {
                return;
            }
            drop(shard);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(REDELIVERY_BACKOFF_MAX);
        }
    });
}

fn load(shard: &Shard, session: &[u8]) -> Result<Option<Record>, MongoError> {
    let read = shard.state().storage.begin_read().map_err(storage_error)?;
    let bytes = read
        .get(Table::Transactions, &record_key(session))
        .map_err(storage_error)?;
    Ok(bytes.as_deref().and_then(Record::decode))
}

/// After a restart: decides abort for every coordinated transaction without a decision, then
/// delivers every decision again, in the background, until the participants have it.
pub fn recover(shard: &Arc<Shard>) -> Result<usize, MongoError> {
    let read = shard.state().storage.begin_read().map_err(storage_error)?;
    let mut found = Vec::new();
    read.scan(
        Table::Transactions,
        &KeyRange::prefix(COORDINATOR_PREFIX),
        false,
        &mut |k, v| {
            if let Some(r) = Record::decode(v) {
                found.push((k[COORDINATOR_PREFIX.len()..].to_vec(), r));
            }
            Scan::Continue
        },
    )
    .map_err(storage_error)?;
    let n = found.len();
    for (session, record) in found {
        deliver_in_background(shard, session, record);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_record_round_trips_with_each_decision() {
        let mut r = Record {
            lsid: doc! {"id": 1},
            txn_number: 7,
            participants: vec![
                Peer {
                    name: "shard0".into(),
                    host: None,
                },
                Peer {
                    name: "shard1".into(),
                    host: Some("127.0.0.1:27019".into()),
                },
            ],
            decision: None,
            commit_metadata: None,
        };
        for d in [
            None,
            Some(Decision::Abort),
            Some(Decision::Commit(ClusterTime::new(5, 2))),
        ] {
            r.decision = d;
            let back = Record::decode(&r.encode().unwrap()).unwrap();
            assert_eq!(back.decision, d);
            assert_eq!(back.participants, r.participants);
            assert_eq!(back.txn_number, 7);
            assert_eq!(back.commit_metadata, None);
        }
        r.commit_metadata = Some(doc! {"user": "ada", "comment": {"why": 1}});
        let back = Record::decode(&r.encode().unwrap()).unwrap();
        assert_eq!(back.commit_metadata, r.commit_metadata);
    }
}
