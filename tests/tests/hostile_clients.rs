//! Hostile clients cost the well-behaved ones little (short form; a known failure for now, see
//! the reason on the test).
//!
//! One embedded cluster (this process), four writers inserting for a fixed period and one
//! watcher reading every event. First a baseline period with nobody else; then the same period
//! again while, together:
//! * 1,000 raw TCP connections each send a header promising a 48 MB message and then a byte now
//!   and then (a slowloris);
//! * 100 change streams are opened and never read;
//! * 100 change streams started at an early operation time read one batch a second, far
//!   behind.
//!
//! Invariants checked:
//! * throughput with the hostile clients ≥ 0.9 × the baseline's (each the median of its
//!   one-second windows);
//! * the watcher saw every acknowledged insert, once (count and ids);
//! * this process's RSS (cluster and clients alike) stays under [`RSS_BOUND`], and its virtual
//!   size under [`VIRTUAL_BOUND`];
//! * `serverStatus.connections` is truthful (`current` counts the tricklers, `available` is the
//!   limit in force minus `current`);
//! * each trickling connection is closed once its message has taken the frame timeout, not
//!   before, while the never-read streams' idle connections stay usable.
//!
//! The figures are printed (`--no-capture`) before anything is asserted. The file-descriptor
//! soft limit is raised for the run (both ends of every connection are in this process).

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
use tests::EmbeddedCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WRITERS: u64 = 4;
/// Each throughput measurement (baseline, then with the hostile clients) lasts this long.
const PERIOD: Duration = Duration::from_secs(8);
const TRICKLERS: usize = 1_000;
const IDLE_STREAMS: usize = 100;
const SLOW_STREAMS: usize = 100;
/// Each slow stream reads this many events (its batch size), then sleeps a second.
const SLOW_BATCH: u32 = 100;
/// Shorter than the 30 s default so the test sees the tricklers cut off, yet well longer than
/// the hostile period, so they all trickle through it.
const FRAME_TIMEOUT: Duration = Duration::from_secs(15);
/// What this whole process (cluster, drivers, hostile clients) may hold resident at its peak.
///
/// Measured on a shared 2-core Linux VM, debug build: about 45–60 MB after the baseline
/// period, and peaks of 189–250 MB with the hostile clients (six runs). Most of that is the
/// 100 far-behind streams: without them the peak is 65–70 MB (1,000 tricklers cost their
/// 8 KiB read buffers, their tasks and sockets; 100 never-read streams their cursors). Each
/// far-behind stream's feeds prefetch a shard batch of the client's batch size (100 here) per
/// shard per reply, with `FEED_DEPTH` replies queued per shard (router/src/changestream); when
/// they prefetched 1,000 events whatever the client asked, the peaks were 260–630 MB. The bound
/// leaves room above the worst run for allocator slack; a per-client copy of a shared buffer,
/// or a buffer per trickler of the size its header declares once touched, would go past it.
const RSS_BOUND: u64 = 400 << 20;
/// The process's peak virtual size. Measured 660 MB with the hostile clients (thread stacks and
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

/// A field of `/proc/self/status` given in kB (`VmRSS`, `VmSize`), in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The largest resident and virtual sizes seen since the last `take`.
#[derive(Default)]
struct MemoryPeak {
    rss: AtomicU64,
    virt: AtomicU64,
}

impl MemoryPeak {
    fn sample(&self) {
        self.rss.fetch_max(status_bytes("VmRSS"), Ordering::Relaxed);
        self.virt
            .fetch_max(status_bytes("VmSize"), Ordering::Relaxed);
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

    /// Inserts per second: the median over the period's one-second windows, so that a burst
    /// of slow disk syncs (the machine is shared) moves it less than it moves the mean.
    fn rate(&self, started: Instant) -> f64 {
        let windows = PERIOD.as_secs() as usize;
        let mut counts = vec![0u32; windows];
        for (at, _) in &self.acked {
            let w = at.duration_since(started).as_secs() as usize;
            if let Some(c) = counts.get_mut(w) {
                *c += 1;
            }
        }
        counts.sort_unstable();
        let mid = windows / 2;
        f64::from(counts[mid - 1] + counts[mid]) / 2.0
    }
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

/// `serverStatus.connections.<field>` as an integer.
fn connections_field(status: &Document, field: &str) -> i64 {
    let c = status.get_document("connections").expect("connections");
    match c.get(field) {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        other => panic!("connections.{field} is {other:?}"),
    }
}

// Known failure, so not in the default run (`cargo nextest run -p tests --test hostile_clients
// --run-ignored only`): every check holds but the throughput one. On 2 cores the writers keep
// 0.45–1.04 × their baseline over six runs (0.92, 0.45, 0.75, 0.91 at 28ecfe8; 1.04, 0.84 at
// 7a099fd, the slow streams taking raw bytes), from 0.09–1.11 × before the feeds asked the
// shards for the client's batch size. The shards already share one read among the far-behind
// streams; what is left is per-stream work on the router (merge, post-merge stages, replies)
// and in this process's own drivers: 100 readers take about 12,000 events/s beside about 700
// writes/s. Issue 25, point 3.
#[ignore = "far-behind change streams still slow writers: 0.45-1.04x of the baseline, not 0.9x"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_cost_the_others_little() -> anyhow::Result<()> {
    let open_files = raise_open_files(OPEN_FILES_WANTED);
    let needed = 2 * (TRICKLERS + SLOW_STREAMS + 64) as u64;
    anyhow::ensure!(
        open_files >= needed,
        "the open-files limit is {open_files}; this test needs about {needed} (ulimit -n)"
    );
    let options = router::RouterOptions {
        client_limits: wire::limits::Limits {
            frame_timeout: FRAME_TIMEOUT,
            ..wire::limits::Limits::default()
        },
        ..router::RouterOptions::default()
    };
    let cluster = EmbeddedCluster::start_with_options(2, options).await?;
    let addr = cluster.addr;
    let writers = client(addr, 16).await?;
    let admin = writers.database("admin");
    tests::shard_collection(&writers, "hostile.c", doc! {"_id": "hashed"}).await?;
    let coll = writers.database("hostile").collection::<Document>("c");
    coll.insert_one(doc! {"_id": -1_i64}).await?;
    let early: Timestamp = admin
        .run_command(doc! {"ping": 1})
        .await?
        .get_timestamp("operationTime")?;

    let peak = Arc::new(MemoryPeak::default());
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
                Some(id) => seen.push(id),
                None => anyhow::bail!("an event without an integer _id"),
            }
        }
        anyhow::Ok(seen)
    });

    // Baseline: the writers alone.
    let started = Instant::now();
    let baseline = write_for(&coll, 0, PERIOD).await;
    let baseline_rate = baseline.rate(started);
    let (baseline_rss, baseline_virt) = peak.take();

    // The hostile clients. The tricklers connect first (an idle connection costs little) and
    // start their messages only once the streams are open, just before the measurement, so
    // that all of them trickle through it and are cut off only after it.
    let connected = Arc::new(AtomicUsize::new(0));
    let (go, ready) = tokio::sync::watch::channel(false);
    let mut tricklers = Vec::with_capacity(TRICKLERS);
    for n in 0..TRICKLERS {
        tricklers.push(tokio::spawn(trickle(
            addr,
            n,
            connected.clone(),
            ready.clone(),
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while connected.load(Ordering::Relaxed) < TRICKLERS {
        assert!(Instant::now() < deadline, "the tricklers could not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hostile = client(addr, 256).await?;
    let hostile_coll = hostile.database("hostile").collection::<Document>("c");
    let mut idle: Vec<ChangeStream<Document>> = Vec::with_capacity(IDLE_STREAMS);
    for _ in 0..IDLE_STREAMS {
        idle.push(
            hostile_coll
                .watch()
                .max_await_time(Duration::from_millis(200))
                .await?
                .with_type::<Document>(),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut slow = Vec::with_capacity(SLOW_STREAMS);
    for _ in 0..SLOW_STREAMS {
        let mut stream = hostile_coll
            .watch()
            .start_at_operation_time(early)
            .batch_size(SLOW_BATCH)
            .max_await_time(Duration::from_millis(200))
            .await?
            // Taken as raw bytes: the hostile clients share this process's cores with the
            // cluster, and what is measured is the cluster's cost, not the driver's parsing.
            .with_type::<RawDocumentBuf>();
        let stop = stop.clone();
        slow.push(tokio::spawn(async move {
            let mut read = 0u64;
            while !stop.load(Ordering::Relaxed) {
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

    // With the hostile clients.
    let started = Instant::now();
    let during = write_for(&coll, 1_000_000_000, PERIOD).await;
    let hostile_rate = during.rate(started);
    let (hostile_rss, hostile_virt) = peak.take();
    stop.store(true, Ordering::Relaxed);
    let mut slow_read = 0;
    for s in slow {
        slow_read += s.await??;
    }
    println!(
        "baseline {baseline_rate:.0} inserts/s (peak RSS {} MB, virtual {} MB); with the hostile \
         clients {hostile_rate:.0} inserts/s ({:.2}x; peak RSS {} MB, virtual {} MB); the slow \
         streams read {slow_read} events; {current} connections open",
        baseline_rss >> 20,
        baseline_virt >> 20,
        hostile_rate / baseline_rate,
        hostile_rss >> 20,
        hostile_virt >> 20,
    );

    // The end marker, then every acknowledged insert must have reached the watcher, once.
    coll.insert_one(doc! {"_id": -2_i64}).await?;
    let seen = tokio::time::timeout(Duration::from_secs(60), watcher).await???;
    let unique: HashSet<i64> = seen.iter().copied().collect();
    let acked: HashSet<i64> = baseline.ids().chain(during.ids()).collect();
    let failed: HashSet<i64> = baseline
        .failed
        .iter()
        .chain(&during.failed)
        .copied()
        .collect();
    println!(
        "{} acknowledged, {} failed, {} seen",
        acked.len(),
        failed.len(),
        seen.len()
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
    let status = admin.run_command(doc! {"serverStatus": 1}).await?;
    let after = connections_field(&status, "current");
    // The drivers' pools may have opened a few more connections meanwhile.
    assert!(
        current - after >= TRICKLERS as i64 - 100,
        "{after} connections still open after the tricklers were closed (was {current})"
    );
    // The never-read streams idled all along and still answer, with their first event.
    for stream in &mut idle {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await?
            .expect("open")?;
        assert!(id_of(&event).is_some());
    }
    drop(idle);
    sampling.abort();
    cluster.stop().await;

    assert!(
        hostile_virt < VIRTUAL_BOUND,
        "peak virtual size {} MB with the hostile clients, bound {} MB",
        hostile_virt >> 20,
        VIRTUAL_BOUND >> 20
    );
    assert!(
        hostile_rss < RSS_BOUND,
        "peak RSS {} MB with the hostile clients, bound {} MB",
        hostile_rss >> 20,
        RSS_BOUND >> 20
    );
    assert!(
        hostile_rate >= 0.9 * baseline_rate,
        "throughput fell from {baseline_rate:.0} to {hostile_rate:.0} inserts/s with the hostile \
         clients"
    );
    Ok(())
}
