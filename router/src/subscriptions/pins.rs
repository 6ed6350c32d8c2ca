//! Pins: each consumer holds every shard's oplog from its ack floor on (and a subscription
//! without consumers yet from its start), through the shards' retention pins
//! (`_shardsvrRetentionPins`, `shard::pins`); a pin further behind than the subscription's
//! `maxLagBytes` / `maxLagSecs` expires on its shard, and its consumer with it.
//!
//! The subscription's own pin lets go once its first consumer is pinned: held for consumers
//! that may never come, it would keep every shard's oplog forever. A consumer created later
//! starts at the subscription's start while that history is still kept, and fails with
//! `SubscriptionResetRequired` (9104) once it is not.
//!
//! Invariants: a subscription's start pin is set on every shard before `createSubscription`
//! returns, a new consumer's and a reset consumer's before their first read or the reset
//! returns; the owner of a consumer pushes its
//! moved floor at most once a second (a pin that lags only keeps more); a dropped consumer or
//! subscription drops its pins; an expired pin makes its consumer `expired` (reads fail with
//! 9103 until a reset).

use bson::{Document, Timestamp, doc};
use resume::token::ResumeToken;
use wire::Result;

use super::Subscriptions;
use super::spec::Definition;
use super::state::Status;
use crate::kernel::transport::Shards;

/// The id of a consumer's pin (`$start`: the subscription's own).
pub fn pin_id(sub: &str, consumer: &str) -> String {
    format!("{sub}/{consumer}")
}

pub const START: &str = "$start";

/// The oldest time a position needs: its token's (later events of that time follow it).
pub fn from_of(token: &ResumeToken) -> Result<Timestamp> {
    Ok(token.decode()?.cluster_time().timestamp())
}

pub(super) fn pin_doc(id: &str, from: Timestamp, def: &Definition) -> Document {
    let mut d = doc! {"id": id, "from": from};
    if let Some(b) = def.max_lag_bytes {
        d.insert("maxLagBytes", b);
    }
    if let Some(s) = def.max_lag_secs {
        d.insert("maxLagSecs", s);
    }
    d
}

impl Subscriptions {
    /// Sends pins to every shard; returns the ids expired on any of them.
    pub(super) async fn send_pins(
        &self,
        set: Vec<Document>,
        drop: Vec<String>,
        get: Vec<String>,
    ) -> Result<Vec<String>> {
        let mut expired = Vec::new();
        if set.is_empty() && drop.is_empty() && get.is_empty() {
            return Ok(expired);
        }
        let cmd = doc! {"_shardsvrRetentionPins": 1, "set": set, "drop": drop, "get": get};
        for shard in self.transport.all() {
            let reply = self.transport.command(shard, "admin", cmd.clone()).await?;
            for p in reply.get_array("pins").map(Vec::as_slice).unwrap_or(&[]) {
                if let Some(p) = p.as_document()
                    && p.get_bool("expired").unwrap_or(false)
                    && let Ok(id) = p.get_str("id")
                    && !expired.iter().any(|e| e == id)
                {
                    expired.push(id.to_string());
                }
            }
        }
        Ok(expired)
    }

    /// Pins a subscription's start on every shard.
    pub(super) async fn pin_start(&self, def: &Definition) -> Result<()> {
        let id = pin_id(&def.id(), START);
        self.send_pins(
            vec![pin_doc(&id, from_of(&def.start)?, def)],
            Vec::new(),
            Vec::new(),
        )
        .await?;
        Ok(())
    }

    /// Drops pins.
    pub(super) async fn unpin(&self, ids: Vec<String>) -> Result<()> {
        self.send_pins(Vec::new(), ids, Vec::new()).await?;
        Ok(())
    }

    /// The pass: pushes each served consumer's moved floor, and learns which pins expired.
    pub(super) async fn push_pins(&self) -> Result<()> {
        let mut set = Vec::new();
        let mut get = Vec::new();
        let mut pushed = Vec::new();
        for live in self.all_live() {
            let def = live.def();
            let id = pin_id(&live.sub, &live.consumer);
            let m = live.machine();
            if m.status != Status::Active {
                continue;
            }
            let from = from_of(m.consumer.floor().unwrap_or(&def.start))?;
            if m.pinned == Some(from) {
                get.push(id);
            } else {
                set.push(pin_doc(&id, from, &def));
                pushed.push((live.clone(), from));
            }
        }
        let expired = self.send_pins(set, Vec::new(), get).await?;
        for (live, from) in pushed {
            live.machine().pinned = Some(from);
        }
        for live in self.all_live() {
            if expired.contains(&pin_id(&live.sub, &live.consumer)) {
                let mut m = live.machine();
                if m.status != Status::Expired {
                    tracing::info!(consumer = %live.consumer, subscription = %live.sub, "consumer expired: it fell further behind than its maxLag");
                    m.status = Status::Expired;
                    m.mark(true);
                }
            }
        }
        Ok(())
    }

    /// Pins a reset consumer at its new floor (before the reset returns).
    pub(super) async fn pin_consumer(
        &self,
        def: &Definition,
        consumer: &str,
        at: &ResumeToken,
    ) -> Result<bool> {
        let id = pin_id(&def.id(), consumer);
        let from = from_of(at)?;
        let expired = self
            .send_pins(vec![pin_doc(&id, from, def)], Vec::new(), Vec::new())
            .await?;
        Ok(expired.is_empty())
    }
}
