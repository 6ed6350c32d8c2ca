//! One consumer's deliveries, as a pure state machine: no I/O, the wall clock passed in as
//! [`Millis`], outputs returned as values the caller carries out (send, dead-letter, persist).
//!
//! A consumer takes messages from its feed in token (commit) order. Each message taken sits in
//! the **window** until it is *done* (acked or dead-lettered); the **floor** is the token below
//! which everything is done, and so the consumer's durable resume point. A message in the
//! window is out (delivered, its ack deadline running), due (to be delivered again at a time:
//! after a timeout, a nack, or a restart) or done. Redelivered dead letters (`redrive`) sit
//! beside the window, below the floor, and complete the same way.
//!
//! Invariants: every message taken ends done (acked or dead-lettered) or stays in the window;
//! first deliveries happen in token order; a message is never delivered again before its
//! deadline has passed (or a nack asked for it); a delivery count never exceeds
//! `max_deliveries` (the delivery that would pass it dead-letters the message instead); the
//! floor only rises within an epoch; `delivered = acked + dead_lettered + in_flight`, every
//! counter counting messages, not deliveries (`redelivered` counts the extra deliveries); a
//! `deliveryId` names its message and its epoch, so acking twice, late or from before a reset
//! is a no-op that is reported, never an error; the window holds at most
//! [`WINDOW_FACTOR`] × `max_in_flight` messages and at most `max_in_flight` that are not done.
//!
//! The window is a queue in token order (the feed brings tokens in order): a message joins at
//! the back without a copy of its token, a cumulative ack pops the front, and a done message
//! keeps only its token (its bytes are released). No out or due message's timer is earlier
//! than `timers_from`, so a read with nothing due does not scan the window.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use resume::token::ResumeToken;

/// Wall-clock milliseconds since the Unix epoch: persisted due times are in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    pub fn after(self, d: Duration) -> Millis {
        Millis(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    pub fn until(self, later: Millis) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0))
    }
}

/// How many messages the window may hold per message allowed in flight: done messages above an
/// unacked one wait there for the floor to pass them.
pub const WINDOW_FACTOR: usize = 4;

/// The most bytes of events not yet done that a consumer holds (at least one message always
/// fits): with `max_in_flight` this bounds a consumer's memory whatever its events' sizes.
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// A subscription's delivery settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub ack_timeout: Duration,
    /// The delivery that would exceed it dead-letters the message instead.
    pub max_deliveries: u32,
    /// The wait before delivery `n + 1` after delivery `n` timed out or was nacked without
    /// `retryInMS`: entry `n - 1`, the last one for every later delivery; none without a
    /// schedule.
    pub backoff: Vec<Duration>,
    pub max_in_flight: usize,
}

impl Limits {
    fn backoff_after(&self, deliveries: u32) -> Duration {
        let i = (deliveries as usize).saturating_sub(1);
        self.backoff
            .get(i)
            .or(self.backoff.last())
            .copied()
            .unwrap_or(Duration::ZERO)
    }
}

/// A change event as the subscription delivers it: its resume token and its encoded bytes
/// (exactly what `watch()` returns), shared by every consumer that holds it.
#[derive(Debug)]
pub struct Message {
    pub token: ResumeToken,
    pub event: Bytes,
    /// A selector subscription's message: every matching change of its document in its
    /// transaction, `event` first; empty otherwise.
    pub changes: Vec<Bytes>,
    /// The token's part of its `deliveryId`s, encoded once for every consumer.
    id_part: std::sync::OnceLock<Box<str>>,
}

impl Message {
    pub fn new(token: ResumeToken, event: Bytes) -> Message {
        Message::grouped(token, event, Vec::new())
    }

    /// A message carrying `changes` (a selector subscription's).
    pub fn grouped(token: ResumeToken, event: Bytes, changes: Vec<Bytes>) -> Message {
        Message {
            token,
            event,
            changes,
            id_part: std::sync::OnceLock::new(),
        }
    }

    /// Its `deliveryId` in `epoch`.
    pub fn delivery_id(&self, epoch: u32) -> String {
        let part = self.id_part();
        let mut id = String::with_capacity(11 + part.len());
        let _ = write!(id, "{epoch}.");
        id.push_str(part);
        id
    }

    /// The token's part of its `deliveryId`s (after `<epoch>.`).
    pub fn id_part(&self) -> &str {
        self.id_part
            .get_or_init(|| URL_SAFE_NO_PAD.encode(self.token.data()).into())
    }

    /// The bytes it adds to a reply.
    pub fn size(&self) -> usize {
        self.event.len() + self.changes.iter().map(Bytes::len).sum::<usize>()
    }
}

/// One delivery to hand a reader: its `deliveryId` is the message's in `epoch`.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub epoch: u32,
    pub count: u32,
    pub message: Arc<Message>,
}

impl Delivery {
    pub fn id(&self) -> String {
        self.message.delivery_id(self.epoch)
    }
}

/// Why a message was set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// Its deliveries reached `maxDeliveries` unacked.
    MaxDeliveries,
    /// A reader nacked it with `deadLetter: true`.
    Nacked,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::MaxDeliveries => "maxDeliveries",
            DeadReason::Nacked => "nack",
        }
    }
}

/// A message to set aside as a dead letter.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub message: Arc<Message>,
    pub deliveries: u32,
    pub reason: DeadReason,
}

#[derive(Debug, Clone)]
enum Slot {
    /// Delivered `deliveries` times; the last delivery's ack is due by `deadline`.
    Out {
        message: Arc<Message>,
        deliveries: u32,
        deadline: Millis,
    },
    /// Delivered `deliveries` times (perhaps none, after a restart); to deliver again at `at`.
    Due {
        message: Arc<Message>,
        deliveries: u32,
        at: Millis,
    },
    /// Acked or dead-lettered: its token alone is kept.
    Done(ResumeToken),
}

impl Slot {
    fn token(&self) -> &ResumeToken {
        match self {
            Slot::Out { message, .. } | Slot::Due { message, .. } => &message.token,
            Slot::Done(token) => token,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self, Slot::Done(_))
    }

    fn bytes(&self) -> usize {
        match self {
            Slot::Out { message, .. } | Slot::Due { message, .. } => message.size(),
            Slot::Done(_) => 0,
        }
    }

    /// What the persisted state remembers of it.
    fn remembered(&self) -> Remembered {
        match self {
            Slot::Done(_) => Remembered::Done,
            Slot::Out { deliveries, .. } => Remembered::Delivered {
                deliveries: *deliveries,
                at: None,
            },
            Slot::Due { deliveries, at, .. } => Remembered::Delivered {
                deliveries: *deliveries,
                at: Some(*at),
            },
        }
    }

    fn deliveries(&self) -> u32 {
        match self {
            Slot::Out { deliveries, .. } | Slot::Due { deliveries, .. } => *deliveries,
            Slot::Done(_) => 0,
        }
    }

    /// When it is next due: its ack deadline or its redelivery time.
    fn timer(&self) -> Option<Millis> {
        match self {
            Slot::Out { deadline, .. } => Some(*deadline),
            Slot::Due { at, .. } => Some(*at),
            Slot::Done(_) => None,
        }
    }
}

/// A position: a token, or the message that carries it (so moving it copies nothing).
#[derive(Debug, Clone)]
enum Mark {
    Token(ResumeToken),
    Message(Arc<Message>),
}

impl Mark {
    fn token(&self) -> &ResumeToken {
        match self {
            Mark::Token(token) => token,
            Mark::Message(message) => &message.token,
        }
    }
}

fn token_of(mark: &Option<Mark>) -> Option<&ResumeToken> {
    mark.as_ref().map(Mark::token)
}

/// What the persisted state remembers of a message above the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remembered {
    Done,
    /// Delivered this many times; due again no earlier than `at` (a nack's delay).
    Delivered {
        deliveries: u32,
        at: Option<Millis>,
    },
}

/// A run of the persisted window: every message after the previous run's end (the first
/// run's: after the floor) through `end` is in `state`. A window is contiguous (it holds every
/// message the feed brought above the floor), and the feed brings the same messages again
/// after a restore (as a resumed stream does), so runs remember each message exactly while a
/// window of messages delivered once, or done, is one run whatever its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub end: ResumeToken,
    pub state: Remembered,
}

/// A consumer's counters (messages, not deliveries, except `redelivered`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub dead_lettered: u64,
    pub late: u64,
}

/// What an ack, extension or nack did, per id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Messages this call completed, extended or nacked.
    pub applied: u32,
    /// Ids whose message was done already, or whose deadline had passed when acked (the ack
    /// still completes it).
    pub late: u32,
    /// Ids of another epoch (from before a reset) or of no message this consumer holds.
    pub unknown: u32,
}

/// A message just acked: its bytes, and whether its deadline had passed.
struct Completed {
    bytes: usize,
    late: bool,
}

impl Completed {
    fn of(message: &Message, late: bool) -> Completed {
        Completed {
            bytes: message.size(),
            late,
        }
    }
}

/// Marks an out or due message done; `None` when it was done already.
fn complete(slot: &mut Slot, now: Millis) -> Option<Completed> {
    let late = match slot {
        Slot::Done(_) => return None,
        Slot::Out { deadline, .. } => *deadline <= now,
        Slot::Due { .. } => true,
    };
    let bytes = slot.bytes();
    *slot = Slot::Done(slot.token().clone());
    Some(Completed { bytes, late })
}

/// A parsed `deliveryId`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryId {
    pub epoch: u32,
    pub token: ResumeToken,
}

impl DeliveryId {
    #[cfg(test)]
    pub fn format(epoch: u32, token: &ResumeToken) -> String {
        format!("{epoch}.{}", URL_SAFE_NO_PAD.encode(token.data()))
    }

    /// `None` when `id` is not one this server formats.
    pub fn parse(id: &str) -> Option<DeliveryId> {
        let (epoch, token) = id.split_once('.')?;
        if token.len() > 4096 {
            return None;
        }
        let data = URL_SAFE_NO_PAD.decode(token).ok()?;
        Some(DeliveryId {
            epoch: epoch.parse().ok()?,
            token: ResumeToken::from_parts(data, Vec::new()),
        })
    }
}

/// One consumer's deliveries.
#[derive(Debug)]
pub struct Consumer {
    limits: Limits,
    epoch: u32,
    /// Every message up to it is done; `None` before the first one (the subscription's start).
    floor: Option<Mark>,
    /// The newest token taken from the feed or scanned past (≥ the floor).
    horizon: Option<Mark>,
    /// Messages taken above the floor, in token order.
    window: VecDeque<Slot>,
    /// No timer of an out or due message (of the window or redriven) is earlier.
    timers_from: Millis,
    /// Redriven dead letters, below the floor.
    redriven: BTreeMap<ResumeToken, Slot>,
    /// What the persisted state says of messages above the horizon (not taken again yet since
    /// a restore), in token order.
    remembered: VecDeque<Run>,
    /// Messages out or due (not done), and their bytes.
    in_flight: usize,
    in_flight_bytes: usize,
    paused: bool,
    pub counters: Counters,
}

impl Consumer {
    pub fn new(limits: Limits, epoch: u32, floor: Option<ResumeToken>) -> Consumer {
        let floor = floor.map(Mark::Token);
        Consumer {
            limits,
            epoch,
            horizon: floor.clone(),
            floor,
            window: VecDeque::new(),
            timers_from: Millis(u64::MAX),
            redriven: BTreeMap::new(),
            remembered: VecDeque::new(),
            in_flight: 0,
            in_flight_bytes: 0,
            paused: false,
            counters: Counters::default(),
        }
    }

    /// A consumer restored from its persisted state: messages above the floor the state
    /// remembers come back as done, or with their delivery counts and nack delays, when the
    /// feed brings them again.
    pub fn restored(
        limits: Limits,
        epoch: u32,
        floor: Option<ResumeToken>,
        remembered: VecDeque<Run>,
        counters: Counters,
    ) -> Consumer {
        let mut c = Consumer::new(limits, epoch, floor);
        c.remembered = remembered;
        c.counters = counters;
        // What was in flight when the state was written comes again, uncounted as new.
        c.counters.delivered = c.counters.acked + c.counters.dead_lettered;
        c
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn floor(&self) -> Option<&ResumeToken> {
        token_of(&self.floor)
    }

    pub fn horizon(&self) -> Option<&ResumeToken> {
        token_of(&self.horizon)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// What the persisted state must remember above the floor, as runs in token order
    /// (bounded by the window): done messages, and delivery counts and nack delays of the
    /// others.
    pub fn runs(&self) -> Vec<(&ResumeToken, Remembered)> {
        let mut out = Vec::new();
        let mut slots = self.window.iter().peekable();
        while let Some(slot) = slots.next() {
            let state = slot.remembered();
            if slots.peek().is_none_or(|next| next.remembered() != state) {
                out.push((slot.token(), state));
            }
        }
        // What the feed has not brought back yet since a restore is still owed.
        out.extend(self.remembered.iter().map(|r| (&r.end, r.state)));
        out
    }

    /// Messages due for delivery again now, in token order (redriven dead letters first), at
    /// most `max` of them and `budget` bytes (one at least); a message whose deliveries reached
    /// `max_deliveries` is dead-lettered instead. Out messages whose deadline passed become
    /// due after the backoff.
    pub fn take_due(
        &mut self,
        now: Millis,
        max: usize,
        budget: usize,
    ) -> (Vec<Delivery>, Vec<DeadLetter>) {
        let mut out: Vec<Delivery> = Vec::new();
        let mut dead = Vec::new();
        if self.paused || self.timers_from > now {
            return (out, dead);
        }
        let mut bytes = 0usize;
        // The earliest timer left, found on the way (the bound is exact after a whole scan).
        let mut soonest = Millis(u64::MAX);
        let epoch = self.epoch;
        let limits = &self.limits;
        let slots = self.redriven.values_mut().chain(self.window.iter_mut());
        for slot in slots {
            if out.len() >= max {
                // What was not looked at may be due already: the next call looks.
                soonest = Millis(0);
                break;
            }
            if let Slot::Out {
                message,
                deliveries,
                deadline,
            } = slot
                && *deadline <= now
            {
                let at = deadline.after(limits.backoff_after(*deliveries));
                *slot = Slot::Due {
                    message: message.clone(),
                    deliveries: *deliveries,
                    at,
                };
            }
            let Slot::Due {
                message,
                deliveries,
                at,
            } = slot
            else {
                soonest = soonest.min(slot.timer().unwrap_or(Millis(u64::MAX)));
                continue;
            };
            if *at > now {
                soonest = soonest.min(*at);
                continue;
            }
            if *deliveries >= limits.max_deliveries {
                dead.push(DeadLetter {
                    message: message.clone(),
                    deliveries: *deliveries,
                    reason: DeadReason::MaxDeliveries,
                });
                self.in_flight -= 1;
                self.in_flight_bytes -= message.size();
                self.counters.dead_lettered += 1;
                *slot = Slot::Done(message.token.clone());
                continue;
            }
            if !out.is_empty() && bytes + message.size() > budget {
                soonest = soonest.min(*at);
                continue;
            }
            bytes += message.size();
            let count = *deliveries + 1;
            if count > 1 {
                self.counters.redelivered += 1;
            }
            let message = message.clone();
            let deadline = now.after(limits.ack_timeout);
            soonest = soonest.min(deadline);
            *slot = Slot::Out {
                message: message.clone(),
                deliveries: count,
                deadline,
            };
            out.push(Delivery {
                epoch,
                count,
                message,
            });
        }
        self.timers_from = soonest;
        self.redriven.retain(|_, s| !s.is_done());
        self.advance_floor();
        (out, dead)
    }

    /// How many new messages the consumer may take now.
    pub fn room(&self) -> usize {
        if self.paused || self.in_flight_bytes >= MAX_IN_FLIGHT_BYTES {
            return 0;
        }
        let window = (WINDOW_FACTOR * self.limits.max_in_flight).saturating_sub(self.window.len());
        self.limits
            .max_in_flight
            .saturating_sub(self.in_flight)
            .min(window)
    }

    /// Takes the feed's next message (its token above the horizon, or it is ignored: the
    /// feed may bring again what a re-opened stream passed): delivered now, unless the
    /// persisted state remembers it done or nacked until later.
    pub fn offer(&mut self, message: Arc<Message>, now: Millis) -> Option<Delivery> {
        if self.horizon().is_some_and(|h| message.token <= *h) {
            return None;
        }
        self.horizon = Some(Mark::Message(message.clone()));
        // Runs that end before this message, the feed no longer brings.
        while self
            .remembered
            .front()
            .is_some_and(|r| r.end < message.token)
        {
            self.remembered.pop_front();
        }
        let remembered = self.remembered.front().map(|r| r.state);
        if self
            .remembered
            .front()
            .is_some_and(|r| r.end == message.token)
        {
            self.remembered.pop_front();
        }
        let (deliveries, at) = match remembered {
            Some(Remembered::Done) => {
                self.window.push_back(Slot::Done(message.token.clone()));
                self.advance_floor();
                return None;
            }
            Some(Remembered::Delivered { deliveries, at }) => (deliveries, at),
            None => (0, None),
        };
        self.counters.delivered += 1;
        self.in_flight += 1;
        self.in_flight_bytes += message.size();
        let waits = at.is_some_and(|at| at > now);
        if waits || deliveries >= self.limits.max_deliveries {
            // Owed again from a restore after its nack's delay, or to dead-letter: through
            // `take_due`.
            let at = at.unwrap_or(now);
            self.timers_from = self.timers_from.min(at);
            self.window.push_back(Slot::Due {
                message,
                deliveries,
                at,
            });
            return None;
        }
        // Delivered now: for the first time, or again after a restore (in token order, so
        // before anything newer).
        let count = deliveries + 1;
        if count > 1 {
            self.counters.redelivered += 1;
        }
        let deadline = now.after(self.limits.ack_timeout);
        self.timers_from = self.timers_from.min(deadline);
        self.window.push_back(Slot::Out {
            message: message.clone(),
            deliveries: count,
            deadline,
        });
        Some(Delivery {
            epoch: self.epoch,
            count,
            message,
        })
    }

    /// The feed has read through `token` (a post-batch resume token) with nothing more for
    /// this consumer: the horizon moves there, and with nothing in the window so does the
    /// floor, so a rarely matching stream does not hold the consumer far back.
    pub fn scanned(&mut self, token: &ResumeToken) {
        if self.horizon().is_some_and(|h| token <= h) {
            return;
        }
        self.horizon = Some(Mark::Token(token.clone()));
        while self.remembered.front().is_some_and(|r| r.end <= *token) {
            self.remembered.pop_front();
        }
        self.advance_floor();
    }

    /// Acks `ids`: each completes its message (if not done already).
    pub fn ack(&mut self, ids: &[DeliveryId], now: Millis) -> (Outcome, Vec<ResumeToken>) {
        let mut outcome = Outcome::default();
        let mut redriven_done = Vec::new();
        for id in ids {
            if self.passed(id) {
                outcome.late += 1;
                continue;
            }
            let Some((slot, redriven)) = self.slot_mut(id) else {
                outcome.unknown += 1;
                continue;
            };
            let Some(done) = complete(slot, now) else {
                outcome.late += 1;
                continue;
            };
            if redriven {
                redriven_done.push(id.token.clone());
            }
            self.count_acked(done, &mut outcome);
        }
        self.redriven.retain(|_, s| !s.is_done());
        self.advance_floor();
        (outcome, redriven_done)
    }

    /// Acks every message of the window out or due at or before `through` (a cumulative ack,
    /// for a consumer read by one reader at a time); redriven dead letters are acked by id.
    pub fn ack_through(&mut self, through: &DeliveryId, now: Millis) -> Outcome {
        let mut outcome = Outcome::default();
        if through.epoch != self.epoch {
            outcome.unknown = 1;
            return outcome;
        }
        // The window's prefix at or before `through`: all of it done, it leaves the window
        // and the floor passes it.
        while self
            .window
            .front()
            .is_some_and(|s| *s.token() <= through.token)
        {
            let Some(slot) = self.window.pop_front() else {
                break;
            };
            self.floor = Some(match slot {
                Slot::Out {
                    message, deadline, ..
                } => {
                    let late = deadline <= now;
                    self.count_acked(Completed::of(&message, late), &mut outcome);
                    Mark::Message(message)
                }
                Slot::Due { message, .. } => {
                    self.count_acked(Completed::of(&message, true), &mut outcome);
                    Mark::Message(message)
                }
                Slot::Done(token) => Mark::Token(token),
            });
        }
        if outcome.applied == 0 {
            // Everything through it was done already, or it names nothing held.
            if self.passed(through) {
                outcome.late = 1;
            } else {
                outcome.unknown = 1;
            }
        }
        self.advance_floor();
        outcome
    }

    fn count_acked(&mut self, done: Completed, outcome: &mut Outcome) {
        self.in_flight -= 1;
        self.in_flight_bytes -= done.bytes;
        self.counters.acked += 1;
        outcome.applied += 1;
        if done.late {
            outcome.late += 1;
            self.counters.late += 1;
        }
    }

    /// Extends the deadline of each out message named (`inProgress`).
    pub fn extend(&mut self, ids: &[DeliveryId], now: Millis) -> Outcome {
        let mut outcome = Outcome::default();
        let deadline_now = now.after(self.limits.ack_timeout);
        for id in ids {
            if self.passed(id) {
                outcome.late += 1;
                continue;
            }
            match self.slot_mut(id) {
                None => outcome.unknown += 1,
                Some((Slot::Out { deadline, .. }, _)) => {
                    *deadline = deadline_now;
                    outcome.applied += 1;
                }
                Some(_) => outcome.late += 1,
            }
        }
        outcome
    }

    /// Nacks `ids`: each out message is due again after `retry` (the backoff schedule
    /// without one), or is dead-lettered now.
    pub fn nack(
        &mut self,
        ids: &[DeliveryId],
        now: Millis,
        retry: Option<Duration>,
        dead_letter: bool,
    ) -> (Outcome, Vec<DeadLetter>) {
        let mut outcome = Outcome::default();
        let mut dead = Vec::new();
        let backoff = self.limits.clone();
        let mut soonest = self.timers_from;
        for id in ids {
            if self.passed(id) {
                outcome.late += 1;
                continue;
            }
            let Some((slot, _)) = self.slot_mut(id) else {
                outcome.unknown += 1;
                continue;
            };
            let Slot::Out {
                message,
                deliveries,
                ..
            } = slot
            else {
                outcome.late += 1;
                continue;
            };
            outcome.applied += 1;
            if dead_letter {
                dead.push(DeadLetter {
                    message: message.clone(),
                    deliveries: *deliveries,
                    reason: DeadReason::Nacked,
                });
                let bytes = message.size();
                *slot = Slot::Done(message.token.clone());
                self.in_flight -= 1;
                self.in_flight_bytes -= bytes;
                self.counters.dead_lettered += 1;
                continue;
            }
            let wait = retry.unwrap_or_else(|| backoff.backoff_after(*deliveries));
            let at = now.after(wait);
            soonest = soonest.min(at);
            *slot = Slot::Due {
                message: message.clone(),
                deliveries: *deliveries,
                at,
            };
        }
        self.timers_from = soonest;
        self.redriven.retain(|_, s| !s.is_done());
        self.advance_floor();
        (outcome, dead)
    }

    /// Puts dead letters back: each is delivered again (its count restarting) before any new
    /// message, and its ack removes it from the dead letters (the caller's part).
    pub fn redrive(&mut self, messages: Vec<Arc<Message>>, now: Millis) {
        for message in messages {
            if self.redriven.contains_key(&message.token) || self.position(&message.token).is_some()
            {
                continue;
            }
            self.in_flight += 1;
            self.in_flight_bytes += message.size();
            self.counters.delivered += 1;
            self.counters.dead_lettered = self.counters.dead_lettered.saturating_sub(1);
            self.timers_from = self.timers_from.min(now);
            self.redriven.insert(
                message.token.clone(),
                Slot::Due {
                    message,
                    deliveries: 0,
                    at: now,
                },
            );
        }
    }

    /// Starts over at `floor` in a new epoch: everything held is dropped (ids of the old epoch
    /// ack nothing), the counters of messages in flight leave with them.
    pub fn reset(&mut self, floor: Option<ResumeToken>) {
        self.epoch = self.epoch.wrapping_add(1);
        self.floor = floor.map(Mark::Token);
        self.horizon = self.floor.clone();
        self.window.clear();
        self.timers_from = Millis(u64::MAX);
        self.redriven.clear();
        self.remembered.clear();
        self.in_flight = 0;
        self.in_flight_bytes = 0;
        self.counters.delivered = self.counters.acked + self.counters.dead_lettered;
    }

    /// No out message's deadline passes, and no due one comes due, before it (it may be
    /// earlier than the next one: a waiting read wakes then and finds out).
    pub fn next_timer(&self) -> Option<Millis> {
        (self.timers_from.0 != u64::MAX).then_some(self.timers_from)
    }

    /// Whether a message may be due now (a read would not wait).
    pub fn has_due(&self, now: Millis) -> bool {
        !self.paused && self.next_timer().is_some_and(|t| t <= now)
    }

    /// Whether `id` names a message of this epoch the floor has passed (done already).
    fn passed(&self, id: &DeliveryId) -> bool {
        id.epoch == self.epoch
            && self.floor().is_some_and(|f| id.token <= *f)
            && !self.redriven.contains_key(&id.token)
    }

    /// Where the message `token` is in the window.
    fn position(&self, token: &ResumeToken) -> Option<usize> {
        self.window.binary_search_by(|s| s.token().cmp(token)).ok()
    }

    fn slot_mut(&mut self, id: &DeliveryId) -> Option<(&mut Slot, bool)> {
        if id.epoch != self.epoch {
            return None;
        }
        if self.redriven.contains_key(&id.token) {
            return self.redriven.get_mut(&id.token).map(|slot| (slot, true));
        }
        let i = self.position(&id.token)?;
        Some((&mut self.window[i], false))
    }

    /// Pops done messages off the window's front; an empty window lets the floor reach the
    /// horizon.
    fn advance_floor(&mut self) {
        while self.window.front().is_some_and(Slot::is_done) {
            if let Some(Slot::Done(token)) = self.window.pop_front() {
                self.floor = Some(Mark::Token(token));
            }
        }
        if self.window.is_empty() && self.remembered.is_empty() && self.horizon() > self.floor() {
            self.floor.clone_from(&self.horizon);
        }
    }

    /// Deliveries made of the message `token` (0 when it is not held or done): for tests and
    /// the consumer's listing.
    pub fn deliveries_of(&self, token: &ResumeToken) -> u32 {
        self.position(token)
            .map(|i| &self.window[i])
            .or_else(|| self.redriven.get(token))
            .map_or(0, Slot::deliveries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn token(n: u64) -> ResumeToken {
        ResumeToken::from_parts(n.to_be_bytes().to_vec(), Vec::new())
    }

    fn message(n: u64) -> Arc<Message> {
        Arc::new(Message::new(token(n), Bytes::from(vec![0u8; 10])))
    }

    fn limits() -> Limits {
        Limits {
            ack_timeout: Duration::from_secs(30),
            max_deliveries: 3,
            backoff: Vec::new(),
            max_in_flight: 10,
        }
    }

    fn id(c: &Consumer, n: u64) -> DeliveryId {
        DeliveryId {
            epoch: c.epoch(),
            token: token(n),
        }
    }

    const T0: Millis = Millis(1_000_000);

    #[test]
    fn delivery_ids_round_trip_and_refuse_garbage() {
        let t = token(42);
        let id = DeliveryId::format(7, &t);
        assert_eq!(
            DeliveryId::parse(&id),
            Some(DeliveryId { epoch: 7, token: t })
        );
        for bad in ["", "7", "x.AA", "7.!!", &"7.".repeat(3000)] {
            assert_eq!(DeliveryId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn acks_move_the_floor_over_the_acked_prefix_only() {
        let mut c = Consumer::new(limits(), 0, None);
        for n in 1..=3 {
            assert!(c.offer(message(n), T0).is_some());
        }
        let (o, _) = c.ack(&[id(&c, 2)], T0);
        assert_eq!(o.applied, 1);
        assert_eq!(c.floor(), None, "1 is unacked: the floor stays");
        c.ack(&[id(&c, 1)], T0);
        assert_eq!(c.floor(), Some(&token(2)));
        let (again, _) = c.ack(&[id(&c, 1), id(&c, 2)], T0);
        assert_eq!((again.applied, again.late), (0, 2), "acking twice is late");
        c.ack(&[id(&c, 3)], T0);
        assert_eq!(c.floor(), Some(&token(3)));
        assert_eq!(c.counters.acked, 3);
    }

    #[test]
    fn an_ack_through_a_message_acks_everything_out_or_due_up_to_it() {
        let mut c = Consumer::new(limits(), 0, None);
        for n in 1..=5 {
            assert!(c.offer(message(n), T0).is_some());
        }
        c.ack(&[id(&c, 2)], T0);
        c.nack(&[id(&c, 3)], T0, None, false);
        let o = c.ack_through(&id(&c, 4), T0);
        assert_eq!(
            (o.applied, o.late, o.unknown),
            (3, 1, 0),
            "1, 3 (due: late) and 4"
        );
        assert_eq!(c.floor(), Some(&token(4)));
        assert_eq!((c.in_flight(), c.counters.acked), (1, 4));
        let again = c.ack_through(&id(&c, 4), T0);
        assert_eq!((again.applied, again.late), (0, 1), "done already: late");
        let stale = DeliveryId {
            epoch: c.epoch() + 1,
            token: token(5),
        };
        assert_eq!(c.ack_through(&stale, T0).unknown, 1, "another epoch's id");
        assert_eq!(c.in_flight(), 1, "5 is still out");
        assert_eq!(c.ack_through(&id(&c, 9), T0).applied, 1);
        assert_eq!(c.floor(), Some(&token(5)));
    }

    #[test]
    fn an_unacked_message_comes_again_after_its_timeout_and_not_before() {
        let mut c = Consumer::new(limits(), 0, None);
        c.offer(message(1), T0);
        let just_before = T0.after(Duration::from_millis(29_999));
        assert!(c.take_due(just_before, 10, usize::MAX).0.is_empty());
        let (again, _) = c.take_due(T0.after(Duration::from_secs(30)), 10, usize::MAX);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].count, 2);
        assert_eq!(c.counters.redelivered, 1);
    }

    #[test]
    fn the_delivery_past_max_deliveries_dead_letters_the_message() {
        let mut c = Consumer::new(limits(), 0, None);
        c.offer(message(1), T0);
        c.offer(message(2), T0);
        c.ack(&[id(&c, 2)], T0);
        let mut now = T0;
        for expected in 2..=3 {
            now = now.after(Duration::from_secs(30));
            let (d, dead) = c.take_due(now, 10, usize::MAX);
            assert_eq!((d.len(), dead.len()), (1, 0));
            assert_eq!(d[0].count, expected);
        }
        now = now.after(Duration::from_secs(30));
        let (d, dead) = c.take_due(now, 10, usize::MAX);
        assert!(d.is_empty());
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].deliveries, 3);
        assert_eq!(dead[0].reason, DeadReason::MaxDeliveries);
        assert_eq!(
            c.floor(),
            Some(&token(2)),
            "a dead letter no longer holds the floor"
        );
        assert_eq!(c.counters.dead_lettered, 1);
    }

    #[test]
    fn nacks_redeliver_at_once_after_retry_in_or_by_the_backoff_schedule() {
        let mut l = limits();
        l.backoff = vec![Duration::from_secs(1), Duration::from_secs(5)];
        let mut c = Consumer::new(l, 0, None);
        c.offer(message(1), T0);
        let (o, _) = c.nack(&[id(&c, 1)], T0, None, false);
        assert_eq!(o.applied, 1);
        assert!(
            c.take_due(T0.after(Duration::from_millis(999)), 10, usize::MAX)
                .0
                .is_empty()
        );
        assert_eq!(
            c.take_due(T0.after(Duration::from_secs(1)), 10, usize::MAX)
                .0
                .len(),
            1
        );
        let t1 = T0.after(Duration::from_secs(1));
        c.nack(&[id(&c, 1)], t1, Some(Duration::from_millis(10)), false);
        assert_eq!(
            c.take_due(t1.after(Duration::from_millis(10)), 10, usize::MAX)
                .0
                .len(),
            1
        );
        // The third delivery times out: the schedule's last entry applies after the deadline.
        let t2 = t1.after(Duration::from_millis(10));
        let deadline = t2.after(Duration::from_secs(30));
        assert!(
            c.take_due(deadline.after(Duration::from_millis(4_999)), 10, usize::MAX)
                .0
                .is_empty()
        );
        let (d, dead) = c.take_due(deadline.after(Duration::from_secs(5)), 10, usize::MAX);
        assert!(d.is_empty(), "the fourth delivery would pass maxDeliveries");
        assert_eq!(dead.len(), 1);
    }

    #[test]
    fn nack_with_dead_letter_sets_aside_at_once_and_redrive_brings_it_back() {
        let mut c = Consumer::new(limits(), 0, None);
        c.offer(message(1), T0);
        let (_, dead) = c.nack(&[id(&c, 1)], T0, None, true);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reason, DeadReason::Nacked);
        assert_eq!(c.floor(), Some(&token(1)));
        c.redrive(vec![dead[0].message.clone()], T0);
        let (d, _) = c.take_due(T0, 10, usize::MAX);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].count, 1, "a redriven message's count starts over");
        let (o, done) = c.ack(&[id(&c, 1)], T0);
        assert_eq!(o.applied, 1);
        assert_eq!(done, vec![token(1)]);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn in_progress_extends_the_deadline() {
        let mut c = Consumer::new(limits(), 0, None);
        c.offer(message(1), T0);
        let t = T0.after(Duration::from_secs(20));
        assert_eq!(c.extend(&[id(&c, 1)], t).applied, 1);
        assert!(
            c.take_due(T0.after(Duration::from_secs(49)), 10, usize::MAX)
                .0
                .is_empty()
        );
        assert_eq!(
            c.take_due(T0.after(Duration::from_secs(50)), 10, usize::MAX)
                .0
                .len(),
            1
        );
    }

    #[test]
    fn ids_from_before_a_reset_ack_nothing() {
        let mut c = Consumer::new(limits(), 0, None);
        c.offer(message(1), T0);
        let old = id(&c, 1);
        c.reset(Some(token(0)));
        c.offer(message(1), T0);
        let (o, _) = c.ack(&[old], T0);
        assert_eq!((o.applied, o.unknown), (0, 1));
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn max_in_flight_and_the_window_bound_the_room() {
        let mut l = limits();
        l.max_in_flight = 2;
        let mut c = Consumer::new(l, 0, None);
        assert_eq!(c.room(), 2);
        c.offer(message(1), T0);
        c.offer(message(2), T0);
        assert_eq!(c.room(), 0);
        c.ack(&[id(&c, 2)], T0);
        assert_eq!(c.room(), 1, "2 is done but 1 holds the floor");
        for n in 3..=8 {
            let d = c.offer(message(n), T0).expect("delivered");
            c.ack(&[DeliveryId::parse(&d.id()).unwrap()], T0);
        }
        assert_eq!(c.room(), 0, "the window holds 4 × maxInFlight");
        c.set_paused(true);
        c.ack(&[id(&c, 1)], T0);
        assert_eq!(c.room(), 0, "a paused consumer takes nothing");
        c.set_paused(false);
        assert_eq!(c.room(), 2);
    }

    #[test]
    fn a_restored_consumer_skips_what_was_done_and_keeps_counts_and_delays() {
        let later = T0.after(Duration::from_secs(60));
        let run = |n, state| Run {
            end: token(n),
            state,
        };
        let remembered = VecDeque::from([
            run(2, Remembered::Done),
            run(
                3,
                Remembered::Delivered {
                    deliveries: 2,
                    at: Some(later),
                },
            ),
            run(
                4,
                Remembered::Delivered {
                    deliveries: 1,
                    at: None,
                },
            ),
        ]);
        let mut c =
            Consumer::restored(limits(), 4, Some(token(1)), remembered, Counters::default());
        assert!(c.offer(message(1), T0).is_none(), "at the floor: passed");
        assert!(c.offer(message(2), T0).is_none(), "done before the restart");
        assert_eq!(c.floor(), Some(&token(2)));
        assert!(c.offer(message(3), T0).is_none(), "nacked until later");
        let again = c
            .offer(message(4), T0)
            .expect("owed again: delivered in token order");
        assert_eq!(again.count, 2, "its delivery count goes on");
        assert!(c.take_due(T0, 10, usize::MAX).0.is_empty());
        let (d, _) = c.take_due(later, 10, usize::MAX);
        assert_eq!(
            (d.len(), d[0].count),
            (2, 3),
            "3 after its delay, 4 after its timeout"
        );
        assert!(d[0].id().starts_with("4."));
    }

    #[test]
    fn a_window_is_remembered_as_runs_and_restored_message_by_message() {
        let mut c = Consumer::new(limits(), 0, Some(token(0)));
        for n in 1..=6 {
            c.offer(message(n), T0).expect("delivered");
        }
        c.ack(&[id(&c, 3), id(&c, 4)], T0);
        let later = T0.after(Duration::from_secs(5));
        c.nack(&[id(&c, 6)], T0, Some(Duration::from_secs(5)), false);
        let runs: Vec<_> = c.runs().into_iter().map(|(t, r)| (t.clone(), r)).collect();
        let once = Remembered::Delivered {
            deliveries: 1,
            at: None,
        };
        let nacked = Remembered::Delivered {
            deliveries: 1,
            at: Some(later),
        };
        assert_eq!(
            runs,
            [
                (token(2), once),
                (token(4), Remembered::Done),
                (token(5), once),
                (token(6), nacked)
            ],
            "two delivered once, two done, one delivered once, one nacked"
        );

        let restored = runs
            .into_iter()
            .map(|(end, state)| Run { end, state })
            .collect();
        let mut c = Consumer::restored(limits(), 0, Some(token(0)), restored, Counters::default());
        let counts: Vec<_> = (1..=7)
            .map(|n| c.offer(message(n), T0).map(|d| d.count))
            .collect();
        assert_eq!(
            counts,
            [Some(2), Some(2), None, None, Some(2), None, Some(1)],
            "each message in its run's state; past the last run, new"
        );
    }

    #[test]
    fn scanning_past_with_nothing_held_moves_the_floor() {
        let mut c = Consumer::new(limits(), 0, None);
        c.scanned(&token(5));
        assert_eq!(c.floor(), Some(&token(5)));
        c.offer(message(6), T0);
        c.scanned(&token(9));
        assert_eq!(c.floor(), Some(&token(5)), "6 is out");
        c.ack(&[id(&c, 6)], T0);
        assert_eq!(c.floor(), Some(&token(9)));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Take(usize),
        Ack(usize),
        AckThrough(usize),
        Nack(usize, Option<u16>, bool),
        Extend(usize),
        Tick(u32),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..6).prop_map(Op::Take),
            (0usize..20).prop_map(Op::Ack),
            (0usize..20).prop_map(Op::AckThrough),
            (0usize..20, proptest::option::of(0u16..5000), any::<bool>())
                .prop_map(|(i, r, d)| Op::Nack(i, r, d)),
            (0usize..20).prop_map(Op::Extend),
            (0u32..40_000).prop_map(Op::Tick),
            Just(Op::Reset),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Random reads, acks, nacks, extensions and clock steps: first deliveries in token
        /// order, no redelivery before a deadline or a nack, counts within maxDeliveries, the
        /// floor monotone within an epoch, the counters balanced, and at the end, with time
        /// run on and every delivery acked, everything is done.
        #[test]
        fn deliveries_keep_their_invariants(ops in proptest::collection::vec(op(), 1..120)) {
            let mut c = Consumer::new(Limits {
                ack_timeout: Duration::from_secs(10),
                max_deliveries: 4,
                backoff: vec![Duration::from_millis(100), Duration::from_secs(2)],
                max_in_flight: 5,
            }, 0, None);
            let mut now = T0;
            let mut next = 1u64;
            let mut last_first = 0u64;
            // Per token: the earliest time it may be delivered again.
            let mut not_before: HashMap<u64, Millis> = HashMap::new();
            let mut out: Vec<(u64, String)> = Vec::new();
            let mut floor = None;
            let n_of = |t: &ResumeToken| u64::from_be_bytes(t.data().try_into().unwrap());
            for op in ops {
                match op {
                    Op::Take(n) => {
                        let (again, _) = c.take_due(now, n, usize::MAX);
                        for d in again {
                            let t = n_of(&d.message.token);
                            prop_assert!(now >= not_before[&t], "redelivered early");
                            prop_assert!(d.count <= 4);
                            not_before.insert(t, now.after(Duration::from_secs(10)));
                            out.push((t, d.id()));
                        }
                        for _ in 0..c.room().min(n) {
                            let Some(d) = c.offer(message(next), now) else { break };
                            prop_assert!(next > last_first, "first deliveries in order");
                            last_first = next;
                            not_before.insert(next, now.after(Duration::from_secs(10)));
                            out.push((next, d.id()));
                            next += 1;
                        }
                    }
                    Op::Ack(i) if !out.is_empty() => {
                        let (_, id) = &out[i % out.len()];
                        c.ack(&[DeliveryId::parse(id).unwrap()], now);
                    }
                    Op::AckThrough(i) if !out.is_empty() => {
                        let (t, id) = &out[i % out.len()];
                        let in_flight = c.in_flight();
                        let o = c.ack_through(&DeliveryId::parse(id).unwrap(), now);
                        prop_assert_eq!(in_flight - c.in_flight(), o.applied as usize);
                        prop_assert!(
                            c.floor().is_some_and(|f| n_of(f) >= *t),
                            "the floor passed what was acked through"
                        );
                    }
                    Op::Nack(i, retry, dead) if !out.is_empty() => {
                        let (t, id) = out[i % out.len()].clone();
                        let retry = retry.map(|ms| Duration::from_millis(u64::from(ms)));
                        let (o, _) = c.nack(&[DeliveryId::parse(&id).unwrap()], now, retry, dead);
                        if o.applied == 1 {
                            // Due at once at the earliest (a nack asked for it).
                            not_before.insert(t, now);
                        }
                    }
                    Op::Extend(i) if !out.is_empty() => {
                        let (t, id) = out[i % out.len()].clone();
                        if c.extend(&[DeliveryId::parse(&id).unwrap()], now).applied == 1 {
                            not_before.insert(t, now.after(Duration::from_secs(10)));
                        }
                    }
                    Op::Tick(ms) => now = now.after(Duration::from_millis(u64::from(ms))),
                    Op::Reset => {
                        let at = c.horizon().cloned();
                        c.reset(at.clone());
                        floor = at;
                        out.clear();
                        not_before.clear();
                    }
                    _ => {}
                }
                prop_assert!(c.floor() >= floor.as_ref(), "the floor went back");
                let soonest = c.window.iter().chain(c.redriven.values()).filter_map(Slot::timer).min();
                if let Some(t) = soonest {
                    prop_assert!(c.next_timer().is_some_and(|b| b <= t), "a timer before the bound");
                }
                prop_assert!(
                    c.window.iter().zip(c.window.iter().skip(1)).all(|(a, b)| a.token() < b.token()),
                    "the window out of token order"
                );
                floor = c.floor().cloned();
                let k = c.counters;
                prop_assert_eq!(k.delivered, k.acked + k.dead_lettered + c.in_flight() as u64);
            }
            // Drain: run time on and ack everything delivered.
            for _ in 0..10 {
                now = now.after(Duration::from_secs(60));
                let (again, _) = c.take_due(now, usize::MAX, usize::MAX);
                let ids: Vec<DeliveryId> =
                    again.iter().map(|d| DeliveryId::parse(&d.id()).unwrap()).collect();
                c.ack(&ids, now);
            }
            prop_assert_eq!(c.in_flight(), 0);
            prop_assert_eq!(c.floor(), c.horizon());
        }

        /// A consumer restored from its runs, fed the same messages again, finds each one
        /// as it was: done ones stay done, the others come again with their counts, or wait
        /// out their nack's delay.
        #[test]
        fn a_restore_from_runs_remembers_every_message(ops in proptest::collection::vec(op(), 1..80)) {
            let limits = Limits {
                ack_timeout: Duration::from_secs(10),
                max_deliveries: 4,
                backoff: vec![Duration::from_millis(100)],
                max_in_flight: 8,
            };
            let mut c = Consumer::new(limits.clone(), 0, None);
            let mut now = T0;
            let mut next = 1u64;
            let mut out: Vec<String> = Vec::new();
            for op in ops {
                match op {
                    Op::Take(n) => {
                        let (again, _) = c.take_due(now, n, usize::MAX);
                        out.extend(again.iter().map(Delivery::id));
                        for _ in 0..c.room().min(n) {
                            let Some(d) = c.offer(message(next), now) else { break };
                            out.push(d.id());
                            next += 1;
                        }
                    }
                    Op::Ack(i) if !out.is_empty() => {
                        c.ack(&[DeliveryId::parse(&out[i % out.len()]).unwrap()], now);
                    }
                    Op::Nack(i, retry, dead) if !out.is_empty() => {
                        let retry = retry.map(|ms| Duration::from_millis(u64::from(ms)));
                        let id = DeliveryId::parse(&out[i % out.len()]).unwrap();
                        c.nack(&[id], now, retry, dead);
                    }
                    Op::Tick(ms) => now = now.after(Duration::from_millis(u64::from(ms))),
                    _ => {}
                }
            }
            let runs: VecDeque<Run> = c
                .runs()
                .into_iter()
                .map(|(end, state)| Run { end: end.clone(), state })
                .collect();
            let mut again = Consumer::restored(limits, 0, c.floor().cloned(), runs, c.counters);
            let first = c.floor().map_or(1, |f| u64::from_be_bytes(f.data().try_into().unwrap()) + 1);
            for n in first..next {
                let expected = match c.position(&token(n)).map(|i| c.window[i].remembered()) {
                    None | Some(Remembered::Done) => None,
                    Some(Remembered::Delivered { deliveries, at }) => {
                        let waits = at.is_some_and(|at| at > now);
                        (!waits && deliveries < 4).then_some(deliveries + 1)
                    }
                };
                prop_assert_eq!(again.offer(message(n), now).map(|d| d.count), expected, "message {}", n);
            }
        }
    }
}
