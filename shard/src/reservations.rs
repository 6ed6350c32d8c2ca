//! Keys held by ordered batches between their validation and their commit.
//!
//! An ordered `insert` that spans shards must apply nothing after its first failing document,
//! on any shard. The router therefore validates before it writes: every shard runs its part
//! of the batch as a dry run (`_shardsvrReserveInsert`), stops at its own first failure, and
//! holds the keys its validated documents will write (their `_id` and unique-index entries).
//! The router then commits on every shard only the documents that come before the first
//! failure of all shards (`_shardsvrCommitReservation`), one durable commit per shard.
//! Holding the keys is what keeps the validation true until the commit.
//!
//! Invariants:
//! * a key is held by at most one reservation, and only its own commit may create it;
//! * a plain write that would create a held key waits until the reservation ends, then runs
//!   (and finds the document there, or not), as it waits for a prepared transaction's
//!   decision on a key that one holds; a transaction that wrote one fails its commit or
//!   prepare with `WriteConflict`; a reservation that meets one stops there without waiting,
//!   so two batches can never wait on each other;
//! * a reservation ends when it commits, is released, or expires after [`LIFETIME`] (its
//!   router went away); every end wakes the writes waiting on holds;
//! * ids are never reused across runs of the shard: each run numbers its reservations after a
//!   random run number of its own ([`Reservations::of_this_run`]), so a router's commit of a
//!   reservation from before a restart can never commit another batch's, and is told that
//!   the restart ended it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bson::Document;

use crate::session::RetryInfo;
use crate::storage::Table;

/// How long a reservation lives without its commit or release.
pub const LIFETIME: Duration = Duration::from_secs(30);

/// The longest a waiting write sleeps before it looks again (it is woken sooner when holds
/// move).
pub const RECHECK: Duration = Duration::from_millis(200);

/// A key of one table.
pub type Key = (Table, Vec<u8>);

/// What a reservation will insert when it commits: the validated documents, in order.
#[derive(Debug, Clone)]
pub struct Batch {
    pub db: String,
    pub coll: String,
    pub docs: Vec<Document>,
    pub retry: Option<RetryInfo>,
}

struct Reservation {
    batch: Option<Batch>,
    keys: Vec<Key>,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    holders: HashMap<Key, u64>,
    by_id: HashMap<u64, Reservation>,
}

/// A reservation being committed: it ends when this is dropped, however its commit ends.
pub struct Taken<'a> {
    reservations: &'a Reservations,
    id: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.reservations.release(self.id);
    }
}

/// The reservations of a shard.
pub struct Reservations {
    inner: Mutex<Inner>,
    /// Keys held (a cheap check for the common case of none).
    held: AtomicUsize,
    /// This run's number, in the high bits of every id it gives (below 2^31: ids stay
    /// positive as BSON longs).
    run: u64,
    next_id: AtomicU64,
    /// How many reservations have ended: a write that met a hold waits for it to move.
    generation: AtomicU64,
    ended: tokio::sync::Notify,
}

impl Default for Reservations {
    fn default() -> Reservations {
        let run = u64::from(rand::random::<u32>() >> 1).max(1);
        Reservations {
            inner: Mutex::default(),
            held: AtomicUsize::new(0),
            run,
            next_id: AtomicU64::new(run << 32),
            generation: AtomicU64::new(0),
            ended: tokio::sync::Notify::new(),
        }
    }
}

impl Reservations {
    /// Whether `id` was given by this run of the shard (else an earlier run gave it, and the
    /// restart ended it).
    pub fn of_this_run(&self, id: u64) -> bool {
        id >> 32 == self.run
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any key is held.
    pub fn any(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }

    /// The reservation holding `key`, if any.
    pub fn holder(&self, table: Table, key: &[u8]) -> Option<u64> {
        if !self.any() {
            return None;
        }
        self.lock().holders.get(&(table, key.to_vec())).copied()
    }

    /// Holds `keys` for `batch`; returns the reservation's id. The caller has checked that no
    /// other reservation holds them (the writer thread does both, with no write in between).
    pub fn hold(&self, batch: Batch, keys: Vec<Key>) -> u64 {
        // Reservations left behind by a router that went away end here at the latest (or
        // when a write meets one of their keys).
        self.expire();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut inner = self.lock();
        for k in &keys {
            inner.holders.insert(k.clone(), id);
        }
        inner.by_id.insert(
            id,
            Reservation {
                batch: Some(batch),
                keys,
                expires: Instant::now() + LIFETIME,
            },
        );
        self.held.store(inner.holders.len(), Ordering::Release);
        id
    }

    /// Takes the batch of reservation `id` to commit it; its keys stay held (it no longer
    /// expires) until the returned guard is dropped. `None` when it expired, was taken or
    /// never existed.
    pub fn take(&self, id: u64) -> Option<(Batch, Taken<'_>)> {
        let mut inner = self.lock();
        let r = inner.by_id.get_mut(&id)?;
        if r.expires <= Instant::now() {
            return None;
        }
        let batch = r.batch.take()?;
        Some((
            batch,
            Taken {
                reservations: self,
                id,
            },
        ))
    }

    /// Ends reservation `id` (idempotent) and wakes the writes waiting on holds.
    pub fn release(&self, id: u64) {
        let mut inner = self.lock();
        if let Some(r) = inner.by_id.remove(&id) {
            for k in r.keys {
                inner.holders.remove(&k);
            }
        }
        self.held.store(inner.holders.len(), Ordering::Release);
        drop(inner);
        self.holds_moved();
    }

    /// Wakes the writes waiting on holds: a reservation ended, or a prepared transaction was
    /// decided (its keys are held the same way).
    pub fn holds_moved(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.ended.notify_waiters();
    }

    /// Ends the reservations past their lifetime; returns when the next one expires.
    fn expire(&self) -> Option<Instant> {
        let now = Instant::now();
        let expired: Vec<u64> = {
            let inner = self.lock();
            inner
                .by_id
                .iter()
                .filter(|(_, r)| r.batch.is_some() && r.expires <= now)
                .map(|(id, _)| *id)
                .collect()
        };
        for id in expired {
            tracing::warn!(reservation = id, "an ordered batch's reservation expired");
            self.release(id);
        }
        self.lock()
            .by_id
            .values()
            .filter(|r| r.batch.is_some())
            .map(|r| r.expires)
            .min()
    }

    /// The count of ended reservations: read it before a write, and [`Reservations::wait`]
    /// for it to move when the write met a hold.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Waits until holds have moved since [`Reservations::generation`] read `seen` (a
    /// reservation ended or expired, a prepared transaction was decided), or for
    /// [`RECHECK`] at most.
    pub async fn wait(&self, seen: u64) {
        let ended = self.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.generation() != seen {
            return;
        }
        let recheck = Instant::now() + RECHECK;
        let until = self.expire().map_or(recheck, |next| next.min(recheck));
        let _ = tokio::time::timeout_at(until.into(), ended).await;
        self.expire();
    }

    /// How many reservations are open (for tests and `serverStatus`).
    pub fn open(&self) -> usize {
        self.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch {
            db: "d".into(),
            coll: "c".into(),
            docs: vec![],
            retry: None,
        }
    }

    #[test]
    fn a_key_is_held_until_its_reservation_is_released() {
        let r = Reservations::default();
        assert!(!r.any());
        let id = r.hold(batch(), vec![(Table::Documents, b"k".to_vec())]);
        assert_eq!(r.holder(Table::Documents, b"k"), Some(id));
        assert_eq!(r.holder(Table::Documents, b"other"), None);
        let taken = r.take(id).expect("the batch");
        assert!(r.take(id).is_none(), "a batch is taken once");
        assert_eq!(
            r.holder(Table::Documents, b"k"),
            Some(id),
            "taken, still held"
        );
        drop(taken);
        assert_eq!(r.holder(Table::Documents, b"k"), None);
        assert!(!r.any());
        r.release(id);
        assert_eq!(r.open(), 0);
    }

    #[test]
    fn no_id_is_given_twice_across_runs() {
        // Two runs of a shard (two tables): a router holding an id of the first can never
        // commit a batch of the second, and the second knows the id is not its own.
        let (first, second) = (Reservations::default(), Reservations::default());
        let old = first.hold(batch(), vec![(Table::Documents, b"a".to_vec())]);
        let new = second.hold(batch(), vec![(Table::Documents, b"b".to_vec())]);
        assert_ne!(old, new);
        assert!(first.of_this_run(old) && second.of_this_run(new));
        assert!(!second.of_this_run(old), "an earlier run's id");
        assert!(second.take(old).is_none());
        assert!(i64::try_from(new).is_ok(), "ids stay positive BSON longs");
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_a_reservation_ends() {
        let r = std::sync::Arc::new(Reservations::default());
        let id = r.hold(batch(), vec![(Table::Documents, b"k".to_vec())]);
        let waiter = {
            let r = r.clone();
            let seen = r.generation();
            tokio::spawn(async move { r.wait(seen).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "nothing ended yet");
        r.release(id);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .expect("the waiter ran");
    }
}
