//! The commands running on this shard for a router's client operation, by the operation's
//! `clientOperationKey`, so a `killOp` on the router stops its work here too: the router sends
//! `_killOperations {operationKeys: [...]}` to every shard, as mongos does.
//!
//! Invariants: a command is registered from the moment it is dispatched until it ends (the
//! [`Registered`] guard removes it however it ends); killing a key marks every command
//! registered under it, whose synchronous work then fails its next interrupt check
//! (`pipeline::interrupt`) and whose awaiting ends at once, with 11601 `Interrupted`. A killed
//! key is remembered for [`REMEMBER_KILLED`] (at most [`MAX_KILLED`] keys), so a command of the
//! operation that arrives after the kill (it crossed it on the way) is refused at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document};
use tokio_util::sync::CancellationToken;

/// The field a router adds to the commands it sends for a client operation.
pub const KEY_FIELD: &str = "clientOperationKey";

/// How long a killed key is remembered.
pub const REMEMBER_KILLED: Duration = Duration::from_secs(60);

/// The most killed keys remembered (the oldest are forgotten first).
pub const MAX_KILLED: usize = 10_000;

/// One registered command's kill switch.
#[derive(Debug, Default)]
struct Kill {
    name: String,
    flag: Arc<AtomicBool>,
    cancel: CancellationToken,
}

/// The registered commands: by operation key, then by registration.
type Running = HashMap<Vec<u8>, HashMap<u64, Arc<Kill>>>;

/// The commands running for client operations, by operation key.
#[derive(Default)]
pub struct Operations {
    next: AtomicU64,
    running: Mutex<Running>,
    /// Recently killed keys, oldest first.
    killed: Mutex<VecDeque<(Instant, Vec<u8>)>>,
}

/// A command registered under its operation's key; dropping it ends the registration.
pub struct Registered<'a> {
    ops: &'a Operations,
    key: Vec<u8>,
    id: u64,
    kill: Arc<Kill>,
}

impl Registered<'_> {
    /// The flag the command's interrupt checks read.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.kill.flag.clone()
    }

    /// Completes when the command is killed.
    pub async fn killed(&self) {
        self.kill.cancel.cancelled().await
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut running = self.ops.lock();
        if let Some(commands) = running.get_mut(&self.key) {
            commands.remove(&self.id);
            if commands.is_empty() {
                running.remove(&self.key);
            }
        }
    }
}

impl Operations {
    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers command `name` of the operation `key` (already killed when the key was).
    pub fn start(&self, key: Vec<u8>, name: &str) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let kill = Arc::new(Kill {
            name: name.to_string(),
            ..Kill::default()
        });
        if self.was_killed(&key) {
            kill.flag.store(true, Ordering::Relaxed);
            kill.cancel.cancel();
        }
        self.lock()
            .entry(key.clone())
            .or_default()
            .insert(id, kill.clone());
        Registered {
            ops: self,
            key,
            id,
            kill,
        }
    }

    fn was_killed(&self, key: &[u8]) -> bool {
        let mut killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
        while killed
            .front()
            .is_some_and(|(at, _)| at.elapsed() > REMEMBER_KILLED)
        {
            killed.pop_front();
        }
        killed.iter().any(|(_, k)| k == key)
    }

    /// Kills every command registered under any of `keys`, and those still to come; how many
    /// were running.
    pub fn kill(&self, keys: &[Vec<u8>]) -> usize {
        {
            let mut killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
            for k in keys {
                if killed.len() >= MAX_KILLED {
                    killed.pop_front();
                }
                killed.push_back((Instant::now(), k.clone()));
            }
        }
        let running = self.lock();
        let mut n = 0;
        for kill in keys
            .iter()
            .filter_map(|k| running.get(k))
            .flat_map(|c| c.values())
        {
            kill.flag.store(true, Ordering::Relaxed);
            kill.cancel.cancel();
            n += 1;
        }
        n
    }

    /// How many commands are registered (tests, diagnostics).
    pub fn running(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }

    /// The names of the commands registered.
    pub fn running_commands(&self) -> Vec<String> {
        self.lock()
            .values()
            .flat_map(|c| c.values().map(|k| k.name.clone()))
            .collect()
    }
}

/// The bytes of an operation key (a UUID or any binary).
pub fn key_bytes(v: &Bson) -> Option<Vec<u8>> {
    match v {
        Bson::Binary(b) => Some(b.bytes.clone()),
        _ => None,
    }
}

/// Takes the operation key off a command (the command itself never sees it).
pub fn take_key(cmd: &mut Document) -> Option<Vec<u8>> {
    cmd.remove(KEY_FIELD).as_ref().and_then(key_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_reaches_every_command_of_its_key_and_registrations_end_with_their_guards() {
        let ops = Operations::default();
        let a1 = ops.start(b"a".to_vec(), "find");
        let a2 = ops.start(b"a".to_vec(), "find");
        let b = ops.start(b"b".to_vec(), "find");
        assert_eq!(ops.running(), 3);
        assert_eq!(ops.kill(&[b"a".to_vec(), b"zzz".to_vec()]), 2);
        assert!(a1.flag().load(Ordering::Relaxed) && a2.flag().load(Ordering::Relaxed));
        assert!(!b.flag().load(Ordering::Relaxed));
        drop((a1, a2));
        assert_eq!(ops.running(), 1);
        drop(b);
        assert_eq!(ops.running(), 0);
        assert!(ops.lock().is_empty(), "no key outlives its commands");
        let late = ops.start(b"a".to_vec(), "getMore");
        assert!(
            late.flag().load(Ordering::Relaxed),
            "a command arriving after its operation's kill is killed"
        );
    }
}
