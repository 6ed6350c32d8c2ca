//! A replica set as its clients see it: its name and members ([`SetSpec`], written
//! `NAME/h1:p1,h2:p2,h3:p3` as in a MongoDB seed list), which member is primary now
//! and which serve reads as secondaries ([`SetMonitor`]), and which error codes say that a member is not (or no longer) the primary.
//!
//! The monitor asks every member `hello` every [`HEARTBEAT`], and at once when a caller reports
//! a member it could not use ([`SetMonitor::suspect`]). The primary is the member that says it
//! is writable and belongs to the set, the highest `electionId` winning when two claim it (a
//! deposed primary that has not yet noticed). Used by the router for a replicated shard and by
//! a two-phase commit's coordinator for a participant that is a replica set.
//!
//! The members are the seed list's and then every host a member of the set names in its
//! `hello` (`hosts` and `passives`), as drivers discover them: a member added by
//! `replSetReconfig` is found, and can be followed as primary. A member's position never
//! changes; one removed from the set stays listed (it says it is not primary, or does not
//! answer), up to [`MAX_MEMBERS`].
//!
//! Invariants:
//! * every `hello` has a deadline ([`HELLO_TIMEOUT`]): a paused or cut-off member cannot stall
//!   the monitor, and a primary that stops answering is replaced as soon as another member
//!   claims the role;
//! * the monitor holds its set weakly: it stops when the last handle to the set is dropped;
//! * a member is dropped as primary only when it says so, cannot be reached, or another member
//!   is elected; callers waiting on a member's deposition ([`SetMonitor::deposed`]) wake only
//!   for a different primary, never for a moment of doubt.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bson::{Bson, Document, doc};
use futures::future::join_all;
use tokio::sync::{Notify, watch};

use crate::client::Client;
use crate::keyfile::KeyFile;
use crate::tls::ClientTls;

/// How often the monitor asks every member where it stands.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// How long a member has to answer the monitor's `hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_millis(1000);
/// The most members a set may list (MongoDB's limit).
pub const MAX_MEMBERS: usize = 50;

/// Codes with which a member refuses a command before running it, because it is not the
/// primary: sending the command to the primary cannot run it twice.
pub const NOT_PRIMARY_UNRUN: &[i32] = &[
    10107, // NotWritablePrimary
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// Codes with which a member reports that it stopped being the primary, or shut down, while
/// the command ran: the command may have taken effect.
pub const NOT_PRIMARY_MAYBE_RUN: &[i32] = &[
    11602, // InterruptedDueToReplStateChange
    189,   // PrimarySteppedDown
    91,    // ShutdownInProgress
    11600, // InterruptedAtShutdown
];

/// A replica set's name and its members' `host:port`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    pub name: String,
    pub hosts: Vec<String>,
}

impl SetSpec {
    /// `NAME/h1:p1,h2:p2,...`, or `None` when `s` does not name a set: no `/`, an empty name
    /// or host, or more than [`MAX_MEMBERS`] hosts.
    pub fn parse(s: &str) -> Option<SetSpec> {
        let (name, hosts) = s.split_once('/')?;
        let hosts: Vec<String> = hosts.split(',').map(|h| h.trim().to_string()).collect();
        let valid = !name.is_empty()
            && !name.contains(',')
            && hosts.len() <= MAX_MEMBERS
            && hosts.iter().all(|h| !h.is_empty() && !h.contains('/'));
        valid.then(|| SetSpec {
            name: name.to_string(),
            hosts,
        })
    }
}

impl std::fmt::Display for SetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.name, self.hosts.join(","))
    }
}

/// The error code of a reply, if it is an error reply.
pub fn reply_code(reply: &bson::RawDocument) -> Option<i32> {
    let ok = match reply.get("ok").ok().flatten()? {
        bson::RawBsonRef::Double(d) => d != 0.0,
        bson::RawBsonRef::Int32(i) => i != 0,
        bson::RawBsonRef::Int64(i) => i != 0,
        bson::RawBsonRef::Boolean(b) => b,
        _ => false,
    };
    if ok {
        return None;
    }
    match reply.get("code").ok().flatten() {
        Some(bson::RawBsonRef::Int32(c)) => Some(c),
        Some(bson::RawBsonRef::Int64(c)) => i32::try_from(c).ok(),
        Some(bson::RawBsonRef::Double(c)) if c.is_finite() => Some(c as i32),
        _ => Some(0),
    }
}

/// Follows which member of a set is primary (see the module header).
pub struct SetMonitor {
    spec: SetSpec,
    /// Every member's host, in the order found (the seed list first); only grows.
    hosts: Mutex<Vec<String>>,
    /// One client per member for the monitor's `hello`s, apart from the callers' connections.
    members: PerMember<Client>,
    /// How many members the primary's `hello` names (`hosts` and `passives`).
    size: std::sync::atomic::AtomicUsize,
    primary: watch::Sender<Option<usize>>,
    /// The members whose last `hello` said they serve reads as secondaries, by position.
    secondaries: Mutex<Vec<usize>>,
    /// Wakes the monitor before its next heartbeat.
    wake: Notify,
}

impl SetMonitor {
    /// Starts following `spec`'s members (over TLS and with the cluster's key when given).
    /// Needs a tokio runtime; the monitor stops when the returned handle's last clone goes.
    pub fn start(
        spec: SetSpec,
        tls: Option<ClientTls>,
        key: Option<Arc<KeyFile>>,
    ) -> Arc<SetMonitor> {
        let members = PerMember::new(move |h: &str| {
            Client::with_tls(h.to_string(), tls.clone()).with_key(key.clone())
        });
        let monitor = Arc::new(SetMonitor {
            hosts: Mutex::new(spec.hosts.clone()),
            size: spec.hosts.len().into(),
            spec,
            members,
            primary: watch::channel(None).0,
            secondaries: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        tokio::spawn(follow(Arc::downgrade(&monitor)));
        monitor
    }

    pub fn spec(&self) -> &SetSpec {
        &self.spec
    }

    /// The host of the member at `position`.
    pub fn host(&self, position: usize) -> Option<String> {
        lock(&self.hosts).get(position).cloned()
    }

    /// How many members the set has, as its primary last said (the seed list's until then).
    pub fn size(&self) -> usize {
        self.size.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The member believed primary now, by its position (see [`SetMonitor::host`]).
    pub fn primary(&self) -> Option<usize> {
        *self.primary.borrow()
    }

    /// The members serving reads as secondaries, as their last `hello`s said.
    pub fn secondaries(&self) -> Vec<usize> {
        lock(&self.secondaries).clone()
    }

    /// `member` could not serve a read as a secondary: it is not offered for one until its
    /// next `hello` says it can.
    pub fn suspect_secondary(&self, member: usize) {
        lock(&self.secondaries).retain(|&m| m != member);
        self.wake.notify_one();
    }

    /// The primary, waiting up to `patience` for one to be known.
    pub async fn wait_primary(&self, patience: Duration) -> Option<usize> {
        if let Some(p) = self.primary() {
            return Some(p);
        }
        self.wake.notify_one();
        let mut rx = self.primary.subscribe();
        let found = tokio::time::timeout(patience, rx.wait_for(Option::is_some)).await;
        match found {
            Ok(Ok(p)) => *p,
            _ => None,
        }
    }

    /// `member` answered that it is not the primary, or could not be reached: it is no longer
    /// taken for the primary, and the monitor looks again now.
    pub fn suspect(&self, member: usize) {
        self.primary.send_if_modified(|p| {
            let was = *p == Some(member);
            if was {
                *p = None;
            }
            was
        });
        self.wake.notify_one();
    }

    /// Resolves once a member other than `member` is primary: a command still waiting on
    /// `member` then waits on a deposed primary (paused or cut off) and is given up.
    pub async fn deposed(&self, member: usize) {
        let mut rx = self.primary.subscribe();
        let _ = rx.wait_for(|p| matches!(p, Some(q) if *q != member)).await;
    }

    /// One round: every member's `hello`, and the primary they show.
    async fn look(&self) {
        let hello = doc! {"hello": 1};
        let n = lock(&self.hosts).len();
        let members: Vec<Arc<Client>> = (0..n).filter_map(|i| self.members.get(self, i)).collect();
        let replies = join_all(members.iter().map(|m| async {
            match tokio::time::timeout(HELLO_TIMEOUT, m.command("admin", &hello)).await {
                Ok(Ok(reply)) => Some(reply),
                _ => None,
            }
        }))
        .await;
        for reply in replies.iter().flatten() {
            self.learn_hosts(reply);
        }
        let claims = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref()?)))
            .filter(|(_, r)| self.claims_primary(r));
        let secondaries = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref()?)))
            .filter(|(_, r)| self.claims_secondary(r))
            .map(|(i, _)| i)
            .collect();
        *lock(&self.secondaries) = secondaries;
        let primary = claims.max_by_key(|(_, r)| election_id(r));
        if let Some((_, hello)) = primary {
            let size = named_hosts(hello).count();
            if size > 0 {
                self.size.store(size, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let primary = primary.map(|(i, _)| i);
        self.primary.send_if_modified(|p| {
            let changed = *p != primary;
            if changed {
                let host = |i: Option<usize>| i.and_then(|i| self.host(i));
                tracing::info!(set = %self.spec.name, from = ?host(*p), to = ?host(primary),
                    "replica set primary changed");
                *p = primary;
            }
            changed
        });
    }

    /// Adds the hosts a member of this set names that are not listed yet (up to
    /// [`MAX_MEMBERS`]).
    fn learn_hosts(&self, hello: &Document) {
        if hello.get_str("setName").ok() != Some(self.spec.name.as_str()) {
            return;
        }
        let mut hosts = lock(&self.hosts);
        for host in named_hosts(hello) {
            if hosts.len() < MAX_MEMBERS && !hosts.iter().any(|h| h == host) {
                tracing::info!(set = %self.spec.name, host, "a new member of the replica set");
                hosts.push(host.to_string());
            }
        }
    }

    /// Whether `hello` says its member serves reads as a secondary of this set.
    fn claims_secondary(&self, hello: &Document) -> bool {
        hello.get_bool("secondary").is_ok_and(|s| s)
            && hello.get_str("setName").is_ok_and(|n| n == self.spec.name)
    }

    /// Whether `hello` says its member is this set's writable primary.
    fn claims_primary(&self, hello: &Document) -> bool {
        let writable = ["isWritablePrimary", "ismaster"]
            .iter()
            .any(|f| hello.get_bool(f).is_ok_and(|w| w));
        writable && hello.get_str("setName").is_ok_and(|n| n == self.spec.name)
    }
}

/// The members a `hello` names: `hosts`, then `passives`.
fn named_hosts(hello: &Document) -> impl Iterator<Item = &str> {
    ["hosts", "passives"]
        .into_iter()
        .filter_map(|f| hello.get_array(f).ok())
        .flatten()
        .filter_map(Bson::as_str)
        .filter(|h| !h.is_empty() && !h.contains(['/', ',']))
}

/// Something per member of a set (a client, a pool), made when first needed and kept by the
/// member's position in its [`SetMonitor`].
pub struct PerMember<T> {
    made: Mutex<Vec<Arc<T>>>,
    make: Box<dyn Fn(&str) -> T + Send + Sync>,
}

impl<T> PerMember<T> {
    pub fn new(make: impl Fn(&str) -> T + Send + Sync + 'static) -> PerMember<T> {
        PerMember {
            made: Mutex::new(Vec::new()),
            make: Box::new(make),
        }
    }

    /// The one for the member at `position` in `monitor`, if the monitor lists it.
    pub fn get(&self, monitor: &SetMonitor, position: usize) -> Option<Arc<T>> {
        let mut made = lock(&self.made);
        while made.len() <= position {
            let host = monitor.host(made.len())?;
            made.push(Arc::new((self.make)(&host)));
        }
        made.get(position).cloned()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A `hello`'s `electionId` as comparable bytes (none sorts first).
fn election_id(hello: &Document) -> [u8; 12] {
    match hello.get("electionId") {
        Some(Bson::ObjectId(id)) => id.bytes(),
        _ => [0; 12],
    }
}

/// The monitor's loop: a look every heartbeat, or sooner when woken; ends with the set.
async fn follow(monitor: Weak<SetMonitor>) {
    loop {
        let Some(m) = monitor.upgrade() else { return };
        m.look().await;
        let wait = async {
            tokio::select! {
                () = tokio::time::sleep(HEARTBEAT) => {}
                () = m.wake.notified() => {}
            }
        };
        wait.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::RawDocumentBuf;

    #[test]
    fn a_set_spec_parses_and_prints_back() {
        let s = SetSpec::parse("rs0/a:1,b:2,c:3").unwrap();
        assert_eq!(s.name, "rs0");
        assert_eq!(s.hosts, ["a:1", "b:2", "c:3"]);
        assert_eq!(s.to_string(), "rs0/a:1,b:2,c:3");
    }

    #[test]
    fn a_plain_host_or_an_empty_part_is_not_a_set() {
        for s in ["a:1", "/a:1", "rs0/", "rs0/a:1,,b:2", "rs0/a/b"] {
            assert_eq!(SetSpec::parse(s), None, "{s}");
        }
        let many = (0..=MAX_MEMBERS)
            .map(|i| format!("h:{i}"))
            .collect::<Vec<_>>();
        assert_eq!(SetSpec::parse(&format!("rs/{}", many.join(","))), None);
    }

    #[test]
    fn an_error_reply_has_its_code_and_an_ok_reply_none() {
        let raw = |d: Document| RawDocumentBuf::try_from(&d).unwrap();
        assert_eq!(reply_code(&raw(doc! {"ok": 1.0})), None);
        assert_eq!(
            reply_code(&raw(
                doc! {"ok": 0.0, "code": 10107, "errmsg": "not primary"}
            )),
            Some(10107)
        );
        assert_eq!(reply_code(&raw(doc! {"ok": 0})), Some(0));
    }
}
