//! Keys other writes may not touch for a while: those of prepared transactions, until their
//! decision (the ordered batches' reservations are in `reservations`). A leaf: the writer's
//! jobs and the shared state consult it, and it imports nothing of the shard but the tables.
//!
//! Invariants:
//! * A key is held while at least one prepared transaction listed it (counted per key).
//! * [`PreparedKeys::any`] is false only when no key is held, so the common case costs writes
//!   one atomic load.
//! * A prepare lists its keys from inside its writer batch ([`PreparedKeys::add_in_batch`]),
//!   so the next job, in the same batch or the next, finds them; they go again if the batch
//!   fails ([`PreparedKeys::abandon_batch`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::storage::Table;

/// A key of one table.
type Key = (Table, Vec<u8>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The keys prepared transactions hold: no other write may touch them until they are decided.
#[derive(Default)]
pub struct PreparedKeys {
    keys: Mutex<HashMap<Key, usize>>,
    count: std::sync::atomic::AtomicUsize,
    /// How many prepared transactions have their keys here (a prepare holds the clock and lists
    /// its keys in the same job; a recovered one holds the clock just before: while the clock
    /// has more holds than this, one is in between).
    transactions: std::sync::atomic::AtomicUsize,
    /// The keys listed by the writer batch in flight, taken back if it fails.
    tentative: Mutex<Vec<Vec<Key>>>,
}

impl PreparedKeys {
    /// Whether any transaction is prepared (cheap: writes check it first).
    pub fn any(&self) -> bool {
        self.count.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    pub fn contains(&self, table: Table, key: &[u8]) -> bool {
        self.any() && lock(&self.keys).contains_key(&(table, key.to_vec()))
    }

    /// Whether a prepared transaction holds a key that starts with `prefix` (a collection's:
    /// its documents' and its index entries' keys start with its UUID).
    pub fn holds_prefix(&self, prefix: &[u8]) -> bool {
        self.any() && lock(&self.keys).keys().any(|(_, k)| k.starts_with(prefix))
    }

    /// How many prepared transactions have listed their keys.
    pub fn transactions(&self) -> usize {
        self.transactions.load(std::sync::atomic::Ordering::Acquire)
    }

    /// One prepared transaction's keys.
    pub(crate) fn add(&self, keys: impl Iterator<Item = Key>) {
        self.transactions
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut map = lock(&self.keys);
        for k in keys {
            *map.entry(k).or_default() += 1;
        }
        self.count
            .store(map.len(), std::sync::atomic::Ordering::Release);
    }

    /// One decided transaction's keys.
    pub(crate) fn remove(&self, keys: impl Iterator<Item = Key>) {
        let _ = self.transactions.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| n.checked_sub(1),
        );
        let mut map = lock(&self.keys);
        for k in keys {
            if let Some(n) = map.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&k);
                }
            }
        }
        self.count
            .store(map.len(), std::sync::atomic::Ordering::Release);
    }

    /// One prepared transaction's keys, listed by its prepare job inside the writer's batch.
    pub(crate) fn add_in_batch(&self, keys: Vec<Key>) {
        self.add(keys.iter().cloned());
        lock(&self.tentative).push(keys);
    }

    /// The writer's batch applied: the keys its prepares listed stay.
    pub(crate) fn keep_batch(&self) {
        let mut tentative = lock(&self.tentative);
        if !tentative.is_empty() {
            tentative.clear();
        }
    }

    /// The writer's batch failed: its prepares never happened, so their keys go.
    pub(crate) fn abandon_batch(&self) {
        for keys in std::mem::take(&mut *lock(&self.tentative)) {
            self.remove(keys.into_iter());
        }
    }
}
