//! Starting Tributary's processes: the embedded cluster (a router with in-process shards), a
//! lone shard, and a router over remote shards. Used by the binary and by the tests.
//!
//! Invariant: a started component runs until its [`Running::shutdown`] (or the cancellation
//! token) stops it; shutdown waits for the servers to stop and the shards to close cleanly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::kernel::replica_set::{LocalSet, ReplicaSetShard};
use crate::kernel::shard_client::{LocalShard, RemoteShard, ShardClient};
use crate::router::{Presentation, Router, RouterOptions};
use shard::replica_set::ReplicaSetMember;

/// A running component.
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    pub cancel: CancellationToken,
    task: JoinHandle<()>,
    shards: Vec<Arc<shard::Shard>>,
    /// Replica-set members run here (`tributary shard --replSet`, or `--replicas N`: shard by
    /// shard, `replicas` each).
    members: Vec<Arc<ReplicaSetMember>>,
    replicas: usize,
    pub router: Option<Arc<Router>>,
}

impl Running {
    /// Stops serving and closes the in-process shards.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.wait().await;
    }

    /// Waits until the server stops (after the cancellation token fires), then for the
    /// router's background tasks, then closes the in-process shards.
    pub async fn wait(self) {
        let _ = self.task.await;
        if let Some(router) = &self.router {
            router.wait_for_tasks().await;
        }
        for s in self.shards {
            s.shutdown().await;
        }
        for member in self.members {
            member.shutdown().await;
        }
    }

    /// The in-process shards of one copy each (empty for a router over remote shards, and for
    /// replicated ones: see [`Running::on_each_shard`]).
    pub fn shards(&self) -> &[Arc<shard::Shard>] {
        &self.shards
    }

    /// The replica-set members run in this process, shard by shard.
    pub fn members(&self) -> &[Arc<ReplicaSetMember>] {
        &self.members
    }

    /// The members of each replicated shard in this process, in shard order.
    pub fn sets(&self) -> impl Iterator<Item = &[Arc<ReplicaSetMember>]> {
        self.members.chunks(self.replicas.max(1))
    }

    /// Does `f` to every shard in this process: the plain ones now, and each replica-set
    /// member's whenever it opens one as primary.
    pub fn on_each_shard(&self, f: impl Fn(&Arc<shard::Shard>) + Send + Sync + 'static) {
        let f = Arc::new(f);
        for s in &self.shards {
            f(s);
        }
        for m in &self.members {
            let f = f.clone();
            m.on_open(move |s| f(s));
        }
    }

    /// Serves the router's HTTP service on `bind` until shutdown (see [`crate::http`]): every
    /// endpoint (`--httpPort`), or the metrics alone (`--metricsPort`); returns the address it
    /// listens on.
    pub async fn serve_http(
        &self,
        bind: SocketAddr,
        endpoints: crate::http::Endpoints,
    ) -> anyhow::Result<SocketAddr> {
        let what = match endpoints {
            crate::http::Endpoints::All => "http",
            crate::http::Endpoints::Metrics => "metrics",
        };
        let router = self.router.clone().context("only a router serves HTTP")?;
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding the {what} endpoint to {bind}"))?;
        let addr = listener.local_addr()?;
        let cancel = self.cancel.clone();
        let seams = router.seams().clone();
        let services = seams.services.clone();
        services.spawn(what, crate::http::serve(seams, listener, endpoints, cancel));
        tracing::info!(%addr, what, "http endpoint listening");
        Ok(addr)
    }
}

async fn open_shard(dbpath: PathBuf, name: String) -> anyhow::Result<Arc<shard::Shard>> {
    std::fs::create_dir_all(&dbpath)
        .with_context(|| format!("creating shard directory {}", dbpath.display()))?;
    let opts = shard::ShardOptions {
        dbpath: dbpath.clone(),
        name,
        clock: Arc::new(shard::SystemClock),
    };
    shard::Shard::open(opts)
        .await
        .map_err(|e| anyhow::anyhow!("opening shard at {}: {e}", dbpath.display()))
}

/// The embedded default: a router on `bind` with `n_shards` in-process shards under `dbpath`.
pub async fn embedded(
    bind: SocketAddr,
    n_shards: usize,
    dbpath: PathBuf,
    presentation: Presentation,
    argv: Vec<String>,
) -> anyhow::Result<Running> {
    let options = RouterOptions {
        presentation,
        argv,
        ..RouterOptions::default()
    };
    embedded_with(bind, n_shards, dbpath, options).await
}

/// [`embedded`] with every router option (`advertised_host` is set from the bound address).
pub async fn embedded_with(
    bind: SocketAddr,
    n_shards: usize,
    dbpath: PathBuf,
    options: RouterOptions,
) -> anyhow::Result<Running> {
    embedded_replicated(bind, n_shards, 1, dbpath, options).await
}

/// [`embedded_with`], every shard a replica set of `replicas` members in this process (one:
/// plain shards), talking to each other directly; each shard's members store under
/// `dbpath/shard<i>/m<j>`.
pub async fn embedded_replicated(
    bind: SocketAddr,
    n_shards: usize,
    replicas: usize,
    dbpath: PathBuf,
    options: RouterOptions,
) -> anyhow::Result<Running> {
    anyhow::ensure!(n_shards >= 1, "a cluster needs at least one shard");
    anyhow::ensure!(
        matches!(replicas, 1 | 3 | 5 | 7),
        "--replicas is 1, 3, 5 or 7 (not {replicas})"
    );
    let (clients, shards, members) = if replicas > 1 {
        let (clients, members) = in_process_sets(n_shards, replicas, &dbpath, &options).await?;
        (clients, Vec::new(), members)
    } else {
        let (clients, shards) = in_process_shards(n_shards, &dbpath, &options).await?;
        (clients, shards, Vec::new())
    };
    let mut running = router_over(bind, clients, options).await?;
    running.shards = shards;
    running.members = members;
    running.replicas = replicas;
    Ok(running)
}

/// `n_shards` shards of one copy under `dbpath`, reaching each other directly (a two-phase
/// commit's coordinator), and the router's clients to them.
async fn in_process_shards(
    n_shards: usize,
    dbpath: &std::path::Path,
    options: &RouterOptions,
) -> anyhow::Result<(Vec<Arc<dyn ShardClient>>, Vec<Arc<shard::Shard>>)> {
    let mut shards = Vec::with_capacity(n_shards);
    let mut clients: Vec<Arc<dyn ShardClient>> = Vec::with_capacity(n_shards);
    for i in 0..n_shards {
        let s = open_shard(dbpath.join(format!("shard{i}")), format!("shard{i}")).await?;
        clients.push(Arc::new(LocalShard::new(s.clone())));
        shards.push(s);
    }
    for s in &shards {
        if options.enable_test_commands {
            s.enable_test_commands();
        }
        for (j, peer) in shards.iter().enumerate() {
            s.peers().register(&format!("shard{j}"), peer);
        }
    }
    Ok((clients, shards))
}

/// `n_shards` replica sets of `replicas` members each in this process, shard by shard, and the
/// router's clients to them.
async fn in_process_sets(
    n_shards: usize,
    replicas: usize,
    dbpath: &std::path::Path,
    options: &RouterOptions,
) -> anyhow::Result<(Vec<Arc<dyn ShardClient>>, Vec<Arc<ReplicaSetMember>>)> {
    use shard::repl::{LocalNet, Member, Net, Replica, Timing};
    let mut sets: Vec<Vec<Arc<ReplicaSetMember>>> = Vec::with_capacity(n_shards);
    for i in 0..n_shards {
        let name = format!("shard{i}");
        let net = LocalNet::new();
        let hosts: Vec<String> = (0..replicas).map(|j| format!("{name}-m{j}")).collect();
        let mut members = Vec::with_capacity(replicas);
        for (j, host) in (0..).zip(&hosts) {
            let home = dbpath.join(&name).join(format!("m{j}"));
            let (replica, storage) =
                Replica::open_in(&home, j, Net::Local(net.clone()), Timing::default())
                    .await
                    .map_err(|e| anyhow::anyhow!("opening {host}: {e}"))?;
            let replica = Arc::new(replica);
            if j == 0 {
                let all = (0..)
                    .zip(&hosts)
                    .map(|(id, addr)| (id, Member { addr: addr.clone() }))
                    .collect();
                replica
                    .initialize_if_new(all)
                    .await
                    .map_err(|e| anyhow::anyhow!("starting replica set {name}: {e}"))?;
            }
            let opts = shard::ShardOptions {
                dbpath: home,
                name: name.clone(),
                clock: Arc::new(shard::SystemClock),
            };
            let info = shard::replica_set::SetInfo {
                name: name.clone(),
                hosts: hosts.clone(),
                me: j,
            };
            members.push(ReplicaSetMember::start(
                opts,
                info,
                replica,
                storage,
                std::time::Duration::from_secs(10),
            ));
        }
        sets.push(members);
    }
    // Each member's shard reaches the other sets' primaries directly (a two-phase commit's
    // coordinator), and takes test commands when the router does.
    let primaries: Vec<(String, shard::txn::coordinator::PrimaryOf)> = sets
        .iter()
        .enumerate()
        .map(|(i, members)| {
            let weak: Vec<_> = members.iter().map(Arc::downgrade).collect();
            let primary: shard::txn::coordinator::PrimaryOf = Arc::new(move || {
                weak.iter()
                    .filter_map(std::sync::Weak::upgrade)
                    .find_map(|m| m.primary())
            });
            (format!("shard{i}"), primary)
        })
        .collect();
    let test_commands = options.enable_test_commands;
    for member in sets.iter().flatten() {
        let primaries = primaries.clone();
        member.on_open(move |s| {
            if test_commands {
                s.enable_test_commands();
            }
            for (name, primary) in &primaries {
                s.peers().register_set(name, primary.clone());
            }
        });
    }
    let clients = sets
        .iter()
        .enumerate()
        .map(|(i, members)| {
            Arc::new(LocalSet::new(format!("shard{i}"), members.clone())) as Arc<dyn ShardClient>
        })
        .collect();
    Ok((clients, sets.into_iter().flatten().collect()))
}

/// Another router on `bind` over the in-process shards of an embedded cluster (`running`):
/// one more mongos of the same cluster. Its shutdown leaves the shards to `running`'s.
pub async fn router_beside(
    bind: SocketAddr,
    running: &Running,
    options: RouterOptions,
) -> anyhow::Result<Running> {
    anyhow::ensure!(
        !running.shards.is_empty() || running.replicas > 1,
        "a router beside another needs its in-process shards"
    );
    let clients = if running.replicas > 1 {
        running
            .sets()
            .enumerate()
            .map(|(i, set)| {
                Arc::new(LocalSet::new(format!("shard{i}"), set.to_vec())) as Arc<dyn ShardClient>
            })
            .collect()
    } else {
        running
            .shards
            .iter()
            .map(|s| Arc::new(LocalShard::new(s.clone())) as Arc<dyn ShardClient>)
            .collect()
    };
    router_over(bind, clients, options).await
}

/// A router on `bind` over shards at `shard_addrs`: `host:port` for a one-member shard,
/// `NAME/h1:p1,h2:p2,...` for a replica set.
pub async fn router(
    bind: SocketAddr,
    shard_addrs: Vec<String>,
    presentation: Presentation,
    argv: Vec<String>,
) -> anyhow::Result<Running> {
    let options = RouterOptions {
        presentation,
        argv,
        ..RouterOptions::default()
    };
    router_with(bind, shard_addrs, options).await
}

/// [`router`] with every router option (`advertised_host` is set from the bound address).
pub async fn router_with(
    bind: SocketAddr,
    shard_addrs: Vec<String>,
    options: RouterOptions,
) -> anyhow::Result<Running> {
    anyhow::ensure!(
        !shard_addrs.is_empty(),
        "a router needs at least one --shard"
    );
    let clients = shard_addrs
        .into_iter()
        .map(|a| {
            let (tls, key) = (options.shard_tls.clone(), options.shard_key.clone());
            match wire::replset::SetSpec::parse(&a) {
                Some(set) => {
                    Arc::new(ReplicaSetShard::start(set, tls, key)) as Arc<dyn ShardClient>
                }
                None => Arc::new(RemoteShard::secured(a, tls, key)),
            }
        })
        .collect();
    router_over(bind, clients, options).await
}

async fn router_over(
    bind: SocketAddr,
    clients: Vec<Arc<dyn ShardClient>>,
    mut options: RouterOptions,
) -> anyhow::Result<Running> {
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding the router to {bind}"))?;
    let addr = listener.local_addr()?;
    options.advertised_host = advertised(addr);
    let router = Router::new(clients, options);
    let cancel = router.shutdown_token().clone();
    let task = tokio::spawn(crate::server::serve(
        router.clone(),
        listener,
        cancel.clone(),
    ));
    tracing::info!(%addr, "router listening");
    Ok(Running {
        addr,
        cancel,
        task,
        shards: Vec::new(),
        members: Vec::new(),
        replicas: 1,
        router: Some(router),
    })
}

/// One shard serving on `bind`, storing under `dbpath`.
pub async fn shard(bind: SocketAddr, dbpath: PathBuf, name: String) -> anyhow::Result<Running> {
    shard_with(bind, dbpath, name, false).await
}

/// [`shard`], with `configureFailPoint` accepted when `test_commands`.
pub async fn shard_with(
    bind: SocketAddr,
    dbpath: PathBuf,
    name: String,
    test_commands: bool,
) -> anyhow::Result<Running> {
    shard_secured(bind, dbpath, name, test_commands, ShardSecurity::default()).await
}

/// A shard's TLS (on its port, and to the other shards: a two-phase commit's coordinator
/// reaching its participants) and the cluster's key file (which its clients and the other
/// shards must log in with, and which it logs in to the other shards with).
#[derive(Debug, Clone, Default)]
pub struct ShardSecurity {
    pub server_tls: Option<Arc<wire::tls::ServerTls>>,
    pub peer_tls: Option<wire::tls::ClientTls>,
    pub key: Option<Arc<wire::keyfile::KeyFile>>,
}

/// [`shard_with`], with TLS and a key file.
pub async fn shard_secured(
    bind: SocketAddr,
    dbpath: PathBuf,
    name: String,
    test_commands: bool,
    security: ShardSecurity,
) -> anyhow::Result<Running> {
    let s = open_shard(dbpath, name).await?;
    if test_commands {
        s.enable_test_commands();
    }
    if let Some(peers) = security.peer_tls {
        s.peers().use_tls(peers);
    }
    if let Some(key) = &security.key {
        s.peers().use_key(key.clone());
    }
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding the shard to {bind}"))?;
    let addr = listener.local_addr()?;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(shard::server::serve_secured(
        s.clone(),
        listener,
        cancel.clone(),
        security.server_tls,
        security.key,
    ));
    tracing::info!(%addr, "shard listening");
    Ok(Running {
        addr,
        cancel,
        task,
        shards: vec![s],
        members: Vec::new(),
        replicas: 1,
        router: None,
    })
}

/// A replica set's settings for one member (`--replSet NAME --peers h1:p1,h2:p2,...`).
#[derive(Debug, Clone)]
pub struct ReplSet {
    pub name: String,
    /// Every member's `host:port`, this one's included, in the same order on every member.
    pub peers: Vec<String>,
}

/// Which of `peers` is the member bound to `addr`: the entry equal to its address, or to
/// `localhost`, `127.0.0.1` or the bound IP with its port.
fn member_id(peers: &[String], addr: SocketAddr) -> anyhow::Result<u64> {
    let port = addr.port();
    let mine = [
        addr.to_string(),
        advertised(addr),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
    ];
    let position = peers
        .iter()
        .position(|p| mine.contains(p))
        .with_context(|| {
            format!(
                "this member's address ({addr}) is not among --peers {}",
                peers.join(",")
            )
        })?;
    Ok(u64::try_from(position)?)
}

/// One member of a replicated shard serving on `bind`, storing under `dbpath`: it serves the
/// shard while it leads its set, and its peers' Raft messages always. The first member of
/// `peers` starts a new set when its log is empty and its peers say the set is new.
pub async fn shard_member(
    bind: SocketAddr,
    dbpath: PathBuf,
    name: String,
    set: ReplSet,
    test_commands: bool,
    security: ShardSecurity,
) -> anyhow::Result<Running> {
    use shard::repl::{Member, Net, Replica, Timing, WireNet};
    anyhow::ensure!(
        (1..=wire::replset::MAX_MEMBERS).contains(&set.peers.len()),
        "a replica set has 1 to {} members (--peers lists {})",
        wire::replset::MAX_MEMBERS,
        set.peers.len()
    );
    std::fs::create_dir_all(&dbpath)
        .with_context(|| format!("creating shard directory {}", dbpath.display()))?;
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding the shard to {bind}"))?;
    let addr = listener.local_addr()?;
    let me = member_id(&set.peers, addr)?;
    let net = Net::Wire(WireNet::new(
        security.peer_tls.clone(),
        security.key.clone(),
    ));
    let (replica, storage) = Replica::open_in(&dbpath, me, net, Timing::default())
        .await
        .map_err(|e| anyhow::anyhow!("opening the member: {e}"))?;
    let replica = Arc::new(replica);
    let peers: Vec<(u64, Arc<wire::Client>)> = (0..)
        .zip(&set.peers)
        .filter(|(id, _)| *id != me)
        .map(|(id, addr)| {
            let client = wire::Client::with_tls(addr.clone(), security.peer_tls.clone())
                .with_key(security.key.clone());
            (id, Arc::new(client))
        })
        .collect();
    let is_new = replica
        .is_new()
        .await
        .map_err(|e| anyhow::anyhow!("reading the member's log: {e}"))?;
    // An empty log may be new or lost: the member takes no part in its set until its peers
    // tell which (`join_set`, once it serves: they may be finding out the same of it).
    let first = if is_new {
        replica.hold();
        // The first member starts a new set with every listed member a voter; members added
        // later (`replSetReconfig`) list themselves anywhere but first.
        (me == 0).then(|| {
            (0..)
                .zip(&set.peers)
                .map(|(id, addr)| (id, Member { addr: addr.clone() }))
                .collect()
        })
    } else {
        None
    };
    if first.is_some() {
        anyhow::ensure!(
            set.peers.len() <= 7,
            "a new replica set starts with at most 7 voting members (--peers lists {})",
            set.peers.len()
        );
    }
    let opts = shard::ShardOptions {
        dbpath: dbpath.clone(),
        name,
        clock: Arc::new(shard::SystemClock),
    };
    let set_name = set.name.clone();
    let info = shard::replica_set::SetInfo {
        name: set.name,
        hosts: set.peers,
        me,
    };
    let member = shard::replica_set::ReplicaSetMember::start(
        opts,
        info,
        replica.clone(),
        storage,
        std::time::Duration::from_secs(10),
    );
    if test_commands {
        member.enable_test_commands();
    }
    // The shard it opens as primary reaches the other shards as a plain one does.
    let (peer_tls, peer_key) = (security.peer_tls.clone(), security.key.clone());
    member.on_open(move |s| {
        if let Some(tls) = &peer_tls {
            s.peers().use_tls(tls.clone());
        }
        if let Some(key) = &peer_key {
            s.peers().use_key(key.clone());
        }
    });
    let cancel = CancellationToken::new();
    let task = tokio::spawn(shard::server::serve_any(
        shard::server::Served::Member(member.clone()),
        listener,
        cancel.clone(),
        security.server_tls,
        security.key,
    ));
    tracing::info!(%addr, member = me, "replica-set member listening");
    if is_new {
        tokio::spawn(join_set(replica, peers, me, first, set_name));
    }
    Ok(Running {
        addr,
        cancel,
        task,
        shards: Vec::new(),
        members: vec![member],
        replicas: 1,
        router: None,
    })
}

/// An empty member held out of its set (`Replica::hold`) finds out from its peers whether the
/// set has history ([`set_has_history`]): then it rejoins (`Replica::rejoin`: the leader takes
/// it back from the start, and it votes once it caught up); else the set is new and it takes
/// part, the first member (`first`, its members) starting it.
async fn join_set(
    replica: Arc<shard::repl::Replica>,
    peers: Vec<(u64, Arc<wire::Client>)>,
    me: u64,
    first: Option<BTreeMap<u64, shard::repl::Member>>,
    set: String,
) {
    if !set_has_history(&peers).await {
        replica.release();
        if let Some(members) = first
            && let Err(e) = replica.initialize_if_new(members).await
        {
            tracing::error!(%set, "starting the replica set: {e}");
        }
        return;
    }
    // Back without its data (or new to a set that already runs): the leader takes it back.
    tracing::warn!(
        member = me,
        "this member's log is empty but its set has history: rejoining"
    );
    replica.rejoin(move || {
        let peers = peers.clone();
        async move {
            let ask =
                bson::doc! {"_replRejoin": 1, "member": i64::try_from(me).unwrap_or(i64::MAX)};
            for (_, peer) in &peers {
                let reply =
                    tokio::time::timeout(Duration::from_secs(2), peer.command("admin", &ask)).await;
                if let Ok(Ok(reply)) = reply
                    && wire::MongoError::from_reply(&reply).is_none()
                {
                    return true;
                }
            }
            false
        }
    });
}

/// Whether an empty member's set has history, asked of its peers until the answer is certain.
/// A peer whose log holds an entry past the set's first (the membership its first member
/// starts it with, at index 0) proves history. Its absence is proven only by enough peers
/// answering without it ([`peers_to_prove_new`]); until then the member asks again, so one
/// whose peers are down or cut off waits for them instead of taking part with a lost log.
async fn set_has_history(peers: &[(u64, Arc<wire::Client>)]) -> bool {
    let needed = peers_to_prove_new(peers.len() + 1);
    let status = bson::doc! {"replSetGetStatus": 1};
    let mut without = std::collections::BTreeSet::new();
    for round in 1_u64.. {
        let asked = peers.iter().map(|(id, peer)| {
            let status = &status;
            async move {
                let reply =
                    tokio::time::timeout(Duration::from_millis(500), peer.command("admin", status))
                        .await;
                (*id, reply.ok().and_then(Result::ok))
            }
        });
        for (id, reply) in futures::future::join_all(asked).await {
            match reply.as_ref().and_then(holds_history) {
                Some(true) => return true,
                Some(false) => {
                    without.insert(id);
                }
                None => {}
            }
        }
        if without.len() >= needed {
            return false;
        }
        if round % 40 == 0 {
            tracing::warn!(
                heard = without.len(),
                needed,
                "this member's log is empty: waiting for its peers to tell whether its set has \
                 history before it takes part"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    unreachable!("the rounds never end")
}

/// How many of an `n`-member set's peers must answer without history before an empty member
/// may take its set for new: a committed entry is in the logs of a majority, of which at most
/// this member's is lost, so at least `n / 2` peers hold it, and more than `n − 1 − n / 2`
/// answers reach one of them. (A one-member set has no one to ask.)
fn peers_to_prove_new(n: usize) -> usize {
    if n <= 1 { 0 } else { n - n / 2 }
}

/// What a peer's `replSetGetStatus` says: whether its log holds an entry past the set's first
/// (`None`: no answer, an error).
fn holds_history(reply: &bson::Document) -> Option<bool> {
    if wire::MongoError::from_reply(reply).is_some() {
        return None;
    }
    let optimes = reply.get_document("optimes").ok()?;
    let index = |name: &str| {
        optimes
            .get_document(name)
            .ok()
            .and_then(|p| p.get_i64("index").ok())
            .unwrap_or(0)
    };
    let last = optimes.get_i64("lastLogIndex").unwrap_or(0);
    Some(
        last > 0
            || ["lastCommittedOpTime", "snapshotOpTime"]
                .into_iter()
                .any(|name| index(name) > 0),
    )
}

/// The `host:port` drivers should dial, as the replica-set presentation lists it in `hosts`:
/// the bound IP itself (so a client dialing `127.0.0.1:port` finds exactly that address in
/// `hosts` and keeps its connection), `localhost` when bound to every interface.
fn advertised(addr: SocketAddr) -> String {
    match addr.ip() {
        ip if ip.is_unspecified() => format!("localhost:{}", addr.port()),
        std::net::IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        std::net::IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_member_needs_answers_from_peers_that_must_include_a_holder_of_any_commit() {
        // A commit is on a majority; without this member's lost copy at least n / 2 peers hold
        // it, and the answers needed always reach one of them.
        for n in 1_usize..=7 {
            let (needed, peers) = (peers_to_prove_new(n), n - 1);
            // Every committed entry's majority, less this member.
            let holders = (n / 2 + 1) - 1;
            assert!(
                needed <= peers,
                "{n} members: needs {needed} of {peers} peers"
            );
            assert!(
                n == 1 || needed + holders > peers,
                "{n} members: {needed} answers may all miss the {holders} holders"
            );
        }
        assert_eq!(peers_to_prove_new(3), 2);
        assert_eq!(peers_to_prove_new(5), 3);
    }

    #[test]
    fn a_peer_holds_history_when_its_log_passes_the_first_entry() {
        let status = |durable: i64, committed: i64| {
            bson::doc! {"ok": 1.0, "optimes": {
                "lastCommittedOpTime": {"index": committed, "t": 1_i64},
                "appliedOpTime": {"index": committed, "t": 1_i64},
                "lastLogIndex": durable,
            }}
        };
        assert_eq!(holds_history(&status(0, 0)), Some(false));
        assert_eq!(holds_history(&status(3, 0)), Some(true));
        assert_eq!(holds_history(&status(3, 3)), Some(true));
        let refused =
            bson::doc! {"ok": 0.0, "code": 13, "codeName": "Unauthorized", "errmsg": "no"};
        assert_eq!(holds_history(&refused), None);
    }
}
