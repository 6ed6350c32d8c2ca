//! The Jepsen-style test: three replicated shards of three members and two routers, every
//! process on a host of its own (`netns`), links cut with nftables. Through the routers,
//! writers insert with retryable writes, a bank moves money between accounts on different
//! shards in transactions (committed through the routers' two-phase commit), a reader takes
//! snapshot reads of every account, two watchers follow the inserts (one resuming after every
//! error, one closing its cursor and resuming from its token after every event), and a monitor
//! asks every member `hello` all along. The faults, in turn, each on the next set: its primary
//! cut off from every other host (its clients still reach it); its primary and a router cut
//! off together from the set's other members; its primary's packets to them dropped one way;
//! its primary paused (`SIGSTOP`) past an election; `kill -9` of its primary and of a router;
//! a secondary's data directory wiped, the member back while cut off from its set. Then the
//! checks: no acknowledged write lost; every one delivered to each watcher once, in token
//! order, and nothing else; every snapshot read, and the end, holding the bank's whole total;
//! each set's oplogs byte for byte the same on its members; one primary per set and term;
//! tokens recorded along the way resume to the exact rest of the stream.
//!
//! The faults run once each here (a few minutes); `TRIBUTARY_SOAK_SECONDS` runs them over and
//! over for that long (the soak).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bson::{Bson, Document, doc};
use rand::Rng;
use tests::Proc;
use tests::netns::{End, Network};

/// Replica sets, members in each, routers.
const SETS: usize = 3;
const MEMBERS: usize = 3;
const ROUTERS: usize = 2;
/// Every member and router listens on one of these ports, each on its own host.
const MEMBER_PORT: u16 = 27018;
const ROUTER_PORT: u16 = 27017;
/// How long one request may take before the test counts it as lost (a cut link drops it).
const REQUEST: Duration = Duration::from_secs(5);
/// The bank's accounts (`_id`s `0..ACCOUNTS` in a hashed collection, so most transfers span
/// shards), each opening with `BALANCE`.
const ACCOUNTS: i64 = 12;
const BALANCE: i64 = 100;
/// The watchers stop at this insert, made after everything else.
const END: i64 = -1;
/// A writer's pause between inserts: the watcher that opens a new cursor after every event
/// (three shards' cursors each time) keeps up with two writers at this pace in a debug build
/// beside the eleven processes, so a soak ends with it caught up.
const PACE: Duration = Duration::from_millis(200);

/// A request with the test's deadline.
async fn ask(client: &wire::Client, db: &str, cmd: &Document) -> Result<Document> {
    match tokio::time::timeout(REQUEST, client.command(db, cmd)).await {
        Ok(reply) => Ok(reply?),
        Err(_) => bail!("no reply within {REQUEST:?}"),
    }
}

fn ok(reply: &Document) -> bool {
    reply.get("ok") == Some(&Bson::Double(1.0)) && !reply.contains_key("writeErrors")
}

fn has_label(reply: &Document, label: &str) -> bool {
    reply
        .get_array("errorLabels")
        .is_ok_and(|labels| labels.iter().any(|l| l.as_str() == Some(label)))
}

/// A new logical session id.
fn lsid() -> Document {
    doc! {"id": bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: rand::random::<[u8; 16]>().to_vec(),
    }}
}

/// The host of member `m` of set `s`.
fn member_host(s: usize, m: usize) -> usize {
    s * MEMBERS + m
}

/// The host of router `r`.
fn router_host(r: usize) -> usize {
    SETS * MEMBERS + r
}

/// The sets and the routers, each process on a host of `net`.
struct Cluster {
    net: Network,
    /// Each set's members, in host order.
    sets: Vec<Vec<Proc>>,
    routers: Vec<Proc>,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Cluster> {
        tests::init_tracing();
        let net = Network::create(SETS * MEMBERS + ROUTERS)?;
        let dir = tempfile::tempdir()?;
        let mut sets = Vec::new();
        let mut specs = Vec::new();
        for s in 0..SETS {
            let hosts: Vec<String> = (0..MEMBERS)
                .map(|m| format!("{}:{MEMBER_PORT}", net.host(member_host(s, m)).ip))
                .collect();
            let mut members = Vec::new();
            for m in 0..MEMBERS {
                members.push(Self::member(&net, &dir, &hosts, s, m).await?);
            }
            specs.push(format!("rs{s}/{}", hosts.join(",")));
            sets.push(members);
        }
        let mut routers = Vec::new();
        for r in 0..ROUTERS {
            let host = net.host(router_host(r));
            let mut args = vec![
                "router".to_string(),
                "--port".into(),
                ROUTER_PORT.to_string(),
                "--bind-ip".into(),
                host.ip.to_string(),
            ];
            for spec in &specs {
                args.extend(["--shard".to_string(), spec.clone()]);
            }
            let addr = SocketAddr::from((host.ip, ROUTER_PORT));
            routers.push(Proc::spawn_in(Some(host.ns.clone()), args, addr).await?);
        }
        Ok(Cluster {
            net,
            sets,
            routers,
            dir,
        })
    }

    /// Member `m` of set `s`, whose set is `hosts`.
    async fn member(
        net: &Network,
        dir: &tempfile::TempDir,
        hosts: &[String],
        s: usize,
        m: usize,
    ) -> Result<Proc> {
        let host = net.host(member_host(s, m));
        let name = format!("rs{s}");
        let args = [
            "shard",
            "--port",
            &MEMBER_PORT.to_string(),
            "--bind-ip",
            &host.ip.to_string(),
            "--dbpath",
            &Self::dbpath(dir, s, m),
            "--name",
            &name,
            "--replSet",
            &name,
            "--peers",
            &hosts.join(","),
        ]
        .map(String::from)
        .to_vec();
        let addr = SocketAddr::from((host.ip, MEMBER_PORT));
        Proc::spawn_in(Some(host.ns.clone()), args, addr).await
    }

    fn dbpath(dir: &tempfile::TempDir, s: usize, m: usize) -> String {
        dir.path().join(format!("rs{s}-m{m}")).display().to_string()
    }

    fn member_client(&self, s: usize, m: usize) -> wire::Client {
        wire::Client::new(self.sets[s][m].addr.to_string())
    }

    fn router(&self, r: usize) -> wire::Client {
        wire::Client::new(self.routers[r].addr.to_string())
    }

    /// The member of set `s` that says it is the writable primary, once one does (within 20 s).
    async fn primary(&self, s: usize) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for m in 0..MEMBERS {
                if let Ok(hello) = ask(&self.member_client(s, m), "admin", &doc! {"hello": 1}).await
                    && hello.get_bool("isWritablePrimary").unwrap_or(false)
                {
                    return Ok(m);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "set {s} has no primary after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until member `m` of set `s` serves as a secondary of a primary other than itself.
    async fn secondary(&self, s: usize, m: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(hello) = ask(&self.member_client(s, m), "admin", &doc! {"hello": 1}).await
                && hello.get_bool("secondary").unwrap_or(false)
            {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "member {m} of set {s} is no secondary after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A writer's acknowledged inserts (`_id`s).
type Acked = Arc<std::sync::Mutex<BTreeSet<i64>>>;

/// Inserts `{_id}`s `first, first + stride, ...` through `router` until `stop`, one per
/// [`PACE`], each a retryable write sent again (same `txnNumber`) until acknowledged or 30 s
/// passed.
async fn writer(
    router: wire::Client,
    first: i64,
    stride: i64,
    acked: Acked,
    stop: Arc<AtomicBool>,
) {
    let lsid = lsid();
    let mut id = first;
    let mut txn_number = 0_i64;
    while !stop.load(Ordering::Relaxed) {
        txn_number += 1;
        let cmd = doc! {
            "insert": "c",
            "documents": [{"_id": id}],
            "lsid": lsid.clone(),
            "txnNumber": txn_number,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(reply) = ask(&router, "app", &cmd).await
                && ok(&reply)
            {
                acked.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        id += stride;
        tokio::time::sleep(PACE).await;
    }
}

/// What a bank's transfers came to.
#[derive(Debug, Default)]
struct Transfers {
    committed: u64,
    aborted: u64,
    /// Commits whose outcome the bank never learned (each retried for 60 s).
    unknown: u64,
}

/// Moves money between two random accounts in one transaction through `router`, over and over
/// until `stop`. A commit whose outcome is unknown (`UnknownTransactionCommitResult`, no
/// reply) is retried, as drivers do; whatever each outcome, the total stays whole.
async fn bank(router: wire::Client, stop: Arc<AtomicBool>) -> Transfers {
    let lsid = lsid();
    let mut tally = Transfers::default();
    let mut txn_number = 0_i64;
    while !stop.load(Ordering::Relaxed) {
        txn_number += 1;
        let (from, to, amount) = {
            let mut rng = rand::rng();
            let from = rng.random_range(0..ACCOUNTS);
            let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            (from, to, rng.random_range(1..=10_i64))
        };
        let step = |id: i64, delta: i64, first: bool| {
            let mut cmd = doc! {
                "update": "accounts",
                "updates": [{"q": {"_id": id}, "u": {"$inc": {"balance": delta}}}],
                "lsid": lsid.clone(),
                "txnNumber": txn_number,
                "autocommit": false,
            };
            if first {
                cmd.insert("startTransaction", true);
            }
            cmd
        };
        let mut staged = true;
        for cmd in [step(from, -amount, true), step(to, amount, false)] {
            let done = ask(&router, "app", &cmd).await;
            if !done.is_ok_and(|r| ok(&r) && r.get_i32("n").ok() == Some(1)) {
                staged = false;
                break;
            }
        }
        let end = |verb: &str| doc! {verb: 1, "lsid": lsid.clone(), "txnNumber": txn_number, "autocommit": false};
        if !staged {
            let _ = ask(&router, "admin", &end("abortTransaction")).await;
            tally.aborted += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match ask(&router, "admin", &end("commitTransaction")).await {
                Ok(r) if ok(&r) => {
                    tally.committed += 1;
                    break;
                }
                Ok(r) if !has_label(&r, "UnknownTransactionCommitResult") => {
                    tally.aborted += 1;
                    break;
                }
                _ if Instant::now() >= deadline => {
                    tally.unknown += 1;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    tally
}

/// The bank's accounts in one snapshot read through `router`, if the read succeeded.
async fn accounts(router: &wire::Client) -> Option<Vec<i64>> {
    let cmd = doc! {
        "find": "accounts",
        "batchSize": 1_000,
        "readConcern": {"level": "snapshot"},
    };
    let reply = ask(router, "app", &cmd).await.ok().filter(ok)?;
    let batch = reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?;
    batch
        .iter()
        .map(|d| d.as_document()?.get_i64("balance").ok())
        .collect()
}

/// Snapshot reads of every account through the routers in turn until `stop`: each must hold
/// the whole total (a transaction seen in part would not). Returns how many succeeded.
async fn reader(routers: Vec<wire::Client>, stop: Arc<AtomicBool>) -> Result<u64> {
    let mut reads = 0;
    for router in routers.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // A read may fail under a fault (or find its snapshot too old after a restart).
        if let Some(balances) = accounts(router).await {
            ensure!(
                balances.len() == ACCOUNTS as usize
                    && balances.iter().sum::<i64>() == ACCOUNTS * BALANCE,
                "a snapshot read saw {balances:?}: a transaction in part"
            );
            reads += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(reads)
}

/// What a watcher saw: each insert's `_id` and token, in order.
type Seen = Arc<std::sync::Mutex<Vec<(i64, Document)>>>;

/// Opens a change stream on `app.c` through `router` (after `token` when given); returns its
/// cursor and its post-batch resume token.
async fn open(router: &wire::Client, token: Option<&Document>) -> Result<(i64, Document)> {
    let spec = match token {
        Some(t) => doc! {"resumeAfter": t.clone()},
        None => doc! {},
    };
    let opened = ask(
        router,
        "app",
        &doc! {"aggregate": "c", "pipeline": [{"$changeStream": spec}], "cursor": {"batchSize": 0}},
    )
    .await?;
    ensure!(ok(&opened), "aggregate: {opened}");
    let cursor = opened.get_document("cursor")?;
    Ok((
        cursor.get_i64("id")?,
        cursor.get_document("postBatchResumeToken")?.clone(),
    ))
}

/// How a watcher follows the stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// One cursor, resumed from its last post-batch token after an error (as drivers do).
    AfterErrors,
    /// A new cursor after every event, resumed from the event's token.
    AfterEachEvent,
}

/// Follows `app.c` through `router` from `position` (a token) until it sees `{_id: end}`.
async fn watcher(
    router: wire::Client,
    mut position: Document,
    resume: Resume,
    seen: Seen,
) -> Result<()> {
    // The faults' rounds (a soak's included), then ten minutes.
    let deadline = Instant::now() + soak().unwrap_or_default() + Duration::from_secs(600);
    let mut cursor = None;
    loop {
        ensure!(
            Instant::now() < deadline,
            "the watcher never saw the end marker"
        );
        let id = match cursor {
            Some(id) => id,
            None => match open(&router, Some(&position)).await {
                Ok((id, _)) => id,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        cursor = Some(id);
        let mut more = doc! {"getMore": id, "collection": "c", "maxTimeMS": 500};
        if resume == Resume::AfterEachEvent {
            more.insert("batchSize", 1);
        }
        let reply = match ask(&router, "app", &more).await {
            Ok(reply) if ok(&reply) => reply,
            _ => {
                cursor = None;
                continue;
            }
        };
        let batch = reply.get_document("cursor")?;
        let events = batch.get_array("nextBatch")?.clone();
        let mut next = batch.get_document("postBatchResumeToken")?.clone();
        for event in events {
            let event = event.as_document().context("an event")?;
            ensure!(event.get_str("operationType")? == "insert", "{event}");
            let key = event.get_document("documentKey")?.get_i64("_id")?;
            let token = event.get_document("_id")?.clone();
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((key, token.clone()));
            if key == END {
                return Ok(());
            }
            if resume == Resume::AfterEachEvent {
                let kill = doc! {"killCursors": "c", "cursors": [id]};
                let _ = ask(&router, "app", &kill).await;
                cursor = None;
                next = token;
            }
        }
        position = next;
    }
}

/// Every member's `hello` every 100 ms until `stop`: which members of which set said they were
/// the writable primary under each `electionId`.
async fn monitor(
    clients: Vec<(usize, usize, wire::Client)>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<(usize, bson::oid::ObjectId), BTreeSet<usize>> {
    let mut claims: BTreeMap<_, BTreeSet<usize>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        for (s, m, c) in &clients {
            let Ok(Ok(hello)) = tokio::time::timeout(
                Duration::from_millis(300),
                c.command("admin", &doc! {"hello": 1}),
            )
            .await
            else {
                continue;
            };
            if hello.get_bool("isWritablePrimary").unwrap_or(false)
                && let Ok(id) = hello.get_object_id("electionId")
            {
                claims.entry((*s, id)).or_default().insert(*m);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    claims
}

/// A member's oplog, read on it (on a secondary, as a secondary may be read).
async fn oplog(client: &wire::Client) -> Result<Vec<Document>> {
    let found = ask(
        client,
        "local",
        &doc! {
            "find": "oplog.rs",
            "sort": {"$natural": 1},
            "batchSize": 100_000,
            "$readPreference": {"mode": "secondaryPreferred"},
        },
    )
    .await?;
    ensure!(ok(&found), "{found}");
    let cursor = found.get_document("cursor")?;
    ensure!(cursor.get_i64("id")? == 0, "more oplog than one batch");
    Ok(cursor
        .get_array("firstBatch")?
        .iter()
        .filter_map(|e| e.as_document().cloned())
        .collect())
}

/// How long the faults repeat (`TRIBUTARY_SOAK_SECONDS`); one round without it.
fn soak() -> Option<Duration> {
    std::env::var("TRIBUTARY_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Logs a fault as it starts, with the wall clock's seconds: a token's cluster time is those
/// seconds too, so a failed check's events can be set beside the faults around them.
fn log_fault(round: usize, s: usize, what: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    eprintln!("[{secs}] round {round}, set {s}: {what}");
}

/// Round `round` of every fault, each on the next set and followed by a return to whole sets.
async fn faults(cluster: &mut Cluster, round: usize) -> Result<()> {
    let set = |k: usize| (round + k) % SETS;

    // A primary cut off from every other host; its clients still reach it, and it stops
    // taking writes once it hears no majority.
    let s = set(0);
    let p = cluster.primary(s).await?;
    log_fault(round, s, &format!("primary {p} cut off from every host"));
    for h in (0..SETS * MEMBERS + ROUTERS).filter(|&h| h != member_host(s, p)) {
        cluster
            .net
            .cut(End::Host(member_host(s, p)), End::Host(h))?;
    }
    // (A write it took before it noticed waits for a majority, and fails when it steps down.)
    let cut = Instant::now();
    loop {
        let cmd = doc! {"insert": "direct", "documents": [{"x": 1}]};
        let reply = ask(&cluster.member_client(s, p), "app", &cmd).await;
        match &reply {
            Ok(r) if r.get_i32("code").ok() == Some(10107) => break,
            Ok(r) => ensure!(!ok(r), "a primary without a majority took a write: {r}"),
            Err(_) => {}
        }
        ensure!(
            cut.elapsed() < Duration::from_secs(15),
            "a primary without a majority still took writes: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "set {s}: the cut-off primary refused writes {:?} after the cut",
        cut.elapsed()
    );
    ensure!(
        cluster.primary(s).await? != p,
        "the majority elected another primary"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.net.heal()?;
    cluster.secondary(s, p).await?;

    // A primary and a router together, cut off from the set's other members (the router still
    // reaches the other sets).
    let s = set(1);
    let p = cluster.primary(s).await?;
    let r = router_host(round % ROUTERS);
    log_fault(
        round,
        s,
        &format!(
            "primary {p} and router {} cut off from the set",
            round % ROUTERS
        ),
    );
    for m in (0..MEMBERS).filter(|&m| m != p) {
        for side in [member_host(s, p), r] {
            cluster
                .net
                .cut(End::Host(side), End::Host(member_host(s, m)))?;
        }
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.net.heal()?;
    cluster.secondary(s, p).await?;

    // A primary's packets to the set's other members dropped, theirs to it arriving.
    let s = set(2);
    let p = cluster.primary(s).await?;
    log_fault(
        round,
        s,
        &format!("primary {p}'s packets to the set dropped"),
    );
    for m in (0..MEMBERS).filter(|&m| m != p) {
        cluster
            .net
            .cut_one_way(End::Host(member_host(s, p)), End::Host(member_host(s, m)))?;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.net.heal()?;
    cluster.secondary(s, p).await?;

    // A primary paused past an election, then resumed.
    let s = set(3);
    let p = cluster.primary(s).await?;
    log_fault(round, s, &format!("primary {p} paused"));
    cluster.sets[s][p].freeze(true)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.sets[s][p].freeze(false)?;
    cluster.secondary(s, p).await?;

    // kill -9 of a primary and of a router, each restarted on its data.
    let s = set(4);
    let p = cluster.primary(s).await?;
    let r = (round + 1) % ROUTERS;
    log_fault(round, s, &format!("kill -9 of primary {p} and router {r}"));
    cluster.sets[s][p].kill();
    cluster.routers[r].kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.sets[s][p].restart().await?;
    cluster.routers[r].restart().await?;
    cluster.secondary(s, p).await?;

    // A secondary's data directory lost, and the member back while cut off from its set: it
    // takes no part until it hears from its peers, then rejoins from them.
    let s = set(5);
    let p = cluster.primary(s).await?;
    let m = (p + 1) % MEMBERS;
    log_fault(round, s, &format!("member {m} wiped and restarted cut off"));
    cluster.sets[s][m].kill();
    std::fs::remove_dir_all(Cluster::dbpath(&cluster.dir, s, m))?;
    for other in (0..MEMBERS).filter(|&o| o != m) {
        cluster.net.cut(
            End::Host(member_host(s, m)),
            End::Host(member_host(s, other)),
        )?;
    }
    cluster.sets[s][m].restart().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hello = ask(&cluster.member_client(s, m), "admin", &doc! {"hello": 1}).await?;
    ensure!(
        !hello.get_bool("isWritablePrimary").unwrap_or(false)
            && !hello.get_bool("secondary").unwrap_or(false),
        "a wiped member cut off from its set serves: {hello}"
    );
    cluster.net.heal()?;
    cluster.secondary(s, m).await?;
    Ok(())
}

/// The events `seen` are the `stored` writes, each once, in token order; a failure shows each
/// missing event's neighbours in `reference` (another watcher's stream), with their tokens.
fn check_events(
    name: &str,
    seen: &[(i64, Document)],
    reference: &[(i64, Document)],
    stored: &BTreeSet<i64>,
) -> Result<()> {
    let ids: Vec<i64> = seen
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != END)
        .collect();
    let unique: HashSet<i64> = ids.iter().copied().collect();
    ensure!(
        unique.len() == ids.len(),
        "{name}: an event delivered twice"
    );
    let missing: Vec<i64> = stored
        .iter()
        .copied()
        .filter(|id| !unique.contains(id))
        .collect();
    let extra: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !stored.contains(id))
        .collect();
    ensure!(
        missing.is_empty() && extra.is_empty(),
        "{name}: the events are not the stored writes: {} events, {} stored; missing {}, \
         not stored {extra:?}",
        unique.len(),
        stored.len(),
        missing
            .iter()
            .take(10)
            .map(|id| around(id, reference, seen))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let data = |t: &Document| t.get_str("_data").map(str::to_string);
    for pair in seen.windows(2) {
        ensure!(
            data(&pair[0].1)? < data(&pair[1].1)?,
            "{name}: tokens out of order: {pair:?}"
        );
    }
    Ok(())
}

/// Insert `id` with its neighbours in `reference`: each `_id`, its token's `_data` (whose
/// first 4 bytes after `82` are the event's cluster time in seconds, as the fault log's), and
/// whether `seen` has it.
fn around(id: &i64, reference: &[(i64, Document)], seen: &[(i64, Document)]) -> String {
    let Some(at) = reference.iter().position(|(r, _)| r == id) else {
        return format!("{id} (in neither stream)");
    };
    let shown: Vec<String> = reference[at.saturating_sub(2)..(at + 3).min(reference.len())]
        .iter()
        .map(|(r, token)| {
            let has = seen.iter().any(|(s, _)| s == r);
            format!(
                "{r} {} {}",
                token.get_str("_data").unwrap_or("?"),
                if has { "seen" } else { "MISSED" }
            )
        })
        .collect();
    format!("{id}: [{}]", shown.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_shards_under_partitions_pauses_kills_and_wipes_lose_and_repeat_nothing()
-> Result<()> {
    if !Network::available() {
        ensure!(
            std::env::var("CI").is_err(),
            "the partition test needs root, ip and nft, which CI has"
        );
        eprintln!("skipped: making network namespaces needs root, ip and nft");
        return Ok(());
    }
    let mut cluster = Cluster::start().await?;
    for s in 0..SETS {
        cluster.primary(s).await?;
    }
    let router = cluster.router(0);
    for coll in ["c", "accounts"] {
        let cmd = doc! {"shardCollection": format!("app.{coll}"), "key": {"_id": "hashed"}};
        let reply = ask(&router, "admin", &cmd).await?;
        ensure!(ok(&reply), "shardCollection: {reply}");
    }
    let opening: Vec<Document> = (0..ACCOUNTS)
        .map(|id| doc! {"_id": id, "balance": BALANCE})
        .collect();
    let reply = ask(
        &router,
        "app",
        &doc! {"insert": "accounts", "documents": opening},
    )
    .await?;
    ensure!(ok(&reply), "opening the accounts: {reply}");
    // The streams start before the first insert.
    let (_, start) = open(&router, None).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    const WRITERS: i64 = 2;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let router = cluster.router(w as usize % ROUTERS);
            tokio::spawn(writer(router, w, WRITERS, acked.clone(), stop.clone()))
        })
        .collect();
    let banks: Vec<_> = (0..ROUTERS)
        .map(|r| tokio::spawn(bank(cluster.router(r), stop.clone())))
        .collect();
    let reading = tokio::spawn(reader(
        (0..ROUTERS).map(|r| cluster.router(r)).collect(),
        stop.clone(),
    ));
    let (continuous, each): (Seen, Seen) = Default::default();
    let watchers = [
        tokio::spawn(watcher(
            cluster.router(0),
            start.clone(),
            Resume::AfterErrors,
            continuous.clone(),
        )),
        tokio::spawn(watcher(
            cluster.router(1 % ROUTERS),
            start.clone(),
            Resume::AfterEachEvent,
            each.clone(),
        )),
    ];
    let members = (0..SETS)
        .flat_map(|s| (0..MEMBERS).map(move |m| (s, m)))
        .map(|(s, m)| (s, m, cluster.member_client(s, m)))
        .collect();
    let monitoring = tokio::spawn(monitor(members, stop.clone()));

    let soak = soak();
    let began = Instant::now();
    let mut rounds = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        faults(&mut cluster, rounds).await?;
        rounds += 1;
        if soak.is_none_or(|s| began.elapsed() >= s) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await?;
    }
    let mut transfers = Transfers::default();
    for b in banks {
        let t = b.await?;
        transfers.committed += t.committed;
        transfers.aborted += t.aborted;
        transfers.unknown += t.unknown;
    }
    let reads = reading.await??;
    let end = doc! {"insert": "c", "documents": [{"_id": END}]};
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ask(&router, "app", &end).await.is_ok_and(|r| ok(&r)) {
        ensure!(
            Instant::now() < deadline,
            "the end marker was never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in watchers {
        w.await??;
    }
    let claims = monitoring.await?;
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let continuous = continuous.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let each = each.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "{rounds} rounds of faults in {:?}: {} inserts acknowledged, {} events to each \
         watcher, transfers {transfers:?}, {reads} snapshot reads, {} terms with a primary",
        began.elapsed(),
        acked.len(),
        continuous.len(),
        claims.len()
    );
    ensure!(
        transfers.committed > 0 && reads > 0,
        "no transfer committed or no snapshot read succeeded"
    );

    // No acknowledged write lost.
    let found = ask(
        &router,
        "app",
        &doc! {"find": "c", "filter": {"_id": {"$gte": 0}}, "batchSize": 1_000_000},
    )
    .await?;
    ensure!(ok(&found), "{found}");
    let cursor = found.get_document("cursor")?;
    ensure!(cursor.get_i64("id")? == 0, "more inserts than one batch");
    let stored: BTreeSet<i64> = cursor
        .get_array("firstBatch")?
        .iter()
        .filter_map(|d| d.as_document()?.get_i64("_id").ok())
        .collect();
    let lost: Vec<&i64> = acked.difference(&stored).collect();
    ensure!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // Every stored write delivered once, in token order, and nothing else (a write that was
    // not acknowledged may have been made: then it is delivered too); both watchers saw the
    // same stream, token for token.
    check_events(
        "the resuming-after-errors watcher",
        &continuous,
        &each,
        &stored,
    )?;
    check_events(
        "the resuming-after-each-event watcher",
        &each,
        &continuous,
        &stored,
    )?;
    ensure!(continuous == each, "the watchers saw different streams");

    // The bank's total is whole.
    let deadline = Instant::now() + Duration::from_secs(30);
    let balances = loop {
        if let Some(b) = accounts(&router).await {
            break b;
        }
        ensure!(Instant::now() < deadline, "the accounts cannot be read");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        balances.iter().sum::<i64>() == ACCOUNTS * BALANCE,
        "the bank's total is not whole: {balances:?}"
    );

    // One primary per set and term.
    for ((s, election), members) in &claims {
        ensure!(
            members.len() == 1,
            "members {members:?} of set {s} were both primary under {election}"
        );
    }

    // Each set's oplogs are the same bytes as far as every member holds them. (The primary
    // keeps appending its clock renewals, and the members are read one after another, so a
    // long oplog may never be read at one length on all three.)
    for s in 0..SETS {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut logs = Vec::new();
            for m in 0..MEMBERS {
                logs.push(oplog(&cluster.member_client(s, m)).await?);
            }
            let held = logs.iter().map(Vec::len).min().unwrap_or(0);
            if logs.windows(2).all(|w| w[0][..held] == w[1][..held]) {
                break;
            }
            let lens: Vec<usize> = logs.iter().map(Vec::len).collect();
            ensure!(
                Instant::now() < deadline,
                "set {s}: the members' oplogs differ: {lens:?} entries"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Recorded tokens resume to the exact rest of the stream, through either router.
    for (k, at) in [
        0,
        each.len() / 3,
        each.len() / 2,
        each.len().saturating_sub(2),
    ]
    .into_iter()
    .enumerate()
    {
        let Some((_, token)) = each.get(at) else {
            continue;
        };
        let rest: Seen = Arc::default();
        watcher(
            cluster.router(k % ROUTERS),
            token.clone(),
            Resume::AfterErrors,
            rest.clone(),
        )
        .await?;
        let rest = rest.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ensure!(
            rest == each[at + 1..],
            "resuming after event {at} gave another suffix"
        );
    }
    Ok(())
}
