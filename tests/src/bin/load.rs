//! `load`: end-to-end throughput and latency through a real driver, for the figures in the
//! closing notes. Not a test: it measures, and prints what it measured.
//!
//!   cargo run --release -p tests --bin load -- insert --clients 1,16 --seconds 10
//!   cargo run --release -p tests --bin load -- latency --events 2000
//!
//! Without `--uri` it starts an embedded cluster (3 shards) in a temporary directory.
//! `insert` runs N concurrent clients doing `insert_one` (each acknowledged, so durable) on an
//! unsharded and on a hashed collection. `latency` watches a collection of an unsharded
//! database (so one shard writes and the other two are idle) and measures, per insert, the
//! time from the insert's acknowledgement to the event's arrival at the driver, one insert at
//! a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use hdrhistogram::Histogram;
use mongodb::Client;
use mongodb::bson::{Document, doc};

struct Args {
    mode: String,
    uri: Option<String>,
    clients: Vec<usize>,
    seconds: u64,
    events: usize,
    shards: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        mode: String::new(),
        uri: None,
        clients: vec![1, 16],
        seconds: 10,
        events: 2000,
        shards: 3,
    };
    let mut it = std::env::args().skip(1);
    args.mode = it.next().context("usage: load insert|latency [options]")?;
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--uri" => args.uri = Some(value),
            "--clients" => {
                args.clients = value
                    .split(',')
                    .map(|c| c.parse().context("--clients takes numbers"))
                    .collect::<Result<_>>()?
            }
            "--seconds" => args.seconds = value.parse()?,
            "--events" => args.events = value.parse()?,
            "--shards" => args.shards = value.parse()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let mut cluster = None;
    let uri = match &args.uri {
        Some(u) => u.clone(),
        None => {
            let c = tests::EmbeddedCluster::start(args.shards).await?;
            let uri = format!("mongodb://{}/?directConnection=true", c.addr);
            cluster = Some(c);
            uri
        }
    };
    let client = tests::connect_uri(&uri).await?;
    match args.mode.as_str() {
        "insert" => insert(&client, &args).await?,
        "latency" => latency(&client, &args).await?,
        other => anyhow::bail!("unknown mode {other}: insert or latency"),
    }
    if let Some(c) = cluster {
        c.stop().await;
    }
    Ok(())
}

async fn insert(client: &Client, args: &Args) -> Result<()> {
    client
        .database("admin")
        .run_command(doc! {"shardCollection": "load.hashed", "key": {"_id": "hashed"}})
        .await?;
    for coll_name in ["unsharded", "hashed"] {
        for &clients in &args.clients {
            let coll = client.database("load").collection::<Document>(coll_name);
            coll.delete_many(doc! {}).await?;
            let done = Arc::new(AtomicU64::new(0));
            let deadline = Instant::now() + Duration::from_secs(args.seconds);
            let mut tasks = Vec::new();
            for c in 0..clients {
                let coll = coll.clone();
                let done = done.clone();
                tasks.push(tokio::spawn(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let id = format!("{c}-{i}");
                        coll.insert_one(
                            doc! {"_id": id, "client": c as i64, "payload": "x".repeat(100)},
                        )
                        .await?;
                        done.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    anyhow::Ok(())
                }));
            }
            let start = Instant::now();
            for t in tasks {
                t.await??;
            }
            let secs = start.elapsed().as_secs_f64();
            let n = done.load(Ordering::Relaxed);
            println!(
                "insert collection={coll_name} clients={clients}: {n} docs in {secs:.1}s = {:.0} docs/s",
                n as f64 / secs
            );
        }
    }
    Ok(())
}

async fn latency(client: &Client, args: &Args) -> Result<()> {
    let coll = client.database("latency").collection::<Document>("events");
    coll.insert_one(doc! {"_id": -1}).await?;
    let mut stream = coll.watch().await?.with_type::<Document>();
    let mut ack_to_event = Histogram::<u64>::new(3)?;
    let mut send_to_event = Histogram::<u64>::new(3)?;
    for i in 0..args.events as i64 {
        let sent = Instant::now();
        coll.insert_one(doc! {"_id": i}).await?;
        let acked = Instant::now();
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .context("no event within 10 s")?
            .context("stream ended")??;
        let arrived = Instant::now();
        anyhow::ensure!(
            event.get_document("documentKey")?.get_i64("_id").ok() == Some(i)
                || event.get_document("documentKey")?.get_i32("_id").ok() == Some(i as i32),
            "unexpected event {event}"
        );
        let waited = arrived.saturating_duration_since(acked);
        if waited > Duration::from_millis(100) {
            eprintln!("slow event {i}: {waited:?} after its acknowledgement");
        }
        ack_to_event.record(waited.as_micros() as u64)?;
        send_to_event.record(arrived.duration_since(sent).as_micros() as u64)?;
    }
    let show = |name: &str, h: &Histogram<u64>| {
        println!(
            "latency {name} (n={}, shards={}, 1 writing + {} idle): p50={:.2}ms p99={:.2}ms max={:.2}ms",
            h.len(),
            args.shards,
            args.shards.saturating_sub(1),
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0
        );
    };
    show("ack->event", &ack_to_event);
    show("send->event", &send_to_event);
    Ok(())
}
