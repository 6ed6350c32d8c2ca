//! Suite fixtures (the cluster a suite runs against) and hooks (faults in the background,
//! checks after each workload), as resmoke's `executor.fixture` and `executor.hooks`.
//!
//! Invariants: router and shard addresses never change over a fixture's life (restarts reuse
//! the ports), so clients made once keep working; a fault hook holds the fixture lock while a
//! process is down, so a check that takes the lock sees a whole cluster.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::TryStreamExt;
use mongodb::Client;
use mongodb::bson::{Bson, Document, doc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use router::Presentation;
use router::launch::{self, Running};
use serde::Deserialize;
use tempfile::TempDir;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util_free::CancelFlag;

use crate::replicated::ReplicaSetProcs;
use crate::{Proc, connect, free_port};

/// When the whole cluster was down (a `RestartCluster`): from the kill to the last router
/// back. An application's driver may give up during such a window (below).
#[derive(Clone, Default)]
pub struct Outages(Arc<std::sync::Mutex<Vec<(tokio::time::Instant, tokio::time::Instant)>>>);

impl Outages {
    /// Restarts the whole cluster, noting the window.
    pub async fn restart(&self, fixture: &mut Fixture) -> Result<Duration> {
        let began = tokio::time::Instant::now();
        fixture.restart_all().await?;
        let ended = tokio::time::Instant::now();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((began, ended));
        Ok(ended - began)
    }

    /// Whether `at` falls in an outage or within `grace` after one.
    pub fn covers(&self, at: tokio::time::Instant, grace: Duration) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|&(began, ended)| began <= at && at <= ended + grace)
    }
}

/// `executor.fixture` of a suite.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureSpec {
    /// `EmbeddedCluster` (router and shards in this process) or `ProcessCluster` (one
    /// `tributary shard` process per shard and `tributary router` processes).
    pub class: String,
    #[serde(default = "three")]
    pub num_shards: usize,
    #[serde(default = "one")]
    pub num_routers: usize,
    /// `mongos` or `replica_set`.
    #[serde(default = "mongos")]
    pub presentation: String,
    /// Members per shard of a `ProcessCluster`: 1 (one `tributary shard` process), or 3 or 5
    /// (a replica set of `tributary shard --replSet` processes, the router following its
    /// elections; `KillShard` then kills a set's primary).
    #[serde(default = "one")]
    pub members_per_shard: usize,
}

fn three() -> usize {
    3
}
fn one() -> usize {
    1
}
fn mongos() -> String {
    "mongos".into()
}

/// A cluster under test.
pub enum Fixture {
    Embedded {
        dir: TempDir,
        running: Option<Running>,
        addr: SocketAddr,
        n_shards: usize,
        presentation: Presentation,
    },
    Process {
        dir: TempDir,
        /// One process per shard (one member each), or none when the shards are `sets`.
        shards: Vec<Proc>,
        /// The replicated shards, when there are.
        sets: Vec<ReplicaSetProcs>,
        routers: Vec<Proc>,
    },
}

impl Fixture {
    pub async fn start(spec: &FixtureSpec) -> Result<Fixture> {
        crate::init_tracing();
        let presentation = match spec.presentation.as_str() {
            "mongos" => Presentation::Mongos,
            "replica_set" => Presentation::ReplicaSet,
            other => bail!("unknown presentation {other} (mongos or replica_set)"),
        };
        ensure!(spec.num_shards > 0, "num_shards must be positive");
        ensure!(spec.num_routers > 0, "num_routers must be positive");
        let dir = tempfile::tempdir()?;
        match spec.class.as_str() {
            "EmbeddedCluster" => {
                ensure!(
                    spec.num_routers == 1,
                    "an EmbeddedCluster has one router (use ProcessCluster for more)"
                );
                let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                let running = launch::embedded(
                    addr,
                    spec.num_shards,
                    dir.path().to_path_buf(),
                    presentation,
                    vec!["tributary".into()],
                )
                .await?;
                Ok(Fixture::Embedded {
                    dir,
                    running: Some(running),
                    addr,
                    n_shards: spec.num_shards,
                    presentation,
                })
            }
            "ProcessCluster" => {
                let mut shards = Vec::new();
                let mut sets = Vec::new();
                let members = spec.members_per_shard;
                ensure!(
                    matches!(members, 1 | 3 | 5),
                    "members_per_shard is 1, 3 or 5"
                );
                for i in 0..spec.num_shards {
                    if members > 1 {
                        let name = format!("shard{i}");
                        sets.push(ReplicaSetProcs::start(dir.path(), &name, members, &[]).await?);
                        continue;
                    }
                    let port = free_port()?;
                    let dbpath = dir.path().join(format!("shard{i}"));
                    let args = vec![
                        "shard".to_string(),
                        "--port".into(),
                        port.to_string(),
                        "--dbpath".into(),
                        dbpath.display().to_string(),
                        "--name".into(),
                        format!("shard{i}"),
                    ];
                    shards.push(Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?);
                }
                let mut routers = Vec::new();
                for _ in 0..spec.num_routers {
                    let port = free_port()?;
                    let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
                    for s in &shards {
                        args.push("--shard".into());
                        args.push(s.addr.to_string());
                    }
                    for set in &sets {
                        args.push("--shard".into());
                        args.push(set.spec());
                    }
                    if presentation == Presentation::ReplicaSet {
                        args.push("--replSetMode".into());
                    }
                    routers
                        .push(Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?);
                }
                Ok(Fixture::Process {
                    dir,
                    shards,
                    sets,
                    routers,
                })
            }
            other => bail!("unknown fixture class {other} (EmbeddedCluster or ProcessCluster)"),
        }
    }

    pub fn router_addrs(&self) -> Vec<SocketAddr> {
        match self {
            Fixture::Embedded { addr, .. } => vec![*addr],
            Fixture::Process { routers, .. } => routers.iter().map(|r| r.addr).collect(),
        }
    }

    pub fn is_process(&self) -> bool {
        matches!(self, Fixture::Process { .. })
    }

    pub fn n_shards(&self) -> usize {
        match self {
            Fixture::Embedded { n_shards, .. } => *n_shards,
            Fixture::Process { shards, sets, .. } => shards.len() + sets.len(),
        }
    }

    pub fn n_routers(&self) -> usize {
        self.router_addrs().len()
    }

    /// `kill -9` of shard `i` (a replicated shard's primary), then (after `down`) a restart
    /// on the same port and data.
    pub async fn kill_shard(&mut self, i: usize, down: Duration) -> Result<()> {
        let Fixture::Process { shards, sets, .. } = self else {
            bail!("killing a shard needs a ProcessCluster fixture");
        };
        if !sets.is_empty() {
            let set = sets.get_mut(i).context("no such shard")?;
            let primary = set.primary(&[], Duration::from_secs(20)).await?;
            let m = &mut set.members[primary];
            m.kill();
            tokio::time::sleep(down).await;
            return m.restart().await;
        }
        let s = shards.get_mut(i).context("no such shard")?;
        s.kill();
        tokio::time::sleep(down).await;
        s.restart().await
    }

    /// `kill -9` of router `i`, then a restart on the same port.
    pub async fn kill_router(&mut self, i: usize, down: Duration) -> Result<()> {
        let Fixture::Process { routers, .. } = self else {
            bail!("killing a router needs a ProcessCluster fixture");
        };
        let r = routers.get_mut(i).context("no such router")?;
        r.kill();
        tokio::time::sleep(down).await;
        r.restart().await
    }

    /// Stops every process (`kill -9` for processes; a clean shutdown in process) and starts
    /// the cluster again on the same ports and data.
    pub async fn restart_all(&mut self) -> Result<()> {
        match self {
            Fixture::Embedded {
                dir,
                running,
                addr,
                n_shards,
                presentation,
            } => {
                if let Some(r) = running.take() {
                    r.shutdown().await;
                }
                let mut tries = 0;
                let r = loop {
                    match launch::embedded(
                        *addr,
                        *n_shards,
                        dir.path().to_path_buf(),
                        *presentation,
                        vec!["tributary".into()],
                    )
                    .await
                    {
                        Ok(r) => break r,
                        Err(e) if tries < 50 => {
                            tries += 1;
                            tracing::warn!("restarting the embedded cluster: {e:#}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => return Err(e),
                    }
                };
                *running = Some(r);
                Ok(())
            }
            Fixture::Process {
                shards,
                sets,
                routers,
                ..
            } => {
                for r in routers.iter_mut() {
                    r.kill();
                }
                let members = sets.iter_mut().flat_map(|s| s.members.iter_mut());
                let all: Vec<&mut Proc> = shards.iter_mut().chain(members).collect();
                for p in all {
                    p.kill();
                }
                let members = sets.iter_mut().flat_map(|s| s.members.iter_mut());
                for p in shards.iter_mut().chain(members) {
                    p.restart().await?;
                }
                for r in routers.iter_mut() {
                    r.restart().await?;
                }
                Ok(())
            }
        }
    }

    /// Every shard's oplog, in `$natural` order: (shard name, entries' `ts`).
    pub async fn oplog_times(&self) -> Result<Vec<(String, Vec<(u32, u32)>)>> {
        let mut out = Vec::new();
        match self {
            Fixture::Embedded { running, .. } => {
                let shards = running.as_ref().map(|r| r.shards()).unwrap_or(&[]);
                for s in shards {
                    let mut times = Vec::new();
                    let mut reply = s
                        .run_command(doc! {"find": "oplog.rs", "$db": "local",
                        "sort": {"$natural": 1}, "projection": {"ts": 1}, "batchSize": 100_000})
                        .await;
                    loop {
                        ensure!(
                            reply.get_f64("ok").unwrap_or(0.0) == 1.0
                                || reply.get_i32("ok").unwrap_or(0) == 1,
                            "reading {}'s oplog: {reply}",
                            s.name()
                        );
                        let cursor = reply.get_document("cursor")?;
                        let batch = cursor
                            .get_array("firstBatch")
                            .or_else(|_| cursor.get_array("nextBatch"))?;
                        for e in batch {
                            if let Some(Bson::Timestamp(t)) =
                                e.as_document().and_then(|d| d.get("ts"))
                            {
                                times.push((t.time, t.increment));
                            }
                        }
                        let id = cursor.get_i64("id").unwrap_or(0);
                        if id == 0 {
                            break;
                        }
                        reply = s
                            .run_command(doc! {"getMore": id, "collection": "oplog.rs",
                            "$db": "local", "batchSize": 100_000})
                            .await;
                    }
                    out.push((s.name().to_string(), times));
                }
            }
            Fixture::Process { shards, sets, .. } => {
                // A replicated shard's oplog is read on its primary (the members' are the same).
                let mut addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
                for set in sets {
                    let primary = set.primary(&[], Duration::from_secs(20)).await?;
                    addrs.push(set.hosts[primary].parse()?);
                }
                for (i, addr) in addrs.into_iter().enumerate() {
                    let client = connect(addr).await?;
                    let coll = client.database("local").collection::<Document>("oplog.rs");
                    let docs: Vec<Document> = coll
                        .find(doc! {})
                        .sort(doc! {"$natural": 1})
                        .projection(doc! {"ts": 1})
                        .await?
                        .try_collect()
                        .await?;
                    let times = docs
                        .iter()
                        .filter_map(|d| match d.get("ts") {
                            Some(Bson::Timestamp(t)) => Some((t.time, t.increment)),
                            _ => None,
                        })
                        .collect();
                    out.push((format!("shard{i}"), times));
                }
            }
        }
        Ok(out)
    }

    pub async fn stop(self) {
        match self {
            Fixture::Embedded { mut running, .. } => {
                if let Some(r) = running.take() {
                    r.shutdown().await;
                }
            }
            Fixture::Process { .. } => {}
        }
    }
}

/// A suite hook, as in `executor.hooks`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "class", deny_unknown_fields)]
pub enum HookSpec {
    /// In the background: every `interval_secs`, `kill -9` a random shard process, wait
    /// `down_ms`, restart it.
    KillShard {
        interval_secs: f64,
        #[serde(default = "down_ms")]
        down_ms: u64,
    },
    /// In the background: every `interval_secs`, `kill -9` a random router and restart it.
    KillRouter {
        interval_secs: f64,
        #[serde(default = "down_ms")]
        down_ms: u64,
    },
    /// Restart the whole cluster: in the background every `interval_secs`, or between
    /// workloads when `interval_secs` is absent.
    RestartCluster { interval_secs: Option<f64> },
    /// After each workload: every shard's oplog `ts` strictly increases.
    ValidateOplogs,
    /// After each workload's threads: the documents match the model.
    ValidateDocuments,
}

fn down_ms() -> u64 {
    300
}

impl HookSpec {
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            HookSpec::KillShard { .. }
                | HookSpec::KillRouter { .. }
                | HookSpec::RestartCluster {
                    interval_secs: Some(_)
                }
        )
    }
}

/// A stop flag shared with background tasks.
mod tokio_util_free {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Clone, Default)]
    pub struct CancelFlag(Arc<AtomicBool>);

    impl CancelFlag {
        pub fn cancel(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        pub fn is_cancelled(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
}

/// The background fault hooks of a suite, running until stopped.
pub struct Background {
    stop: CancelFlag,
    tasks: Vec<JoinHandle<Result<usize>>>,
    names: Vec<String>,
}

impl Background {
    /// Starts the background hooks among `hooks`.
    pub fn start(
        fixture: Arc<Mutex<Fixture>>,
        hooks: &[HookSpec],
        seed: u64,
        outages: Outages,
    ) -> Background {
        let stop = CancelFlag::default();
        let mut tasks = Vec::new();
        let mut names = Vec::new();
        for (n, h) in hooks.iter().enumerate() {
            let (interval, down, what) = match h {
                HookSpec::KillShard {
                    interval_secs,
                    down_ms,
                } => (*interval_secs, *down_ms, 0),
                HookSpec::KillRouter {
                    interval_secs,
                    down_ms,
                } => (*interval_secs, *down_ms, 1),
                HookSpec::RestartCluster {
                    interval_secs: Some(i),
                } => (*i, 0, 2),
                _ => continue,
            };
            names.push(format!("{h:?}"));
            let fixture = fixture.clone();
            let stop = stop.clone();
            let outages = outages.clone();
            let mut rng = StdRng::seed_from_u64(seed ^ (n as u64 + 1).wrapping_mul(0x9e37_79b9));
            tasks.push(tokio::spawn(async move {
                let mut count = 0;
                let period = Duration::from_secs_f64(interval.max(0.1));
                loop {
                    // Sleep in small steps so stopping is prompt.
                    let until = tokio::time::Instant::now() + period;
                    while tokio::time::Instant::now() < until {
                        if stop.is_cancelled() {
                            return Ok(count);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let mut f = fixture.lock().await;
                    if stop.is_cancelled() {
                        return Ok(count);
                    }
                    let down = Duration::from_millis(down);
                    match what {
                        0 => {
                            let i = rng.random_range(0..f.n_shards());
                            tracing::info!("hook: kill -9 shard {i}");
                            f.kill_shard(i, down).await?;
                        }
                        1 => {
                            let i = rng.random_range(0..f.n_routers());
                            tracing::info!("hook: kill -9 router {i}");
                            f.kill_router(i, down).await?;
                        }
                        _ => {
                            let down = outages.restart(&mut f).await?;
                            println!(
                                "[resmoke] hook RestartCluster: no router for {:.1}s",
                                down.as_secs_f64()
                            );
                        }
                    }
                    count += 1;
                }
            }));
        }
        Background { stop, tasks, names }
    }

    /// Stops the hooks; returns how many faults each injected, or the first hook error.
    pub async fn stop(self) -> Result<Vec<(String, usize)>> {
        self.stop.cancel();
        let mut out = Vec::new();
        for (t, name) in self.tasks.into_iter().zip(self.names) {
            let n = t.await.context("hook task panicked")??;
            out.push((name, n));
        }
        Ok(out)
    }
}

/// One client over every router with the driver's default options (retryable reads and writes
/// on, automatic resume), as an application connects to a sharded cluster; and how many
/// change-stream `aggregate`s it has sent without a start point.
///
/// A stream's `watch()` from "now" is one such `aggregate`. Any other is the driver resuming
/// without its token: mongodb 3.9 drops the token when retryable reads retry a failed resume
/// (`tests/tests/driver_resume.rs` shows it), and the stream restarts at "now", skipping what
/// came in between. A watcher whose client did that has lost events to the driver.
pub async fn application_client(addrs: &[SocketAddr]) -> Result<(Client, Arc<AtomicUsize>)> {
    let hosts: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    // The driver's own timeouts (30 s to select a server): a whole-cluster restart leaves no
    // router for a while, and the driver's one resume waits for one as an application's would.
    let mut opts =
        mongodb::options::ClientOptions::parse(format!("mongodb://{}/", hosts.join(","))).await?;
    let token_less = Arc::new(AtomicUsize::new(0));
    let counted = token_less.clone();
    // Traced as router 9: this client picks its router itself.
    let trace = trace_file()?;
    opts.command_event_handler = Some(mongodb::event::EventHandler::callback(
        move |ev: mongodb::event::command::CommandEvent| {
            if let mongodb::event::command::CommandEvent::Started(e) = &ev
                && e.command_name == "aggregate"
                && change_stream_stage(&e.command).is_some_and(|s| {
                    !["resumeAfter", "startAfter", "startAtOperationTime"]
                        .iter()
                        .any(|k| s.contains_key(*k))
                })
            {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(file) = &trace {
                trace_command(file, 9, ev);
            }
        },
    ));
    Ok((Client::with_options(opts)?, token_less))
}

/// The `$changeStream` stage of an `aggregate` command, when it opens a change stream.
fn change_stream_stage(cmd: &Document) -> Option<&Document> {
    cmd.get_array("pipeline")
        .ok()?
        .first()?
        .as_document()?
        .get_document("$changeStream")
        .ok()
}

/// Connects one client per router (threads and watchers spread over them). With
/// `TRIBUTARY_FSM_TRACE=<file>`, every change-stream `aggregate` and `getMore` (command, reply's
/// batch size and post-batch resume token) is appended to that file, for placing a failure.
///
/// Watchers use clients with `retry_reads: false`: the driver (mongodb 3.9) takes its cached
/// resume token when it builds a resume `aggregate`, so a retried resume falls back to the
/// stream's original `resumeAfter`/`startAfter`/start time and re-delivers (or skips) events.
/// Without read retries a failed resume surfaces and the watcher reopens from its own token.
pub async fn clients(addrs: &[SocketAddr], retry_reads: bool) -> Result<Vec<Client>> {
    let mut out = Vec::new();
    for (n, a) in addrs.iter().enumerate() {
        let uri = format!("mongodb://{a}/?directConnection=true");
        let mut opts = mongodb::options::ClientOptions::parse(&uri).await?;
        opts.server_selection_timeout = Some(Duration::from_secs(10));
        opts.connect_timeout = Some(Duration::from_secs(5));
        opts.retry_reads = Some(retry_reads);
        opts.command_event_handler = tracer(n)?;
        out.push(Client::with_options(opts)?);
    }
    Ok(out)
}

/// With `TRIBUTARY_FSM_TRACE=<file>`: a command handler that appends the change-stream commands
/// of the client of `router` to that file.
fn tracer(
    router: usize,
) -> Result<Option<mongodb::event::EventHandler<mongodb::event::command::CommandEvent>>> {
    Ok(trace_file()?.map(|file| {
        mongodb::event::EventHandler::callback(move |ev: mongodb::event::command::CommandEvent| {
            trace_command(&file, router, ev)
        })
    }))
}

/// The file `TRIBUTARY_FSM_TRACE` names, open for appending (`None` without it).
fn trace_file() -> Result<Option<Arc<std::sync::Mutex<std::fs::File>>>> {
    let Ok(path) = std::env::var("TRIBUTARY_FSM_TRACE") else {
        return Ok(None);
    };
    Ok(Some(Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?,
    ))))
}

fn trace_command(
    file: &std::sync::Mutex<std::fs::File>,
    router: usize,
    ev: mongodb::event::command::CommandEvent,
) {
    use mongodb::event::command::CommandEvent;
    use std::io::Write;
    let token = |d: &Document| -> String {
        d.get_document("cursor")
            .and_then(|c| c.get_document("postBatchResumeToken"))
            .and_then(|t| t.get_str("_data"))
            .unwrap_or("-")
            .to_string()
    };
    let line = match ev {
        CommandEvent::Started(e) if e.command_name == "aggregate" => {
            match change_stream_stage(&e.command) {
                Some(spec) => format!("r{router} #{} aggregate {spec}", e.request_id),
                None => return,
            }
        }
        CommandEvent::Started(e) if e.command_name == "getMore" => format!(
            "r{router} #{} getMore {}",
            e.request_id,
            e.command
                .get("getMore")
                .map(|b| b.to_string())
                .unwrap_or_default()
        ),
        CommandEvent::Succeeded(e)
            if matches!(e.command_name.as_str(), "aggregate" | "getMore") =>
        {
            let batch = e
                .reply
                .get_document("cursor")
                .ok()
                .and_then(|c| {
                    c.get_array("firstBatch")
                        .or_else(|_| c.get_array("nextBatch"))
                        .ok()
                })
                .map(|b| {
                    b.iter()
                        .filter_map(|d| {
                            d.as_document()?
                                .get_document("_id")
                                .ok()?
                                .get_str("_data")
                                .ok()
                                .map(|s| s.chars().skip(2).take(16).collect::<String>())
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            format!(
                "r{router} #{} ok {} events [{batch}] pbrt {}",
                e.request_id,
                e.command_name,
                token(&e.reply)
            )
        }
        CommandEvent::Failed(e) if matches!(e.command_name.as_str(), "aggregate" | "getMore") => {
            format!(
                "r{router} #{} FAILED {}: {}",
                e.request_id, e.command_name, e.failure
            )
        }
        _ => return,
    };
    if let Ok(mut f) = file.lock() {
        let _ = writeln!(f, "{line}");
    }
}

/// Every shard's oplog strictly increases by `ts`; returns the times seen (for prefix reads).
pub fn check_oplogs(oplogs: &[(String, Vec<(u32, u32)>)]) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    for (name, times) in oplogs {
        for (i, w) in times.windows(2).enumerate() {
            if w[1] <= w[0] {
                errs.push(format!(
                    "{name}'s oplog does not strictly increase at entry {}: {:?} then {:?}",
                    i + 1,
                    w[0],
                    w[1]
                ));
                break;
            }
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}
