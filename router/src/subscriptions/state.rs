//! The subscriptions' durable state on the config shard, and the service that writes it.
//!
//! `config.subscriptionConsumers` holds one document per consumer: its epoch, ack floor (a
//! resume token), what it remembers above the floor (done messages, delivery counts, nack
//! delays; packed in one binary value), counters, status, lease (`owner`, `gen`, `leaseUntil`) and last read.
//! `config.subscriptionDeadLetters` holds each dead letter with its event.
//!
//! Invariants: state is written in batches ([`PERIOD`]), never on the commit path of a user's
//! write: one `update` of every changed consumer per pass, after the pass's dead letters are
//! stored, so a floor is never stored past a message whose dead letter is not; each update
//! filters on the lease (`owner`, `gen`), so a router that lost a consumer's lease can no
//! longer write it, and learns so; an ack that asked to wait (`waitDurable`) is answered only
//! after the pass that stored it; a failed pass loses nothing (what it wrote is written again).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bson::spec::BinarySubtype;
use bson::{Binary, Bson, Document, doc};
use resume::token::ResumeToken;
use wire::{MongoError, Result};

use super::delivery::{Consumer, Counters, DeadLetter, Millis, Remembered, Run};
use super::spec::{CONSUMERS, DEAD_LETTERS, STATE_DB};
use super::{Live, Subscriptions};
use crate::kernel::services::Service;
use crate::kernel::transport::Shards;

/// How often changed consumers are written.
pub const PERIOD: Duration = Duration::from_millis(100);

/// How long a lease lasts without renewal: another router may take a consumer over after it.
pub const LEASE: Duration = Duration::from_secs(10);

/// A lease is renewed when less than this is left of it.
pub const RENEW_BEFORE: Duration = Duration::from_secs(7);

/// A consumer's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    /// Fell behind its `maxLag`: reads fail until a reset.
    Expired,
    /// Its history is gone or discontinuous: reads fail until a reset.
    ResetRequired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Expired => "expired",
            Status::ResetRequired => "resetRequired",
        }
    }

    fn parse(s: &str) -> Status {
        match s {
            "expired" => Status::Expired,
            "resetRequired" => Status::ResetRequired,
            _ => Status::Active,
        }
    }
}

/// A consumer document's `_id`.
pub fn consumer_id(sub: &str, consumer: &str) -> Document {
    doc! {"s": sub, "c": consumer}
}

fn binary(bytes: &[u8]) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.to_vec(),
    })
}

/// What a consumer remembers above its floor ([`Run`]s in token order), packed into one
/// binary value (the whole window is written with every moved position, so its encoding is
/// kept cheap for the config shard to store): per run, its end token's length (u16 LE) and
/// bytes, then `0` (done) or `1` (delivered) with its deliveries (u32 LE) and the time it is
/// due again (u64 LE ms, 0: not set). The form written when each message had its own entry is
/// the same packing with one run per message.
fn pack_runs(runs: &[(&ResumeToken, Remembered)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(runs.iter().map(|(t, _)| t.data().len() + 15).sum());
    for (t, r) in runs {
        let data = &t.data()[..t.data().len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(data.len() as u16).to_le_bytes());
        out.extend_from_slice(data);
        match r {
            Remembered::Done => out.extend_from_slice(&[0; 13]),
            Remembered::Delivered { deliveries, at } => {
                out.push(1);
                out.extend_from_slice(&deliveries.to_le_bytes());
                out.extend_from_slice(&at.map_or(0, |at| at.0).to_le_bytes());
            }
        }
    }
    out
}

/// [`pack_runs`]'s runs; `None` when the bytes are not such a packing, or its runs are not in
/// token order.
fn unpack_runs(mut b: &[u8]) -> Option<VecDeque<Run>> {
    let mut out: VecDeque<Run> = VecDeque::new();
    while !b.is_empty() {
        let len = usize::from(u16::from_le_bytes(b.get(..2)?.try_into().ok()?));
        let token = b.get(2..2 + len)?;
        let rest = b.get(2 + len..2 + len + 13)?;
        let deliveries = u32::from_le_bytes(rest[1..5].try_into().ok()?);
        let at = u64::from_le_bytes(rest[5..13].try_into().ok()?);
        let state = match rest[0] {
            0 => Remembered::Done,
            1 => Remembered::Delivered {
                deliveries,
                at: (at > 0).then_some(Millis(at)),
            },
            _ => return None,
        };
        let end = ResumeToken::from_parts(token.to_vec(), Vec::new());
        if out.back().is_some_and(|r| r.end >= end) {
            return None;
        }
        out.push_back(Run { end, state });
        b = &b[2 + len + 13..];
    }
    Some(out)
}

/// What a consumer document restores.
pub struct Stored {
    pub epoch: u32,
    pub floor: Option<ResumeToken>,
    pub remembered: VecDeque<Run>,
    pub counters: Counters,
    pub status: Status,
    pub paused: bool,
    pub owner: Option<String>,
    pub generation: i64,
    pub lease_until: Millis,
    pub last_read: Millis,
    /// The resets of every consumer it has applied (`Definition::resets`).
    pub resets: i64,
}

impl Stored {
    pub fn parse(d: &Document) -> Result<Stored> {
        let int = |d: &Document, f: &str| match d.get(f) {
            Some(Bson::Int64(v)) => *v,
            Some(Bson::Int32(v)) => i64::from(*v),
            _ => 0,
        };
        let floor = match d.get_document("floor") {
            Ok(t) => Some(ResumeToken::from_document(t)?),
            Err(_) => None,
        };
        let mut remembered = VecDeque::new();
        if let Ok(packed) = d.get_binary_generic("remembered") {
            remembered = unpack_runs(packed).ok_or_else(|| {
                MongoError::internal("a stored consumer whose 'remembered' does not decode")
            })?;
        }
        // The form written before it was packed: an array of documents, one per message.
        let mut entries = Vec::new();
        for r in d.get_array("remembered").map(Vec::as_slice).unwrap_or(&[]) {
            let Some(r) = r.as_document() else { continue };
            let Ok(t) = r.get_binary_generic("t") else {
                continue;
            };
            let state = if r.get_bool("done").unwrap_or(false) {
                Remembered::Done
            } else {
                let at = int(r, "at");
                Remembered::Delivered {
                    deliveries: u32::try_from(int(r, "n")).unwrap_or(0),
                    at: (at > 0).then_some(Millis(at as u64)),
                }
            };
            entries.push(Run {
                end: ResumeToken::from_parts(t.clone(), Vec::new()),
                state,
            });
        }
        entries.sort_by(|a, b| a.end.cmp(&b.end));
        entries.dedup_by(|a, b| a.end == b.end);
        remembered.extend(entries);
        let c = d.get_document("counters").cloned().unwrap_or_default();
        let count = |f: &str| u64::try_from(int(&c, f)).unwrap_or(0);
        Ok(Stored {
            epoch: u32::try_from(int(d, "epoch")).unwrap_or(0),
            floor,
            remembered,
            counters: Counters {
                delivered: count("delivered"),
                acked: count("acked"),
                redelivered: count("redelivered"),
                dead_lettered: count("deadLettered"),
                late: count("late"),
            },
            status: Status::parse(d.get_str("status").unwrap_or("active")),
            paused: d.get_bool("paused").unwrap_or(false),
            owner: d.get_str("owner").ok().map(str::to_string),
            generation: int(d, "gen"),
            lease_until: Millis(u64::try_from(int(d, "leaseUntil")).unwrap_or(0)),
            last_read: Millis(u64::try_from(int(d, "lastRead")).unwrap_or(0)),
            resets: int(d, "resets"),
        })
    }
}

/// The fields of a consumer's document that its owner writes.
pub fn consumer_fields(
    c: &Consumer,
    status: Status,
    last_read: Millis,
    lease_until: Millis,
) -> Document {
    let remembered = binary(&pack_runs(&c.runs()));
    let k = c.counters;
    doc! {
        "epoch": i64::from(c.epoch()),
        "floor": c.floor().map_or(Bson::Null, |t| Bson::Document(t.to_document())),
        "remembered": remembered,
        "counters": {
            "delivered": k.delivered as i64,
            "acked": k.acked as i64,
            "redelivered": k.redelivered as i64,
            "deadLettered": k.dead_lettered as i64,
            "late": k.late as i64,
        },
        "inFlight": c.in_flight() as i64,
        "status": status.as_str(),
        "paused": c.is_paused(),
        "leaseUntil": lease_until.0 as i64,
        "lastRead": last_read.0 as i64,
    }
}

/// A dead letter's document.
pub fn dead_letter_doc(sub: &str, consumer: &str, d: &DeadLetter, now: Millis) -> Document {
    let decode = |bytes: &[u8]| {
        bson::RawDocument::from_bytes(bytes)
            .ok()
            .and_then(|raw| Document::try_from(raw).ok())
            .map_or(Bson::Null, Bson::Document)
    };
    let event = decode(&d.message.event);
    let mut letter = doc! {
        "_id": {"s": sub, "c": consumer, "t": binary(d.message.token.data())},
        "subscription": sub,
        "consumer": consumer,
        "token": d.message.token.to_document(),
        "event": event,
        "deliveryCount": i64::from(d.deliveries),
        "reason": d.reason.as_str(),
        "at": bson::DateTime::from_millis(now.0 as i64),
        "redriven": false,
    };
    // A trigger queue's changes, when they fit beside the event in one document (else the
    // letter keeps the first change only).
    if !d.message.changes.is_empty() && d.message.size() < 15 << 20 {
        let changes: Vec<Bson> = d.message.changes.iter().map(|c| decode(c)).collect();
        letter.insert("changes", changes);
    }
    letter
}

/// Writes changed consumers, their dead letters and renewed leases, every [`PERIOD`].
pub struct StateWriter {
    pub subs: Arc<Subscriptions>,
    pub passes: u64,
    /// Passes to skip: a pass that made `k` commits (dead letters, redriven letters done,
    /// consumers) owes `k - 1`, so the state costs at most one commit per [`PERIOD`].
    pub owed: u64,
}

/// Pins are pushed to the shards every this many passes (about once a second).
const PIN_EVERY: u64 = 10;

/// Idle consumers no router serves are looked for every this many passes (15 s).
const ABANDONED_EVERY: u64 = 150;

impl Service for StateWriter {
    const NAME: &'static str = "subscription_state";

    fn period(&self) -> Duration {
        PERIOD
    }

    async fn pass(&mut self) {
        if self.owed > 0 {
            self.owed -= 1;
        } else {
            let before = self.subs.state_commits();
            if let Err(e) = self.subs.write_state().await {
                self.subs.state_write_failed();
                tracing::warn!(error = %e, "subscription state not written; trying again");
            }
            self.owed = (self.subs.state_commits() - before).saturating_sub(1);
        }
        self.passes += 1;
        if self.passes.is_multiple_of(PIN_EVERY) {
            if let Err(e) = self.subs.push_pins().await {
                tracing::warn!(error = %e, "subscription pins not pushed; trying again");
            }
            self.subs.expire_idle().await;
            if let Err(e) = self.subs.refresh_definitions().await {
                tracing::warn!(error = %e, "subscription definitions not refreshed");
            }
        }
        // Consumers whose router died are looked for far less often.
        if self.passes.is_multiple_of(ABANDONED_EVERY)
            && let Err(e) = self.subs.expire_abandoned().await
        {
            tracing::warn!(error = %e, "abandoned consumers not looked for");
        }
    }
}

/// One consumer's share of a pass: what it wrote, to confirm or take back.
pub struct Written {
    pub live: Arc<Live>,
    /// When the lease ended before this pass renewed it.
    pub old_lease: Millis,
    pub update: Document,
    pub dead: Vec<DeadLetter>,
    pub redriven_done: Vec<ResumeToken>,
    pub durable: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Subscriptions {
    /// One pass: dead letters first, then every changed consumer in one unordered update.
    pub(super) async fn write_state(&self) -> Result<()> {
        let now = super::wall_clock();
        let written: Vec<Written> = self
            .all_live()
            .into_iter()
            .filter_map(|live| live.take_changes(self.router_id(), now))
            .collect();
        if written.is_empty() {
            return Ok(());
        }
        let result = self.store(&written).await;
        match result {
            Ok(lost) => {
                for w in written {
                    if lost.iter().any(|l| Arc::ptr_eq(l, &w.live)) {
                        continue;
                    }
                    for tx in w.durable {
                        let _ = tx.send(());
                    }
                }
                for live in lost {
                    tracing::info!(consumer = %live.consumer, "consumer lease lost to another router");
                    self.unload(&live).await;
                }
                Ok(())
            }
            Err(e) => {
                for w in written {
                    // The lease was not renewed: it ends when it did before.
                    w.live
                        .take_back(w.dead, w.redriven_done, w.durable, w.old_lease);
                }
                Err(e)
            }
        }
    }

    /// Stores a pass; returns the consumers whose lease another router holds now.
    async fn store(&self, written: &[Written]) -> Result<Vec<Arc<Live>>> {
        let now = super::wall_clock();
        let dead: Vec<Document> = written
            .iter()
            .flat_map(|w| {
                w.dead
                    .iter()
                    .map(|d| dead_letter_doc(&w.live.sub, &w.live.consumer, d, now))
            })
            .collect();
        if !dead.is_empty() {
            let updates: Vec<Document> = dead
                .iter()
                .map(|d| {
                    doc! {"q": {"_id": d.get("_id").cloned().unwrap_or(Bson::Null)}, "u": d.clone(), "upsert": true}
                })
                .collect();
            self.config_write(DEAD_LETTERS, "update", "updates", updates)
                .await?;
        }
        let done: Vec<Document> = written
            .iter()
            .flat_map(|w| {
                w.redriven_done.iter().map(|t| {
                    doc! {"q": {"_id": {"s": w.live.sub.as_str(), "c": w.live.consumer.as_str(), "t": binary(t.data())}}, "limit": 0}
                })
            })
            .collect();
        if !done.is_empty() {
            self.config_write(DEAD_LETTERS, "delete", "deletes", done)
                .await?;
        }
        let updates: Vec<Document> = written.iter().map(|w| w.update.clone()).collect();
        let expected = updates.len() as i64;
        let reply = self
            .config_write(CONSUMERS, "update", "updates", updates)
            .await?;
        let n = match reply.get("n") {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            _ => 0,
        };
        if n == expected {
            return Ok(Vec::new());
        }
        // Some filter on the lease matched nothing: find whose.
        let mut lost = Vec::new();
        for w in written {
            let id = consumer_id(&w.live.sub, &w.live.consumer);
            let found = self
                .config
                .find_one(STATE_DB, CONSUMERS, doc! {"_id": id})
                .await?;
            let ours = found.as_ref().is_some_and(|d| {
                d.get_str("owner").ok() == Some(self.router_id())
                    && d.get_i64("gen").ok() == Some(w.live.generation)
            });
            if !ours {
                lost.push(w.live.clone());
            }
        }
        Ok(lost)
    }

    /// One write command to the config shard, its write errors an error.
    pub(super) async fn config_write(
        &self,
        coll: &str,
        command: &str,
        field: &str,
        items: Vec<Document>,
    ) -> Result<Document> {
        let mut cmd = doc! {command: coll};
        cmd.insert(field, items);
        cmd.insert("ordered", false);
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply = self
            .transport
            .command(shard::sharding::ShardId::CONFIG, STATE_DB, cmd)
            .await?;
        if let Some(e) = reply
            .get_array("writeErrors")
            .ok()
            .and_then(|a| a.first())
            .and_then(Bson::as_document)
        {
            return Err(MongoError::with_code(
                e.get_i32("code").unwrap_or(1),
                e.get_str("errmsg")
                    .unwrap_or("a subscription state write failed"),
            ));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_pack_and_unpack_and_garbage_is_refused() {
        let t = |n: u8| ResumeToken::from_parts(vec![n; usize::from(n)], Vec::new());
        let (t1, t7, t40) = (t(1), t(7), t(40));
        let runs = vec![
            (&t1, Remembered::Done),
            (
                &t7,
                Remembered::Delivered {
                    deliveries: 1,
                    at: Some(Millis(1_700_000_000_000)),
                },
            ),
            (
                &t40,
                Remembered::Delivered {
                    deliveries: 3,
                    at: None,
                },
            ),
        ];
        let packed = pack_runs(&runs);
        let back = unpack_runs(&packed).expect("decodes");
        assert_eq!(
            back.iter().map(|r| (&r.end, r.state)).collect::<Vec<_>>(),
            runs
        );
        assert_eq!(unpack_runs(&[]), Some(VecDeque::new()));
        assert_eq!(unpack_runs(&packed[..packed.len() - 1]), None, "cut short");
        assert_eq!(unpack_runs(&[0xff, 0xff, 1]), None, "a length past the end");
        let mut bad_kind = pack_runs(&[(&t(2), Remembered::Done)]);
        bad_kind[4] = 9;
        assert_eq!(unpack_runs(&bad_kind), None);
        let unordered = pack_runs(&[(&t7, Remembered::Done), (&t1, Remembered::Done)]);
        assert_eq!(unpack_runs(&unordered), None, "runs out of token order");
    }
}
