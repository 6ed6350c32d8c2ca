//! Subscription consumers (`--consumers 1,100`): for each count in turn, that many consumers of
//! one new subscription each read every document one writer inserts (`readSubscription` of up
//! to `--read-max` (100), then one ack of the batch: through its last delivery, naming every
//! one with `--ack-ids`, or carried by the next read with `--ack-with-read`), and the bench reports acked deliveries/s and the server's CPU per acked
//! delivery and per written document, with each count's CPU per document over the first's.
//!
//! Invariant: a round ends only when every consumer has had every document; the CPU is the
//! server's from just before the first write to just after the last ack.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bson::{Bson, Document, doc};
use mongodb::{Client, Database};

use crate::procstat;

pub struct Spec {
    pub counts: Vec<usize>,
    pub docs: u64,
    pub batch: usize,
    pub payload: usize,
    pub acks: Acks,
    pub read_max: i32,
}

/// How a consumer acks the batch it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// `ackSubscription {deliveryIds}` naming every delivery.
    Ids,
    /// `ackSubscription {through}` its last delivery.
    Through,
    /// The next `readSubscription {ackThrough}`.
    WithRead,
}

/// One round's figures.
struct Round {
    consumers: usize,
    deliveries: u64,
    elapsed: Duration,
    cpu: Option<Duration>,
}

pub async fn run(client: &Client, db_name: &str, pid: Option<u32>, spec: &Spec) -> Result<()> {
    let db = client.database(db_name);
    db.drop().await.context("dropping the bench database")?;
    let ticks = procstat::ticks_per_second();
    let mut first_per_doc = None;
    for (n, &consumers) in spec.counts.iter().enumerate() {
        let round = round(&db, n, consumers, spec, pid, ticks).await?;
        let secs = round.elapsed.as_secs_f64();
        println!(
            "consumers {:>4}: {} acked deliveries in {secs:.2} s ({:.0}/s)",
            round.consumers,
            round.deliveries,
            round.deliveries as f64 / secs
        );
        if let Some(cpu) = round.cpu {
            let us = cpu.as_secs_f64() * 1e6;
            let per_doc = us / spec.docs as f64;
            let ratio = *first_per_doc.get_or_insert(per_doc);
            println!(
                "  server CPU: {:.2} µs per acked delivery, {per_doc:.1} µs per written document ({:.2}× the first count's)",
                us / round.deliveries as f64,
                per_doc / ratio
            );
        }
    }
    Ok(())
}

async fn round(
    db: &Database,
    n: usize,
    consumers: usize,
    spec: &Spec,
    pid: Option<u32>,
    ticks: u64,
) -> Result<Round> {
    let sub = format!("sub{n}");
    let coll = format!("load{n}");
    db.run_command(doc! {"createSubscription": &sub, "collection": &coll, "maxInFlight": 10_000})
        .await
        .context("createSubscription")?;
    // Each consumer exists (at the subscription's start) before the first write.
    for c in 0..consumers {
        read(db, &sub, c, 1, 0, None).await?;
    }
    let cpu0 = pid.and_then(|p| procstat::sample(p, ticks));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..consumers {
        let (db, sub, want) = (db.clone(), sub.clone(), spec.docs);
        let (acks, read_max) = (spec.acks, spec.read_max);
        tasks.push(tokio::spawn(async move {
            drain(&db, &sub, c, want, acks, read_max).await
        }));
    }
    let filler = "x".repeat(spec.payload);
    let target = db.collection::<Document>(&coll);
    let mut written = 0u64;
    while written < spec.docs {
        let k = (spec.docs - written).min(spec.batch as u64);
        let docs: Vec<Document> = (written..written + k)
            .map(|i| doc! {"_id": i as i64, "payload": &filler})
            .collect();
        target.insert_many(docs).await.context("inserting")?;
        written += k;
    }
    let mut deliveries = 0;
    for t in tasks {
        deliveries += t.await.context("a consumer task")??;
    }
    let elapsed = started.elapsed();
    let cpu1 = pid.and_then(|p| procstat::sample(p, ticks));
    db.run_command(doc! {"dropSubscription": &sub}).await?;
    Ok(Round {
        consumers,
        deliveries,
        elapsed,
        cpu: cpu0.zip(cpu1).map(|(a, b)| b.cpu.saturating_sub(a.cpu)),
    })
}

async fn read(
    db: &Database,
    sub: &str,
    c: usize,
    max: i32,
    wait_ms: i32,
    ack_through: Option<Bson>,
) -> Result<Vec<Bson>> {
    let mut cmd = doc! {
        "readSubscription": sub, "consumer": format!("c{c}"), "max": max, "waitMS": wait_ms,
    };
    if let Some(id) = ack_through {
        cmd.insert("ackThrough", id);
    }
    let reply = db.run_command(cmd).await.context("readSubscription")?;
    Ok(reply.get_array("messages")?.clone())
}

/// Reads and acks until `want` messages came; returns how many.
async fn drain(
    db: &Database,
    sub: &str,
    c: usize,
    want: u64,
    acks: Acks,
    read_max: i32,
) -> Result<u64> {
    let mut got = 0u64;
    let mut unacked = None;
    while got < want {
        let messages = read(db, sub, c, read_max, 1000, unacked.take()).await?;
        let ids: Vec<Bson> = messages
            .iter()
            .filter_map(|m| m.as_document()?.get("deliveryId").cloned())
            .collect();
        let Some(last) = ids.last().cloned() else {
            continue;
        };
        got += ids.len() as u64;
        let mut ack = doc! {"ackSubscription": sub, "consumer": format!("c{c}")};
        match acks {
            Acks::Ids => ack.insert("deliveryIds", ids),
            Acks::Through => ack.insert("through", last),
            Acks::WithRead if got < want => {
                unacked = Some(last);
                continue;
            }
            // The last batch: no read follows to carry its ack.
            Acks::WithRead => ack.insert("through", last),
        };
        db.run_command(ack).await.context("ackSubscription")?;
    }
    Ok(got)
}
