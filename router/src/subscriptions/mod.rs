//! Subscriptions: named, server-tracked change streams whose consumers the server remembers,
//! with acks, redelivery and dead letters (`createSubscription`, `readSubscription`,
//! `ackSubscription`, `nackSubscription`, `alterSubscription`, `listSubscriptions`,
//! `dropSubscription`).
//!
//! * [`spec`]: a subscription's definition, checked and bounded;
//! * [`delivery`]: one consumer's deliveries, a pure state machine;
//! * [`feed`]: the change stream a consumer reads, from where it stands;
//! * [`state`]: the durable state on the config shard, written in batches, and the leases.
//!
//! Invariants: a consumer is served by one router at a time, the holder of its lease; a read
//! holds the consumer's lock only to pick its messages, never across a wait; an event is
//! delivered as the exact bytes `watch()` returns; a consumer's durable position is its ack
//! floor, so after a restart or a takeover it resumes there and what was delivered but not
//! acked comes again; the number of consumers a router serves is bounded ([`MAX_LIVE`]).

pub mod delivery;
pub mod errors;
pub mod feed;
pub mod pins;
pub mod shared;
pub mod snapshot;
pub mod spec;
pub mod state;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document, RawDocumentBuf, doc};
use resume::token::ResumeToken;
use wire::{ErrorCode, MongoError, Result};

use self::delivery::{Consumer, DeadLetter, Delivery, DeliveryId, Message, Millis, Outcome};
use self::feed::Feed;
use self::spec::{CONSUMERS, DEAD_LETTERS, DEFINITIONS, Definition, STATE_DB, StartAsked};
use self::state::{LEASE, RENEW_BEFORE, Status, Stored, Written, consumer_id};
use crate::kernel::config::ConfigStore;
use crate::kernel::services::Services;
use crate::kernel::transport::{ShardTransport, Shards};
use crate::streams::Streams;

/// The most subscriptions a cluster has.
pub const MAX_SUBSCRIPTIONS: usize = 10_000;

/// The most consumers one router serves at once.
pub const MAX_LIVE: usize = 10_000;

/// The most bytes of events one `readSubscription` reply carries (one event at least).
pub const REPLY_BUDGET: usize = 16 * 1024 * 1024 - 64 * 1024;

/// How often a consumer's moved position (plain acks, deliveries) is written at most: a
/// crash delivers again at most this much of what was acked without `waitDurable`.
pub const POSITION_EVERY: Duration = Duration::from_secs(1);

/// How long an ack with `waitDurable` waits for its batch to be stored.
const DURABLE_PATIENCE: Duration = Duration::from_secs(30);

/// The wall clock, as delivery times are kept.
pub fn wall_clock() -> Millis {
    Millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// The router's subscriptions: the consumers it serves, and what they run on.
pub struct Subscriptions {
    streams: Arc<Streams>,
    transport: Arc<ShardTransport>,
    config: ConfigStore,
    /// This router's name in leases: its address once it listens (a router restarted on the
    /// same address takes its consumers back at once), else a random one.
    router_id: std::sync::OnceLock<String>,
    live: Mutex<HashMap<(String, String), Arc<Live>>>,
    /// The shared logs of the consumers served here: one per stream (subscriptions that read
    /// the same stream share one, [`Definition::stream_key`]).
    shared: Mutex<HashMap<Vec<u8>, Arc<shared::Shared>>>,
    /// Loads (and their lease takeovers) one at a time.
    loading: tokio::sync::Mutex<()>,
    /// Writes to the state collections so far (each one commit on the config shard).
    commits: std::sync::atomic::AtomicU64,
    /// Passes of the state writer that failed (the config shard away or out of space).
    failed_writes: std::sync::atomic::AtomicU64,
    /// Clients to the other routers that hold consumers' leases (commands forwarded there).
    peers: Mutex<HashMap<String, Arc<wire::Client>>>,
}

/// The most other routers a router keeps a client to.
const MAX_PEERS: usize = 64;

/// A consumer this router serves.
pub struct Live {
    pub sub: String,
    pub consumer: String,
    /// The lease generation this router holds.
    pub generation: i64,
    def: Mutex<Arc<Definition>>,
    machine: Mutex<Machine>,
    /// The log shared by the consumers served here that read its stream, and its key.
    shared: Arc<shared::Shared>,
    stream_key: Vec<u8>,
    /// The consumer's own stream, while it is behind the shared log.
    feed: tokio::sync::Mutex<Feed>,
    /// Woken when an ack, a nack or a resume may let a waiting read go on.
    freed: tokio::sync::Notify,
}

struct Machine {
    consumer: Consumer,
    status: Status,
    why: String,
    /// The consumer's own pause (the subscription's is in its definition).
    paused: bool,
    /// Changed since its last write; `urgent`: by more than its position (a reset, a pause, a
    /// status, a redrive), written at the next pass rather than within [`POSITION_EVERY`].
    dirty: bool,
    urgent: bool,
    /// When its state was last written.
    written: Millis,
    dead: Vec<DeadLetter>,
    redriven_done: Vec<ResumeToken>,
    durable: Vec<tokio::sync::oneshot::Sender<()>>,
    last_read: Millis,
    lease_until: Millis,
    /// The time its pin was last pushed to the shards as (`from`).
    pinned: Option<bson::Timestamp>,
    /// The resets of every consumer (`Definition::resets`) it has applied.
    resets: i64,
}

impl Machine {
    /// Something changed: its position and counters (`urgent: false`), or more.
    fn mark(&mut self, urgent: bool) {
        self.dirty = true;
        self.urgent |= urgent;
    }

    /// A cumulative ack: every message out or due at or before `through` is done.
    fn ack_through(&mut self, through: &DeliveryId) -> Outcome {
        let outcome = self.consumer.ack_through(through, wall_clock());
        self.mark(false);
        outcome
    }
}

impl Live {
    fn def(&self) -> Arc<Definition> {
        self.def.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its share of a state pass, if it changed or its lease is due for renewal.
    fn take_changes(self: &Arc<Self>, router: &str, now: Millis) -> Option<Written> {
        let mut m = self.machine();
        let renew = m.lease_until.0.saturating_sub(now.0) < RENEW_BEFORE.as_millis() as u64;
        // A moved position waits up to POSITION_EVERY; what someone waits for does not.
        let waited_for =
            m.urgent || !m.durable.is_empty() || !m.dead.is_empty() || !m.redriven_done.is_empty();
        let due = m.dirty
            && (waited_for
                || now.0.saturating_sub(m.written.0) >= POSITION_EVERY.as_millis() as u64);
        if !due && !renew {
            return None;
        }
        let lease_until = now.after(LEASE);
        let mut fields = state::consumer_fields(&m.consumer, m.status, m.last_read, lease_until);
        fields.insert("paused", m.paused);
        fields.insert("resets", m.resets);
        let update = doc! {
            "q": {"_id": consumer_id(&self.sub, &self.consumer), "owner": router, "gen": self.generation},
            "u": {"$set": fields},
        };
        m.dirty = false;
        m.urgent = false;
        m.written = now;
        let old_lease = std::mem::replace(&mut m.lease_until, lease_until);
        Some(Written {
            old_lease,
            live: self.clone(),
            update,
            dead: std::mem::take(&mut m.dead),
            redriven_done: std::mem::take(&mut m.redriven_done),
            durable: std::mem::take(&mut m.durable),
        })
    }

    /// A pass that failed: its changes wait for the next one.
    fn take_back(
        &self,
        dead: Vec<DeadLetter>,
        done: Vec<ResumeToken>,
        durable: Vec<tokio::sync::oneshot::Sender<()>>,
        lease_until: Millis,
    ) {
        let mut m = self.machine();
        m.mark(true);
        m.lease_until = lease_until;
        m.dead.extend(dead);
        m.redriven_done.extend(done);
        m.durable.extend(durable);
    }

    fn check(&self, m: &Machine) -> Result<()> {
        match m.status {
            Status::Active => Ok(()),
            Status::Expired => Err(errors::expired(&self.sub, &self.consumer)),
            Status::ResetRequired => Err(errors::reset_required(&self.sub, &self.consumer, &m.why)),
        }
    }
}

/// What a read has gathered so far, and its bounds: at most `max` messages and
/// [`REPLY_BUDGET`] bytes (one message at least), by `deadline`.
struct Gathered {
    out: Vec<Delivery>,
    bytes: usize,
    max: usize,
    deadline: Instant,
}

impl Gathered {
    /// How many more messages the reply takes.
    fn room(&self) -> usize {
        self.max - self.out.len()
    }

    /// How many more bytes of events the reply takes.
    fn budget(&self) -> usize {
        REPLY_BUDGET.saturating_sub(self.bytes)
    }

    /// Whether an event of `len` bytes still fits.
    fn fits(&self, len: usize) -> bool {
        self.out.is_empty() || self.bytes + len <= REPLY_BUDGET
    }

    fn push(&mut self, d: Delivery) {
        self.bytes += d.message.size();
        self.out.push(d);
    }

    /// How long the read may wait for new messages now: not at all once it has some, else
    /// until its deadline or the consumer's next timer.
    fn wait(&self, live: &Live, now: Millis) -> Duration {
        if !self.out.is_empty() {
            return Duration::ZERO;
        }
        let until = live.machine().consumer.next_timer();
        let left = self.deadline.saturating_duration_since(Instant::now());
        until.map_or(left, |t| left.min(now.until(t)))
    }
}

/// What `readSubscription` returns.
pub struct Read {
    pub messages: Vec<Delivery>,
    pub caught_up: bool,
    /// What the read's `ackThrough` did (`None`: it had none, or the consumer's state was
    /// away and the ack was not applied).
    pub acked: Option<Outcome>,
}

impl Read {
    /// The reply: `{messages: [{deliveryId, deliveryCount, event, changes?}], caughtUp,
    /// acked?, late?, unknown?, ok: 1}`.
    pub fn reply(self) -> RawDocumentBuf {
        // Sized up front (a reply grown as it is written is copied again and again): per
        // message its event, its id and at most 80 bytes of keys, lengths and count, and each
        // of its changes with up to 8 bytes of key.
        let size: usize = self
            .messages
            .iter()
            .map(|d| {
                d.message.size() + d.message.id_part().len() + 80 + 8 * d.message.changes.len()
            })
            .sum();
        let mut w = wire::raw::Writer::with_capacity(size + 64);
        let (mut index, mut epoch) = (itoa::Buffer::new(), itoa::Buffer::new());
        w.begin_document(None);
        w.begin_array("messages");
        for (i, d) in self.messages.iter().enumerate() {
            // Each event's bytes copied once, straight from the shared message.
            w.begin_document(Some(index.format(i)));
            w.string_of(
                "deliveryId",
                &[epoch.format(d.epoch), ".", d.message.id_part()],
            );
            w.int64("deliveryCount", i64::from(d.count));
            w.document_bytes("event", &d.message.event);
            if !d.message.changes.is_empty() {
                w.begin_array("changes");
                for (j, c) in d.message.changes.iter().enumerate() {
                    w.document_bytes(index.format(j), c);
                }
                w.end();
            }
            w.end();
        }
        w.end();
        w.boolean("caughtUp", self.caught_up);
        if let Some(o) = self.acked {
            w.int64("acked", i64::from(o.applied));
            w.int64("late", i64::from(o.late));
            w.int64("unknown", i64::from(o.unknown));
        }
        w.double("ok", 1.0);
        w.finish()
    }
}

impl Subscriptions {
    pub fn new(streams: Arc<Streams>, transport: Arc<ShardTransport>) -> Arc<Subscriptions> {
        Arc::new(Subscriptions {
            config: ConfigStore::new(transport.clone()),
            streams,
            transport,
            router_id: std::sync::OnceLock::new(),
            live: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            commits: std::sync::atomic::AtomicU64::new(0),
            failed_writes: std::sync::atomic::AtomicU64::new(0),
            peers: Mutex::new(HashMap::new()),
        })
    }

    fn source(&self) -> feed::Source<'_> {
        feed::Source {
            streams: &self.streams,
            config: &self.config,
        }
    }

    /// Names this router in leases (before it serves a consumer).
    pub fn set_router_id(&self, id: String) {
        let _ = self.router_id.set(id);
    }

    pub fn router_id(&self) -> &str {
        self.router_id
            .get_or_init(|| format!("router-{}", uuid::Uuid::new_v4()))
    }

    /// Starts the state writer.
    pub fn start(self: &Arc<Self>, services: &Services) {
        services.start(state::StateWriter {
            subs: self.clone(),
            passes: 0,
            owed: 0,
        });
    }

    /// `serverStatus`'s `metrics.subscriptions`: the consumers served here, the state commits
    /// made so far and the state writes that failed (each tried again).
    pub fn status(&self) -> Document {
        let consumers = self.live.lock().unwrap_or_else(|e| e.into_inner()).len();
        let failed = self
            .failed_writes
            .load(std::sync::atomic::Ordering::Relaxed);
        doc! {
            "consumers": consumers as i64,
            "stateCommits": self.state_commits() as i64,
            "stateWriteFailures": failed as i64,
        }
    }

    pub(super) fn state_write_failed(&self) {
        self.failed_writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn state_commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A client to the router at `addr` (with the cluster's TLS and key).
    pub fn peer(
        &self,
        addr: &str,
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> Arc<wire::Client> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(addr) {
            peers.clear();
        }
        peers
            .entry(addr.to_string())
            .or_insert_with(|| {
                Arc::new(wire::Client::with_tls(addr.to_string(), tls).with_key(key))
            })
            .clone()
    }

    fn all_live(&self) -> Vec<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn cached(&self, sub: &str, consumer: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(sub.to_string(), consumer.to_string()))
            .cloned()
    }

    /// Stops serving a consumer: its stream closed, its waiting acks failed.
    async fn unload(&self, live: &Arc<Live>) {
        let removed = {
            let mut map = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let key = (live.sub.clone(), live.consumer.clone());
            match map.get(&key) {
                Some(l) if Arc::ptr_eq(l, live) => map.remove(&key),
                _ => None,
            }
        };
        if removed.is_some() {
            live.machine().durable.clear();
            live.freed.notify_waiters();
            live.feed.lock().await.close().await;
            // The last consumer served here of its stream takes the shared log along.
            let last = {
                let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                let others = self
                    .all_live()
                    .iter()
                    .any(|l| Arc::ptr_eq(&l.shared, &live.shared));
                match shared.get(&live.stream_key) {
                    Some(log) if !others && Arc::ptr_eq(log, &live.shared) => {
                        shared.remove(&live.stream_key)
                    }
                    _ => None,
                }
            };
            if let Some(log) = last {
                log.close().await;
            }
        }
    }

    async fn definition(&self, sub: &str) -> Result<Definition> {
        let found = self
            .config
            .find_one(STATE_DB, DEFINITIONS, doc! {"_id": sub})
            .await?
            .ok_or_else(|| errors::not_found(sub))?;
        Definition::from_document(&found)
    }

    /// The consumer, served here: loaded from its state under a lease taken over if it lapsed,
    /// or created at the subscription's start (`create`).
    async fn live(&self, db: &str, name: &str, consumer: &str, create: bool) -> Result<Arc<Live>> {
        let sub = spec::sub_id(db, name);
        let now = wall_clock();
        if let Some(live) = self.cached(&sub, consumer) {
            if live.machine().lease_until > now {
                return Ok(live);
            }
            // The config shard has not renewed the lease in time: take it again.
            self.unload(&live).await;
        }
        let _loading = self.loading.lock().await;
        if let Some(live) = self.cached(&sub, consumer) {
            return Ok(live);
        }
        if self.live.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_LIVE {
            return Err(MongoError::new(
                ErrorCode::EXCEEDED_MEMORY_LIMIT,
                format!("this router serves {MAX_LIVE} consumers already"),
            ));
        }
        let def = self.definition(&sub).await?;
        let id = consumer_id(&sub, consumer);
        let found = self
            .config
            .find_one(STATE_DB, CONSUMERS, doc! {"_id": id.clone()})
            .await?;
        let stored = match found {
            Some(d) => Stored::parse(&d)?,
            None if create => {
                let fresh = doc! {
                    "_id": id.clone(), "subscription": &sub, "consumer": consumer,
                    "epoch": 0i64, "floor": Bson::Null, "status": "active",
                    "owner": self.router_id(), "gen": 0i64, "leaseUntil": 0i64,
                    "lastRead": now.0 as i64, "resets": def.resets,
                };
                Stored::parse(
                    &self
                        .config
                        .get_or_insert(STATE_DB, CONSUMERS, fresh)
                        .await?,
                )?
            }
            None => return Err(errors::consumer_not_found(&sub, consumer)),
        };
        if stored.generation == 0 && stored.floor.is_none() {
            // A new consumer: pinned at the start before the subscription's own pin, which
            // holds the start only until its first consumer comes, lets go.
            self.pin_consumer(&def, consumer, &def.start).await?;
            self.unpin(vec![pins::pin_id(&sub, pins::START)]).await?;
        }
        if let Some(owner) = &stored.owner
            && owner != self.router_id()
            && stored.lease_until > now
        {
            return Err(errors::lease_held_at(
                &sub,
                consumer,
                owner,
                stored.lease_until.0 - now.0,
            ));
        }
        let generation = stored.generation + 1;
        let lease_until = now.after(LEASE);
        let took = self
            .config
            .cas(
                STATE_DB,
                CONSUMERS,
                doc! {"_id": id.clone(), "gen": stored.generation},
                doc! {"$set": {"owner": self.router_id(), "gen": generation, "leaseUntil": lease_until.0 as i64}},
            )
            .await?;
        if !took {
            return Err(errors::lease_moved(
                &sub,
                consumer,
                "another router",
                LEASE.as_millis() as u64,
            ));
        }
        let mut c = Consumer::restored(
            def.limits.clone(),
            stored.epoch,
            stored.floor,
            stored.remembered,
            stored.counters,
        );
        c.set_paused(def.paused || stored.paused);
        // Dead letters redriven and not acked yet come again.
        let redriven = self
            .config
            .find(
                STATE_DB,
                DEAD_LETTERS,
                doc! {"_id.s": &sub, "_id.c": consumer, "redriven": true},
            )
            .await?;
        c.redrive(
            redriven.iter().filter_map(dead_letter_message).collect(),
            now,
        );
        let (mut status, mut resets, mut pinned) = (stored.status, stored.resets, None);
        let reset = stored.resets < def.resets;
        if reset {
            // Every consumer was reset while this one was served nowhere: it starts over at
            // the subscription's start, pinned there first.
            self.pin_consumer(&def, consumer, &def.start).await?;
            c.reset(Some(def.start.clone()));
            status = Status::Active;
            resets = def.resets;
            pinned = Some(pins::from_of(&def.start)?);
        }
        let stream_key = def.stream_key();
        let live = Arc::new(Live {
            sub: sub.clone(),
            consumer: consumer.to_string(),
            generation,
            def: Mutex::new(Arc::new(def)),
            machine: Mutex::new(Machine {
                consumer: c,
                status,
                why: "its history was found discontinuous".into(),
                paused: stored.paused,
                dirty: reset,
                urgent: reset,
                written: now,
                dead: Vec::new(),
                redriven_done: Vec::new(),
                durable: Vec::new(),
                last_read: now,
                lease_until,
                pinned,
                resets,
            }),
            shared: self
                .shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(stream_key.clone())
                .or_default()
                .clone(),
            stream_key,
            feed: tokio::sync::Mutex::new(Feed::default()),
            freed: tokio::sync::Notify::new(),
        });
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((sub, consumer.to_string()), live.clone());
        Ok(live)
    }

    /// Starts a consumer served here over after `token`: pinned there first, its window and
    /// dead letters cleared, a new epoch.
    async fn start_over(&self, live: &Live, def: &Definition, token: &ResumeToken) -> Result<()> {
        self.pin_consumer(def, &live.consumer, token).await?;
        let mut feed = live.feed.lock().await;
        feed.restart().await;
        let mut m = live.machine();
        m.consumer.reset(Some(token.clone()));
        m.pinned = Some(pins::from_of(token)?);
        m.status = Status::Active;
        m.dead.clear();
        m.mark(true);
        drop(m);
        drop(feed);
        live.freed.notify_waiters();
        Ok(())
    }

    /// Fails with the owner's address when another router holds the consumer's lease.
    async fn not_held_elsewhere(&self, sub: &str, consumer: &str) -> Result<()> {
        if self.cached(sub, consumer).is_some() {
            return Ok(());
        }
        let found = self
            .config
            .find_one(
                STATE_DB,
                CONSUMERS,
                doc! {"_id": consumer_id(sub, consumer)},
            )
            .await?;
        let Some(stored) = found.as_ref().map(Stored::parse).transpose()? else {
            return Ok(());
        };
        let now = wall_clock();
        match &stored.owner {
            Some(owner) if owner != self.router_id() && stored.lease_until > now => Err(
                errors::lease_held_at(sub, consumer, owner, stored.lease_until.0 - now.0),
            ),
            _ => Ok(()),
        }
    }

    /// `createSubscription`: stores the definition, its start resolved now; creating it again
    /// with the same definition is a no-op.
    pub async fn create(&self, db: &str, cmd: &Document) -> Result<Document> {
        let asked = StartAsked::parse(cmd.get("start"), "start")?;
        // Checked before the start is resolved (a placeholder start meanwhile).
        let probe = Definition::parse(
            db,
            cmd,
            spec::at_time(bson::Timestamp {
                time: 0,
                increment: 1,
            }),
        )?;
        let count = self
            .transport
            .command(
                shard::sharding::ShardId::CONFIG,
                STATE_DB,
                doc! {"count": DEFINITIONS, "limit": MAX_SUBSCRIPTIONS as i64 + 1},
            )
            .await?;
        let existing = self
            .config
            .find_one(STATE_DB, DEFINITIONS, doc! {"_id": probe.id()})
            .await?
            .map(|d| Definition::from_document(&d))
            .transpose()?;
        let count = match count.get("n") {
            Some(Bson::Int32(n)) => *n as usize,
            Some(Bson::Int64(n)) => *n as usize,
            Some(Bson::Double(n)) => *n as usize,
            _ => 0,
        };
        if existing.is_none() && count >= MAX_SUBSCRIPTIONS {
            return Err(MongoError::new(
                ErrorCode::EXCEEDED_MEMORY_LIMIT,
                format!("the cluster has {MAX_SUBSCRIPTIONS} subscriptions already"),
            ));
        }
        let def = match (asked, &existing) {
            // Created already: its start and copy stand (compared below without them).
            (_, Some(found)) => Definition {
                start: found.start.clone(),
                snapshot: found.snapshot,
                resets: found.resets,
                ..probe
            },
            (StartAsked::Snapshot, None) => {
                let snap = self.take_snapshot(&probe).await?;
                Definition {
                    start: spec::at_time(snap.at),
                    snapshot: Some(snap),
                    ..probe
                }
            }
            (asked, None) => Definition {
                start: self.resolve(&probe, asked).await?,
                ..probe
            },
        };
        let stored = self
            .config
            .get_or_insert(STATE_DB, DEFINITIONS, def.to_document())
            .await?;
        let existing = Definition::from_document(&stored)?;
        if let Some(ours) = def.snapshot
            && existing.snapshot.map(|s| s.at) != Some(ours.at)
        {
            // Another router created it first: our copy is not its.
            self.discard_snapshot(&def.id(), Some(ours.at), true)
                .await?;
        }
        // Its consumers-to-be start there: every shard keeps its history from there on.
        self.pin_start(&existing).await?;
        let same_but_start = Definition {
            start: def.start.clone(),
            snapshot: def.snapshot,
            resets: def.resets,
            ..existing.clone()
        } == def;
        if !same_but_start {
            return Err(errors::exists(&def.id()));
        }
        Ok(doc! {"subscription": existing.id(), "start": existing.start.to_document(), "ok": 1.0})
    }

    /// The token a start point resolves to, now.
    async fn resolve(&self, def: &Definition, asked: StartAsked) -> Result<ResumeToken> {
        match asked {
            // A high-water mark handed out by a stream carries this cluster's stamp: a
            // subscription starts from MongoDB's form of it (another cluster's is refused).
            StartAsked::After(token) => match token.unstamp() {
                Some((plain, stamp)) => {
                    let ours = self.streams.lineages.cluster_id().await?;
                    if stamp != ours {
                        return Err(MongoError::bad_value(format!(
                            "the start token comes from another cluster (cluster id {stamp}; \
                             this cluster is {ours})"
                        )));
                    }
                    Ok(plain)
                }
                None => Ok(token),
            },
            StartAsked::At(ts) => Ok(spec::at_time(ts)),
            StartAsked::Now => {
                // The stream opened now says where now is: its first post-batch resume token.
                let opened = self
                    .streams
                    .open(&def.db, &def.aggregate_from(None)?)
                    .await?;
                if let Some(mut cursor) = opened.cursor {
                    cursor.kill().await;
                }
                opened
                    .batch
                    .post_batch_resume_token
                    .ok_or_else(|| MongoError::internal("a stream opened without a resume token"))
            }
            StartAsked::Earliest => Ok(spec::at_time(self.streams.earliest_kept().await?)),
            // A snapshot is taken (`take_snapshot`), not resolved.
            StartAsked::Snapshot => Err(MongoError::internal(
                "a snapshot start reached the start resolver",
            )),
        }
    }

    /// `readSubscription`: first the cumulative ack it carries (`ackThrough`, as
    /// `ackSubscription {through}` would), then due redeliveries, then new messages; waits up
    /// to `wait` for the first one, holding no lock meanwhile.
    pub async fn read(
        &self,
        db: &str,
        name: &str,
        consumer: &str,
        max: usize,
        wait: Duration,
        ack_through: Option<&str>,
    ) -> Result<Read> {
        let ack_through = ack_through.map(parse_id).transpose()?;
        // The config shard away (the consumer's state cannot be loaded, its lease not taken
        // or renewed) is not the reader's error: the read waits and comes back empty, as a
        // read with nothing new does, and the consumer is served again once it is back.
        let away = || Read {
            messages: Vec::new(),
            caught_up: false,
            acked: None,
        };
        let patience = wait.max(Duration::from_secs(1));
        let live = match tokio::time::timeout(patience, self.live(db, name, consumer, true)).await {
            Ok(Ok(live)) => live,
            Ok(Err(e)) if crate::streams::is_resumable(&e) => {
                tracing::debug!(error = %e, %consumer, "subscription state away");
                tokio::time::sleep(wait).await;
                return Ok(away());
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(away()),
        };
        let acked = ack_through.map(|through| {
            let outcome = live.machine().ack_through(&through);
            live.freed.notify_waiters();
            outcome
        });
        // Caught up means: read through everything this router knew of when the read began.
        let head = self.transport.clock().now();
        let mut got = Gathered {
            out: Vec::new(),
            bytes: 0,
            max,
            deadline: Instant::now() + wait,
        };
        let mut caught_up;
        loop {
            let now = wall_clock();
            let room = {
                let mut m = live.machine();
                live.check(&m)?;
                // A read alone changes nothing worth a write (its time goes with the next).
                m.last_read = now;
                let (due, dead) = m.consumer.take_due(now, got.room(), got.budget());
                if !due.is_empty() || !dead.is_empty() {
                    m.mark(false);
                }
                due.into_iter().for_each(|d| got.push(d));
                m.dead.extend(dead);
                m.consumer.room().min(got.room())
            };
            caught_up = false;
            if room > 0 && got.budget() > 0 {
                let def = live.def();
                let read = match self.read_shared(&live, &def, &mut got, now).await {
                    Some(read) => read,
                    None => self.read_own(&live, &def, &mut got, now).await,
                };
                match read {
                    Ok(at_head) => caught_up = at_head,
                    Err(e) if feed::needs_reset(&e) => {
                        let mut m = live.machine();
                        m.status = Status::ResetRequired;
                        m.why = e.errmsg.clone();
                        m.mark(true);
                        drop(m);
                        if got.out.is_empty() {
                            return Err(errors::reset_required(
                                &live.sub,
                                &live.consumer,
                                &e.errmsg,
                            ));
                        }
                    }
                    Err(e) => {
                        // A pause (a shard lost, the config shard away): not the reader's
                        // error. The stream opens again at the next read.
                        tracing::debug!(error = %e, consumer = %live.consumer, "subscription feed paused");
                        if got.out.is_empty() {
                            let left = got.deadline.saturating_duration_since(Instant::now());
                            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
                        }
                    }
                }
            }
            if !got.out.is_empty() || Instant::now() >= got.deadline {
                break;
            }
            if room == 0 {
                // Full (maxInFlight) or paused: wait for an ack, a nack, a timer or the deadline.
                let timer = live.machine().consumer.next_timer();
                let left = got.deadline.saturating_duration_since(Instant::now());
                let wait = timer.map_or(left, |t| left.min(wall_clock().until(t)));
                let freed = live.freed.notified();
                tokio::select! {
                    () = freed => {}
                    () = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
                }
            }
        }
        let mut m = live.machine();
        // A read that waited long is not idle: it counts from its end.
        m.last_read = wall_clock();
        let through = m
            .consumer
            .horizon()
            .and_then(|t| t.decode().ok())
            .is_some_and(|t| t.cluster_time() >= head);
        let caught_up = caught_up && through && got.room() > 0 && !m.consumer.has_due(wall_clock());
        Ok(Read {
            messages: got.out,
            caught_up,
            acked,
        })
    }

    /// New messages from the subscription's shared log, extending it (or waiting for it) when
    /// the consumer has read it all; `None` when the consumer is behind the log (it reads by
    /// itself). `Ok(true)`: the stream had nothing newer.
    async fn read_shared(
        &self,
        live: &Arc<Live>,
        def: &Definition,
        got: &mut Gathered,
        now: Millis,
    ) -> Option<Result<bool>> {
        let position = |live: &Live| {
            live.machine()
                .consumer
                .horizon()
                .cloned()
                .unwrap_or_else(|| def.start.clone())
        };
        if !live.shared.covers(&position(live)) {
            return None;
        }
        // Back on the shared log: its own stream is no longer needed.
        if let Ok(mut own) = live.feed.try_lock()
            && own.is_open()
        {
            own.restart().await;
        }
        let mut extended = false;
        loop {
            let at = position(live);
            let room = live.machine().consumer.room().min(got.room());
            let taken = live.shared.after(&at, room, got.budget());
            if let Some(taken) = &taken {
                let mut m = live.machine();
                for message in &taken.messages {
                    if let Some(d) = m.consumer.offer(message.clone(), now) {
                        got.push(d);
                    }
                }
                if let Some(end) = &taken.end {
                    m.consumer.scanned(end);
                }
                m.mark(false);
            }
            let at_head = taken.as_ref().is_some_and(|t| t.at_head && t.end.is_some());
            let some = taken.as_ref().is_some_and(|t| !t.messages.is_empty());
            if some || extended || room == 0 {
                return Some(Ok(at_head));
            }
            if taken.is_none() && !live.shared.covers(&at) {
                return None;
            }
            let wait = got.wait(live, now);
            let passed = self.passed_by_all(live);
            if let Err(e) = live
                .shared
                .extend(self.source(), def, &at, passed.as_ref(), room.max(64), wait)
                .await
            {
                return Some(Err(e));
            }
            extended = true;
        }
    }

    /// The oldest position among the consumers served here that share `live`'s log.
    fn passed_by_all(&self, live: &Live) -> Option<ResumeToken> {
        self.all_live()
            .into_iter()
            .filter(|l| Arc::ptr_eq(&l.shared, &live.shared))
            .map(|l| l.machine().consumer.horizon().cloned())
            .min()
            .flatten()
    }

    /// New messages from the consumer's own stream (it is behind the shared log).
    async fn read_own(
        &self,
        live: &Arc<Live>,
        def: &Definition,
        got: &mut Gathered,
        now: Millis,
    ) -> Result<bool> {
        let mut feed = live.feed.lock().await;
        Self::offer(live, &mut feed, got, now);
        let room = live.machine().consumer.room().min(got.room());
        if room == 0 || feed.has_lookahead() || got.budget() == 0 {
            return Ok(false);
        }
        let wait = got.wait(live, now);
        let from = live.machine().consumer.horizon().cloned();
        match feed
            .fetch(self.source(), def, from.as_ref(), room, wait)
            .await
        {
            Ok(fetched) => {
                Self::offer(live, &mut feed, got, wall_clock());
                Ok(fetched.at_head && !feed.has_lookahead())
            }
            Err(e) => {
                feed.restart().await;
                Err(e)
            }
        }
    }

    /// Offers the feed's lookahead to the consumer while it has room and the reply has space.
    fn offer(live: &Live, feed: &mut Feed, got: &mut Gathered, now: Millis) {
        let mut m = live.machine();
        while got.room() > 0 && m.consumer.room() > 0 {
            let Some(next) = feed.peek() else { break };
            if !got.fits(next.size()) {
                break;
            }
            let Some(message) = feed.pop() else { break };
            if let Some(d) = m.consumer.offer(message, now) {
                got.push(d);
            }
            m.mark(false);
        }
        if let Some(t) = feed.scanned() {
            m.consumer.scanned(t);
        }
    }

    /// `ackSubscription` (or its `inProgress` extension): the ids named, and with `through`
    /// every message of the window at or before it.
    pub async fn ack(
        &self,
        db: &str,
        name: &str,
        consumer: &str,
        ack: Ack<'_>,
    ) -> Result<Document> {
        let ids = parse_ids(ack.ids)?;
        let through = ack.through.map(parse_id).transpose()?;
        let live = self.live(db, name, consumer, false).await?;
        let now = wall_clock();
        let in_progress = ack.in_progress;
        let (outcome, rx) = {
            let mut m = live.machine();
            let outcome = if in_progress {
                m.consumer.extend(&ids, now)
            } else {
                let (mut o, done) = m.consumer.ack(&ids, now);
                m.redriven_done.extend(done);
                if let Some(through) = &through {
                    let t = m.ack_through(through);
                    o.applied += t.applied;
                    o.late += t.late;
                    o.unknown += t.unknown;
                }
                o
            };
            m.mark(false);
            let rx = ack.wait_durable.then(|| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                m.durable.push(tx);
                rx
            });
            (outcome, rx)
        };
        live.freed.notify_waiters();
        if let Some(rx) = rx {
            wait_stored(rx, &live).await?;
        }
        let mut reply = outcome_reply(outcome, if in_progress { "extended" } else { "acked" });
        reply.insert("ok", 1.0);
        Ok(reply)
    }

    /// `nackSubscription`.
    pub async fn nack(
        &self,
        db: &str,
        name: &str,
        consumer: &str,
        ids: &[String],
        retry: Option<Duration>,
        dead_letter: bool,
    ) -> Result<Document> {
        let ids = parse_ids(ids)?;
        let live = self.live(db, name, consumer, false).await?;
        let outcome = {
            let mut m = live.machine();
            let (o, dead) = m.consumer.nack(&ids, wall_clock(), retry, dead_letter);
            m.dead.extend(dead);
            m.mark(false);
            o
        };
        live.freed.notify_waiters();
        let mut reply = outcome_reply(outcome, "nacked");
        reply.insert("ok", 1.0);
        Ok(reply)
    }

    /// `alterSubscription`: pause, resume, reset, dropConsumer, redrive, or new delivery
    /// settings.
    pub async fn alter(&self, db: &str, name: &str, cmd: &Document) -> Result<Document> {
        let sub = spec::sub_id(db, name);
        let mut def = self.definition(&sub).await?;
        let consumer = match cmd.get("consumer") {
            None => None,
            v => Some(spec::check_name(v, "consumer")?),
        };
        let mut reply = doc! {};
        // New delivery settings, for the subscription.
        let limits = spec::parse_limits(cmd, Some(&def.limits))?;
        let pause = match (cmd.get("pause"), cmd.get("resume")) {
            (Some(Bson::Boolean(p)), None) => Some(*p),
            (None, Some(Bson::Boolean(true))) => Some(false),
            (None, None) => None,
            _ => {
                return Err(MongoError::bad_value(
                    "'pause' and 'resume' take true (pause: false resumes), one of them",
                ));
            }
        };
        if limits != def.limits || (pause.is_some() && consumer.is_none()) {
            def.limits = limits;
            if consumer.is_none()
                && let Some(p) = pause
            {
                def.paused = p;
            }
            self.config
                .cas(
                    STATE_DB,
                    DEFINITIONS,
                    doc! {"_id": &sub},
                    doc! {"$set": def.to_document()},
                )
                .await?;
            self.apply_definition(&def).await;
        }
        if let (Some(p), Some(c)) = (pause, &consumer) {
            let live = self.live(db, name, c, false).await?;
            let mut m = live.machine();
            m.paused = p;
            m.consumer.set_paused(p || def.paused);
            m.mark(true);
            drop(m);
            live.freed.notify_waiters();
        }
        if let Some(reset) = cmd.get("reset") {
            let Bson::Document(reset) = reset else {
                return Err(MongoError::type_mismatch(
                    "'reset' must be a document {to, consumer?}",
                ));
            };
            let to = StartAsked::parse(reset.get("to"), "reset.to")?;
            let target = match reset.get("consumer") {
                None => consumer.clone(),
                v => Some(spec::check_name(v, "reset.consumer")?),
            };
            let token = match (&to, &target) {
                (StartAsked::Snapshot, None) => {
                    // Every consumer starts over from a new copy.
                    let snap = self.take_snapshot(&def).await?;
                    def.snapshot = Some(snap);
                    spec::at_time(snap.at)
                }
                (StartAsked::Snapshot, Some(_)) => match def.snapshot {
                    // One consumer starts over from the subscription's copy.
                    Some(snap) => spec::at_time(snap.at),
                    None => {
                        return Err(MongoError::bad_value(
                            "the subscription has no snapshot: reset every consumer to \
                             \"snapshot\" to take one",
                        ));
                    }
                },
                _ => self.resolve(&def, to).await?,
            };
            let reset = match target {
                Some(c) => {
                    let live = self.live(db, name, &c, true).await?;
                    self.start_over(&live, &def, &token).await?;
                    1
                }
                None => {
                    // Every consumer, and the subscription's start for new ones: each owner
                    // starts its consumers over when it learns of the new count (here at
                    // once, elsewhere within a second), one served nowhere when loaded.
                    // The new start is held (the subscription's own pin) before any
                    // consumer may start there.
                    def.start = token.clone();
                    self.pin_start(&def).await?;
                    let mut set = doc! {"start": token.to_document(), "resets": def.resets + 1};
                    if let Some(snap) = def.snapshot {
                        set.insert("snapshot", snap.to_document());
                    }
                    let took = self
                        .config
                        .cas(
                            STATE_DB,
                            DEFINITIONS,
                            doc! {"_id": &sub, "resets": def.resets},
                            doc! {"$set": set},
                        )
                        .await?;
                    if !took {
                        // The other reset's start is the one to hold.
                        self.pin_start(&self.definition(&sub).await?).await?;
                        return Err(MongoError::new(
                            ErrorCode::WRITE_CONFLICT,
                            "the subscription was reset meanwhile: retry",
                        )
                        .with_label("TransientTransactionError"));
                    }
                    def.resets += 1;
                    // Each consumer's pin moves there too (a consumer served nowhere keeps
                    // it until it is loaded and starts over).
                    let names = self.consumer_names(&sub).await?;
                    let at = pins::from_of(&token)?;
                    let pins = names
                        .iter()
                        .map(|c| pins::pin_doc(&pins::pin_id(&sub, c), at, &def))
                        .collect();
                    self.send_pins(pins, Vec::new(), Vec::new()).await?;
                    if let Some(snap) = def.snapshot {
                        // The copies before this one are no one's now.
                        self.discard_snapshot(&sub, Some(snap.at), false).await?;
                    }
                    self.apply_definition(&def).await;
                    names.len()
                }
            };
            reply.insert("reset", reset as i64);
        }
        if let Some(v) = cmd.get("dropConsumer") {
            let c = spec::check_name(Some(v), "dropConsumer")?;
            self.not_held_elsewhere(&sub, &c).await?;
            self.drop_consumer(&sub, &c).await?;
            reply.insert("droppedConsumer", c);
        }
        if let Some(v) = cmd.get("redrive") {
            let Bson::Document(r) = v else {
                return Err(MongoError::type_mismatch(
                    "'redrive' must be a document {consumer, ids?}",
                ));
            };
            let c = spec::check_name(r.get("consumer"), "redrive.consumer")?;
            let mut filter = doc! {"_id.s": &sub, "_id.c": &c, "redriven": false};
            if let Ok(ids) = r.get_array("ids") {
                let strs: Vec<String> = ids
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
                let tokens: Vec<Bson> = parse_ids(&strs)?
                    .into_iter()
                    .map(|id| {
                        bson::Bson::Binary(bson::Binary {
                            subtype: bson::spec::BinarySubtype::Generic,
                            bytes: id.token.data().to_vec(),
                        })
                    })
                    .collect();
                filter.insert("_id.t", doc! {"$in": tokens});
            }
            let live = self.live(db, name, &c, false).await?;
            let letters = self
                .config
                .find(STATE_DB, DEAD_LETTERS, filter.clone())
                .await?;
            let messages: Vec<Arc<Message>> =
                letters.iter().filter_map(dead_letter_message).collect();
            let n = messages.len();
            if n > 0 {
                self.config_write(
                    DEAD_LETTERS,
                    "update",
                    "updates",
                    vec![doc! {"q": filter, "u": {"$set": {"redriven": true}}, "multi": true}],
                )
                .await?;
                let mut m = live.machine();
                m.consumer.redrive(messages, wall_clock());
                m.mark(true);
                drop(m);
                live.freed.notify_waiters();
            }
            reply.insert("redriven", n as i64);
        }
        reply.insert("ok", 1.0);
        Ok(reply)
    }

    /// Applies a definition to the consumers of it served here (new settings, a pause, a new
    /// start or snapshot: the shared log then starts over).
    async fn apply_definition(&self, def: &Definition) {
        let sub = def.id();
        let mut moved: Vec<Arc<shared::Shared>> = Vec::new();
        for live in self.all_live().into_iter().filter(|l| l.sub == sub) {
            let old = live.def();
            if *old == *def {
                continue;
            }
            if (old.start != def.start || old.snapshot != def.snapshot)
                && !moved.iter().any(|log| Arc::ptr_eq(log, &live.shared))
            {
                moved.push(live.shared.clone());
            }
            *live.def.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(def.clone());
            let reset = {
                let mut m = live.machine();
                m.consumer.set_limits(def.limits.clone());
                let paused = def.paused || m.paused;
                m.consumer.set_paused(paused);
                m.mark(true);
                m.resets < def.resets
            };
            if reset {
                if let Err(e) = self.start_over(&live, def, &def.start).await {
                    // Tried again at the next refresh (its count is unchanged).
                    tracing::warn!(error = %e, consumer = %live.consumer, "resetting a consumer");
                    *live.def.lock().unwrap_or_else(|e| e.into_inner()) = old;
                    continue;
                }
                live.machine().resets = def.resets;
            }
            live.freed.notify_waiters();
        }
        for log in moved {
            log.close().await;
        }
    }

    /// Applies the definitions another router changed to the consumers served here.
    pub(super) async fn refresh_definitions(&self) -> Result<()> {
        let mut subs: Vec<String> = self.all_live().iter().map(|l| l.sub.clone()).collect();
        subs.sort();
        subs.dedup();
        if subs.is_empty() {
            return Ok(());
        }
        let found = self
            .config
            .find(STATE_DB, DEFINITIONS, doc! {"_id": {"$in": subs}})
            .await?;
        for d in found {
            self.apply_definition(&Definition::from_document(&d)?).await;
        }
        Ok(())
    }

    /// Deletes every document of a state collection matching `filter`.
    async fn config_delete(&self, coll: &str, filter: Document) -> Result<()> {
        self.config_write(
            coll,
            "delete",
            "deletes",
            vec![doc! {"q": filter, "limit": 0}],
        )
        .await
        .map(|_| ())
    }

    async fn consumer_names(&self, sub: &str) -> Result<Vec<String>> {
        Ok(self
            .config
            .find(STATE_DB, CONSUMERS, doc! {"_id.s": sub})
            .await?
            .iter()
            .filter_map(|d| d.get_str("consumer").ok().map(str::to_string))
            .collect())
    }

    async fn drop_consumer(&self, sub: &str, consumer: &str) -> Result<()> {
        if let Some(live) = self.cached(sub, consumer) {
            self.unload(&live).await;
        }
        self.unpin(vec![pins::pin_id(sub, consumer)]).await?;
        self.config_delete(CONSUMERS, doc! {"_id": consumer_id(sub, consumer)})
            .await?;
        self.config_delete(DEAD_LETTERS, doc! {"_id.s": sub, "_id.c": consumer})
            .await?;
        Ok(())
    }

    /// `dropSubscription`: its definition, consumers and dead letters.
    pub async fn drop_subscription(&self, db: &str, name: &str) -> Result<Document> {
        let sub = spec::sub_id(db, name);
        self.definition(&sub).await?;
        self.drop_all(&[sub]).await?;
        Ok(doc! {"ok": 1.0})
    }

    /// Drops the subscriptions named (a dropped database's).
    pub async fn drop_all(&self, subs: &[String]) -> Result<()> {
        for live in self.all_live() {
            if subs.contains(&live.sub) {
                self.unload(&live).await;
            }
        }
        let ids: Vec<Bson> = subs.iter().cloned().map(Bson::String).collect();
        let mut pinned: Vec<String> = subs.iter().map(|s| pins::pin_id(s, pins::START)).collect();
        for sub in subs {
            pinned.extend(
                self.consumer_names(sub)
                    .await?
                    .iter()
                    .map(|c| pins::pin_id(sub, c)),
            );
        }
        self.unpin(pinned).await?;
        self.config_delete(DEFINITIONS, doc! {"_id": {"$in": ids.clone()}})
            .await?;
        self.config_delete(CONSUMERS, doc! {"_id.s": {"$in": ids.clone()}})
            .await?;
        self.config_delete(DEAD_LETTERS, doc! {"_id.s": {"$in": ids.clone()}})
            .await?;
        self.config_delete(spec::SNAPSHOTS, doc! {"_id.s": {"$in": ids}})
            .await?;
        Ok(())
    }

    /// Drops every subscription of a database being dropped.
    pub async fn drop_database(&self, db: &str) -> Result<()> {
        let subs: Vec<String> = self
            .config
            .find(STATE_DB, DEFINITIONS, doc! {"db": db})
            .await?
            .iter()
            .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
            .collect();
        if subs.is_empty() {
            return Ok(());
        }
        self.drop_all(&subs).await
    }

    /// `listSubscriptions`: a row per consumer (and one per subscription without any), with
    /// what this router knows of the consumers it serves fresher than what is stored.
    pub async fn list(&self, db: &str, filter: Option<&Document>) -> Result<Vec<Document>> {
        let matcher = filter.map(pipeline::matcher::Matcher::parse).transpose()?;
        let defs_filter = if db == "admin" {
            doc! {}
        } else {
            doc! {"db": db}
        };
        let defs = self.config.find(STATE_DB, DEFINITIONS, defs_filter).await?;
        let now = wall_clock();
        let mut rows = Vec::new();
        let mut lagging: Vec<(usize, bson::Timestamp)> = Vec::new();
        for d in &defs {
            let def = Definition::from_document(d)?;
            let sub = def.id();
            let consumers = self
                .config
                .find(STATE_DB, CONSUMERS, doc! {"_id.s": &sub})
                .await?;
            let base = doc! {
                "subscription": &def.name,
                "db": &def.db,
                "collection": def.collection.clone().map_or(Bson::Null, Bson::String),
                "paused": def.paused,
            };
            if consumers.is_empty() {
                let mut row = base.clone();
                row.insert("consumer", Bson::Null);
                rows.push(row);
            }
            for c in consumers {
                let mut row = base.clone();
                let name = c.get_str("consumer").unwrap_or("").to_string();
                let stored = Stored::parse(&c)?;
                let (floor, counters, in_flight, status, paused, last_read) =
                    match self.cached(&sub, &name) {
                        Some(live) => {
                            let m = live.machine();
                            (
                                m.consumer.floor().cloned(),
                                m.consumer.counters,
                                m.consumer.in_flight() as i64,
                                m.status,
                                m.paused,
                                m.last_read,
                            )
                        }
                        None => (
                            stored.floor.clone(),
                            stored.counters,
                            c.get_i64("inFlight").unwrap_or(0),
                            stored.status,
                            stored.paused,
                            stored.last_read,
                        ),
                    };
                let state = if status != Status::Active {
                    status.as_str()
                } else if paused || def.paused {
                    "paused"
                } else {
                    "active"
                };
                let position = floor.as_ref().unwrap_or(&def.start);
                let lag_secs = position
                    .decode()
                    .map(|t| {
                        (now.0 / 1000).saturating_sub(u64::from(t.cluster_time().timestamp().time))
                    })
                    .unwrap_or(0);
                row.insert("consumer", name);
                row.insert("state", state);
                row.insert("position", position.to_document());
                row.insert("lagSecs", lag_secs as i64);
                // Filled in below, from every shard at once.
                row.insert("lagBytes", Bson::Null);
                if let Ok(from) = pins::from_of(position) {
                    lagging.push((rows.len(), from));
                }
                row.insert("inFlight", in_flight);
                row.insert("delivered", counters.delivered as i64);
                row.insert("acked", counters.acked as i64);
                row.insert("redelivered", counters.redelivered as i64);
                row.insert("deadLettered", counters.dead_lettered as i64);
                row.insert("late", counters.late as i64);
                row.insert("lastRead", bson::DateTime::from_millis(last_read.0 as i64));
                row.insert(
                    "owner",
                    stored.owner.clone().map_or(Bson::Null, Bson::String),
                );
                rows.push(row);
            }
        }
        let froms: Vec<bson::Timestamp> = lagging.iter().map(|(_, t)| *t).collect();
        match self.oplog_bytes_since(&froms).await {
            Ok(bytes) => {
                for ((row, _), b) in lagging.iter().zip(bytes) {
                    rows[*row].insert("lagBytes", b);
                }
            }
            // A shard away: the lag in bytes is unknown (null) for now.
            Err(e) => tracing::debug!(error = %e, "listSubscriptions: lag in bytes"),
        }
        if let Some(m) = matcher {
            rows.retain(|r| m.matches(r));
        }
        Ok(rows)
    }

    /// For each time, the bytes of every shard's oplog from it on: what a consumer at that
    /// position has not acknowledged yet, as its pins hold it.
    async fn oplog_bytes_since(&self, froms: &[bson::Timestamp]) -> Result<Vec<i64>> {
        let mut total = vec![0i64; froms.len()];
        for shard in self.transport.all() {
            for (n, chunk) in froms.chunks(shard::pins::MAX_PINS).enumerate() {
                let reply = self
                    .transport
                    .command(
                        shard,
                        "admin",
                        doc! {"_shardsvrOplogBytesSince": chunk.to_vec()},
                    )
                    .await?;
                let bytes = reply.get_array("bytes").map_err(|_| {
                    MongoError::internal("_shardsvrOplogBytesSince answered without 'bytes'")
                })?;
                for (i, b) in bytes.iter().enumerate() {
                    if let (Some(t), Some(b)) =
                        (total.get_mut(n * shard::pins::MAX_PINS + i), b.as_i64())
                    {
                        *t = t.saturating_add(b);
                    }
                }
            }
        }
        Ok(total)
    }

    /// Drops consumers nobody read for their subscription's `consumerIdleTimeoutSecs`.
    pub(super) async fn expire_idle(&self) {
        let now = wall_clock();
        for live in self.all_live() {
            let Some(idle) = live.def().idle_timeout else {
                continue;
            };
            let last = live.machine().last_read;
            if now.0.saturating_sub(last.0) >= idle.as_millis() as u64
                && let Err(e) = self.drop_consumer(&live.sub, &live.consumer).await
            {
                tracing::warn!(error = %e, consumer = %live.consumer, "an idle consumer not dropped");
            }
        }
    }

    /// Drops idle consumers no router serves (their router died): those whose lease lapsed
    /// and whose last read is older than their subscription's `consumerIdleTimeoutSecs`.
    pub(super) async fn expire_abandoned(&self) -> Result<()> {
        let now = wall_clock();
        let defs = self
            .config
            .find(
                STATE_DB,
                DEFINITIONS,
                doc! {"consumerIdleTimeoutSecs": {"$exists": true}},
            )
            .await?;
        for d in defs {
            let def = Definition::from_document(&d)?;
            let Some(idle) = def.idle_timeout else {
                continue;
            };
            let before = now.0.saturating_sub(idle.as_millis() as u64) as i64;
            let abandoned = self
                .config
                .find(
                    STATE_DB,
                    CONSUMERS,
                    doc! {
                        "_id.s": def.id(),
                        "leaseUntil": {"$lt": now.0 as i64},
                        "lastRead": {"$lt": before},
                    },
                )
                .await?;
            for c in abandoned {
                if let Ok(name) = c.get_str("consumer") {
                    self.drop_consumer(&def.id(), name).await?;
                }
            }
        }
        Ok(())
    }
}

/// Waits until the state pass that stored an ack confirms it.
async fn wait_stored(rx: tokio::sync::oneshot::Receiver<()>, live: &Live) -> Result<()> {
    match tokio::time::timeout(DURABLE_PATIENCE, rx).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(errors::lease_moved(
            &live.sub,
            &live.consumer,
            "another router",
            LEASE.as_millis() as u64,
        )),
        Err(_) => Err(MongoError::new(
            ErrorCode::EXCEEDED_TIME_LIMIT,
            format!(
                "the ack was not stored within {} s (the config shard is away); it may be \
                 stored later",
                DURABLE_PATIENCE.as_secs()
            ),
        )),
    }
}

fn outcome_reply(o: Outcome, applied: &str) -> Document {
    let mut d = Document::new();
    d.insert(applied, i64::from(o.applied));
    d.insert("late", i64::from(o.late));
    d.insert("unknown", i64::from(o.unknown));
    d
}

/// Delivery ids as a command gives them: at most [`spec::MAX_IDS`], each one this server
/// formatted.
fn parse_ids(ids: &[String]) -> Result<Vec<DeliveryId>> {
    if ids.len() > spec::MAX_IDS {
        return Err(MongoError::bad_value(format!(
            "at most {} delivery ids per call",
            spec::MAX_IDS
        )));
    }
    ids.iter().map(|id| parse_id(id)).collect()
}

fn parse_id(id: &str) -> Result<DeliveryId> {
    DeliveryId::parse(id)
        .ok_or_else(|| MongoError::bad_value(format!("'{id}' is not a deliveryId")))
}

/// What `ackSubscription` asks.
pub struct Ack<'a> {
    pub ids: &'a [String],
    /// A cumulative ack: every message out or due at or before this one.
    pub through: Option<&'a str>,
    /// Extends the deadlines of `ids` instead.
    pub in_progress: bool,
    /// Answers once the ack is stored.
    pub wait_durable: bool,
}

/// A stored dead letter as a message again.
fn dead_letter_message(d: &Document) -> Option<Arc<Message>> {
    let token = ResumeToken::from_document(d.get_document("token").ok()?).ok()?;
    let encode = |d: &Document| {
        let mut bytes = Vec::new();
        d.to_writer(&mut bytes).ok()?;
        Some(bytes::Bytes::from(bytes))
    };
    let event = encode(d.get_document("event").ok()?)?;
    let changes = match d.get_array("changes") {
        Ok(changes) => changes
            .iter()
            .map(|c| c.as_document().and_then(encode))
            .collect::<Option<Vec<_>>>()?,
        Err(_) => Vec::new(),
    };
    Some(Arc::new(Message::grouped(token, event, changes)))
}
