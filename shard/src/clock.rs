//! Time: the injected wall clock ([`Clock`]) and the shard's hybrid logical clock ([`Hlc`]).
//!
//! The HLC is a pure state machine; the writer and the command layer drive it under one mutex.
//!
//! Invariants:
//! * Every timestamp handed out by [`Hlc::tick`] is strictly greater than every timestamp handed
//!   out or observed before it (oplog `ts` strictly increases).
//! * [`Hlc::observe`] never moves the clock backwards; after it, the next tick is above the
//!   observed time.
//! * The high-water mark `H` ([`Hlc::high_water_mark`]) is below every timestamp that is still
//!   in flight (ticked but not yet visible) and below every future tick, and it never exceeds
//!   the durably reserved bound. After a restart the clock starts at the reserved bound, so
//!   every later tick is above every `H` ever given out, even within the same wall-clock second.

use std::sync::atomic::{AtomicU64, Ordering};

use resume::ClusterTime;

/// The wall clock. Library code takes time only from here.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;
}

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(millis: u64) -> Self {
        ManualClock(AtomicU64::new(millis))
    }

    pub fn set(&self, millis: u64) {
        self.0.store(millis, Ordering::SeqCst);
    }

    pub fn advance(&self, millis: u64) {
        self.0.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Seconds of the wall clock, saturated into a u32 BSON timestamp second.
pub fn wall_secs(millis: u64) -> u32 {
    u32::try_from(millis / 1000).unwrap_or(u32::MAX)
}

/// How far ahead of the clock the reservation is kept (in seconds) once renewed, and the margin
/// below which it is renewed.
const RESERVE_AHEAD_SECS: u32 = 3;
const RENEW_MARGIN_SECS: u32 = 2;

/// The hybrid logical clock.
#[derive(Debug, Clone)]
pub struct Hlc {
    /// The highest time handed out or observed.
    last: ClusterTime,
    /// The durable reservation: nothing above it is ever advertised as a high-water mark.
    reserved: ClusterTime,
    /// The first timestamp ticked since the writer last published, if a batch is in flight.
    inflight: Option<ClusterTime>,
    /// Prepare timestamps of prepared, undecided transactions (with how many at each): the
    /// high-water mark stays below the lowest until its transaction is decided.
    holds: std::collections::BTreeMap<ClusterTime, usize>,
    /// Holds taken by the batch in flight: dropped if it fails.
    tentative: Vec<ClusterTime>,
}

impl Hlc {
    /// The clock after a (re)start: above the durable reservation and above the last oplog entry.
    pub fn recover(reserved: ClusterTime, last_oplog: ClusterTime) -> Hlc {
        Hlc {
            last: reserved.max(last_oplog),
            reserved,
            inflight: None,
            holds: std::collections::BTreeMap::new(),
            tentative: Vec::new(),
        }
    }

    /// The current time `max(last, (wall, 0))`, recorded so later ticks exceed it.
    pub fn now(&mut self, wall_millis: u64) -> ClusterTime {
        let wall = ClusterTime::new(wall_secs(wall_millis), 0);
        if wall > self.last {
            self.last = wall;
        }
        self.last
    }

    /// Advances the clock to at least `t` (gossip from the router or a client).
    pub fn observe(&mut self, t: ClusterTime) {
        if t > self.last && t < ClusterTime::MAX {
            self.last = t;
        }
    }

    /// A new timestamp, strictly above everything before it; marks a write in flight.
    pub fn tick(&mut self, wall_millis: u64) -> ClusterTime {
        let wall = wall_secs(wall_millis);
        let ts = if wall > self.last.secs {
            ClusterTime::new(wall, 1)
        } else {
            self.last.next()
        };
        self.last = ts;
        if self.inflight.is_none() {
            self.inflight = Some(ts);
        }
        ts
    }

    /// Everything ticked so far is visible (or was abandoned): release the hold on `H`. The
    /// batch's holds ([`Hlc::hold_in_batch`]) stay.
    pub fn clear_inflight(&mut self) {
        self.inflight = None;
        self.tentative.clear();
    }

    /// The batch in flight failed: the holds it took go (its prepares never happened).
    pub fn abandon_batch_holds(&mut self) {
        for p in std::mem::take(&mut self.tentative) {
            self.release(p);
        }
    }

    /// [`Hlc::hold`] from inside a writer batch, taken back if the batch fails.
    pub fn hold_in_batch(&mut self, p: ClusterTime) {
        self.hold(p);
        self.tentative.push(p);
    }

    /// `H`: every entry made visible from now on has `ts > H`, and no prepared transaction
    /// is undecided at or below it.
    pub fn high_water_mark(&mut self, wall_millis: u64) -> ClusterTime {
        let base = match self.inflight {
            Some(first) => first.prev(),
            None => self.now(wall_millis),
        };
        let held = match self.holds.keys().next() {
            Some(p) => p.prev(),
            None => ClusterTime::MAX,
        };
        base.min(self.reserved).min(held)
    }

    /// A transaction prepared at `p`: hold the high-water mark below it until [`Hlc::release`].
    pub fn hold(&mut self, p: ClusterTime) {
        *self.holds.entry(p).or_default() += 1;
    }

    /// The transaction prepared at `p` is decided.
    pub fn release(&mut self, p: ClusterTime) {
        if let Some(n) = self.holds.get_mut(&p) {
            *n -= 1;
            if *n == 0 {
                self.holds.remove(&p);
            }
        }
    }

    /// Whether a prepared transaction is undecided.
    pub fn has_holds(&self) -> bool {
        !self.holds.is_empty()
    }

    /// How many prepared transactions are undecided (one hold each).
    pub fn hold_count(&self) -> usize {
        self.holds.values().sum()
    }

    pub fn reserved(&self) -> ClusterTime {
        self.reserved
    }

    /// The new reservation to persist, when the current one is close to running out.
    pub fn reservation_needed(&self, wall_millis: u64) -> Option<ClusterTime> {
        let base = self.last.secs.max(wall_secs(wall_millis));
        let needed = ClusterTime::new(base.saturating_add(RENEW_MARGIN_SECS), 0);
        (self.reserved < needed)
            .then(|| ClusterTime::new(base.saturating_add(RESERVE_AHEAD_SECS), 0))
    }

    /// Records that `r` is now durable.
    pub fn set_reserved(&mut self, r: ClusterTime) {
        if r > self.reserved {
            self.reserved = r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_strictly_increase_even_when_the_wall_clock_goes_back() {
        let mut c = Hlc::recover(ClusterTime::ZERO, ClusterTime::ZERO);
        let a = c.tick(10_000);
        let b = c.tick(10_000);
        let d = c.tick(5_000);
        assert!(a < b && b < d);
        assert_eq!(a, ClusterTime::new(10, 1));
    }

    #[test]
    fn observed_time_is_never_undercut() {
        let mut c = Hlc::recover(ClusterTime::ZERO, ClusterTime::ZERO);
        c.observe(ClusterTime::new(100, 7));
        assert!(c.tick(1_000) > ClusterTime::new(100, 7));
        c.observe(ClusterTime::new(50, 0));
        assert!(c.now(1_000) >= ClusterTime::new(100, 8));
    }

    #[test]
    fn a_prepared_transaction_holds_the_high_water_mark_below_its_prepare_time() {
        let mut c = Hlc::recover(ClusterTime::new(100, 0), ClusterTime::new(10, 0));
        c.set_reserved(ClusterTime::new(300, 0));
        let p = c.tick(10_000);
        c.clear_inflight();
        c.hold(p);
        c.hold(p);
        let later = c.tick(10_000);
        c.clear_inflight();
        assert!(later > p);
        assert_eq!(c.high_water_mark(10_000), p.prev());
        c.release(p);
        assert_eq!(c.high_water_mark(10_000), p.prev(), "two transactions at p");
        c.release(p);
        assert!(!c.has_holds());
        assert_eq!(c.high_water_mark(10_000), later);
    }

    #[test]
    fn high_water_mark_stays_below_inflight_and_reservation() {
        let mut c = Hlc::recover(ClusterTime::new(20, 0), ClusterTime::ZERO);
        // Capped by the reservation.
        assert_eq!(c.high_water_mark(30_000), ClusterTime::new(20, 0));
        c.set_reserved(ClusterTime::new(40, 0));
        let h = c.high_water_mark(30_000);
        assert_eq!(h, ClusterTime::new(30, 0));
        let t = c.tick(30_000);
        assert!(c.high_water_mark(31_000) < t);
        c.clear_inflight();
        assert!(c.high_water_mark(31_000) >= t);
        assert!(c.tick(31_000) > c.clone().high_water_mark(0).min(t));
    }

    #[test]
    fn restart_starts_above_every_advertised_high_water_mark() {
        let mut c = Hlc::recover(ClusterTime::ZERO, ClusterTime::ZERO);
        let r = c.reservation_needed(5_000).unwrap();
        c.set_reserved(r);
        let h = c.high_water_mark(5_999);
        // Crash; wall clock even goes back.
        let mut c2 = Hlc::recover(c.reserved(), ClusterTime::ZERO);
        assert!(c2.tick(1_000) > h);
    }

    #[test]
    fn reservation_is_renewed_before_it_runs_out() {
        let mut c = Hlc::recover(ClusterTime::ZERO, ClusterTime::ZERO);
        let r = c.reservation_needed(10_000).unwrap();
        assert_eq!(r, ClusterTime::new(13, 0));
        c.set_reserved(r);
        assert_eq!(c.reservation_needed(11_900), None);
        assert!(c.reservation_needed(12_000).is_some());
        // Gossip far ahead also needs a new reservation.
        c.observe(ClusterTime::new(50, 0));
        assert!(
            c.reservation_needed(12_000)
                .is_some_and(|r| r > ClusterTime::new(50, 0))
        );
    }
}
