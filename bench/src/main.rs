//! `tributary-bench`: drives a Tributary cluster through the Rust driver and reports what it
//! measured: acknowledged writes/s, events/s, acknowledgement → event latency (HDR histogram),
//! watcher lag second by second, and the server's CPU per write and memory. A user-facing
//! tool, not a test: it asserts nothing.
//!
//!   tributary-bench --writers 4 --watchers 1 --seconds 10            # live: write and watch
//!   tributary-bench --writers 1 --batch 100 --docs 100000 --drain    # write, then drain
//!   tributary-bench --uri mongodb://host:27017/ --server-pid 1234 ...
//!
//! Without `--uri` it starts the embedded cluster (`tributary`, from `$TRIBUTARY_BIN` or beside
//! this binary) in a temporary directory and reads that process's CPU and memory.
//!
//! Phases: set-up (collection, shard key, the documents updates work on) → watchers open (live
//! mode) → writers run for `--seconds` or `--docs` → watchers read up to every acknowledged
//! write (or, in drain mode, open now at the time the writes began and read them all).

mod consumers;
mod procstat;
mod report;
mod watchers;
mod workload;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bson::{Document, doc};
use clap::Parser;
use hdrhistogram::Histogram;
use mongodb::Client;
use mongodb::options::{ClientOptions, FullDocumentBeforeChangeType, FullDocumentType};

use report::{Latency, Server, Summary, Tick, rate};
use watchers::WatcherSide;
use workload::{Level, Op, Shared, WatchSpec, Watched, WriteSpec};

#[derive(Parser, Debug)]
#[command(
    name = "tributary-bench",
    version,
    about = "Drives a Tributary cluster through the Rust driver and reports writes/s, events/s, ack→event latency, watcher lag, server CPU and memory."
)]
struct Cli {
    /// The cluster to drive. Without it an embedded cluster is started for the run.
    #[arg(long)]
    uri: Option<String>,
    /// Shards of the embedded cluster (without --uri).
    #[arg(long, default_value_t = 3)]
    shards: usize,
    /// Members of each shard of the embedded cluster (1, or 3, 5 or 7: replica sets on Raft
    /// in the one process).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// The server's process id, to read its CPU and memory (known when the bench starts it).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Concurrent writers.
    #[arg(long, default_value_t = 1)]
    writers: usize,
    /// What the writers do.
    #[arg(long, value_enum, default_value_t = Op::Insert)]
    op: Op,
    /// Shard the collection on `{_id: "hashed"}` (over every shard).
    #[arg(long)]
    sharded: bool,
    /// Documents per insert (`insert_many` when above 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    batch: u64,
    /// Unordered batches (`ordered: false`).
    #[arg(long)]
    unordered: bool,
    /// Each batch is one multi-document transaction of `--batch` inserts, one statement each
    /// (committed with the driver's commit; `--sharded` spreads it over every shard).
    #[arg(long)]
    txn: bool,
    /// Writes per second per writer; 0 writes as fast as acknowledgements come.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// How long the writers run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Stop the writers after this many writes in all (instead of --seconds).
    #[arg(long)]
    docs: Option<u64>,
    /// Bytes of filler per inserted document.
    #[arg(long, default_value_t = 100)]
    payload: usize,
    /// Watchers that read every event.
    #[arg(long, default_value_t = 1)]
    watchers: usize,
    /// Run the watchers' clients on their own threads at this niceness (19: they get only the
    /// CPU the server and the writers leave). On a machine whose cores the server shares with
    /// the bench, this stands in for watchers on other machines; 0 runs them beside the writers.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
    watcher_nice: i32,
    /// Watchers that open a stream and never read it (a stalled consumer).
    #[arg(long, default_value_t = 0)]
    stalled: usize,
    /// What the watchers watch.
    #[arg(long, value_enum, default_value_t = Level::Collection)]
    level: Level,
    /// A `$match` stage for the watchers, as JSON (e.g. '{"operationType": "insert"}').
    #[arg(long = "match")]
    filter: Option<String>,
    /// `fullDocument` for the watchers: updateLookup, whenAvailable or required.
    #[arg(long)]
    full_document: Option<String>,
    /// Create the collection with `changeStreamPreAndPostImages` (every update and delete
    /// keeps its pre-image).
    #[arg(long)]
    pre_images: bool,
    /// `fullDocumentBeforeChange` for the watchers: whenAvailable or required.
    #[arg(long)]
    full_document_before_change: Option<String>,
    /// Write first, then open the watchers at the time the writes began and drain them.
    #[arg(long)]
    drain: bool,
    /// With --drain: also time a stream that resumes after the first event written (a token
    /// as far back as --docs), from the `watch` call to its first event.
    #[arg(long, requires = "drain")]
    resume: bool,
    /// After writing: index `seq`, then time this many point queries `{seq: v}` through the
    /// index and (a tenth as many, at least one) the same queries as collection scans
    /// (`hint: {$natural: 1}`), in the same run.
    #[arg(long, default_value_t = 0)]
    point_queries: u64,
    /// After writing: index `seq`, then time this many aggregates that `$lookup` one
    /// document's `seq` in the same collection by `localField`/`foreignField` and by a
    /// correlated `$eq` (the router reads only the joined documents), and (a tenth as many, at
    /// least one) the same join as a correlated range (which reads the collection whole), in
    /// the same run.
    #[arg(long, default_value_t = 0)]
    lookups: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the result as a CSV row to this file, under a header row when the file is new
    /// (so runs of a sweep can share one file).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Instead of writers and watchers: subscription consumers, for each count given in turn
    /// (e.g. `1,100`), each reading every one of `--docs` documents (default 5,000) one
    /// writer inserts in batches of `--batch` (`bench/src/consumers.rs`).
    #[arg(long, value_delimiter = ',')]
    consumers: Vec<usize>,
    /// With --consumers: ack a batch by naming every delivery, not through its last one.
    #[arg(long, requires = "consumers")]
    ack_ids: bool,
    /// With --consumers: ack a batch through its last delivery with the next read
    /// (`ackThrough`), not with an `ackSubscription` of its own.
    #[arg(long, requires = "consumers", conflicts_with = "ack_ids")]
    ack_with_read: bool,
    /// With --consumers: the most messages one read asks for (`max`).
    #[arg(long, default_value_t = 100, requires = "consumers")]
    read_max: i32,
    /// The database to use (dropped first).
    #[arg(long, default_value = "bench")]
    db: String,
}

const COLL: &str = "load";

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("tributary-bench: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    let full_document = match cli.full_document.as_deref() {
        None => None,
        Some("updateLookup") => Some(FullDocumentType::UpdateLookup),
        Some("whenAvailable") => Some(FullDocumentType::WhenAvailable),
        Some("required") => Some(FullDocumentType::Required),
        Some(other) => anyhow::bail!(
            "--full-document {other}: expected updateLookup, whenAvailable or required"
        ),
    };
    let before_change = match cli.full_document_before_change.as_deref() {
        None => None,
        Some("whenAvailable") => Some(FullDocumentBeforeChangeType::WhenAvailable),
        Some("required") => Some(FullDocumentBeforeChangeType::Required),
        Some(other) => anyhow::bail!(
            "--full-document-before-change {other}: expected whenAvailable or required"
        ),
    };
    let pipeline = match &cli.filter {
        None => Vec::new(),
        Some(json) => {
            let value: serde_json::Value =
                serde_json::from_str(json).context("--match is not valid JSON")?;
            anyhow::ensure!(value.is_object(), "--match must be a JSON object");
            let m = bson::serialize_to_document(&value).context("--match is not a document")?;
            vec![doc! {"$match": m}]
        }
    };
    let mut server = None;
    let (uri, pid) = match &cli.uri {
        Some(u) => (u.clone(), cli.server_pid),
        None => {
            let s = EmbeddedServer::start(cli.shards, cli.replicas).await?;
            let uri = s.uri.clone();
            let pid = s.child.id();
            server = Some(s);
            (uri, Some(pid))
        }
    };
    let mut opts = ClientOptions::parse(&uri).await?;
    let most_consumers = cli.consumers.iter().copied().max().unwrap_or(0);
    opts.max_pool_size =
        Some((cli.writers + cli.watchers + cli.stalled + most_consumers + 8) as u32);
    if !cli.consumers.is_empty() {
        let client = Client::with_options(opts)?;
        let spec = consumers::Spec {
            counts: cli.consumers.clone(),
            docs: cli.docs.unwrap_or(5_000),
            batch: cli.batch as usize,
            payload: cli.payload,
            acks: if cli.ack_ids {
                consumers::Acks::Ids
            } else if cli.ack_with_read {
                consumers::Acks::WithRead
            } else {
                consumers::Acks::Through
            },
            read_max: cli.read_max,
        };
        let result = consumers::run(&client, &cli.db, pid, &spec).await;
        drop(server);
        return result;
    }
    let client = Client::with_options(opts.clone())?;
    let side = WatcherSide::new(cli.watcher_nice, &client, opts)?;
    let result = bench(
        &cli,
        &client,
        &side,
        pid,
        pipeline,
        full_document,
        before_change,
    )
    .await;
    side.shutdown();
    drop(server);
    let summary = result?;
    for line in summary.lines() {
        println!("{line}");
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &cli.csv {
        append_csv(path, &summary).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Appends the summary's row to the CSV file at `path`, after the header if the file is new
/// or empty.
fn append_csv(path: &std::path::Path, summary: &Summary) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut text = String::new();
    if file.metadata()?.len() == 0 {
        text.push_str(report::CSV_HEADER);
        text.push('\n');
    }
    text.push_str(&summary.csv_row());
    text.push('\n');
    file.write_all(text.as_bytes())
}

async fn bench(
    cli: &Cli,
    client: &Client,
    side: &WatcherSide,
    pid: Option<u32>,
    pipeline: Vec<Document>,
    full_document: Option<FullDocumentType>,
    full_document_before_change: Option<FullDocumentBeforeChangeType>,
) -> Result<Summary> {
    let db = client.database(&cli.db);
    db.drop().await.context("dropping the bench database")?;
    let mut create = doc! {"create": COLL};
    if cli.pre_images {
        create.insert("changeStreamPreAndPostImages", doc! {"enabled": true});
    }
    db.run_command(create).await?;
    if cli.sharded {
        client
            .database("admin")
            .run_command(
                doc! {"shardCollection": format!("{}.{COLL}", cli.db), "key": {"_id": "hashed"}},
            )
            .await?;
    }
    let coll = db.collection::<Document>(COLL);
    let write_spec = WriteSpec {
        writers: cli.writers,
        op: cli.op,
        batch: cli.batch as usize,
        rate: cli.rate,
        payload: cli.payload,
        limit: cli.docs,
        ordered: !cli.unordered,
        txn: cli.txn,
    };
    workload::seed_update_pool(&coll, &write_spec).await?;
    let start_time = operation_time(client).await?;
    let mut watch_spec = WatchSpec {
        level: cli.level,
        pipeline,
        full_document,
        full_document_before_change,
        start_at: None,
    };
    let counted = watch_spec.pipeline.is_empty();
    let shared = Shared::new();
    let ticks_per_second = procstat::ticks_per_second();
    let sample = move || pid.and_then(|p| procstat::sample(p, ticks_per_second));

    // Live mode: the watchers open before the first write.
    let counts: Vec<Arc<AtomicU64>> = (0..cli.watchers).map(|_| Arc::default()).collect();
    let mut stalled = Vec::new();
    let mut streams = Vec::new();
    if !cli.drain {
        for _ in 0..cli.watchers {
            streams.push(side.open(&cli.db, COLL, &watch_spec).await?);
        }
        for _ in 0..cli.stalled {
            stalled.push(side.open(&cli.db, COLL, &watch_spec).await?);
        }
    }
    let before = sample();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let goal = match cli.docs {
        Some(docs) => Goal::Writes(docs),
        None => Goal::Seconds(cli.seconds),
    };
    let sampler = tokio::spawn(sample_every_second(
        shared.clone(),
        counts.clone(),
        pid,
        ticks_per_second,
        goal,
        stop_sampling.clone(),
    ));
    let started = Instant::now();
    let watchers = spawn_watchers(side, streams, &counts, &shared, counted);
    let writers: Vec<_> = (0..cli.writers)
        .map(|w| {
            tokio::spawn(workload::write(
                coll.clone(),
                w,
                write_spec.clone(),
                shared.clone(),
            ))
        })
        .collect();
    if cli.docs.is_none() {
        tokio::time::sleep(Duration::from_secs(cli.seconds)).await;
        shared.stop_writing.store(true, Ordering::Relaxed);
    }
    for w in writers {
        w.await?;
    }
    let write_time = started.elapsed();
    if cli.point_queries > 0 {
        point_queries(&db, &coll, cli.point_queries).await?;
    }
    if cli.lookups > 0 {
        lookups(&db, &coll, cli.lookups).await?;
    }
    let acked = shared.acked.load(Ordering::Relaxed);
    shared.stop_writing.store(true, Ordering::Relaxed);
    shared.writers_done.store(true, Ordering::Release);

    let resume_to_first_event = if cli.resume {
        Some(workload::resume_to_first_event(client, &cli.db, COLL, &watch_spec, start_time).await?)
    } else {
        None
    };
    // Drain mode: the watchers open now, at the time the writes began.
    let (watchers, drain_started) = if cli.drain {
        watch_spec.start_at = Some(start_time);
        let drain_started = Instant::now();
        let mut streams = Vec::new();
        for _ in 0..cli.watchers {
            streams.push(side.open(&cli.db, COLL, &watch_spec).await?);
        }
        (
            spawn_watchers(side, streams, &counts, &shared, counted),
            Some(drain_started),
        )
    } else {
        (watchers, None)
    };
    let mut watched: Vec<Watched> = Vec::new();
    for w in watchers {
        watched.push(w.await?);
    }
    let elapsed = drain_started
        .map(|d| d.elapsed())
        .unwrap_or_else(|| started.elapsed());
    let after = sample();
    stop_sampling.store(true, Ordering::Relaxed);
    let ticks = sampler.await?;
    drop(stalled);

    let mut latency = Histogram::<u64>::new(3)?;
    let mut send_latency = Histogram::<u64>::new(3)?;
    for w in &watched {
        latency.add(&w.latency)?;
        send_latency.add(&w.send_latency)?;
    }
    let events: u64 = watched.iter().map(|w| w.events).sum();
    let slowest = watched.iter().map(|w| w.events).min();
    let rss_max = ticks
        .iter()
        .filter_map(|t| t.server_rss_mb)
        .fold(0.0_f64, f64::max);
    Ok(Summary {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        seconds: elapsed.as_secs_f64(),
        writers: cli.writers,
        watchers: cli.watchers,
        acked_writes: acked,
        writes_per_sec: rate(acked, write_time),
        events,
        events_per_sec: rate(events, elapsed),
        delivered_ratio: match (slowest, counted && acked > 0) {
            (Some(s), true) => Some(s as f64 / acked as f64),
            _ => None,
        },
        ack_to_event: if cli.drain {
            None
        } else {
            Latency::from_histogram(&latency)
        },
        send_to_event: if cli.drain {
            None
        } else {
            Latency::from_histogram(&send_latency)
        },
        time_to_first_event_ms: match drain_started {
            Some(d) => watched
                .iter()
                .filter_map(|w| w.first_event_at)
                .min()
                .map(|at| at.duration_since(d).as_secs_f64() * 1000.0),
            None => None,
        },
        resume_to_first_event_ms: resume_to_first_event.map(|d| d.as_secs_f64() * 1000.0),
        write_errors: shared.write_errors.load(Ordering::Relaxed),
        watcher_errors: watched.iter().filter_map(|w| w.error.clone()).collect(),
        server: match (before, after) {
            (Some(b), Some(a)) => Some(Server::between(
                b,
                a,
                (rss_max * 1024.0 * 1024.0) as u64,
                acked,
                events,
            )),
            _ => None,
        },
        ticks,
    })
}

/// Watchers read until they have every acknowledged write once the writers are done (or, with
/// a `$match`, until their stream has been idle for a second after that).
fn spawn_watchers(
    side: &WatcherSide,
    streams: Vec<mongodb::change_stream::ChangeStream<bson::RawDocumentBuf>>,
    counts: &[Arc<AtomicU64>],
    shared: &Arc<Shared>,
    counted: bool,
) -> Vec<tokio::task::JoinHandle<Watched>> {
    streams
        .into_iter()
        .zip(counts)
        .map(|(stream, count)| {
            let done_shared = shared.clone();
            let done = move |n: u64, idle: bool| {
                done_shared.writers_done.load(Ordering::Acquire)
                    && (if counted {
                        n >= done_shared.acked.load(Ordering::Relaxed)
                    } else {
                        idle
                    })
            };
            side.spawn(workload::watch(
                stream,
                COLL.to_string(),
                count.clone(),
                shared.clone(),
                done,
            ))
        })
        .collect()
}

/// One progress line a second on stderr, and the ticks for the report.
/// Where the writers stop: after so many seconds, or so many acknowledged writes.
#[derive(Debug, Clone, Copy)]
enum Goal {
    Seconds(u64),
    Writes(u64),
}

async fn sample_every_second(
    shared: Arc<Shared>,
    counts: Vec<Arc<AtomicU64>>,
    pid: Option<u32>,
    ticks_per_second: u64,
    goal: Goal,
    stop: Arc<AtomicBool>,
) -> Vec<Tick> {
    use std::io::IsTerminal;
    // On a terminal the line is redrawn in place; in a log, one line a second.
    let terminal = std::io::stderr().is_terminal();
    let mut delivering_since = None;
    let mut ticks = Vec::new();
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.tick().await;
    let mut last = (0_u64, 0_u64);
    let mut last_cpu = pid.and_then(|p| procstat::sample(p, ticks_per_second));
    loop {
        every.tick().await;
        let acked = shared.acked.load(Ordering::Relaxed);
        let slowest = counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        let now = pid.and_then(|p| procstat::sample(p, ticks_per_second));
        let cpu = match (last_cpu, now) {
            (Some(a), Some(b)) => format!(
                " server CPU {:.0}%",
                b.cpu.saturating_sub(a.cpu).as_secs_f64() * 100.0
            ),
            _ => String::new(),
        };
        let tick = Tick {
            t_secs: shared.start.elapsed().as_secs_f64(),
            acked,
            slowest_watcher: slowest,
            lag: acked.saturating_sub(slowest),
            server_rss_mb: now.map(|s| report::mb(s.rss)),
        };
        // Writing, then (once the writers are done) delivering to the slowest watcher.
        let (phase, done, elapsed) = if !shared.writers_done.load(Ordering::Acquire) {
            let done = match goal {
                Goal::Seconds(s) => tick.t_secs / s.max(1) as f64,
                Goal::Writes(n) => acked as f64 / n.max(1) as f64,
            };
            ("writing", done, shared.start.elapsed())
        } else {
            let since = *delivering_since.get_or_insert_with(Instant::now);
            let done = if counts.is_empty() || acked == 0 {
                1.0
            } else {
                slowest as f64 / acked as f64
            };
            ("delivering", done, since.elapsed())
        };
        let line = format!(
            "{} {phase} t={:.0}s writes {}/s events {}/s (slowest watcher) lag {}{cpu}{}",
            report::progress(done, elapsed),
            tick.t_secs,
            acked - last.0,
            slowest.saturating_sub(last.1),
            tick.lag,
            tick.server_rss_mb
                .map(|m| format!(" RSS {m:.0} MB"))
                .unwrap_or_default(),
        );
        if terminal {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        last = (acked, slowest);
        last_cpu = now;
        ticks.push(tick);
        if stop.load(Ordering::Relaxed) {
            if terminal {
                eprintln!();
            }
            return ticks;
        }
    }
}

/// Index `seq`, then time `n` point queries by the index and `n / 10` (at least one) as
/// collection scans, and print both latencies and their ratio.
async fn point_queries(
    db: &mongodb::Database,
    coll: &mongodb::Collection<Document>,
    n: u64,
) -> Result<()> {
    use futures::TryStreamExt;
    let max_seq = index_seq(db, coll).await?;
    let time = |hint: Option<Document>, count: u64| {
        let coll = coll.clone();
        async move {
            let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
            for i in 0..count {
                let seq = (i as i64 * 7919) % max_seq;
                let mut find = coll.find(doc! {"seq": seq});
                if let Some(h) = &hint {
                    find = find.hint(mongodb::options::Hint::Keys(h.clone()));
                }
                let t = Instant::now();
                let found: Vec<Document> = find.await?.try_collect().await?;
                hist.record(t.elapsed().as_micros() as u64)?;
                anyhow::ensure!(!found.is_empty() || seq >= max_seq, "seq {seq} not found");
            }
            anyhow::Ok(hist)
        }
    };
    let indexed = time(None, n).await?;
    let scanned = time(Some(doc! {"$natural": 1}), (n / 10).max(1)).await?;
    let p50 = |h: &hdrhistogram::Histogram<u64>| h.value_at_quantile(0.5);
    println!(
        "point query by index: p50 {} µs, p99 {} µs ({} queries)",
        p50(&indexed),
        indexed.value_at_quantile(0.99),
        indexed.len()
    );
    println!(
        "point query by scan:  p50 {} µs, p99 {} µs ({} queries)",
        p50(&scanned),
        scanned.value_at_quantile(0.99),
        scanned.len()
    );
    println!(
        "scan ÷ index (p50): {:.0}×",
        p50(&scanned) as f64 / p50(&indexed).max(1) as f64
    );
    Ok(())
}

/// Builds `{seq: 1}` (a no-op when it exists) and returns the document count (at least 1).
async fn index_seq(db: &mongodb::Database, coll: &mongodb::Collection<Document>) -> Result<i64> {
    let docs = coll.estimated_document_count().await?;
    let built = Instant::now();
    db.run_command(doc! {"createIndexes": COLL, "indexes": [{"key": {"seq": 1}, "name": "seq_1"}]})
        .await?;
    println!(
        "index seq_1 over {docs} documents in {:.2} s",
        built.elapsed().as_secs_f64()
    );
    Ok(docs.max(1) as i64)
}

/// Index `seq`, then time `n` joins of one document to the documents with its `seq` by
/// `localField`/`foreignField` and by a correlated `$eq` (both narrowed to the joined
/// documents), and `n / 10` (at least one) of the same join as a correlated range the router
/// reads the whole collection for; print the latencies and the ratios.
async fn lookups(
    db: &mongodb::Database,
    coll: &mongodb::Collection<Document>,
    n: u64,
) -> Result<()> {
    use futures::TryStreamExt;
    let max_seq = index_seq(db, coll).await?;
    let correlated = |filter: Document| {
        doc! {"$lookup": {
            "from": COLL,
            "let": {"s": "$seq"},
            "pipeline": [{"$match": {"$expr": filter}}],
            "as": "same",
        }}
    };
    // Narrowed by the router: the join values, through `seq_1`.
    let by_fields =
        doc! {"$lookup": {"from": COLL, "localField": "seq", "foreignField": "seq", "as": "same"}};
    let by_eq = correlated(doc! {"$eq": ["$seq", "$$s"]});
    // The same join the router cannot narrow: the whole collection.
    let by_range =
        correlated(doc! {"$and": [{"$gte": ["$seq", "$$s"]}, {"$lte": ["$seq", "$$s"]}]});
    let time = |lookup: &Document, count: u64| {
        let coll = coll.clone();
        let mut sizes = Vec::new();
        let stages: Vec<_> = (0..count)
            .map(|i| {
                let seq = (i as i64 * 7919) % max_seq;
                vec![
                    doc! {"$match": {"seq": seq}},
                    doc! {"$limit": 1},
                    lookup.clone(),
                    doc! {"$project": {"n": {"$size": "$same"}}},
                ]
            })
            .collect();
        async move {
            let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
            for pipeline in stages {
                let t = Instant::now();
                let out: Vec<Document> = coll.aggregate(pipeline).await?.try_collect().await?;
                hist.record(t.elapsed().as_micros() as u64)?;
                sizes.push(out.first().and_then(|d| d.get_i32("n").ok()));
            }
            anyhow::Ok((hist, sizes))
        }
    };
    let (fields, fields_sizes) = time(&by_fields, n).await?;
    let (eq, eq_sizes) = time(&by_eq, n).await?;
    let (range, range_sizes) = time(&by_range, (n / 10).max(1)).await?;
    anyhow::ensure!(
        fields_sizes == eq_sizes && fields_sizes[..range_sizes.len()] == range_sizes[..],
        "the joins disagree: {fields_sizes:?}, {eq_sizes:?}, {range_sizes:?}"
    );
    let p50 = |h: &hdrhistogram::Histogram<u64>| h.value_at_quantile(0.5);
    for (name, h) in [
        ("localField/foreignField", &fields),
        ("a correlated $eq", &eq),
        ("a correlated range (whole collection)", &range),
    ] {
        println!(
            "$lookup by {name}: p50 {} µs, p99 {} µs ({} aggregates)",
            p50(h),
            h.value_at_quantile(0.99),
            h.len()
        );
    }
    println!(
        "whole ÷ localField/foreignField (p50): {:.0}×, whole ÷ correlated $eq: {:.0}×",
        p50(&range) as f64 / p50(&fields).max(1) as f64,
        p50(&range) as f64 / p50(&eq).max(1) as f64
    );
    Ok(())
}

/// The cluster's current time (a `ping`'s `operationTime`): drain mode starts there.
async fn operation_time(client: &Client) -> Result<bson::Timestamp> {
    let reply = client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await?;
    reply
        .get_timestamp("operationTime")
        .context("the ping reply has no operationTime")
}

/// The embedded cluster, as a child process (so its CPU and memory are its own).
struct EmbeddedServer {
    child: Child,
    uri: String,
    _dir: tempfile::TempDir,
}

impl EmbeddedServer {
    async fn start(shards: usize, replicas: usize) -> Result<EmbeddedServer> {
        let binary = match std::env::var_os("TRIBUTARY_BIN") {
            Some(b) => PathBuf::from(b),
            None => std::env::current_exe()?
                .parent()
                .context("the bench binary has no directory")?
                .join("tributary"),
        };
        let dir = tempfile::tempdir()?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--shards", &shards.to_string()])
            .args(["--replicas", &replicas.to_string()])
            .arg("--dbpath")
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it: cargo build --release --bin tributary)",
                    binary.display()
                )
            })?;
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the embedded cluster did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(EmbeddedServer {
            child,
            uri: format!("mongodb://{addr}/?directConnection=true"),
            _dir: dir,
        })
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
