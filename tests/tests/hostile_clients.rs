//! Hostile clients cost the well-behaved ones little (short form). It measures throughput, so
//! it runs alone: `scripts/test.sh` runs it after the other tests (`cargo nextest run -p tests
//! --test hostile_clients --run-ignored only`).
//!
//! One embedded cluster (the `tributary` binary, in a process of its own), four writers
//! inserting and one watcher reading every event. First the writers alone, for a period; then, with:
//! * 1,000 raw TCP connections each sending a header promising a 48 MB message and then a byte
//!   now and then (a slowloris), and
//! * 100 change streams opened and never read,
//!
//! the writers run through phases in which, every other phase,
//! * 100 change streams started at an early operation time read one batch a second, far
//!   behind.
//!
//! Invariants checked:
//! * while the far-behind streams read, the writers keep ≥ 0.9 of their throughput in the
//!   phases around, counted over all of them ([`reading_ratio`]), and the far-behind streams read at least a quarter of
//!   the events they ask for (the lane yields to the writers; it does not starve the readers);
//! * the watcher saw every acknowledged insert, once (count and ids);
//! * the server's RSS, less its shards' bounded caches, stays under [`RSS_BOUND`], and its
//!   virtual size under [`VIRTUAL_BOUND`]; the shard replies its change streams hold stay
//!   under [`HELD_BOUND_MB`];
//! * `serverStatus.connections` is truthful (`current` counts the tricklers, `available` is the
//!   limit in force minus `current`);
//! * each trickling connection is closed once its message has taken the frame timeout, not
//!   before, while the never-read streams' idle connections stay usable.
//!
//! The hostile clients run on threads of their own that run only when a core is idle ([`hostile_runtime`]):
//! in a deployment they run on other machines. What they cost the cluster is paid on the
//! cluster's threads and measured; the cluster serves change streams on its background lane
//! (`shard::background`), at a lower priority than the writers.
//!
//! The figures are printed (`--no-capture`) before anything is asserted. The file-descriptor
//! soft limit is raised for the run (the server inherits it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, Timestamp, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::options::ClientOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WRITERS: u64 = 4;
const SECOND: Duration = Duration::from_secs(1);
/// The first baseline, before any hostile client exists, lasts this long.
const PERIOD: Duration = Duration::from_secs(8);
/// Then the writers run through [`PHASES`] phases of this length, and the far-behind streams
/// read in every other one: the throughput of the phases with them is compared with that of
/// the phases between, which the same minute of the same machine measured. (One period with
/// and one without, even a minute apart, differ by up to 30 % here with nothing changed: a
/// shared VM.)
const PHASE: Duration = Duration::from_secs(2);
const PHASES: usize = 24;
const TRICKLERS: usize = 1_000;
const IDLE_STREAMS: usize = 100;
const SLOW_STREAMS: usize = 100;
/// Each slow stream reads this many events (its batch size), then sleeps a second.
const SLOW_BATCH: u32 = 100;
/// Longer than the phases together, so the tricklers all trickle through them, yet short
/// enough for the test to see them cut off.
const FRAME_TIMEOUT: Duration = Duration::from_secs(56);
/// What the server process may hold resident at its peak, less what the shards' bounded
/// caches (oplog tail window, history, page cache: `serverStatus` `shards.*.memory`, each with
/// its bound) held at the end (the clients' memory, drivers and hostile clients, is this test
/// process's and not counted).
///
/// Measured on a shared 2-core Linux VM, debug build: about 60 MB after the first period, and a
/// peak near 330 MB through the phases, of which the caches were 48 MB. The RSS climbs through
/// the phases; the caches grow with what is written (up to their bounds: 256 MiB of page cache
/// per shard), and were about half of the climb after the first phases; what the change
/// streams held did not grow. A heap profile of the server (heaptrack, on glibc's allocator,
/// after the per-shard reading of 35ab6f9) put its 195 MB heap peak in: 72 MB of shard
/// replies the router's change streams held (the 100 far-behind streams, a few getMores of 100
/// events per shard each, and the never-read streams' shared log), 17 MB the tricklers'
/// connection buffers, 15 MB the shards' write path, 12 MB the shards' stream cursors, 11 MB
/// making the events, 9 MB the merges. Until this test ran the server in a process of its own
/// it measured this process whole, and the driver's own batches of the far-behind and
/// never-read streams, not the server, were most of it (up to 583 MB). The bound leaves room
/// above the worst run for allocator slack; a per-client copy of a shared buffer, or a buffer
/// per trickler of the size its header declares once touched, would go past it.
const RSS_BOUND: u64 = 400 << 20;
/// What the router's change streams may hold of shard replies (`serverStatus`
/// `metrics.changeStreams.heldReplyBytes`) at the end of any phase. Measured: at most 94 MB
/// (about 0.7 MB per far-behind stream, and the never-read streams' shared log, 16 MiB).
/// Before a merge stopped reading a shard that holds a getMore's worth, a stream took in
/// everything its feeds fetched whenever it waited, without a bound.
const HELD_BOUND_MB: u64 = 150;
/// The server's peak virtual size. Measured 1.0 GB with the hostile clients (thread stacks and
/// allocator arenas). Reserving each frame's declared length as soon as its header arrived, as
/// the codec once did, made it 46 GB here (1,000 × 48 MB, mostly never touched, so invisible
/// to RSS) and cut throughput to 0.14×.
const VIRTUAL_BOUND: u64 = 4 << 30;
/// Enough file descriptors for both ends of every connection, plus the shards' files.
const OPEN_FILES_WANTED: u64 = 8_192;

/// Raises this process's soft limit on open files to `want` (at most the hard limit) and
/// returns the soft limit in force.
#[allow(unsafe_code)]
fn raise_open_files(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit`/`setrlimit` read or write one `rlimit` through a pointer to a live,
    // aligned local of that type, and touch nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

/// What the shards' bounded in-memory caches hold (`serverStatus` `shards.*.memory`: the oplog
/// tail window, the history and the page cache): part of
/// this process's RSS that grows with what was written, up to the caches' bounds.
async fn shard_caches(admin: &mongodb::Database) -> anyhow::Result<u64> {
    let status = admin.run_command(doc! {"serverStatus": 1}).await?;
    let mut bytes = 0;
    for (_, shard) in status.get_document("shards")? {
        let memory = shard
            .as_document()
            .and_then(|s| s.get_document("memory").ok());
        for field in ["tailWindowBytes", "historyBytes", "pageCacheBytes"] {
            bytes += memory.and_then(|m| m.get_i64(field).ok()).unwrap_or(0) as u64;
        }
    }
    Ok(bytes)
}

/// The bytes of shard replies the router's change streams hold (`serverStatus`
/// `metrics.changeStreams.heldReplyBytes`).
async fn stream_replies_held(admin: &mongodb::Database) -> anyhow::Result<u64> {
    let metrics = tests::change_stream_metrics(admin).await?;
    Ok(u64::try_from(metrics.get_i64("heldReplyBytes")?)?)
}

/// A field of `/proc/<pid>/status` given in kB (`VmRSS`, `VmSize`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time so far, in clock ticks: process `pid`'s background lane (its threads named
/// `background`), the rest of it, and the machine's steal (time its virtual CPUs waited for
/// the host). For the report: where the reading phases' cost went.
fn cpu_ticks(pid: u32) -> [u64; 3] {
    let mut out = [0; 3];
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            // utime and stime: fields 14 and 15, the 12th and 13th after the name.
            let ticks: u64 = stat[close + 1..]
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|t| t.parse::<u64>().ok())
                .sum();
            out[usize::from(&stat[open + 1..close] != "background")] += ticks;
        }
    }
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    out[2] = machine
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    out
}

/// Per phase kind (quiet, reading): the mean share of one CPU, in percent, that each of
/// [`cpu_ticks`]'s counters took, from samples at the start and the end of each phase.
fn cpu_by_phase(samples: &[[u64; 3]]) -> [[u64; 3]; 2] {
    const TICKS_PER_SECOND: u64 = 100; // USER_HZ on Linux
    let mut ticks = [[0u64; 3]; 2];
    let mut phases = [0u64; 2];
    for (k, pair) in samples.windows(2).enumerate() {
        phases[k % 2] += 1;
        for (i, sum) in ticks[k % 2].iter_mut().enumerate() {
            *sum += pair[1][i].saturating_sub(pair[0][i]);
        }
    }
    let per_phase = PHASE.as_secs() * TICKS_PER_SECOND;
    std::array::from_fn(|kind| ticks[kind].map(|t| t * 100 / (per_phase * phases[kind]).max(1)))
}

/// The largest resident and virtual sizes of process `pid` seen since the last `take`.
struct MemoryPeak {
    pid: u32,
    rss: AtomicU64,
    virt: AtomicU64,
}

impl MemoryPeak {
    fn new(pid: u32) -> MemoryPeak {
        MemoryPeak {
            pid,
            rss: AtomicU64::new(0),
            virt: AtomicU64::new(0),
        }
    }

    fn sample(&self) {
        self.rss
            .fetch_max(status_bytes(self.pid, "VmRSS"), Ordering::Relaxed);
        self.virt
            .fetch_max(status_bytes(self.pid, "VmSize"), Ordering::Relaxed);
    }

    /// `(rss, virtual)` peaks, and starts again.
    fn take(&self) -> (u64, u64) {
        self.sample();
        (
            self.rss.swap(0, Ordering::Relaxed),
            self.virt.swap(0, Ordering::Relaxed),
        )
    }
}

async fn client(addr: SocketAddr, pool: u32) -> anyhow::Result<mongodb::Client> {
    let mut opts = ClientOptions::parse(format!("mongodb://{addr}/?directConnection=true")).await?;
    opts.max_pool_size = Some(pool);
    Ok(mongodb::Client::with_options(opts)?)
}

/// The ids the writers inserted: acknowledged (with when), and failed (which may or may not
/// be in).
#[derive(Default)]
struct Written {
    acked: Vec<(Instant, i64)>,
    failed: Vec<i64>,
}

impl Written {
    fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.acked.iter().map(|(_, id)| *id)
    }

    /// How many inserts were acknowledged in each of `n` consecutive windows of `width` from
    /// `started`.
    fn counts(&self, started: Instant, width: Duration, n: usize) -> Vec<u32> {
        let mut counts = vec![0u32; n];
        for (at, _) in &self.acked {
            let w = (at.duration_since(started).as_millis() / width.as_millis()) as usize;
            if let Some(c) = counts.get_mut(w) {
                *c += 1;
            }
        }
        counts
    }
}

/// The median of `counts` per `width`, in inserts per second: a burst of slow disk syncs (the
/// machine is shared) moves it less than it moves the mean.
fn median_rate(mut counts: Vec<u32>, width: Duration) -> f64 {
    counts.sort_unstable();
    let n = counts.len();
    let mid = if n % 2 == 1 {
        f64::from(counts[n / 2])
    } else {
        f64::from(counts[n / 2 - 1] + counts[n / 2]) / 2.0
    };
    mid / width.as_secs_f64()
}

/// The writers' throughput in the phases in which the far-behind streams read (the odd ones),
/// as a fraction of what the phases around predict: the inserts of the reading phases over
/// the sum, for each, of the mean of its neighbours'. A slow drift of the machine's speed (it
/// moved by half within one run here) cancels out phase by phase; summing before dividing
/// weighs every phase, so one stalled phase moves the figure by a twelfth of its shortfall.
/// (The median of the per-phase ratios, used before, weighs only the middle two of twelve:
/// on the official CI's run that failed at 0.8996 by it, this gave 0.92, and the middle ten's
/// mean 0.91.)
fn reading_ratio(counts: &[u32]) -> f64 {
    let (mut reading, mut predicted) = (0.0, 0.0);
    for k in (1..counts.len()).step_by(2) {
        let around: Vec<f64> = [Some(k - 1), (k + 1 < counts.len()).then_some(k + 1)]
            .into_iter()
            .flatten()
            .map(|j| f64::from(counts[j]))
            .collect();
        reading += f64::from(counts[k]);
        predicted += around.iter().sum::<f64>() / around.len() as f64;
    }
    reading / predicted.max(1.0)
}

#[test]
fn the_reading_ratio_weighs_every_phase_and_cancels_a_drift() {
    // A steady drift, no cost: 1.0.
    let drift: Vec<u32> = (0..24).map(|k| 1000 + 10 * k).collect();
    assert!((reading_ratio(&drift) - 1.0).abs() < 0.001);
    // Reading phases at 0.9 of their neighbours, with a drift: 0.9.
    let cost: Vec<u32> = (0..24_u32)
        .map(|k| (1000 + 10 * k) * if k % 2 == 1 { 9 } else { 10 } / 10)
        .collect();
    assert!(
        (reading_ratio(&cost) - 0.9).abs() < 0.002,
        "{}",
        reading_ratio(&cost)
    );
    // The official CI's failing run (stop 50).
    let official = [
        1067, 1077, 999, 951, 1054, 899, 997, 911, 1032, 983, 886, 975, 1176, 1005, 1111, 967, 985,
        899, 1010, 918, 1103, 992, 1158, 1032,
    ];
    assert!((reading_ratio(&official) - 0.9196).abs() < 0.001);
}

/// How far behind the writers the watcher ran through the phases: from each insert's
/// acknowledgement to its event reaching the watcher (median, 99th percentile, most). Shown,
/// not asserted: on a saturated machine the lane yields to the writers, so streams lag.
fn watcher_lag(during: &Written, seen: &[(Instant, i64)]) -> String {
    let seen: std::collections::HashMap<i64, Instant> =
        seen.iter().map(|(at, id)| (*id, *at)).collect();
    let mut lags: Vec<Duration> = during
        .acked
        .iter()
        .filter_map(|(acked, id)| Some(seen.get(id)?.saturating_duration_since(*acked)))
        .collect();
    if lags.is_empty() {
        return "no watcher lag measured".into();
    }
    lags.sort_unstable();
    let at = |q: f64| lags[((lags.len() - 1) as f64 * q) as usize];
    format!(
        "the watcher's lag through the phases: median {:?}, p99 {:?}, most {:?}",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Four writers inserting one document at a time for `period`; ids start at `base`.
async fn write_for(coll: &mongodb::Collection<Document>, base: i64, period: Duration) -> Written {
    let until = Instant::now() + period;
    let tasks: Vec<_> = (0..WRITERS as i64)
        .map(|w| {
            let coll = coll.clone();
            tokio::spawn(async move {
                let mut out = Written::default();
                let mut i = 0;
                while Instant::now() < until {
                    let id = base + w * 100_000_000 + i;
                    i += 1;
                    match coll
                        .insert_one(doc! {"_id": id, "w": w, "pad": "x".repeat(100)})
                        .await
                    {
                        Ok(_) => out.acked.push((Instant::now(), id)),
                        Err(_) => out.failed.push(id),
                    }
                }
                out
            })
        })
        .collect();
    let mut all = Written::default();
    for t in tasks {
        let w = t.await.expect("writer");
        all.acked.extend(w.acked);
        all.failed.extend(w.failed);
    }
    all
}

fn id_of(event: &Document) -> Option<i64> {
    match event.get_document("documentKey").ok()?.get("_id")? {
        Bson::Int64(i) => Some(*i),
        Bson::Int32(i) => Some(i64::from(*i)),
        _ => None,
    }
}

/// A trickler: connects (and counts itself in `connected`), waits for `go`, then sends a header
/// promising a 48 MB OP_MSG and a byte every second or so (spread by `n`), until the server
/// closes the connection: how long after the header that took.
async fn trickle(
    addr: SocketAddr,
    n: usize,
    connected: Arc<AtomicUsize>,
    mut go: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Duration> {
    let stream = TcpStream::connect(addr).await?;
    connected.fetch_add(1, Ordering::Relaxed);
    go.wait_for(|go| *go).await?;
    let (mut rd, mut wr) = stream.into_split();
    let mut header = 48_000_000i32.to_le_bytes().to_vec();
    header.extend_from_slice(&(n as i32).to_le_bytes());
    header.extend_from_slice(&0i32.to_le_bytes());
    header.extend_from_slice(&2013i32.to_le_bytes());
    wr.write_all(&header).await?;
    let sent = Instant::now();
    let pause = Duration::from_millis(700 + (n as u64 * 7) % 600);
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            read = rd.read(&mut buf) => match read {
                Ok(0) | Err(_) => return Ok(sent.elapsed()),
                Ok(_) => anyhow::bail!("the server answered an incomplete message"),
            },
            _ = tokio::time::sleep(pause) => {
                if wr.write_all(b"x").await.is_err() {
                    return Ok(sent.elapsed());
                }
            }
        }
    }
}

/// The runtime the hostile clients run on: two threads of their own, named `hostile-client`,
/// under `SCHED_IDLE` (they run only on a core nothing else wants). In a deployment these
/// clients run on other machines; here they share the cluster's two cores, and their own work
/// (above all the far-behind streams' drivers taking thousands of events a second) would
/// otherwise be charged to the cluster. What they cost the cluster (connections, cursors,
/// reading and sending the events) is still paid on the cluster's threads and measured; that
/// they still ask for their events is checked (`slow_read`).
fn hostile_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hostile-client")
        .on_thread_start(run_only_when_idle)
        .enable_all()
        .build()
        .expect("the hostile clients' runtime")
}

/// Puts the calling thread (Linux: a thread's own policy) under `SCHED_IDLE`.
#[allow(unsafe_code)]
fn run_only_when_idle() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler(0, ..)` reads one live `sched_param` and changes only the
    // calling thread's policy (moving to `SCHED_IDLE` needs no privilege).
    let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &raw const param) };
    assert_eq!(set, 0, "SCHED_IDLE: {}", std::io::Error::last_os_error());
}

/// Whether the far-behind streams read now, and whether they are done.
#[derive(Default)]
struct SlowControl {
    reading: AtomicBool,
    stop: AtomicBool,
}

/// The change streams of the hostile clients, on a client of their own (run on their runtime):
/// [`IDLE_STREAMS`] opened and never read, and [`SLOW_STREAMS`] started at `early`, each
/// reading [`SLOW_BATCH`] events a second while `control` says so (each task returns how many
/// it read).
async fn open_streams(
    addr: SocketAddr,
    early: Timestamp,
    control: Arc<SlowControl>,
) -> anyhow::Result<(
    mongodb::Client,
    Vec<ChangeStream<Document>>,
    Vec<tokio::task::JoinHandle<anyhow::Result<u64>>>,
)> {
    let hostile = client(addr, 256).await?;
    let coll = hostile.database("hostile").collection::<Document>("c");
    let mut idle = Vec::with_capacity(IDLE_STREAMS);
    for _ in 0..IDLE_STREAMS {
        idle.push(
            coll.watch()
                .max_await_time(Duration::from_millis(200))
                .await?
                .with_type::<Document>(),
        );
    }
    let mut slow = Vec::with_capacity(SLOW_STREAMS);
    for _ in 0..SLOW_STREAMS {
        let mut stream = coll
            .watch()
            .start_at_operation_time(early)
            .batch_size(SLOW_BATCH)
            .max_await_time(Duration::from_millis(200))
            .await?
            // Taken as raw bytes: what is measured is the cluster's cost, not the driver's
            // parsing.
            .with_type::<RawDocumentBuf>();
        let control = control.clone();
        slow.push(tokio::spawn(async move {
            let mut read = 0u64;
            while !control.stop.load(Ordering::Relaxed) {
                if !control.reading.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                for _ in 0..SLOW_BATCH {
                    match tokio::time::timeout(Duration::from_secs(1), stream.next()).await {
                        Ok(Some(Ok(_))) => read += 1,
                        Ok(other) => anyhow::bail!("a slow stream ended: {other:?}"),
                        Err(_) => break,
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            anyhow::Ok(read)
        }));
    }
    Ok((hostile, idle, slow))
}

/// `serverStatus.connections.<field>` as an integer.
fn connections_field(status: &Document, field: &str) -> i64 {
    let c = status.get_document("connections").expect("connections");
    match c.get(field) {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        other => panic!("connections.{field} is {other:?}"),
    }
}

// Measured alone: run by `scripts/test.sh` after the other tests, which would share the cores.
// On 2 cores the writers keep 0.95–0.98x while the far-behind streams read, which took 0.45–1.04x
// (0.66x in the same setup) before change streams were served on the background lane, and
// 0.84–0.89x with the lane at nice 10 and the default slice (BENCHMARKS.md).
#[ignore = "measures throughput, so it runs alone: scripts/test.sh runs it after the other tests"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_cost_the_others_little() -> anyhow::Result<()> {
    let open_files = raise_open_files(OPEN_FILES_WANTED);
    let needed = 2 * (TRICKLERS + SLOW_STREAMS + 64) as u64;
    anyhow::ensure!(
        open_files >= needed,
        "the open-files limit is {open_files}; this test needs about {needed} (ulimit -n)"
    );
    let dir = tempfile::tempdir()?;
    let port = tests::free_port()?;
    let frame_timeout = FRAME_TIMEOUT.as_millis().to_string();
    let mut server = tests::tributary_command(
        port,
        dir.path(),
        &["--shards", "2", "--frameTimeoutMS", &frame_timeout],
    )?
    .spawn()?;
    let pid = server.id().expect("the server runs");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    tests::wait_for_listener(pid, addr, Duration::from_secs(60)).await?;
    let writers = client(addr, 16).await?;
    let admin = writers.database("admin");
    tests::shard_collection(&writers, "hostile.c", doc! {"_id": "hashed"}).await?;
    let coll = writers.database("hostile").collection::<Document>("c");
    coll.insert_one(doc! {"_id": -1_i64}).await?;
    let early: Timestamp = admin
        .run_command(doc! {"ping": 1})
        .await?
        .get_timestamp("operationTime")?;

    let peak = Arc::new(MemoryPeak::new(pid));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.sample();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // The watcher reads everything, from before the first write to the end marker.
    let watcher_client = client(addr, 4).await?;
    let mut watch = watcher_client
        .database("hostile")
        .collection::<Document>("c")
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(event) = watch.next().await {
            match id_of(&event?) {
                Some(-2) => break,
                Some(id) => seen.push((Instant::now(), id)),
                None => anyhow::bail!("an event without an integer _id"),
            }
        }
        anyhow::Ok(seen)
    });

    // Baseline: the writers alone.
    let started = Instant::now();
    let baseline = write_for(&coll, 0, PERIOD).await;
    let before_rate = median_rate(
        baseline.counts(started, SECOND, PERIOD.as_secs() as usize),
        SECOND,
    );
    let (baseline_rss, baseline_virt) = peak.take();
    let baseline_caches = shard_caches(&admin).await?;

    // The hostile clients. The tricklers connect first (an idle connection costs little) and
    // start their messages only once the streams are open, just before the measurement, so
    // that all of them trickle through it and are cut off only after it.
    let connected = Arc::new(AtomicUsize::new(0));
    let (go, ready) = tokio::sync::watch::channel(false);
    let control = Arc::new(SlowControl::default());
    let clients = hostile_runtime();
    let mut tricklers = Vec::with_capacity(TRICKLERS);
    for n in 0..TRICKLERS {
        tricklers.push(clients.spawn(trickle(addr, n, connected.clone(), ready.clone())));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while connected.load(Ordering::Relaxed) < TRICKLERS {
        assert!(Instant::now() < deadline, "the tricklers could not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (hostile, idle, slow) = clients
        .spawn(open_streams(addr, early, control.clone()))
        .await??;
    go.send(true)?;
    // Every trickler is counted, once the accept loop has caught up.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, current) = loop {
        let status = admin.run_command(doc! {"serverStatus": 1}).await?;
        let current = connections_field(&status, "current");
        if current >= TRICKLERS as i64 || Instant::now() > deadline {
            break (status, current);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let limit = wire::limits::effective_max(
        wire::limits::DEFAULT_MAX_CONNECTIONS,
        wire::limits::open_files_limit(),
    ) as i64;
    assert!(
        current >= TRICKLERS as i64,
        "current {current} counts the tricklers"
    );
    assert_eq!(current + connections_field(&status, "available"), limit);
    assert!(connections_field(&status, "totalCreated") >= current);
    assert_eq!(connections_field(&status, "rejected"), 0);
    assert!(
        connections_field(&status, "active") >= 1,
        "serverStatus itself"
    );

    // With the hostile clients: the tricklers and the never-read streams throughout, the
    // far-behind streams reading in the odd phases.
    let started = Instant::now();
    let phases = {
        let control = control.clone();
        let admin = admin.clone();
        tokio::spawn(async move {
            // At the end of each phase, in MB: the server's RSS, the shard replies its change
            // streams hold (`heldReplyBytes`) and the shards' bounded caches.
            let mut rss = Vec::with_capacity(PHASES);
            let mut cpu = vec![cpu_ticks(pid)];
            for k in 1..=PHASES {
                tokio::time::sleep_until((started + PHASE * k as u32).into()).await;
                control
                    .reading
                    .store(k % 2 == 1 && k < PHASES, Ordering::Relaxed);
                let held = stream_replies_held(&admin).await.unwrap_or(u64::MAX);
                let caches = shard_caches(&admin).await.unwrap_or(u64::MAX);
                rss.push((status_bytes(pid, "VmRSS") >> 20, held >> 20, caches >> 20));
                cpu.push(cpu_ticks(pid));
            }
            (rss, cpu_by_phase(&cpu))
        })
    };
    let during = write_for(&coll, 1_000_000_000, PHASE * PHASES as u32).await;
    let (phase_rss, [quiet_cpu, reading_cpu]) = phases.await?;
    let (hostile_rss, hostile_virt) = peak.take();
    let hostile_caches = shard_caches(&admin).await?;
    control.stop.store(true, Ordering::Relaxed);
    let mut slow_read = 0;
    for s in slow {
        slow_read += s.await??;
    }
    let counts = during.counts(started, PHASE, PHASES);
    let quiet_rate = median_rate(counts.iter().step_by(2).copied().collect(), PHASE);
    let ratio = reading_ratio(&counts);
    println!(
        "alone {before_rate:.0} inserts/s (peak RSS {} MB, virtual {} MB); beside the tricklers \
         and never-read streams {quiet_rate:.0} inserts/s; while the far-behind streams read \
         too, {ratio:.2}x that (peak RSS {} MB, virtual {} MB); inserts per {PHASE:?} phase \
         {counts:?}; the far-behind streams read {slow_read} events; {current} connections open; \
         the shards' bounded caches (oplog tail window, history, page cache) held {} MB after the baseline \
         and {} MB after the hostile phases; the server's RSS, the shard replies its change \
         streams held and the shards' caches (MB) at the end of each phase {phase_rss:?}; \
         CPU in % of one of the machine's {} (the server's background lane, the rest of the \
         server, steal) in the quiet phases {quiet_cpu:?} and the reading ones {reading_cpu:?}",
        baseline_rss >> 20,
        baseline_virt >> 20,
        hostile_rss >> 20,
        hostile_virt >> 20,
        baseline_caches >> 20,
        hostile_caches >> 20,
        std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
    );

    // The far-behind streams were served: at least a quarter of the batches they asked for
    // (one a second each while reading). A lane starved to nothing would keep the writers'
    // throughput by serving no one.
    let reading = PHASE.as_secs() * (PHASES as u64 / 2);
    let asked = reading * SLOW_STREAMS as u64 * u64::from(SLOW_BATCH);
    assert!(
        slow_read * 4 >= asked,
        "the far-behind streams read {slow_read} events in {reading} s of asking for {asked}"
    );

    // Each trickler is cut off once its message has taken the frame timeout (give or take its
    // pause between bytes and the scheduling of a loaded machine), not before.
    let slack = Duration::from_secs(5);
    for (n, t) in tricklers.into_iter().enumerate() {
        let lived = tokio::time::timeout(FRAME_TIMEOUT + slack * 2, t).await???;
        assert!(
            lived + slack >= FRAME_TIMEOUT && lived <= FRAME_TIMEOUT + slack,
            "trickler {n} was closed after {lived:?} (frame timeout {FRAME_TIMEOUT:?})"
        );
    }
    // The server counts a connection out once its task has ended, a moment after the client
    // saw it closed; the drivers' pools may have opened a few more connections meanwhile.
    let counted_out = Instant::now() + Duration::from_secs(10);
    loop {
        let status = admin.run_command(doc! {"serverStatus": 1}).await?;
        let after = connections_field(&status, "current");
        if current - after >= TRICKLERS as i64 - 100 {
            break;
        }
        assert!(
            Instant::now() < counted_out,
            "{after} connections still open 10 s after the tricklers were closed (was {current})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The end marker, then every acknowledged insert must have reached the watcher, once.
    coll.insert_one(doc! {"_id": -2_i64}).await?;
    let seen_at = tokio::time::timeout(Duration::from_secs(60), watcher).await???;
    let seen: Vec<i64> = seen_at.iter().map(|(_, id)| *id).collect();
    let unique: HashSet<i64> = seen.iter().copied().collect();
    let acked: HashSet<i64> = baseline.ids().chain(during.ids()).collect();
    let failed: HashSet<i64> = baseline
        .failed
        .iter()
        .chain(&during.failed)
        .copied()
        .collect();
    println!(
        "{} acknowledged, {} failed, {} seen; {}",
        acked.len(),
        failed.len(),
        seen.len(),
        watcher_lag(&during, &seen_at)
    );
    assert_eq!(unique.len(), seen.len(), "the watcher saw an insert twice");
    let missed: Vec<_> = acked.difference(&unique).take(10).collect();
    assert!(
        missed.is_empty(),
        "the watcher missed acknowledged inserts {missed:?}"
    );
    let unknown: Vec<_> = unique
        .iter()
        .filter(|id| **id != -1 && !acked.contains(id) && !failed.contains(id))
        .take(10)
        .collect();
    assert!(
        unknown.is_empty(),
        "the watcher saw inserts never made {unknown:?}"
    );

    // The never-read streams idled all along and still answer, with their first event.
    clients
        .spawn(async move {
            let mut idle = idle;
            for stream in &mut idle {
                let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
                    .await?
                    .expect("open")?;
                anyhow::ensure!(id_of(&event).is_some(), "an event without an integer _id");
            }
            drop(idle);
            // Their cursors killed and their pool closed before the runtime goes.
            hostile.shutdown().await;
            anyhow::Ok(())
        })
        .await??;
    clients.shutdown_background();
    sampling.abort();
    server.kill().await?;

    assert!(
        hostile_virt < VIRTUAL_BOUND,
        "peak virtual size {} MB with the hostile clients, bound {} MB",
        hostile_virt >> 20,
        VIRTUAL_BOUND >> 20
    );
    assert!(
        hostile_rss.saturating_sub(hostile_caches) < RSS_BOUND,
        "peak RSS {} MB with the hostile clients, less {} MB of the shards' caches; bound {} MB",
        hostile_rss >> 20,
        hostile_caches >> 20,
        RSS_BOUND >> 20
    );
    let held = phase_rss
        .iter()
        .map(|&(_, held, _)| held)
        .max()
        .unwrap_or(0);
    assert!(
        held < HELD_BOUND_MB,
        "the router's change streams held {held} MB of shard replies (bound {HELD_BOUND_MB} MB)"
    );
    assert!(
        ratio >= 0.9,
        "while the far-behind streams read the writers kept {ratio:.2}x of their throughput \
         between (phases {counts:?})"
    );
    Ok(())
}
