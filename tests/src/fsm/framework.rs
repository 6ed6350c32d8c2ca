//! The FSM framework, in the shape of MongoDB's concurrency framework (`jstests/concurrency/
//! fsm_libs`): a [`Workload`] declares `states`, weighted `transitions`, a `start_state`,
//! `setup`/`teardown`, `thread_count`, `iterations` and per-thread `data`; [`run_threads`] starts
//! the threads (tokio tasks), walks each one's state machine choosing transitions by weight with
//! a seeded RNG, and gathers the errors of every thread with its thread id.
//!
//! Each thread records what its acknowledged (and unknown-outcome) writes must produce into its
//! own [`ThreadCtx`]: the expected change events ([`model::Expected`]) and the expected
//! documents ([`DocModel`]). A thread owns the document keys and namespaces it writes, so its
//! records are exact without locks; the runner merges them after the threads finish.
//!
//! Invariant: for the same seed, configuration and server answers, every thread makes the same
//! choices (RNG per thread = f(seed, workload, tid)).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use futures::future::BoxFuture;
use mongodb::Client;
use mongodb::bson::{Bson, Document};
use mongodb::error::{Error, ErrorKind, WriteFailure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::{Expected, Op, Outcome};

/// The declared shape of a workload (MongoDB's `$config` minus the functions).
#[derive(Debug, Clone)]
pub struct Config {
    pub thread_count: usize,
    pub iterations: usize,
    pub start_state: &'static str,
    pub states: Vec<&'static str>,
    /// From each state, the next states with their weights (need not sum to 1).
    pub transitions: Vec<(&'static str, Vec<(&'static str, f64)>)>,
}

impl Config {
    /// The checks of MongoDB's `parse_config.js`: positive counts, every named state exists,
    /// weights are finite and non-negative, every state has a way out.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.thread_count > 0, "thread_count must be positive");
        ensure!(self.iterations > 0, "iterations must be positive");
        let known: BTreeSet<&str> = self.states.iter().copied().collect();
        ensure!(
            known.contains(self.start_state),
            "start_state {} is not a state",
            self.start_state
        );
        for (from, tos) in &self.transitions {
            ensure!(known.contains(from), "transition from unknown state {from}");
            ensure!(!tos.is_empty(), "state {from} has no transitions");
            for (to, w) in tos {
                ensure!(
                    known.contains(to),
                    "transition {from} -> unknown state {to}"
                );
                ensure!(
                    w.is_finite() && *w >= 0.0,
                    "weight {w} of {from} -> {to} is not a non-negative number"
                );
            }
            ensure!(
                tos.iter().map(|(_, w)| w).sum::<f64>() > 0.0,
                "the weights out of {from} sum to zero"
            );
        }
        for s in &self.states {
            ensure!(
                self.transitions.iter().any(|(f, _)| f == s),
                "state {s} has no transitions"
            );
        }
        Ok(())
    }

    fn next_state(&self, from: &str, rng: &mut StdRng) -> Result<&'static str> {
        let Some((_, tos)) = self.transitions.iter().find(|(f, _)| *f == from) else {
            bail!("no transitions from {from}");
        };
        Ok(weighted_choice(tos, rng.random::<f64>()))
    }
}

/// MongoDB's `getWeightedRandomChoice`: `r` in [0, 1) is scaled by the sum of the weights and
/// the first bucket whose running total exceeds it wins.
pub fn weighted_choice(choices: &[(&'static str, f64)], r: f64) -> &'static str {
    let total: f64 = choices.iter().map(|(_, w)| w).sum();
    let target = r * total;
    let mut acc = 0.0;
    for (name, w) in choices {
        acc += w;
        if target < acc {
            return name;
        }
    }
    choices.last().map(|(n, _)| *n).unwrap_or("")
}

/// What `setup`, `teardown` and the checks get: a client on the first router and the workload's
/// database (a fresh one per run).
#[derive(Clone)]
pub struct Env {
    pub client: Client,
    pub db: String,
    pub thread_count: usize,
    /// Whether fault hooks run: write errors are then unknown outcomes, not failures.
    pub faults: bool,
}

/// A workload. `Data` is the per-thread state (MongoDB's `this`).
pub trait Workload: Send + Sync + 'static {
    type Data: Send + 'static;
    fn name(&self) -> &'static str;
    fn config(&self) -> Config;
    /// The thread's private data.
    fn data(&self, tid: usize) -> Self::Data;
    /// Runs once before the threads; returns the namespaces (collection names in `env.db`)
    /// that exist afterwards, for the model.
    fn setup<'a>(&'a self, env: &'a Env) -> BoxFuture<'a, Result<Vec<String>>>;
    /// Runs one state function.
    fn state<'a>(
        &'a self,
        state: &'static str,
        data: &'a mut Self::Data,
        t: &'a mut ThreadCtx,
    ) -> BoxFuture<'a, Result<()>>;
    /// The watchers to run during the workload: (scope in `db`, showExpandedEvents).
    fn watch_specs(&self, db: &str) -> Vec<super::model::WatchSpec>;
}

/// The expected current documents of the namespaces a thread owns: `_id` → the document, or
/// the set of states it may be in after an unknown outcome.
#[derive(Debug, Clone, Default)]
pub struct DocModel {
    /// ns ("db.coll") → canonical `_id` → accepted states (`None` = absent). One state when
    /// certain.
    pub docs: BTreeMap<String, BTreeMap<String, Vec<Option<Document>>>>,
    /// Namespaces whose existence or contents are unknown (a DDL command with an unknown
    /// outcome): their documents are not checked.
    pub tainted: BTreeSet<String>,
    /// Namespaces that exist for certain.
    pub existing: BTreeSet<String>,
}

pub fn key_string(key: &Bson) -> String {
    match key {
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        other => other.to_string(),
    }
}

impl DocModel {
    pub fn set(&mut self, ns: &str, key: &Bson, doc: Option<Document>) {
        self.docs
            .entry(ns.to_string())
            .or_default()
            .insert(key_string(key), vec![doc]);
    }

    /// The document is now either what it was or `doc`.
    pub fn maybe(&mut self, ns: &str, key: &Bson, doc: Option<Document>) {
        let states = self
            .docs
            .entry(ns.to_string())
            .or_default()
            .entry(key_string(key))
            .or_insert_with(|| vec![None]);
        if !states.contains(&doc) {
            states.push(doc);
        }
    }

    pub fn rename(&mut self, from: &str, to: &str) {
        if let Some(d) = self.docs.remove(from) {
            self.docs.insert(to.to_string(), d);
        }
        if self.existing.remove(from) {
            self.existing.insert(to.to_string());
        }
    }

    pub fn drop_ns(&mut self, ns: &str) {
        self.docs.remove(ns);
        self.existing.remove(ns);
    }

    pub fn merge(&mut self, other: DocModel) {
        for (ns, docs) in other.docs {
            self.docs.entry(ns).or_default().extend(docs);
        }
        self.tainted.extend(other.tainted);
        self.existing.extend(other.existing);
    }
}

/// One change a write makes, for the model.
#[derive(Debug, Clone)]
pub struct Effect {
    pub coll: Option<String>,
    pub op: Op,
    pub key: Option<Bson>,
    pub tag: Option<Bson>,
    /// The document's state afterwards (`None`: deleted), for CRUD effects.
    pub doc_after: Option<Option<Document>>,
}

impl Effect {
    pub fn crud(coll: &str, op: Op, key: Bson, tag: Option<Bson>, after: Option<Document>) -> Self {
        Effect {
            coll: Some(coll.to_string()),
            op,
            key: Some(key),
            tag,
            doc_after: Some(after),
        }
    }

    pub fn ddl(coll: &str, op: Op, tag: Option<Bson>) -> Self {
        Effect {
            coll: Some(coll.to_string()),
            op,
            key: None,
            tag,
            doc_after: None,
        }
    }
}

/// The outcome of a recorded write.
#[derive(Debug)]
pub enum Written<T> {
    Acked(T),
    /// Failed with an unknown outcome: the caller should stop using what it touched.
    Unknown(Error),
}

/// A worker thread's context: its id, client, RNG and what it recorded.
pub struct ThreadCtx {
    pub tid: usize,
    pub client: Client,
    pub db: String,
    pub rng: StdRng,
    pub faults: bool,
    pub step: u64,
    pub expected: Vec<Expected>,
    pub docs: DocModel,
    /// Unknown outcomes seen (for the report).
    pub unknown: usize,
}

impl ThreadCtx {
    pub fn new(tid: usize, client: Client, db: &str, seed: u64, faults: bool) -> Self {
        ThreadCtx {
            tid,
            client,
            db: db.to_string(),
            rng: StdRng::seed_from_u64(seed),
            faults,
            step: 0,
            expected: Vec::new(),
            docs: DocModel::default(),
            unknown: 0,
        }
    }

    pub fn ns(&self, coll: &str) -> String {
        format!("{}.{coll}", self.db)
    }

    /// A value unique to this thread and run, for `_id`s and write tags.
    pub fn unique(&mut self) -> i64 {
        self.step += 1;
        (self.tid as i64 + 1) * 1_000_000_000 + self.step as i64
    }

    /// Runs one write and records its effects as acknowledged, or as unknown when it failed
    /// in a way that leaves the outcome open and faults are injected. Any other error fails the
    /// thread.
    pub async fn write<T, F>(&mut self, effects: Vec<Effect>, fut: F) -> Result<Written<T>>
    where
        F: Future<Output = mongodb::error::Result<T>>,
    {
        self.step += 1;
        let step = self.step;
        let res = fut.await;
        let outcome = match &res {
            Ok(_) => Outcome::Acked,
            Err(e) if self.faults && unknown_outcome(e) => Outcome::Unknown,
            Err(e) => bail!(
                "thread {} op #{step} ({:?}) failed: {e}",
                self.tid,
                effects.first().map(|x| x.op)
            ),
        };
        for e in &effects {
            self.expected.push(Expected {
                tid: self.tid,
                step,
                db: self.db.clone(),
                coll: e.coll.clone(),
                op: e.op,
                key: e.key.clone(),
                tag: e.tag.clone(),
                outcome,
            });
            let ns = e.coll.as_deref().map(|c| self.ns(c)).unwrap_or_default();
            if let (Some(after), Some(key)) = (&e.doc_after, &e.key) {
                match outcome {
                    Outcome::Acked => self.docs.set(&ns, key, after.clone()),
                    Outcome::Unknown => self.docs.maybe(&ns, key, after.clone()),
                }
            }
        }
        match res {
            Ok(v) => Ok(Written::Acked(v)),
            Err(e) => {
                self.unknown += 1;
                // Give the cluster a moment to come back before the next try.
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(Written::Unknown(e))
            }
        }
    }
}

/// An error after which the write may or may not have happened: network errors, a server
/// that is shutting down or unreachable, anything labelled retryable.
pub fn unknown_outcome(e: &Error) -> bool {
    const TRANSIENT: &[i32] = &[
        6,     // HostUnreachable
        7,     // HostNotFound
        50,    // MaxTimeMSExpired
        70,    // ShardNotFound
        89,    // NetworkTimeout
        91,    // ShutdownInProgress
        189,   // PrimarySteppedDown
        202,   // NetworkInterfaceExceededTimeLimit
        262,   // ExceededTimeLimit
        9001,  // SocketException
        10107, // NotWritablePrimary
        11600, // InterruptedAtShutdown
        11602, // InterruptedDueToReplStateChange
        13435, // NotPrimaryNoSecondaryOk
        13436, // NotPrimaryOrSecondary
    ];
    if e.contains_label("RetryableWriteError") || e.contains_label("TransientTransactionError") {
        return true;
    }
    match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. } => true,
        ErrorKind::Command(c) => TRANSIENT.contains(&c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => TRANSIENT.contains(&w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => true,
        ErrorKind::InsertMany(m) => {
            m.write_errors
                .as_ref()
                .is_some_and(|ws| ws.iter().any(|w| TRANSIENT.contains(&w.code)))
                || m.write_concern_error.is_some()
        }
        _ => false,
    }
}

/// An error from one thread.
#[derive(Debug, Clone)]
pub struct ThreadError {
    pub tid: usize,
    pub iteration: usize,
    pub state: &'static str,
    pub error: String,
}

/// What the threads of one workload run left.
pub struct ThreadsOutcome {
    pub expected: Vec<Expected>,
    pub docs: DocModel,
    pub errors: Vec<ThreadError>,
    pub unknown: usize,
    pub transitions: BTreeMap<&'static str, usize>,
}

/// The RNG seed of thread `tid` of workload `name` under the run seed.
pub fn thread_seed(seed: u64, name: &str, tid: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(tid.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.rotate_left(17)
}

/// Runs the workload's threads (after `setup`, before `teardown`) to completion, or until
/// `deadline`. Thread `tid` uses `clients[tid % clients.len()]`.
pub async fn run_threads<W: Workload>(
    w: std::sync::Arc<W>,
    cfg: &Config,
    clients: &[Client],
    env: &Env,
    seed: u64,
    deadline: Option<tokio::time::Instant>,
) -> Result<ThreadsOutcome> {
    cfg.validate()?;
    ensure!(!clients.is_empty(), "no clients");
    let mut handles = Vec::new();
    for tid in 0..cfg.thread_count {
        let w = w.clone();
        let cfg = cfg.clone();
        let client = clients[tid % clients.len()].clone();
        let mut ctx = ThreadCtx::new(
            tid,
            client,
            &env.db,
            thread_seed(seed, w.name(), tid),
            env.faults,
        );
        handles.push(tokio::spawn(async move {
            let mut data = w.data(tid);
            let mut state = cfg.start_state;
            let mut errors = Vec::new();
            let mut visits: BTreeMap<&'static str, usize> = BTreeMap::new();
            for iteration in 0..cfg.iterations {
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    break;
                }
                *visits.entry(state).or_default() += 1;
                if let Err(e) = w.state(state, &mut data, &mut ctx).await {
                    errors.push(ThreadError {
                        tid,
                        iteration,
                        state,
                        error: format!("{e:#}"),
                    });
                    break;
                }
                match cfg.next_state(state, &mut ctx.rng) {
                    Ok(s) => state = s,
                    Err(e) => {
                        errors.push(ThreadError {
                            tid,
                            iteration,
                            state,
                            error: format!("{e:#}"),
                        });
                        break;
                    }
                }
            }
            (ctx, errors, visits)
        }));
    }
    let mut out = ThreadsOutcome {
        expected: Vec::new(),
        docs: DocModel::default(),
        errors: Vec::new(),
        unknown: 0,
        transitions: BTreeMap::new(),
    };
    for (tid, h) in handles.into_iter().enumerate() {
        match h.await {
            Ok((ctx, errors, visits)) => {
                out.expected.extend(ctx.expected);
                out.docs.merge(ctx.docs);
                out.errors.extend(errors);
                out.unknown += ctx.unknown;
                for (s, n) in visits {
                    *out.transitions.entry(s).or_default() += n;
                }
            }
            Err(e) => out.errors.push(ThreadError {
                tid,
                iteration: 0,
                state: "?",
                error: format!("thread panicked: {e}"),
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cfg() -> Config {
        Config {
            thread_count: 2,
            iterations: 10,
            start_state: "init",
            states: vec!["init", "a", "b"],
            transitions: vec![
                ("init", vec![("a", 1.0)]),
                ("a", vec![("a", 0.25), ("b", 0.75)]),
                ("b", vec![("a", 2.0), ("b", 0.0)]),
            ],
        }
    }

    #[test]
    fn a_valid_config_passes_and_a_broken_one_names_its_fault() {
        cfg().validate().unwrap();
        let mut c = cfg();
        c.transitions.push(("b", vec![("nowhere", 1.0)]));
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("unknown state nowhere")
        );
        let mut c = cfg();
        c.thread_count = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn weighted_choice_scales_by_the_sum_of_weights() {
        let tos = [("a", 1.0), ("b", 3.0)];
        assert_eq!(weighted_choice(&tos, 0.0), "a");
        assert_eq!(weighted_choice(&tos, 0.24), "a");
        assert_eq!(weighted_choice(&tos, 0.26), "b");
        assert_eq!(weighted_choice(&tos, 0.999), "b");
        // A zero weight is never chosen.
        assert_eq!(weighted_choice(&[("a", 0.0), ("b", 1.0)], 0.0), "b");
    }

    /// A workload whose thread 1 fails in its third iteration; the others count visits.
    struct Failing;

    impl Workload for Failing {
        type Data = usize;
        fn name(&self) -> &'static str {
            "failing"
        }
        fn config(&self) -> Config {
            cfg()
        }
        fn data(&self, _tid: usize) -> usize {
            0
        }
        fn setup<'a>(&'a self, _env: &'a Env) -> BoxFuture<'a, Result<Vec<String>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn state<'a>(
            &'a self,
            state: &'static str,
            data: &'a mut usize,
            t: &'a mut ThreadCtx,
        ) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move {
                *data += 1;
                if t.tid == 1 && *data == 3 {
                    bail!("boom in {state}");
                }
                Ok(())
            })
        }
        fn watch_specs(&self, _db: &str) -> Vec<super::super::model::WatchSpec> {
            Vec::new()
        }
    }

    #[tokio::test]
    async fn errors_of_every_thread_are_reported_with_thread_ids() {
        // The client never connects: the states do not use it.
        let client = Client::with_uri_str("mongodb://127.0.0.1:9/")
            .await
            .unwrap();
        let env = Env {
            client: client.clone(),
            db: "x".into(),
            thread_count: 2,
            faults: false,
        };
        let w = std::sync::Arc::new(Failing);
        let out = run_threads(w, &cfg(), &[client], &env, 1, None)
            .await
            .unwrap();
        assert_eq!(out.errors.len(), 1);
        let e = &out.errors[0];
        assert_eq!((e.tid, e.iteration), (1, 2));
        assert!(e.error.contains("boom"), "{}", e.error);
        // Thread 0 ran all 10 iterations, thread 1 stopped at its failing third.
        assert_eq!(out.transitions.values().sum::<usize>(), 13);
    }

    #[test]
    fn the_same_seed_walks_the_same_path() {
        let walk = |seed| {
            let c = cfg();
            let mut rng = StdRng::seed_from_u64(thread_seed(seed, "w", 1));
            let mut s = c.start_state;
            let mut path = vec![s];
            for _ in 0..20 {
                s = c.next_state(s, &mut rng).unwrap();
                path.push(s);
            }
            path
        };
        assert_eq!(walk(7), walk(7));
        assert_ne!(walk(7), walk(8));
    }
}
