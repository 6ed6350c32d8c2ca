//! A replicated shard under network faults, each process on a host of its own (`netns`): three
//! members and a router, each in a network namespace, links cut with nftables. Writers insert
//! through the router with retryable writes, a watcher follows the collection through the
//! router and resumes from its last token after every error, and a monitor asks every member
//! `hello` all along. The faults, in turn: the primary cut off from the other members and the
//! router (its clients still reach it); the primary and the router cut off together from the
//! others; the primary's packets to the others dropped one way; the primary paused (`SIGSTOP`)
//! past an election; `kill -9` of the primary; a secondary's data directory wiped. Then the
//! checks: no acknowledged write lost; every one delivered to the watcher once, in token
//! order, and nothing else; the members' oplogs byte for byte the same; one primary per term;
//! tokens recorded along the way resume to the exact rest of the stream.
//!
//! The faults run once each here (about two minutes); `TRIBUTARY_SOAK_SECONDS` runs them over
//! and over for that long (the soak).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bson::{Bson, Document, doc};
use tests::Proc;
use tests::netns::{End, Network};

/// Every member and the router listen on these ports, each on its own host.
const MEMBER_PORT: u16 = 27018;
const ROUTER_PORT: u16 = 27017;
/// How long one request may take before the test counts it as lost (a cut link drops it).
const REQUEST: Duration = Duration::from_secs(5);

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

/// The set and its router, each on a host of `net` (members on hosts 0..3, the router on 3).
struct Cluster {
    net: Network,
    members: Vec<Proc>,
    router: Proc,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Cluster> {
        tests::init_tracing();
        let net = Network::create(4)?;
        let dir = tempfile::tempdir()?;
        let hosts: Vec<String> = (0..3)
            .map(|i| format!("{}:{MEMBER_PORT}", net.host(i).ip))
            .collect();
        let mut members = Vec::new();
        for i in 0..3 {
            members.push(Self::member(&net, &dir, &hosts, i).await?);
        }
        let router_ip = net.host(3).ip;
        let router = Proc::spawn_in(
            Some(net.host(3).ns.clone()),
            [
                "router",
                "--port",
                &ROUTER_PORT.to_string(),
                "--bind-ip",
                &router_ip.to_string(),
                "--shard",
                &format!("rs/{}", hosts.join(",")),
            ]
            .map(String::from)
            .to_vec(),
            SocketAddr::from((router_ip, ROUTER_PORT)),
        )
        .await?;
        Ok(Cluster {
            net,
            members,
            router,
            dir,
        })
    }

    async fn member(
        net: &Network,
        dir: &tempfile::TempDir,
        hosts: &[String],
        i: usize,
    ) -> Result<Proc> {
        let ip = net.host(i).ip;
        let args = [
            "shard",
            "--port",
            &MEMBER_PORT.to_string(),
            "--bind-ip",
            &ip.to_string(),
            "--dbpath",
            &dir.path().join(format!("m{i}")).display().to_string(),
            "--name",
            "rs",
            "--replSet",
            "rs",
            "--peers",
            &hosts.join(","),
        ]
        .map(String::from)
        .to_vec();
        Proc::spawn_in(
            Some(net.host(i).ns.clone()),
            args,
            SocketAddr::from((ip, MEMBER_PORT)),
        )
        .await
    }

    fn client(&self, i: usize) -> wire::Client {
        wire::Client::new(self.members[i].addr.to_string())
    }

    fn router(&self) -> wire::Client {
        wire::Client::new(self.router.addr.to_string())
    }

    /// The member that says it is the writable primary, once one does (within 20 s).
    async fn primary(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for i in 0..3 {
                if let Ok(hello) = ask(&self.client(i), "admin", &doc! {"hello": 1}).await
                    && hello.get_bool("isWritablePrimary").unwrap_or(false)
                {
                    return Ok(i);
                }
            }
            ensure!(Instant::now() < deadline, "no primary within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until member `i` serves as a secondary of a primary other than itself.
    async fn secondary(&self, i: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(hello) = ask(&self.client(i), "admin", &doc! {"hello": 1}).await
                && hello.get_bool("secondary").unwrap_or(false)
            {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "member {i} is no secondary after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A writer's acknowledged inserts (`_id`s).
type Acked = Arc<std::sync::Mutex<BTreeSet<i64>>>;

/// Inserts `{_id}`s `first, first + stride, ...` through the router until `stop`, each a
/// retryable write sent again (same `txnNumber`) until acknowledged or 30 s passed.
async fn writer(
    router: wire::Client,
    first: i64,
    stride: i64,
    acked: Acked,
    stop: Arc<AtomicBool>,
) {
    let lsid = doc! {"id": bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: rand::random::<[u8; 16]>().to_vec(),
    }};
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
    }
}

/// What the watcher saw: each insert's `_id` and token, in order.
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

/// Follows `app.c` through the router from `position` (a token) until it sees `{_id: end}`,
/// resuming from its last post-batch resume token after every error, as drivers do.
async fn watcher(router: wire::Client, mut position: Document, end: i64, seen: Seen) -> Result<()> {
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
        let more = ask(
            &router,
            "app",
            &doc! {"getMore": id, "collection": "c", "maxTimeMS": 500},
        )
        .await;
        let reply = match more {
            Ok(reply) if ok(&reply) => reply,
            _ => {
                cursor = None;
                continue;
            }
        };
        let batch = reply.get_document("cursor")?;
        let events = batch.get_array("nextBatch")?.clone();
        let next = batch.get_document("postBatchResumeToken")?.clone();
        for event in events {
            let event = event.as_document().context("an event")?;
            ensure!(event.get_str("operationType")? == "insert", "{event}");
            let id = event.get_document("documentKey")?.get_i64("_id")?;
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((id, event.get_document("_id")?.clone()));
            if id == end {
                return Ok(());
            }
        }
        position = next;
    }
}

/// Every member's `hello` every 100 ms until `stop`: which hosts said they were the writable
/// primary under each `electionId`.
async fn monitor(
    clients: Vec<wire::Client>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<bson::oid::ObjectId, BTreeSet<usize>> {
    let mut claims: BTreeMap<bson::oid::ObjectId, BTreeSet<usize>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        for (i, c) in clients.iter().enumerate() {
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
                claims.entry(id).or_default().insert(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    claims
}

/// Member `i`'s oplog, read on it (on a secondary, as a secondary may be read).
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

/// One round of every fault, each followed by a return to a whole set.
async fn faults(cluster: &mut Cluster) -> Result<()> {
    let net = &cluster.net;
    let others = |p: usize| (0..4).filter(move |&h| h != p).map(End::Host);

    // The primary cut off from the other members and the router; its clients still reach it,
    // and it stops taking writes once it hears no majority.
    let p = cluster.primary().await?;
    for other in others(p) {
        net.cut(End::Host(p), other)?;
    }
    // (A write it took before it noticed waits for a majority, and fails when it steps down.)
    let cut = Instant::now();
    loop {
        let cmd = doc! {"insert": "direct", "documents": [{"x": 1}]};
        let reply = ask(&cluster.client(p), "app", &cmd).await;
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
        "the cut-off primary refused writes {:?} after the cut",
        cut.elapsed()
    );
    ensure!(
        cluster.primary().await? != p,
        "the majority elected another primary"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    net.heal()?;
    cluster.secondary(p).await?;

    // The primary and the router together, cut off from the other members.
    let p = cluster.primary().await?;
    for m in (0..3).filter(|&m| m != p) {
        net.cut(End::Host(p), End::Host(m))?;
        net.cut(End::Host(3), End::Host(m))?;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    net.heal()?;
    cluster.secondary(p).await?;

    // The primary's packets to the other members dropped, theirs to it arriving.
    let p = cluster.primary().await?;
    for m in (0..3).filter(|&m| m != p) {
        net.cut_one_way(End::Host(p), End::Host(m))?;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    net.heal()?;
    cluster.secondary(p).await?;

    // The primary paused past an election, then resumed.
    let p = cluster.primary().await?;
    cluster.members[p].freeze(true)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.members[p].freeze(false)?;
    cluster.secondary(p).await?;

    // kill -9 of the primary, restarted on its data.
    let p = cluster.primary().await?;
    cluster.members[p].kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.members[p].restart().await?;
    cluster.secondary(p).await?;

    // A secondary's data directory lost: it rejoins from the others.
    let p = cluster.primary().await?;
    let s = (p + 1) % 3;
    cluster.members[s].kill();
    std::fs::remove_dir_all(cluster.dir.path().join(format!("m{s}")))?;
    cluster.members[s].restart().await?;
    cluster.secondary(s).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_shard_under_partitions_pauses_kills_and_a_wipe_loses_and_repeats_nothing()
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
    let router = cluster.router();
    cluster.primary().await?;
    // The stream starts before the first write.
    let (_, start) = open(&router, None).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    const WRITERS: i64 = 2;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                cluster.router(),
                w,
                WRITERS,
                acked.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let seen: Seen = Arc::default();
    const END: i64 = -1;
    let watching = tokio::spawn(watcher(cluster.router(), start.clone(), END, seen.clone()));
    let member_clients: Vec<wire::Client> = (0..3).map(|i| cluster.client(i)).collect();
    let monitoring = tokio::spawn(monitor(member_clients, stop.clone()));

    let soak = soak();
    let began = Instant::now();
    let mut rounds = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        faults(&mut cluster).await?;
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
    let end = doc! {"insert": "c", "documents": [{"_id": END}]};
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ask(&router, "app", &end).await.is_ok_and(|r| ok(&r)) {
        ensure!(
            Instant::now() < deadline,
            "the end marker was never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watching.await??;
    let claims = monitoring.await?;
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "{rounds} rounds of faults in {:?}: {} writes acknowledged, {} events, {} terms with a primary",
        began.elapsed(),
        acked.len(),
        seen.len(),
        claims.len()
    );

    // No acknowledged write lost.
    let found = ask(
        &router,
        "app",
        &doc! {"find": "c", "filter": {"_id": {"$gte": 0}}, "batchSize": 1_000_000},
    )
    .await?;
    let stored: BTreeSet<i64> = found
        .get_document("cursor")?
        .get_array("firstBatch")?
        .iter()
        .filter_map(|d| d.as_document()?.get_i64("_id").ok())
        .collect();
    let lost: Vec<&i64> = acked.difference(&stored).collect();
    ensure!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // Every stored write delivered once, in token order, and nothing else (a write that was
    // not acknowledged may have been made: then it is delivered too).
    let ids: Vec<i64> = seen
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != END)
        .collect();
    let unique: HashSet<i64> = ids.iter().copied().collect();
    ensure!(unique.len() == ids.len(), "an event delivered twice");
    ensure!(
        unique == stored.iter().copied().collect::<HashSet<_>>(),
        "the events are not the stored writes: {} events, {} stored",
        unique.len(),
        stored.len()
    );
    let data = |t: &Document| t.get_str("_data").map(str::to_string);
    for pair in seen.windows(2) {
        ensure!(
            data(&pair[0].1)? < data(&pair[1].1)?,
            "tokens out of order: {pair:?}"
        );
    }

    // One primary per term.
    for (election, hosts) in &claims {
        ensure!(
            hosts.len() == 1,
            "members {hosts:?} were both primary under {election}"
        );
    }

    // The members' oplogs, once they hold the same, are the same bytes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = [
            oplog(&cluster.client(0)).await?,
            oplog(&cluster.client(1)).await?,
            oplog(&cluster.client(2)).await?,
        ];
        if logs[0] == logs[1] && logs[1] == logs[2] {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the members' oplogs differ: {} / {} / {} entries",
            logs[0].len(),
            logs[1].len(),
            logs[2].len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Recorded tokens resume to the exact rest of the stream.
    for at in [
        0,
        seen.len() / 3,
        seen.len() / 2,
        seen.len().saturating_sub(2),
    ] {
        let Some((_, token)) = seen.get(at) else {
            continue;
        };
        let rest: Seen = Arc::default();
        watcher(cluster.router(), token.clone(), END, rest.clone()).await?;
        let rest = rest.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ensure!(
            rest == seen[at + 1..],
            "resuming after event {at} gave another suffix"
        );
    }
    Ok(())
}
