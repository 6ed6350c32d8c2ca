//! Suites: YAML files in `tests/suites/` in resmoke's shape (`selector`, `executor` with its
//! `config`, `fixture` and `hooks`), and the runner that executes one: start the fixture and
//! the background hooks, then for each selected workload (again and again while a duration
//! lasts): setup, watchers, threads, checks (documents, oplogs), teardown (`dropDatabase`, the
//! streams' end marker), then verify every watcher against the model and run prefix reads.
//!
//! Invariant: a run is reported failed when any thread, hook, check or stream verification
//! failed; the report names the seed, and `--seed` replays the same choices.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use mongodb::Client;
use mongodb::bson::{Bson, Document, doc};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::fixture::{self, Background, Fixture, FixtureSpec, HookSpec};
use super::framework::{self, DocModel, Env, Workload, key_string};
use super::model::{self, Expected, Op, Outcome, Scope};
use super::watch::{self, Mode, Watcher};
use super::workloads::{self, Any};

/// A suite file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub test_kind: Option<String>,
    pub selector: Selector,
    pub executor: Executor,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// Workload names (see `workloads::NAMES`); `all` selects every one.
    pub roots: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Executor {
    #[serde(default)]
    pub config: ExecConfig,
    pub fixture: FixtureSpec,
    #[serde(default)]
    pub hooks: Vec<HookSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Overrides each workload's thread count.
    pub threads: Option<usize>,
    /// Overrides each workload's iterations per thread.
    pub iterations: Option<usize>,
    /// The run's seed; random when absent (and printed).
    pub seed: Option<u64>,
    /// Run the selected workloads once each (0) or again and again for this many seconds.
    #[serde(default)]
    pub duration_secs: u64,
    /// Watcher modes: `continuous`, `resume_each`, `prefix`.
    #[serde(default = "all_modes")]
    pub watch_modes: Vec<String>,
    /// Start points per prefix-read kind.
    #[serde(default = "four")]
    pub prefix_points: usize,
    /// Run the selected workloads at the same time, each in its own database (MongoDB's
    /// `parallel` mode), instead of one after the other.
    #[serde(default)]
    pub parallel: bool,
    /// `per_router` (thread i uses router i mod n, a client per router) or `all_routers` (one
    /// client over every router: the driver picks a router per operation).
    #[serde(default = "per_router")]
    pub thread_client: String,
    /// A watcher that gets nothing for this long gives up (the verifier then reports what is
    /// missing).
    #[serde(default = "sixty")]
    pub watcher_idle_secs: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            threads: None,
            iterations: None,
            seed: None,
            duration_secs: 0,
            watch_modes: all_modes(),
            prefix_points: four(),
            watcher_idle_secs: sixty(),
            thread_client: per_router(),
            parallel: false,
        }
    }
}

fn all_modes() -> Vec<String> {
    vec!["continuous".into(), "resume_each".into(), "prefix".into()]
}
fn per_router() -> String {
    "per_router".into()
}
fn four() -> usize {
    4
}
fn sixty() -> u64 {
    60
}

/// Test-side fault injection, to show the verifier catches a broken stream: tamper with one
/// observed stream before it is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    DropEvent,
    DupEvent,
    SwapEvents,
}

impl Inject {
    pub fn parse(s: &str) -> Result<Inject> {
        Ok(match s {
            "drop-event" => Inject::DropEvent,
            "dup-event" => Inject::DupEvent,
            "swap-events" => Inject::SwapEvents,
            other => bail!("unknown injection {other} (drop-event, dup-event, swap-events)"),
        })
    }
}

/// Command-line overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub seed: Option<u64>,
    pub duration_secs: Option<u64>,
    pub workload: Option<String>,
    pub inject: Option<Inject>,
}

pub fn suites_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("suites")
}

/// Loads `name` (a path, or a suite name in `tests/suites/`).
pub fn load(name: &str) -> Result<Suite> {
    let p = Path::new(name);
    let path = if p.exists() {
        p.to_path_buf()
    } else {
        suites_dir().join(format!("{name}.yml"))
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let suite: Suite =
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    suite.validate()?;
    Ok(suite)
}

impl Suite {
    pub fn validate(&self) -> Result<()> {
        for r in self.selector.roots.iter().chain(&self.selector.exclude) {
            if r != "all" && workloads::by_name(r).is_none() {
                bail!(
                    "unknown workload {r} (known: {})",
                    workloads::NAMES.join(", ")
                );
            }
        }
        for m in &self.executor.config.watch_modes {
            if !matches!(
                m.as_str(),
                "continuous" | "resume_each" | "driver_resume" | "prefix" | "subscription"
            ) {
                bail!("unknown watch mode {m}");
            }
        }
        let needs_processes = self
            .executor
            .hooks
            .iter()
            .any(|h| matches!(h, HookSpec::KillShard { .. } | HookSpec::KillRouter { .. }));
        if needs_processes && self.executor.fixture.class != "ProcessCluster" {
            bail!("kill hooks need fixture class ProcessCluster");
        }
        Ok(())
    }

    pub fn workloads(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.selector.roots {
            if r == "all" {
                out.extend(workloads::NAMES.iter().map(|s| s.to_string()));
            } else {
                out.push(r.clone());
            }
        }
        out.retain(|w| !self.selector.exclude.contains(w));
        out.dedup();
        out
    }
}

/// The result of one workload run.
#[derive(Debug, Default)]
pub struct WorkloadReport {
    pub name: String,
    pub db: String,
    /// The seed of this workload run: `--seed <it> --duration 0 --workload <name>` replays it.
    pub seed: u64,
    pub failures: Vec<String>,
    pub lines: Vec<String>,
}

/// Runs a suite; returns the reports of every workload run (failed ones have failures).
pub async fn run(suite: &Suite, ov: &Overrides) -> Result<(u64, Vec<WorkloadReport>)> {
    let cfg = &suite.executor.config;
    let seed = ov
        .seed
        .or(cfg.seed)
        .unwrap_or_else(|| rand::random::<u64>() >> 12);
    let duration = ov.duration_secs.unwrap_or(cfg.duration_secs);
    let mut names = suite.workloads();
    if let Some(w) = &ov.workload {
        names.retain(|n| n == w);
        if names.is_empty() {
            bail!("workload {w} is not selected by this suite");
        }
    }
    println!(
        "[resmoke] seed {seed}; workloads {names:?}; fixture {:?}; hooks {:?}",
        suite.executor.fixture, suite.executor.hooks
    );
    let fixture = Fixture::start(&suite.executor.fixture).await?;
    let addrs = fixture.router_addrs();
    let fixture = Arc::new(Mutex::new(fixture));
    let faults = suite.executor.hooks.iter().any(HookSpec::is_fault);
    let outages = fixture::Outages::default();
    let background = Background::start(
        fixture.clone(),
        &suite.executor.hooks,
        seed,
        outages.clone(),
    );
    let clients = fixture::clients(&addrs, true).await?;
    let watch_clients = fixture::clients(&addrs, false).await?;
    // `all_routers`: every thread uses one client over all routers (the driver picks a router
    // per operation and carries the cluster time across them).
    let thread_client = match cfg.thread_client.as_str() {
        "per_router" => None,
        "all_routers" => Some(fixture::application_client(&addrs).await?.0),
        other => bail!("unknown thread_client {other} (per_router or all_routers)"),
    };
    let started = tokio::time::Instant::now();
    let deadline = (duration > 0).then(|| started + Duration::from_secs(duration));
    let mut reports = Vec::new();
    let mut round = 0_u64;
    let groups: Vec<Vec<String>> = if cfg.parallel {
        vec![names.clone()]
    } else {
        names.iter().map(|n| vec![n.clone()]).collect()
    };
    'outer: loop {
        for group in &groups {
            if round > 0 && deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                break 'outer;
            }
            let run_seed = seed.wrapping_add(round.wrapping_mul(1_000_003));
            let dbs: Vec<String> = group.iter().map(|n| format!("fsm_{n}_{round}")).collect();
            let runs = group.iter().zip(&dbs).map(|(name, db)| {
                let others: Vec<String> = dbs.iter().filter(|d| *d != db).cloned().collect();
                let ctx = RunCtx {
                    suite,
                    fixture: &fixture,
                    clients: &clients,
                    watch_clients: &watch_clients,
                    router_addrs: &addrs,
                    outages: &outages,
                    thread_client: thread_client.as_ref(),
                    db: db.clone(),
                    others,
                    seed: run_seed,
                    faults,
                    inject: ov.inject,
                };
                async move {
                    let report = match workloads::by_name(name) {
                        Some(Any::Crud(w)) => run_workload(Arc::new(w), &ctx).await,
                        Some(Any::Ddl(w)) => run_workload(Arc::new(w), &ctx).await,
                        Some(Any::Transfers(w)) => run_workload(Arc::new(w), &ctx).await,
                        None => Err(anyhow::anyhow!("unknown workload {name}")),
                    };
                    report.unwrap_or_else(|e| WorkloadReport {
                        name: name.clone(),
                        db: ctx.db.clone(),
                        seed: run_seed,
                        failures: vec![format!("the workload could not run: {e:#}")],
                        lines: Vec::new(),
                    })
                }
            });
            let done = futures::future::join_all(runs).await;
            let mut failed = false;
            for report in done {
                print_report(&report);
                failed |= !report.failures.is_empty();
                reports.push(report);
            }
            if failed {
                break 'outer;
            }
            // Between workloads: a whole-cluster restart, if asked for.
            if suite.executor.hooks.iter().any(|h| {
                matches!(
                    h,
                    HookSpec::RestartCluster {
                        interval_secs: None
                    }
                )
            }) {
                outages.restart(&mut *fixture.lock().await).await?;
                println!("[resmoke] hook RestartCluster: restarted the cluster");
            }
        }
        round += 1;
        match deadline {
            Some(d) if tokio::time::Instant::now() < d => {}
            _ => break,
        }
    }
    match background.stop().await {
        Ok(counts) => {
            for (h, n) in counts {
                println!("[resmoke] hook {h}: {n} faults injected");
            }
        }
        Err(e) => reports.push(WorkloadReport {
            name: "hooks".into(),
            failures: vec![format!("a background hook failed: {e:#}")],
            ..WorkloadReport::default()
        }),
    }
    if let Ok(f) = Arc::try_unwrap(fixture) {
        f.into_inner().stop().await;
    }
    Ok((seed, reports))
}

fn print_report(r: &WorkloadReport) {
    let status = if r.failures.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    println!(
        "[resmoke] workload {} ({}, seed {}): {status}",
        r.name, r.db, r.seed
    );
    for l in &r.lines {
        println!("[resmoke]   {l}");
    }
    for f in &r.failures {
        println!("[resmoke]   FAILURE: {f}");
    }
}

/// Retries a check while the cluster recovers from a fault.
async fn retrying<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 40 => {
                tries += 1;
                tracing::info!("{what}: {e:#}, retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.context(format!("{what} after {tries} tries"))),
        }
    }
}

/// What one workload run gets from the suite runner.
struct RunCtx<'a> {
    suite: &'a Suite,
    fixture: &'a Arc<Mutex<Fixture>>,
    clients: &'a [Client],
    /// Clients for watchers (no read retries, see `fixture::clients`).
    watch_clients: &'a [Client],
    /// Every router: each driver-resume watcher connects to them all, with a client of its own
    /// (so that a resume its driver made without a token is known to be its own).
    router_addrs: &'a [std::net::SocketAddr],
    /// Whole-cluster restarts so far: a driver-resume watcher's driver may give up in one.
    outages: &'a fixture::Outages,
    thread_client: Option<&'a Client>,
    db: String,
    /// The databases of workloads running at the same time (parallel mode): their events on
    /// cluster streams are left out of this workload's model check.
    others: Vec<String>,
    seed: u64,
    faults: bool,
    inject: Option<Inject>,
}

async fn run_workload<W: Workload>(w: Arc<W>, rc: &RunCtx<'_>) -> Result<WorkloadReport> {
    let (suite, fixture, clients, thread_client) =
        (rc.suite, rc.fixture, rc.clients, rc.thread_client);
    let (db, seed, faults, inject) = (rc.db.as_str(), rc.seed, rc.faults, rc.inject);
    let ec = &suite.executor.config;
    let mut cfg = w.config();
    if let Some(t) = ec.threads {
        cfg.thread_count = t;
    }
    if let Some(i) = ec.iterations {
        cfg.iterations = i;
    }
    let mut report = WorkloadReport {
        name: w.name().to_string(),
        db: db.to_string(),
        seed,
        ..WorkloadReport::default()
    };
    let env = Env {
        client: clients[0].clone(),
        db: db.to_string(),
        thread_count: cfg.thread_count,
        faults,
    };
    let initial = {
        // Setup runs without faults (resmoke's setup is not under test either).
        let _quiet = fixture.lock().await;
        retrying("setup", || w.setup(&env)).await?
    };

    // Watchers, opened before the threads start so they see every write.
    let modes: Vec<Mode> = ec
        .watch_modes
        .iter()
        .filter_map(|m| match m.as_str() {
            "continuous" => Some(Mode::Continuous),
            "resume_each" => Some(Mode::ResumeEach),
            "driver_resume" => Some(Mode::DriverResume),
            "subscription" => Some(Mode::Subscription),
            _ => None,
        })
        .collect();
    let prefix = ec.watch_modes.iter().any(|m| m == "prefix");
    let mut watchers = Vec::new();
    for (n, spec) in w.watch_specs(db).into_iter().enumerate() {
        for (m, mode) in modes.iter().enumerate() {
            // Subscriptions of a database or collection go with the teardown's dropDatabase.
            if *mode == Mode::Subscription && spec.scope != Scope::Cluster {
                continue;
            }
            let spec = spec.clone();
            let mode = *mode;
            let (clients, token_less) = match mode {
                Mode::DriverResume => {
                    let (client, token_less) = fixture::application_client(rc.router_addrs).await?;
                    (vec![client], Some(token_less))
                }
                _ => (rc.watch_clients.to_vec(), None),
            };
            let watcher = retrying("opening a watcher", || {
                Watcher::open(clients.clone(), n + m, spec.clone(), mode, db)
            })
            .await?;
            // Token-less `aggregate`s from here on are resumes that lost their token (the
            // opening ones, retries included, are done).
            let token_less = token_less.map(|t| {
                let opened = t.load(Ordering::Relaxed);
                (t, opened)
            });
            watchers.push((watcher, token_less));
        }
    }
    let idle = Duration::from_secs(ec.watcher_idle_secs);
    let watch_deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    let handles: Vec<_> = watchers
        .into_iter()
        .map(|(wt, token_less)| {
            let spec = wt.spec.clone();
            let mode = wt.mode;
            (
                spec,
                mode,
                token_less,
                tokio::spawn(wt.run(idle, watch_deadline)),
            )
        })
        .collect();

    // The threads.
    let started = tokio::time::Instant::now();
    let thread_clients = match thread_client {
        Some(c) => vec![c.clone()],
        None => clients.to_vec(),
    };
    let out = framework::run_threads(w.clone(), &cfg, &thread_clients, &env, seed, None).await?;
    report.lines.push(format!(
        "{} threads × {} iterations in {:.1}s; states visited {:?}; {} expected events, {} writes with unknown outcome",
        cfg.thread_count,
        cfg.iterations,
        started.elapsed().as_secs_f64(),
        out.transitions,
        out.expected.len(),
        out.unknown
    ));
    for e in &out.errors {
        report.failures.push(format!(
            "thread {} (iteration {}, state {}): {}",
            e.tid, e.iteration, e.state, e.error
        ));
    }
    let mut expected = out.expected;
    let mut docs = out.docs;
    for c in &initial {
        docs.existing.insert(format!("{db}.{c}"));
    }

    // Checks and teardown run with the faults held off.
    let oplog_times;
    {
        let f = fixture.lock().await;
        if suite
            .executor
            .hooks
            .iter()
            .any(|h| matches!(h, HookSpec::ValidateDocuments))
        {
            let errs = retrying("validating documents", || {
                validate_documents(&env.client, db, &docs)
            })
            .await?;
            report.failures.extend(errs);
        }
        let validate_oplogs = suite
            .executor
            .hooks
            .iter()
            .any(|h| matches!(h, HookSpec::ValidateOplogs));
        if validate_oplogs || prefix {
            let oplogs = retrying("reading the oplogs", || f.oplog_times()).await?;
            if validate_oplogs {
                if let Err(errs) = fixture::check_oplogs(&oplogs) {
                    report.failures.extend(errs);
                }
                report.lines.push(format!(
                    "oplogs strictly increase on {} shards ({} entries)",
                    oplogs.len(),
                    oplogs.iter().map(|(_, t)| t.len()).sum::<usize>()
                ));
            }
            let mut all: Vec<(u32, u32)> = oplogs.into_iter().flat_map(|(_, t)| t).collect();
            all.sort();
            oplog_times = all;
        } else {
            oplog_times = Vec::new();
        }
        // Teardown: create an end-marker collection (so the database is never empty), then
        // drop the database. Its drops and dropDatabase end the streams.
        retrying("creating the end marker", || async {
            match env.client.database(db).create_collection(END_MARKER).await {
                Err(e) if crate::scenarios::code_of(&e) == Some(48) => Ok(()),
                r => Ok(r?),
            }
        })
        .await?;
        docs.existing.insert(format!("{db}.{END_MARKER}"));
        expected.extend(teardown_events(db, &docs, cfg.thread_count));
        retrying("dropDatabase", || async {
            env.client.database(db).drop().await?;
            Ok(())
        })
        .await?;
    }

    // Verify every watcher.
    let watch_started = tokio::time::Instant::now();
    let mut recordings = Vec::new();
    for (spec, mode, token_less, h) in handles {
        let mut obs = h.await.context("watcher panicked")?;
        let lost_tokens = token_less.map_or(0, |(t, opened)| {
            t.load(Ordering::Relaxed).saturating_sub(opened)
        });
        if let Some(inj) = inject
            && recordings.is_empty()
            && obs.events.len() > 3
        {
            let i = obs.events.len() / 2;
            match inj {
                Inject::DropEvent => {
                    obs.events.remove(i);
                }
                Inject::DupEvent => {
                    let e = obs.events[i].clone();
                    obs.events.insert(i + 1, e);
                }
                Inject::SwapEvents => obs.events.swap(i, i + 1),
            }
            report.lines.push(format!(
                "injected {inj:?} at event {i} of {} {mode:?}",
                spec.scope
            ));
        }
        let label = format!(
            "{} ({mode:?}{}{})",
            spec.scope,
            if spec.expanded { ", expanded" } else { "" },
            if spec.images { ", images" } else { "" }
        );
        if spec.images {
            for f in model::image_failures(&obs.events) {
                report.failures.push(format!("watcher {label}: {f}"));
            }
        }
        for e in &obs.application_errors {
            // The driver's retries end ~0.3 s after its first failed connect; a second of grace.
            if e.unreachable && rc.outages.covers(e.at, Duration::from_secs(1)) {
                report.lines.push(format!(
                    "watcher {label}: (outage) the driver gave up its resume while the whole \
                     cluster was down: {}",
                    e.what
                ));
            } else {
                report.failures.push(format!(
                    "watcher {label}: an error reached the application: {}",
                    e.what
                ));
            }
        }
        if !obs.complete {
            report.failures.push(format!(
                "watcher {label} did not reach the end of its stream ({} events read)",
                obs.events.len()
            ));
        }
        // Prefix reads replay the whole recording, other workloads' events included.
        let full = obs.events.clone();
        if !rc.others.is_empty() && spec.scope == Scope::Cluster {
            // Other workloads' events interleave: the whole stream must still be in token
            // order; the model check takes this workload's database only.
            for f in model::token_order_failures(&obs.events) {
                report.failures.push(format!("watcher {label}: {f}"));
            }
            obs.events.retain(|e| {
                let db = e
                    .get_document("ns")
                    .and_then(|n| n.get_str("db"))
                    .unwrap_or("");
                !rc.others.iter().any(|o| o == db)
            });
        }
        match model::verify(&expected, &spec, &obs.events, obs.complete) {
            Ok(s) => {
                let mut kinds: Vec<String> = obs
                    .resumed_errors
                    .iter()
                    .map(|e| e.chars().take(90).collect())
                    .collect();
                kinds.sort();
                kinds.dedup();
                kinds.truncate(3);
                report.lines.push(format!(
                    "watcher {label}: {} events, {} acknowledged, {} unknown-outcome seen, {} unknown-outcome absent, {} resumes after errors {kinds:?}",
                    s.observed, s.acked_seen, s.unknown_seen, s.unknown_absent, obs.resumed_errors.len()
                ))
            }
            // The driver resumed without its token (mongodb 3.9's own loss, see
            // `fixture::application_client`): what it skipped is the driver's, not the
            // cluster's. Reported, not failed; the other watchers of the same stream check
            // the cluster.
            Err(errs) if lost_tokens > 0 => {
                for e in errs {
                    report.lines.push(format!(
                        "watcher {label}: (driver) after {lost_tokens} resume(s) the driver \
                         sent without its token: {e}"
                    ));
                }
            }
            Err(errs) => {
                for e in errs {
                    report.failures.push(format!("watcher {label}: {e}"));
                }
                // Where the stream was reopened after an error, to place the failure.
                for (at, err, router) in &obs.reopens {
                    report.failures.push(format!(
                        "watcher {label}: (context) after {at} events: {err}; reopened on router {router} from the last event's token"
                    ));
                }
            }
        }
        if mode == Mode::Continuous && obs.complete {
            recordings.push((spec, full));
        }
    }

    report.lines.push(format!(
        "watchers finished {:.1}s after the teardown",
        watch_started.elapsed().as_secs_f64()
    ));
    // Prefix reads from recorded tokens and times, against verified recordings.
    let prefix_started = tokio::time::Instant::now();
    if prefix && report.failures.is_empty() {
        let mut reads = 0;
        for (n, (spec, events)) in recordings.iter().enumerate() {
            let client = &rc.watch_clients[n % rc.watch_clients.len()];
            let (k, fails) = watch::prefix_reads(
                client,
                spec,
                events,
                ec.prefix_points,
                &oplog_times,
                Duration::from_secs(ec.watcher_idle_secs.min(20)),
            )
            .await?;
            reads += k;
            report.failures.extend(fails);
        }
        report.lines.push(format!(
            "{reads} prefix reads compared with the recorded suffixes in {:.1}s",
            prefix_started.elapsed().as_secs_f64()
        ));
    }
    Ok(report)
}

/// The collection the teardown creates before `dropDatabase`, so the database is never empty.
pub const END_MARKER: &str = "fsm_end";

/// The events the teardown must make: `create` of the end marker (when it was made), a `drop`
/// per collection (unknown for namespaces whose existence is unknown), then `dropDatabase`;
/// recorded as thread `thread_count`.
pub fn teardown_events(db: &str, docs: &DocModel, thread_count: usize) -> Vec<Expected> {
    let mut out = Vec::new();
    if docs.existing.contains(&format!("{db}.{END_MARKER}")) {
        out.push(Expected {
            tid: thread_count,
            step: 0,
            db: db.to_string(),
            coll: Some(END_MARKER.to_string()),
            op: Op::Create,
            key: None,
            tag: None,
            outcome: Outcome::Acked,
        });
    }
    let prefix = format!("{db}.");
    let mut namespaces: BTreeMap<&String, Outcome> = BTreeMap::new();
    for ns in &docs.existing {
        namespaces.insert(ns, Outcome::Acked);
    }
    for ns in &docs.tainted {
        namespaces.entry(ns).or_insert(Outcome::Unknown);
    }
    for (ns, outcome) in namespaces {
        let Some(coll) = ns.strip_prefix(&prefix) else {
            continue;
        };
        out.push(Expected {
            tid: thread_count,
            step: 1,
            db: db.to_string(),
            coll: Some(coll.to_string()),
            op: Op::Drop,
            key: None,
            tag: None,
            outcome,
        });
    }
    out.push(Expected {
        tid: thread_count,
        step: 2,
        db: db.to_string(),
        coll: None,
        op: Op::DropDatabase,
        key: None,
        tag: None,
        outcome: Outcome::Acked,
    });
    out
}

fn sorted_doc(d: &Document) -> Document {
    let mut keys: Vec<&String> = d.keys().collect();
    keys.sort();
    keys.into_iter()
        .filter_map(|k| d.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// The documents of every collection in `db` match the model (documents of namespaces with an
/// unknown fate are not checked; every other collection must be one the model knows).
pub async fn validate_documents(
    client: &Client,
    db: &str,
    model: &DocModel,
) -> Result<Vec<String>> {
    let mut errs = Vec::new();
    let database = client.database(db);
    let names = database.list_collection_names().await?;
    for name in &names {
        let ns = format!("{db}.{name}");
        if model.tainted.contains(&ns) {
            continue;
        }
        if !model.existing.contains(&ns) {
            errs.push(format!(
                "collection {ns} exists but the model has no such collection"
            ));
            continue;
        }
        let actual: Vec<Document> = database
            .collection::<Document>(name)
            .find(doc! {})
            .await?
            .try_collect()
            .await?;
        let mut actual: BTreeMap<String, Document> = actual
            .into_iter()
            .map(|d| {
                (
                    key_string(d.get("_id").unwrap_or(&Bson::Null)),
                    sorted_doc(&d),
                )
            })
            .collect();
        let empty = BTreeMap::new();
        let expected = model.docs.get(&ns).unwrap_or(&empty);
        for (key, states) in expected {
            let got = actual.remove(key);
            if !states.contains(&got) {
                errs.push(format!(
                    "document {ns} _id={key}: expected {} found {}",
                    states
                        .iter()
                        .map(|s| s
                            .as_ref()
                            .map(|d| d.to_string())
                            .unwrap_or("(absent)".into()))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    got.map(|d| d.to_string()).unwrap_or("(absent)".into())
                ));
            }
        }
        for (key, d) in actual {
            errs.push(format!("document {ns} _id={key} is not in the model: {d}"));
        }
        if errs.len() > 20 {
            break;
        }
    }
    for ns in &model.existing {
        let Some(coll) = ns.strip_prefix(&format!("{db}.")) else {
            continue;
        };
        if !names.iter().any(|n| n == coll) {
            errs.push(format!("collection {ns} is missing"));
        }
    }
    Ok(errs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_suite_file_parses_and_selects_known_workloads() {
        let mut n = 0;
        for entry in std::fs::read_dir(suites_dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yml") {
                let suite = load(path.to_str().unwrap()).unwrap();
                assert!(!suite.workloads().is_empty(), "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 3, "only {n} suites found");
    }

    #[test]
    fn a_suite_with_a_kill_hook_needs_processes() {
        let yaml = "selector: {roots: [crud]}\nexecutor:\n  fixture: {class: EmbeddedCluster}\n  hooks:\n    - {class: KillShard, interval_secs: 1}\n";
        let suite: Suite = serde_norway::from_str(yaml).unwrap();
        let err = suite.validate().unwrap_err().to_string();
        assert!(err.contains("ProcessCluster"), "{err}");
        let bad = "selector: {roots: [nope]}\nexecutor:\n  fixture: {class: EmbeddedCluster}\n";
        let suite: Suite = serde_norway::from_str(bad).unwrap();
        assert!(
            suite
                .validate()
                .unwrap_err()
                .to_string()
                .contains("unknown workload nope")
        );
    }

    #[test]
    fn teardown_expects_a_drop_per_collection_then_drop_database() {
        let mut docs = DocModel::default();
        docs.existing.insert("d.a".into());
        docs.tainted.insert("d.b".into());
        let ev = teardown_events("d", &docs, 4);
        let kinds: Vec<(Op, Option<String>, Outcome)> = ev
            .iter()
            .map(|e| (e.op, e.coll.clone(), e.outcome))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Op::Drop, Some("a".into()), Outcome::Acked),
                (Op::Drop, Some("b".into()), Outcome::Unknown),
                (Op::DropDatabase, None, Outcome::Acked),
            ]
        );
        assert!(ev.iter().all(|e| e.tid == 4));
    }
}
