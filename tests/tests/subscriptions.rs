//! Subscriptions across real process kills: a consumer's position is the server's, so a router
//! killed with `kill -9` (or a lease moved to another router) loses nothing acknowledged and
//! delivers again only what was not.

use std::time::{Duration, Instant};

use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use tests::ProcessCluster;

async fn read(
    db: &Database,
    consumer: &str,
    max: i32,
    wait_ms: i32,
) -> anyhow::Result<Vec<Document>> {
    let reply = db
        .run_command(
            doc! {"readSubscription": "s", "consumer": consumer, "max": max, "waitMS": wait_ms},
        )
        .await?;
    Ok(reply
        .get_array("messages")?
        .iter()
        .filter_map(Bson::as_document)
        .cloned()
        .collect())
}

/// The database `subs` with the subscription `s` to its collection `c`, created with `options`
/// (every test here reads `s`).
async fn subscribed(client: &mongodb::Client, options: Document) -> anyhow::Result<Database> {
    let db = client.database("subs");
    let mut create = doc! {"createSubscription": "s", "collection": "c"};
    create.extend(options);
    db.run_command(create).await?;
    Ok(db)
}

fn key(m: &Document) -> i32 {
    m.get_document("event")
        .and_then(|e| e.get_document("documentKey"))
        .and_then(|k| k.get_i32("_id"))
        .expect("an insert event")
}

fn id(m: &Document) -> Bson {
    Bson::String(m.get_str("deliveryId").expect("deliveryId").to_string())
}

/// What one consumer of `subs.s` saw, read by read: the keys first delivered (in order), those
/// acked with `waitDurable`, any of those delivered again, and the reads that failed.
#[derive(Default)]
struct Tally {
    firsts: Vec<i32>,
    durable: std::collections::HashSet<i32>,
    redelivered_durable: Vec<i32>,
    read_errors: Vec<String>,
}

impl Tally {
    /// A read of up to 50 for consumer `a`, tallied; `None` (after a pause) when it failed.
    async fn read(&mut self, db: &Database) -> anyhow::Result<Option<Vec<Document>>> {
        let batch = match read(db, "a", 50, 500).await {
            Ok(b) => b,
            Err(e) => {
                self.read_errors.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ok(None);
            }
        };
        for m in &batch {
            let k = key(m);
            if m.get_i64("deliveryCount")? == 1 {
                self.firsts.push(k);
            } else if self.durable.contains(&k) {
                self.redelivered_durable.push(k);
            }
        }
        Ok(Some(batch))
    }

    /// Every insert `0..n` delivered first in commit order, and nothing acked durably again.
    fn check(&self, n: i32) {
        assert_eq!(
            self.firsts,
            (0..n).collect::<Vec<_>>(),
            "every insert delivered first in commit order"
        );
        assert!(
            self.redelivered_durable.is_empty(),
            "durably acked, delivered again: {:?}",
            self.redelivered_durable
        );
    }
}

/// Inserts `{_id: 0..n}` into `subs.c` one at a time, `gap` apart, through any failure (a
/// failed insert is tried again; one that was applied before failing is a duplicate key).
fn insert_steadily(db: &Database, n: i32, gap: Duration) -> tokio::task::JoinHandle<()> {
    let coll = db.collection::<Document>("c");
    tokio::spawn(async move {
        let mut i = 0;
        while i < n {
            match coll.insert_one(doc! {"_id": i}).await {
                Ok(_) => i += 1,
                Err(e) if e.to_string().contains("E11000") => i += 1,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            tokio::time::sleep(gap).await;
        }
    })
}

/// Reads until `want` messages arrived or `patience` ran out.
async fn read_all(
    db: &Database,
    consumer: &str,
    want: usize,
    patience: Duration,
) -> anyhow::Result<Vec<Document>> {
    let until = Instant::now() + patience;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < until {
        let max = (want - got.len()).min(100) as i32;
        match read(db, consumer, max, 1000).await {
            Ok(batch) => got.extend(batch),
            // The lease of a killed router has not lapsed yet.
            Err(e)
                if e.to_string().contains("9106")
                    || e.to_string().contains("ConsumerLeaseMoved") =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_router_s_consumer_resumes_after_its_last_durable_ack() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let first = read_all(&db, "a", 50, Duration::from_secs(20)).await?;
    assert_eq!(
        first.iter().map(key).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    let acked: Vec<Bson> = first[..30].iter().map(id).collect();
    let reply = db
        .run_command(doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": acked, "waitDurable": true})
        .await?;
    assert_eq!(reply.get_i64("acked")?, 30);
    cluster.router.restart().await?;
    let client = cluster.client().await?;
    let db = client.database("subs");
    let again = read_all(&db, "a", 70, Duration::from_secs(30)).await?;
    let keys: Vec<i32> = again.iter().map(key).collect();
    assert_eq!(
        keys,
        (30..100).collect::<Vec<_>>(),
        "nothing acked durably comes again; everything else does, in commit order"
    );
    Ok(())
}

/// F2: a consumer is served by the router holding its lease; another router forwards its
/// reads and acks there, and takes it over (from its last durable ack) once the holder is
/// killed and its lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_is_served_by_one_router_and_taken_over_when_its_lease_lapses()
-> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let got = read_all(&db, "a", 10, Duration::from_secs(20)).await?;
    let acked: Vec<Bson> = got[..4].iter().map(id).collect();
    db.run_command(
        doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": acked, "waitDurable": true},
    )
    .await?;

    let other = cluster.start_extra_router().await?;
    let other_client = tests::connect(other.addr).await?;
    let other_db = other_client.database("subs");
    // The other router answers for the consumer: it forwards to the lease's holder, whose
    // consumer has 4..10 in flight (nothing due yet).
    let forwarded = read(&other_db, "a", 10, 0).await?;
    assert!(
        forwarded.is_empty(),
        "served by the first router: {forwarded:?}"
    );
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 10})
        .await?;
    let next = read_all(&other_db, "a", 1, Duration::from_secs(10)).await?;
    assert_eq!(
        next.iter().map(key).collect::<Vec<_>>(),
        [10],
        "read through the other router"
    );
    let acked: Vec<Bson> = next.iter().map(id).collect();
    other_db
        .run_command(doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": acked})
        .await?;
    let list = client
        .database("config")
        .collection::<Document>("subscriptionConsumers")
        .find_one(doc! {"consumer": "a"})
        .await?
        .expect("the consumer's state");
    assert_eq!(
        list.get_str("owner")?,
        cluster.router.addr.to_string(),
        "the first router still holds the lease"
    );

    // The first router dies: its lease lapses and the other takes the consumer over.
    let started = Instant::now();
    cluster.router.kill();
    let again = read_all(&other_db, "a", 6, Duration::from_secs(30)).await?;
    assert_eq!(
        again.iter().map(key).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "taken over after the lease ({:?})",
        started.elapsed()
    );
    Ok(())
}

/// Alterations reach consumers wherever they are served: a consumer's pause, reset and drop
/// sent to a router that does not hold its lease are forwarded to the one that does, and a
/// reset of every consumer reaches the consumers of both routers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alterations_reach_consumers_served_by_other_routers() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let other = cluster.start_extra_router().await?;
    let other_client = tests::connect(other.addr).await?;
    let other_db = other_client.database("subs");
    // `a` is served by the first router, `b` by the other; both have 0..10 in flight.
    assert_eq!(
        read_all(&db, "a", 10, Duration::from_secs(20)).await?.len(),
        10
    );
    assert_eq!(
        read_all(&other_db, "b", 10, Duration::from_secs(20))
            .await?
            .len(),
        10
    );

    let alter = |more: Document| {
        let mut cmd = doc! {"alterSubscription": "s"};
        cmd.extend(more);
        cmd
    };
    // A pause sent to the other router pauses `a` where it is served.
    other_db
        .run_command(alter(doc! {"consumer": "a", "pause": true}))
        .await?;
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 10})
        .await?;
    assert!(read(&db, "a", 10, 500).await?.is_empty(), "paused");
    other_db
        .run_command(alter(doc! {"consumer": "a", "resume": true}))
        .await?;
    let next = read_all(&db, "a", 1, Duration::from_secs(10)).await?;
    assert_eq!(next.iter().map(key).collect::<Vec<_>>(), [10]);

    // A reset of every consumer, sent to the other router, starts both over (the first
    // router learns of it within a second).
    let reply = other_db
        .run_command(alter(doc! {"reset": {"to": "earliest"}}))
        .await?;
    assert_eq!(reply.get_i64("reset")?, 2, "{reply:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (db, consumer) in [(&db, "a"), (&other_db, "b")] {
        let again = read_all(db, consumer, 11, Duration::from_secs(20)).await?;
        assert_eq!(
            again.iter().map(key).collect::<Vec<_>>(),
            (0..11).collect::<Vec<_>>(),
            "{consumer} starts over"
        );
    }

    // Dropping `a` through the other router drops it where it is served.
    other_db
        .run_command(alter(doc! {"dropConsumer": "a"}))
        .await?;
    let rows = other_db
        .run_command(doc! {"listSubscriptions": 1})
        .await?
        .get_document("cursor")?
        .get_array("firstBatch")?
        .iter()
        .filter_map(Bson::as_document)
        .filter_map(|r| r.get_str("consumer").ok().map(str::to_string))
        .collect::<Vec<_>>();
    assert_eq!(rows, ["b"]);
    Ok(())
}

/// F1: the config shard (which also holds data) is killed for a few seconds while a writer
/// inserts and a consumer reads and acks, some acks with `waitDurable`: reads pause instead of
/// failing, and afterwards every insert has been delivered, first deliveries in commit order,
/// and nothing acked durably was delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_config_shard_pauses_consumers_and_loses_nothing() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {"ackTimeoutSecs": 60}).await?;
    const N: i32 = 600;
    let writer = insert_steadily(&db, N, Duration::from_millis(5));
    let mut tally = Tally::default();
    let mut killed = false;
    let started = Instant::now();
    while tally.firsts.len() < N as usize && started.elapsed() < Duration::from_secs(120) {
        if !killed && tally.firsts.len() >= 100 {
            cluster.shards[0].kill();
            tokio::time::sleep(Duration::from_secs(3)).await;
            cluster.shards[0].restart().await?;
            killed = true;
        }
        let Some(batch) = tally.read(&db).await? else {
            continue;
        };
        let ids: Vec<Bson> = batch.iter().map(id).collect();
        let wait_durable = tally.firsts.len().is_multiple_of(2);
        let ack = db
            .run_command(doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": ids, "waitDurable": wait_durable})
            .await;
        if ack.is_ok() && wait_durable {
            tally.durable.extend(batch.iter().map(key));
        }
    }
    writer.await?;
    assert!(killed, "the config shard was killed mid-run");
    tally.check(N);
    let read_errors = &tally.read_errors;
    // The router's connection to the shard drops: at most the read that was in flight fails.
    assert!(read_errors.len() <= 3, "reads failed: {read_errors:?}");
    Ok(())
}

/// `listSubscriptions` is a cursor: a small `batchSize` returns the first rows and `getMore`
/// the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_is_a_cursor_read_in_batches() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    for c in ["a", "b", "c"] {
        read(&db, c, 1, 0).await?;
    }
    let consumers = |batch: &[Bson]| -> Vec<String> {
        batch
            .iter()
            .filter_map(Bson::as_document)
            .filter_map(|r| r.get_str("consumer").ok().map(str::to_string))
            .collect()
    };
    let reply = db
        .run_command(doc! {"listSubscriptions": 1, "cursor": {"batchSize": 2}})
        .await?;
    let cursor = reply.get_document("cursor")?;
    let mut names = consumers(cursor.get_array("firstBatch")?);
    assert_eq!(names.len(), 2, "the first batch holds batchSize rows");
    let id = cursor.get_i64("id")?;
    assert_ne!(id, 0, "the cursor stays open for the rest");
    let more = db
        .run_command(doc! {"getMore": id, "collection": "$cmd.listSubscriptions"})
        .await?;
    let next = more.get_document("cursor")?;
    names.extend(consumers(next.get_array("nextBatch")?));
    assert_eq!(next.get_i64("id")?, 0, "exhausted");
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    Ok(())
}

/// F7: the config shard's disk fills up (its files on a small tmpfs, filled to the last byte,
/// then its own free space taken by writes until even a small one fails) while a writer
/// inserts into a collection on the other shard and a consumer reads and acks, every other
/// batch with `waitDurable`. The config shard's writes fail with OutOfDiskSpace; the consumer
/// goes on being served; a durable ack cannot be stored, so it answers only after the space is
/// given back (4 s later), or fails; after that the config shard writes again without a
/// restart, and in the end every insert was delivered first in commit order and nothing acked
/// durably came again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_config_shard_disk_fails_writes_cleanly_and_loses_nothing() -> anyhow::Result<()> {
    use std::sync::{Arc, Mutex};
    use tests::disk::Tmpfs;
    if !Tmpfs::available() {
        anyhow::ensure!(
            std::env::var("CI").is_err(),
            "the disk-fault test needs root (to mount a tmpfs), which CI has"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let disk = Arc::new(Tmpfs::mount(&dir.path().join("shard0"), 96)?);
    let cluster = ProcessCluster::start_in(dir, 2, &[], &[]).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    admin
        .run_command(doc! {"enableSharding": "subs", "primaryShard": "shard1"})
        .await?;
    admin
        .run_command(doc! {"enableSharding": "ballast", "primaryShard": "shard0"})
        .await?;
    let ballast = client.database("ballast").collection::<Document>("b");
    let db = subscribed(&client, doc! {"ackTimeoutSecs": 60}).await?;
    const N: i32 = 600;
    let writer = insert_steadily(&db, N, Duration::from_millis(10));
    let mut tally = Tally::default();
    let mut full_errors = Vec::new();
    let mut full = false;
    let freed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    // When durable acks were asked while the disk was full.
    let mut asked_while_full = Vec::new();
    let mut durable_after_free = 0;
    let mut ballast_id = 0;
    let started = Instant::now();
    while tally.firsts.len() < N as usize && started.elapsed() < Duration::from_secs(150) {
        if !full && tally.firsts.len() >= 100 {
            disk.fill()?;
            // Then the space the config shard's files still had: writes of ever smaller
            // documents until one of each size fails.
            for size in [1 << 20, 64 << 10, 4 << 10, 256] {
                let pad = "x".repeat(size);
                for _ in 0..20_000 {
                    ballast_id += 1;
                    if let Err(e) = ballast
                        .insert_one(doc! {"_id": ballast_id, "pad": &pad})
                        .await
                    {
                        full_errors.push(e);
                        break;
                    }
                }
            }
            full = true;
            let (disk, freed_at) = (disk.clone(), freed_at.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(4)).await;
                disk.free().expect("freeing the disk");
                *freed_at.lock().unwrap() = Some(Instant::now());
            });
        }
        let freed = freed_at.lock().unwrap().is_some();
        let Some(batch) = tally.read(&db).await? else {
            continue;
        };
        if batch.is_empty() {
            continue;
        }
        let ids: Vec<Bson> = batch.iter().map(id).collect();
        let wait_durable = tally.firsts.len().is_multiple_of(2);
        let asked = Instant::now();
        let ack = db
            .run_command(doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": ids, "waitDurable": wait_durable})
            .await;
        if wait_durable && full && !freed {
            asked_while_full.push(asked);
        }
        match ack {
            Ok(_) if wait_durable => {
                tally.durable.extend(batch.iter().map(key));
                durable_after_free += usize::from(freed);
            }
            Ok(_) => {}
            Err(e) => assert!(
                asked.elapsed() < Duration::from_secs(35),
                "a failed ack waited {:?}: {e}",
                asked.elapsed()
            ),
        }
    }
    writer.await?;
    assert!(full, "the disk filled mid-run");
    assert_eq!(full_errors.len(), 4, "a write of each size failed");
    for e in &full_errors {
        assert_eq!(
            tests::scenarios::code_of(e),
            Some(14031),
            "the full disk's error is OutOfDiskSpace: {e}"
        );
    }
    assert!(
        freed_at.lock().unwrap().is_some(),
        "the disk was given back mid-run"
    );
    assert!(
        !asked_while_full.is_empty(),
        "a durable ack was asked while the disk was full"
    );
    let status = admin.run_command(doc! {"serverStatus": 1}).await?;
    let failures = status
        .get_document("metrics")?
        .get_document("subscriptions")?
        .get_i64("stateWriteFailures")?;
    assert!(failures > 0, "the fault reached the subscription's state");
    // Space given back, the config shard takes writes again (no restart).
    let big = doc! {"_id": 0, "pad": "x".repeat(1 << 20)};
    let until = Instant::now() + Duration::from_secs(20);
    let mut again = ballast.insert_one(big.clone()).await;
    while again.is_err() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        again = ballast.insert_one(big.clone()).await;
    }
    again.map_err(|e| anyhow::anyhow!("writing once space is back: {e}"))?;
    tally.check(N);
    assert!(
        durable_after_free > 0,
        "durable acks stored again after the disk was freed"
    );
    let read_errors = &tally.read_errors;
    assert!(read_errors.is_empty(), "reads failed: {read_errors:?}");
    // What a durable ack answered for was stored: a router killed now (its memory gone) does
    // not deliver any of it again.
    drop(client);
    let mut cluster = cluster;
    cluster.router.restart().await?;
    let client = cluster.client().await?;
    let db = client.database("subs");
    let mut again = Vec::new();
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        match read(&db, "a", 100, 500).await {
            Ok(batch) if batch.is_empty() && !again.is_empty() => break,
            Ok(batch) => again.extend(batch.iter().map(key)),
            // The killed router's lease lapses first.
            Err(e) if e.to_string().contains("ConsumerLeaseMoved") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
    let durable_again: Vec<i32> = again
        .iter()
        .copied()
        .filter(|k| tally.durable.contains(k))
        .collect();
    assert!(
        durable_again.is_empty(),
        "durably acked, delivered again after the restart: {durable_again:?}"
    );
    Ok(())
}

/// F5: the config shard frozen (`SIGSTOP`) for longer than a consumer's lease. The router
/// cannot renew the lease or load the consumer again meanwhile: its reads come back empty,
/// never failed, and once the config shard is back the consumer goes on from its last durable
/// ack, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_come_back_empty_while_the_config_shard_is_away_past_the_lease() -> anyhow::Result<()>
{
    let cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    let docs: Vec<Document> = (0..20).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let first = read_all(&db, "a", 10, Duration::from_secs(20)).await?;
    let acked: Vec<Bson> = first.iter().map(id).collect();
    db.run_command(
        doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": acked, "waitDurable": true},
    )
    .await?;

    cluster.shards[0].freeze(true)?;
    let frozen = Instant::now();
    let mut got = Vec::new();
    let mut errors = Vec::new();
    while frozen.elapsed() < Duration::from_secs(14) {
        let started = Instant::now();
        match read(&db, "a", 10, 1000).await {
            Ok(batch) => got.extend(batch),
            Err(e) => errors.push(e.to_string()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a read waited {:?}",
            started.elapsed()
        );
    }
    cluster.shards[0].freeze(false)?;
    assert!(
        errors.is_empty(),
        "reads failed while the config shard was away: {errors:?}"
    );

    let until = Instant::now() + Duration::from_secs(40);
    let mut keys: std::collections::BTreeSet<i32> = got.iter().map(key).collect();
    while keys.len() < 10 && Instant::now() < until {
        match read(&db, "a", 10, 1000).await {
            Ok(batch) => keys.extend(batch.iter().map(key)),
            // Served again once the lease it held lapses.
            Err(e) if e.to_string().contains("ConsumerLeaseMoved") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        (10..20).collect::<Vec<_>>(),
        "everything after the durable ack, and nothing before it"
    );
    Ok(())
}

/// An embedded cluster keeping 1 MB of oplog per shard.
async fn small_oplog_cluster() -> anyhow::Result<(tempfile::TempDir, tests::Proc)> {
    let dir = tempfile::tempdir()?;
    let port = tests::free_port()?;
    let args = [
        "--port",
        &port.to_string(),
        "--dbpath",
        &dir.path().display().to_string(),
        "--oplogSizeMB",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let proc = tests::Proc::spawn(args, std::net::SocketAddr::from(([127, 0, 0, 1], port))).await?;
    Ok((dir, proc))
}

async fn insert_big(db: &Database, from: i32, n: i32) -> anyhow::Result<()> {
    let pad = "x".repeat(20_000);
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(10) {
        let docs: Vec<Document> = chunk
            .iter()
            .map(|i| doc! {"_id": *i, "pad": &pad})
            .collect();
        db.collection::<Document>("c").insert_many(docs).await?;
    }
    Ok(())
}

/// F3: a data shard killed with `kill -9` under a pinned laggard. The laggard's pin is stored
/// with the shard's data, so after the restart the shard's trim still keeps everything the
/// laggard has not read: with 1 MB of oplog per shard and 4 MB written across the kill, it
/// still gets every insert, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_shard_killed_under_a_laggard_keeps_its_pinned_history() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start_with_args(2, &["--oplogSizeMB", "1"], &[]).await?;
    let client = cluster.client().await?;
    client
        .database("admin")
        .run_command(doc! {"shardCollection": "subs.c", "key": {"_id": "hashed"}})
        .await?;
    let db = subscribed(&client, doc! {}).await?;
    // The laggard exists, and is pinned on both shards, before the writes.
    assert!(read(&db, "slow", 1, 0).await?.is_empty());
    insert_big(&db, 0, 100).await?;
    cluster.shards[1].restart().await?;
    // Written once the router reaches the shard again (a read of both shards answers).
    let until = Instant::now() + Duration::from_secs(30);
    while let Err(e) = db
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
    {
        anyhow::ensure!(Instant::now() < until, "the shard did not come back: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    insert_big(&db, 100, 100).await?;
    let got = read_all(&db, "slow", 200, Duration::from_secs(60)).await?;
    let mut keys: Vec<i32> = got.iter().map(key).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        (0..200).collect::<Vec<_>>(),
        "every insert once, though each shard keeps 1 MB and 4 MB were written"
    );
    Ok(())
}

/// A consumer pins the oplog it has not acknowledged: with 1 MB of oplog and 4 MB written
/// meanwhile, a consumer that has read nothing still gets every event; a subscription with
/// `maxLagBytes` lets its laggard expire instead (9103 until a reset), and a reset consumer
/// goes on from where it was reset to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_pin_the_oplog_and_max_lag_expires_a_laggard() -> anyhow::Result<()> {
    let (_dir, server) = small_oplog_cluster().await?;
    let client = tests::connect(server.addr).await?;
    let db = subscribed(&client, doc! {}).await?;
    db.run_command(
        doc! {"createSubscription": "lag", "collection": "c", "maxLagBytes": 500_000i64},
    )
    .await?;
    // Each consumer exists (and is pinned) before the writes.
    assert!(read(&db, "a", 1, 0).await?.is_empty());
    let lag_read = db
        .run_command(doc! {"readSubscription": "lag", "consumer": "slow", "max": 1})
        .await?;
    assert!(lag_read.get_array("messages")?.is_empty());
    insert_big(&db, 0, 200).await?;
    let all = read_all(&db, "a", 200, Duration::from_secs(60)).await?;
    assert_eq!(
        all.iter().map(key).collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>(),
        "every event, though the oplog is 1 MB and 4 MB were written"
    );
    // Once `a` acks, its pin moves on (within a second), and the next writes trim past the
    // laggard, which expires instead of holding more than 500 KB.
    let ids: Vec<Bson> = all.iter().map(id).collect();
    db.run_command(
        doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": ids, "waitDurable": true},
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    insert_big(&db, 200, 60).await?;
    let until = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match db
            .run_command(doc! {"readSubscription": "lag", "consumer": "slow", "max": 1})
            .await
        {
            Err(e) => break e,
            Ok(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(r) => anyhow::bail!("the laggard never expired: {r}"),
        }
    };
    assert!(err.to_string().contains("SubscriptionExpired"), "{err}");
    db.run_command(doc! {"alterSubscription": "lag", "reset": {"to": "now", "consumer": "slow"}})
        .await?;
    insert_big(&db, 1000, 1).await?;
    let got = db
        .run_command(
            doc! {"readSubscription": "lag", "consumer": "slow", "max": 10, "waitMS": 5000},
        )
        .await?;
    let msgs = got.get_array("messages")?;
    assert_eq!(msgs.len(), 1, "after the reset it goes on: {got}");
    Ok(())
}

/// Consumers of one subscription share one stream on their router: twenty consumers, each
/// getting every event, hold one change-stream cursor on the shard, as one consumer does; so do
/// the consumers of a second subscription to the same stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_subscriptions_to_one_stream_share_it() -> anyhow::Result<()> {
    let cluster = tests::EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {}).await?;
    let open_cursors = || -> anyhow::Result<i64> {
        let status = cluster.shards()[0].status()?;
        Ok(status
            .get_document("metrics")?
            .get_document("cursor")?
            .get_document("open")?
            .get_i64("total")?)
    };
    let before = open_cursors()?;
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    for c in 0..20 {
        let got = read_all(&db, &format!("c{c}"), 10, Duration::from_secs(20)).await?;
        assert_eq!(
            got.iter().map(key).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
    }
    let during = open_cursors()?;
    assert_eq!(
        during - before,
        1,
        "twenty consumers hold one stream cursor on the shard"
    );
    // A second subscription to the same stream shares it too.
    db.run_command(doc! {"createSubscription": "s2", "collection": "c"})
        .await?;
    let docs: Vec<Document> = (10..20).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while got.len() < 10 && Instant::now() < until {
        let reply = db
            .run_command(doc! {"readSubscription": "s2", "consumer": "x", "waitMS": 1000})
            .await?;
        got.extend(
            reply
                .get_array("messages")?
                .iter()
                .filter_map(Bson::as_document)
                .map(key),
        );
    }
    assert_eq!(
        got,
        (10..20).collect::<Vec<_>>(),
        "the second subscription's consumer"
    );
    let first = read_all(&db, "c0", 10, Duration::from_secs(20)).await?;
    assert_eq!(
        first.iter().map(key).collect::<Vec<_>>(),
        (10..20).collect::<Vec<_>>()
    );
    assert_eq!(
        open_cursors()? - before,
        1,
        "two subscriptions to one stream hold one cursor on the shard"
    );
    cluster.stop().await;
    Ok(())
}

/// The randomized workload: a writer inserts while three consumers (one of them a work queue
/// of two readers) read, ack (some with `waitDurable`), nack and drop deliveries at random,
/// and every few seconds a random fault strikes: `kill -9` of the router, of the config shard,
/// of the other shard or of the whole cluster, or the config shard frozen for 3 s. Checked at the end: every insert
/// was acked by every consumer (at least once, nothing lost); per consumer, first deliveries
/// came in commit order; nothing acked with `waitDurable` came again; delivery counts stayed
/// within `maxDeliveries`. The seed is printed; `TRIBUTARY_SUBS_SEED` replays one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_under_random_acks_nacks_and_kills_keep_their_guarantees() -> anyhow::Result<()> {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("TRIBUTARY_SUBS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {"ackTimeoutSecs": 2, "maxDeliveries": 100}).await?;
    const N: i32 = 400;
    // Each consumer, and its readers (b is a work queue of two).
    let readers: [(&str, usize); 3] = [("a", 1), ("b", 2), ("c", 1)];
    for (name, _) in readers {
        read(&db, name, 1, 0).await?;
    }
    let mut next_insert = 0;
    #[derive(Default)]
    struct Seen {
        first: Vec<i32>,
        any: std::collections::HashSet<i32>,
        acked: std::collections::HashSet<i32>,
        durable: std::collections::HashSet<i32>,
        violations: Vec<String>,
    }
    let mut seen: std::collections::HashMap<&str, Seen> = Default::default();
    let mut last_kill = Instant::now();
    let started = Instant::now();
    let mut db = db;
    loop {
        let done = readers
            .iter()
            .all(|(name, _)| seen.get(name).is_some_and(|s| s.acked.len() == N as usize));
        if done || started.elapsed() > Duration::from_secs(240) {
            break;
        }
        if next_insert < N {
            let batch: Vec<Document> = (next_insert..(next_insert + 20).min(N))
                .map(|i| doc! {"_id": i})
                .collect();
            if db
                .collection::<Document>("c")
                .insert_many(batch)
                .await
                .is_ok()
            {
                next_insert = (next_insert + 20).min(N);
            }
        }
        if last_kill.elapsed() > Duration::from_secs(4) && next_insert < N {
            // The kill hooks: the router, the config shard (shard 0), the other shard, the
            // whole cluster, or the config shard frozen (SIGSTOP) for three seconds.
            let fault = rng.random_range(0..5);
            println!("fault {fault} at insert {next_insert}");
            match fault {
                0 => cluster.router.restart().await?,
                1 | 2 => cluster.shards[fault - 1].restart().await?,
                3 => {
                    cluster.router.kill();
                    for shard in &mut cluster.shards {
                        shard.restart().await?;
                    }
                    cluster.router.restart().await?;
                }
                _ => {
                    cluster.shards[0].freeze(true)?;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    cluster.shards[0].freeze(false)?;
                }
            }
            db = cluster.client().await?.database("subs");
            last_kill = Instant::now();
        }
        for (name, n_readers) in readers {
            for _ in 0..n_readers {
                let max = rng.random_range(1..40);
                let Ok(batch) = read(&db, name, max, 200).await else {
                    continue;
                };
                let s = seen.entry(name).or_default();
                let mut ack = Vec::new();
                let mut nack = Vec::new();
                for m in &batch {
                    let k = key(m);
                    let count = m.get_i64("deliveryCount")?;
                    if !(1..=100).contains(&count) {
                        s.violations
                            .push(format!("{k} delivered with count {count}"));
                    }
                    if s.durable.contains(&k) {
                        s.violations
                            .push(format!("{k} came again after a durable ack"));
                    }
                    if s.any.insert(k) {
                        if s.first.last().is_some_and(|last| *last > k) {
                            s.violations
                                .push(format!("{k} first delivered after {:?}", s.first.last()));
                        }
                        s.first.push(k);
                    }
                    match rng.random_range(0..10) {
                        0..7 => ack.push((k, id(m))),
                        7 => nack.push(id(m)),
                        _ => {} // dropped: comes again after the ack timeout
                    }
                }
                if !nack.is_empty() {
                    let _ = db
                        .run_command(doc! {"nackSubscription": "s", "consumer": name, "deliveryIds": nack, "retryInMS": 100})
                        .await;
                }
                if !ack.is_empty() {
                    let durable = rng.random_bool(0.5);
                    let ids: Vec<Bson> = ack.iter().map(|(_, id)| id.clone()).collect();
                    let reply = db
                        .run_command(doc! {"ackSubscription": "s", "consumer": name, "deliveryIds": ids, "waitDurable": durable})
                        .await;
                    if reply.is_ok() {
                        for (k, _) in &ack {
                            s.acked.insert(*k);
                            if durable {
                                s.durable.insert(*k);
                            }
                        }
                    }
                }
            }
        }
    }
    for (name, _) in readers {
        let s = seen.entry(name).or_default();
        assert!(
            s.violations.is_empty(),
            "seed {seed}, consumer {name}: {:?}",
            s.violations
        );
        assert_eq!(
            s.acked.len(),
            N as usize,
            "seed {seed}: consumer {name} acked every insert"
        );
    }
    Ok(())
}

/// A consumer whose router died is dropped by another router once its lease lapsed and it has
/// been idle past `consumerIdleTimeoutSecs`, and its pin with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_idle_consumer_is_dropped_by_another_router() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {"consumerIdleTimeoutSecs": 1}).await?;
    read(&db, "gone", 1, 0).await?;
    let other = cluster.start_extra_router().await?;
    cluster.router.kill();
    let other_db = tests::connect(other.addr).await?.database("subs");
    let consumers = |rows: &Document| -> anyhow::Result<Vec<String>> {
        Ok(rows
            .get_document("cursor")?
            .get_array("firstBatch")?
            .iter()
            .filter_map(|r| {
                r.as_document()?
                    .get_str("consumer")
                    .ok()
                    .map(str::to_string)
            })
            .collect())
    };
    let until = Instant::now() + Duration::from_secs(45);
    loop {
        let rows = other_db.run_command(doc! {"listSubscriptions": 1}).await?;
        if consumers(&rows)?.is_empty() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < until,
            "the abandoned consumer is still there: {rows}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Runs a driver script against `uri`: it passes or this fails with its output.
async fn run_script(program: &str, script: &str, args: &[&str]) -> anyhow::Result<()> {
    use anyhow::Context;
    let path = format!("{}/{script}", env!("CARGO_MANIFEST_DIR"));
    let child = tokio::process::Command::new(program)
        .arg(path)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {program} (scripts/test.sh installs the drivers)"))?;
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .with_context(|| format!("{script} did not finish"))??;
    anyhow::ensure!(
        out.status.success(),
        "{script} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Everything the driver scripts check (pymongo, the Node driver, mongosh, the guide's
/// subscription samples) holds on a multi-process cluster too: a router, a config shard and two shards,
/// each its own process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_scripts_pass_on_a_multi_process_cluster() -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(2).await?;
    let uri = format!("mongodb://{}/", cluster.router.addr);
    run_script("python3", "py/subscriptions.py", &[&uri]).await?;
    run_script(
        "python3",
        "py/guide_samples.py",
        &[&uri, "deployment/subscriptions.md"],
    )
    .await?;
    run_script("node", "js/subscriptions.js", &[&uri]).await?;
    Ok(())
}

/// State commits stay at about ten a second per router whatever the ack rate: a consumer that
/// reads and acks one message at a time, as fast as it can, with dead letters and `waitDurable`
/// acks among them, costs the config shard no more commits than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_commits_stay_at_ten_a_second_whatever_the_ack_rate() -> anyhow::Result<()> {
    let cluster = tests::EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = subscribed(&client, doc! {"maxDeliveries": 1}).await?;
    read(&db, "a", 1, 0).await?;
    let docs: Vec<Document> = (0..5000).map(|i| doc! {"_id": i}).collect();
    db.collection::<Document>("c").insert_many(docs).await?;
    let commits = || async {
        let status = client
            .database("admin")
            .run_command(doc! {"serverStatus": 1})
            .await?;
        anyhow::Ok(
            status
                .get_document("metrics")?
                .get_document("subscriptions")?
                .get_i64("stateCommits")?,
        )
    };
    let before = commits().await?;
    let started = Instant::now();
    let mut acks = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let batch = read(&db, "a", 1, 1000).await?;
        let ids: Vec<Bson> = batch.iter().map(id).collect();
        if acks % 10 == 9 {
            // A dead letter (maxDeliveries 1): a write of its own.
            db.run_command(
                doc! {"nackSubscription": "s", "consumer": "a", "deliveryIds": ids, "deadLetter": true},
            )
            .await?;
        } else {
            let durable = acks % 50 == 0;
            db.run_command(doc! {"ackSubscription": "s", "consumer": "a", "deliveryIds": ids, "waitDurable": durable})
                .await?;
        }
        acks += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let made = commits().await? - before;
    println!("{acks} acks and nacks in {elapsed:.1} s: {made} state commits");
    assert!(
        acks as f64 > 20.0 * elapsed,
        "the consumer acks faster than the state commits: {acks}"
    );
    assert!(
        (made as f64) <= 10.0 * elapsed + 3.0,
        "{made} state commits in {elapsed:.1} s for {acks} acks"
    );
    cluster.stop().await;
    Ok(())
}

/// F6: a shard put back from an older copy of its data directory. A consumer whose position
/// lies in the history the shard lost fails with SubscriptionResetRequired (9104) instead of
/// going on, and stays so until reset; one whose position is wholly before the copy goes on;
/// after a reset the failed one reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_past_a_restored_shards_history_must_be_reset() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "subs.c", doc! {"_id": "hashed"}).await?;
    let db = subscribed(&client, doc! {}).await?;
    let coll = db.collection::<Document>("c");
    let ack_all = |consumer: &'static str, got: Vec<Document>| {
        let db = db.clone();
        async move {
            let ids: Vec<Bson> = got.iter().map(id).collect();
            db.run_command(doc! {"ackSubscription": "s", "consumer": consumer, "deliveryIds": ids, "waitDurable": true})
                .await
        }
    };
    coll.insert_many((0..10).map(|i| doc! {"_id": i})).await?;
    for consumer in ["behind", "past"] {
        let got = read_all(&db, consumer, 10, Duration::from_secs(20)).await?;
        assert_eq!(got.len(), 10, "{consumer}");
        ack_all(consumer, got).await?;
    }
    // Copy shard 1 (stopped, so the copy is whole); the history after it will be lost.
    let dbpath = cluster.dir.path().join("shard1");
    let backup = cluster.dir.path().join("shard1-copy");
    cluster.shards[1].kill();
    tests::copy_dir(&dbpath, &backup)?;
    cluster.shards[1].restart().await?;
    // Past the copy's clock reservation (three seconds), as in `lineage.rs`.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    coll.insert_many((100..120).map(|i| doc! {"_id": i}))
        .await?;
    let lost = read_all(&db, "past", 20, Duration::from_secs(20)).await?;
    assert_eq!(lost.len(), 20);
    ack_all("past", lost).await?;
    // The registry learns how far the lost history reached (about once a second).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    cluster.shards[1].kill();
    std::fs::remove_dir_all(&dbpath)?;
    tests::copy_dir(&backup, &dbpath)?;
    cluster.shards[1].restart().await?;

    let until = Instant::now() + Duration::from_secs(30);
    let failure = loop {
        match read(&db, "past", 100, 500).await {
            Err(e) => break e,
            Ok(_) if Instant::now() < until => {}
            Ok(got) => anyhow::bail!("the consumer past the copy goes on: {got:?}"),
        }
    };
    assert!(
        failure.to_string().contains("9104") || failure.to_string().contains("ResetRequired"),
        "{failure}"
    );
    let again = read(&db, "past", 100, 0).await.expect_err("until reset");
    assert!(again.to_string().contains("ResetRequired"), "{again}");
    // The consumer wholly before the copy goes on: the lost stretch's events that still
    // exist (shard 0's), then what comes next.
    coll.insert_one(doc! {"_id": "after"}).await?;
    let mut keys = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && !keys.contains(&Bson::String("after".into())) {
        for m in read(&db, "behind", 100, 1000).await? {
            keys.push(
                m.get_document("event")?
                    .get_document("documentKey")?
                    .get("_id")
                    .cloned()
                    .unwrap_or(Bson::Null),
            );
        }
    }
    assert!(keys.contains(&Bson::String("after".into())), "{keys:?}");
    assert!(
        keys.len() < 21,
        "not the lost history's events from shard 1: {keys:?}"
    );
    // A reset lets the failed consumer go on.
    db.run_command(doc! {"alterSubscription": "s", "reset": {"to": "now", "consumer": "past"}})
        .await?;
    coll.insert_one(doc! {"_id": "later"}).await?;
    let got = read_all(&db, "past", 1, Duration::from_secs(20)).await?;
    assert_eq!(
        got.first().and_then(|m| m
            .get_document("event")
            .ok()?
            .get_document("documentKey")
            .ok()?
            .get("_id")
            .cloned()),
        Some(Bson::String("later".into()))
    );
    Ok(())
}
