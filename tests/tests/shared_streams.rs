//! Shared change-stream merges: streams with the same shard-side spec share one set of shard
//! cursors and one merge on the router, each keeping its own position; a stream that does not
//! read slows nobody, and one that falls off the shared buffer goes on by itself.

use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::options::ClientOptions;
use tests::EmbeddedCluster;

async fn client_for(cluster: &EmbeddedCluster, pool: u32) -> anyhow::Result<mongodb::Client> {
    let mut opts =
        ClientOptions::parse(format!("mongodb://{}/?directConnection=true", cluster.addr)).await?;
    opts.max_pool_size = Some(pool);
    Ok(mongodb::Client::with_options(opts)?)
}

async fn change_stream_metrics(client: &mongodb::Client) -> anyhow::Result<(i64, i64)> {
    let cs = tests::change_stream_metrics(&client.database("admin")).await?;
    Ok((
        cs.get_i64("sharedMerges")?,
        cs.get_i64("sharedBufferBytes")?,
    ))
}

/// A stream on `coll` from now on (it can share a merge).
async fn watch_now(coll: &mongodb::Collection<Document>) -> anyhow::Result<ChangeStream<Document>> {
    Ok(coll
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>())
}

/// Reads `n` events and returns their `documentKey._id`s.
async fn read_ids(stream: &mut ChangeStream<Document>, n: usize) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let ev = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the stream ended"))??;
        match ev.get_document("documentKey")?.get("_id") {
            Some(Bson::Int64(i)) => ids.push(*i),
            Some(Bson::Int32(i)) => ids.push(i64::from(*i)),
            other => anyhow::bail!("unexpected _id {other:?}"),
        }
    }
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_watchers_share_one_merge_and_a_stalled_one_slows_nobody() -> anyhow::Result<()>
{
    let cluster = EmbeddedCluster::start(3).await?;
    let client = client_for(&cluster, 256).await?;
    let coll = client.database("fan").collection::<Document>("c");
    coll.insert_one(doc! {"_id": -1_i64}).await?;
    let open = || watch_now(&coll);
    let mut stalled = open().await?;
    let mut watchers = Vec::new();
    for _ in 0..200 {
        watchers.push(open().await?);
    }
    assert_eq!(
        change_stream_metrics(&client).await?.0,
        1,
        "every stream shares one merge"
    );
    const N: usize = 300;
    let readers: Vec<_> = watchers
        .into_iter()
        .map(|mut s| tokio::spawn(async move { read_ids(&mut s, N).await }))
        .collect();
    for i in 0..N as i64 {
        coll.insert_one(doc! {"_id": i}).await?;
    }
    let expected: Vec<i64> = (0..N as i64).collect();
    for r in readers {
        assert_eq!(r.await??, expected, "a watcher missed or reordered events");
    }
    // The stalled stream read nothing all along; it still has everything, in order.
    assert_eq!(read_ids(&mut stalled, N).await?, expected);
    drop(stalled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_buffer_stays_bounded_and_a_stream_that_falls_off_it_goes_on_by_itself()
-> anyhow::Result<()> {
    let bound = 64 * 1024;
    let options = router::RouterOptions {
        stream_buffer_bytes: bound,
        ..router::RouterOptions::default()
    };
    let cluster = EmbeddedCluster::start_with_options(3, options).await?;
    let client = client_for(&cluster, 16).await?;
    let coll = client.database("bound").collection::<Document>("c");
    coll.insert_one(doc! {"_id": -1_i64}).await?;
    let open = || watch_now(&coll);
    let mut lagging = open().await?;
    let mut reader = open().await?;
    const N: usize = 400;
    let payload = "x".repeat(1000);
    let expected: Vec<i64> = (0..N as i64).collect();
    let reading = tokio::spawn(async move { read_ids(&mut reader, N).await });
    for i in 0..N as i64 {
        coll.insert_one(doc! {"_id": i, "payload": &payload})
            .await?;
    }
    assert_eq!(reading.await??, expected);
    let (merges, buffered) = change_stream_metrics(&client).await?;
    assert_eq!(merges, 1);
    // ~400 KB of events went through; the buffer keeps at most its bound (plus one event).
    assert!(
        buffered as usize <= bound + 2048,
        "{buffered} bytes buffered, bound {bound}"
    );
    // The lagging stream fell off the buffer's front: it re-reads from the shards, in order.
    assert_eq!(read_ids(&mut lagging, N).await?, expected);
    Ok(())
}

/// Reads `n` events through raw getMores on cursor `id`, checking every reply's size; returns
/// their `documentKey._id`s.
async fn read_raw(
    db: &mongodb::Database,
    coll: &str,
    mut id: i64,
    mut ids: Vec<i64>,
    n: usize,
) -> anyhow::Result<Vec<i64>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ids.len() < n {
        anyhow::ensure!(id != 0, "the cursor closed after {} events", ids.len());
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "only {} of {n} events after 60 s",
            ids.len()
        );
        let reply = db
            .run_command(doc! {"getMore": id, "collection": coll, "maxTimeMS": 1000_i64})
            .await?;
        let size = mongodb::bson::serialize_to_vec(&reply)?.len();
        anyhow::ensure!(size <= 16 << 20, "a getMore reply of {size} bytes");
        let cursor = reply.get_document("cursor")?;
        id = cursor.get_i64("id")?;
        for ev in cursor.get_array("nextBatch")? {
            let Bson::Document(ev) = ev else {
                anyhow::bail!("not an event: {ev}")
            };
            ids.push(ev.get_document("documentKey")?.get_i64("_id")?);
        }
    }
    Ok(ids)
}

/// A getMore never answers more than 16 MiB of events, however many are ready (a drain of
/// 100k events answered one 52 MB getMore, which failed with BSONObjectTooLarge): a shared
/// stream that read nothing while ~19 MB of events went by, and a stream of its own started
/// at the time the writes began, both read every event in replies of at most 16 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_stay_under_sixteen_mebibytes() -> anyhow::Result<()> {
    let options = router::RouterOptions {
        stream_buffer_bytes: 128 << 20,
        ..router::RouterOptions::default()
    };
    let cluster = EmbeddedCluster::start_with_options(3, options).await?;
    let client = client_for(&cluster, 16).await?;
    let db = client.database("big");
    tests::shard_collection(&client, "big.c", doc! {"_id": "hashed"}).await?;
    let coll = db.collection::<Document>("c");
    let started = db
        .run_command(doc! {"ping": 1})
        .await?
        .get_timestamp("operationTime")?;
    let open = |spec: Document| {
        let db = db.clone();
        async move {
            let reply = tests::open_change_stream(&db, "c", spec).await?;
            let cursor = reply.get_document("cursor")?;
            let mut first = Vec::new();
            for ev in cursor.get_array("firstBatch")? {
                let Bson::Document(ev) = ev else {
                    anyhow::bail!("not an event: {ev}")
                };
                first.push(ev.get_document("documentKey")?.get_i64("_id")?);
            }
            anyhow::Ok((cursor.get_i64("id")?, first))
        }
    };
    let shared = open(doc! {}).await?;
    const N: usize = 12_000;
    let payload = "y".repeat(1500);
    for chunk in (0..N as i64).collect::<Vec<_>>().chunks(1000) {
        let docs: Vec<Document> = chunk
            .iter()
            .map(|i| doc! {"_id": *i, "p": &payload})
            .collect();
        // Unordered: one batch per shard (an ordered one is split into runs of one document).
        coll.insert_many(docs).ordered(false).await?;
    }
    let own = open(doc! {"startAtOperationTime": started}).await?;
    for (name, (id, first)) in [("shared", shared), ("own", own)] {
        let mut ids = read_raw(&db, "c", id, first, N)
            .await
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        ids.sort_unstable();
        assert_eq!(ids, (0..N as i64).collect::<Vec<_>>(), "{name}");
    }
    Ok(())
}

/// One OP_MSG frame with `body`.
fn op_msg(request_id: i32, body: &Document) -> anyhow::Result<Vec<u8>> {
    tests::op_msg_frame(request_id, &body.to_vec()?)
}

/// The router process's resident and peak resident memory, in MiB.
fn router_memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow::anyhow!("no {name}"))?;
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("no value"))?
            .parse()?;
        Ok(kib >> 10)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

const LAGGING_WATCHERS: usize = 200;
const LAGGING_EVENTS_MIB: usize = 4;
/// What the router may add to its resident memory while every lagging watcher's reply waits on
/// its socket. Each reply is the 4 MiB batch; written from the shared event bytes they cost
/// the 4 MiB once (measured +9 MiB in all, debug build); replies that copied their batch (as at
/// 311be40) measured +836 MiB here.
const LAGGING_BOUND_MIB: u64 = 160;

/// Change-stream replies are written from the shared event bytes: a watcher that asks for a
/// batch and then reads nothing holds references to the hub's events, not a copy of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watcher_costs_a_bounded_amount() -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let cluster = tests::ProcessCluster::start(1).await?;
    let client = cluster.client().await?;
    let coll = client.database("lag").collection::<Document>("c");
    client.database("lag").create_collection("c").await?;

    let mut watchers = Vec::new();
    for i in 0..LAGGING_WATCHERS {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        let mut stream = socket.connect(cluster.router.addr).await?;
        let open = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}, "$db": "lag"};
        stream.write_all(&op_msg(i32::try_from(i)?, &open)?).await?;
        let reply = tests::read_op_msg(&mut stream).await?;
        let id = reply.get_document("cursor")?.get_i64("id")?;
        watchers.push((stream, id));
    }
    let filler = "x".repeat(8 * 1024);
    let docs: Vec<Document> = (0..LAGGING_EVENTS_MIB * 128)
        .map(|i| doc! {"_id": i as i64, "filler": &filler})
        .collect();
    coll.insert_many(docs).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = cluster.router.child.id();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?; // resets the peak
    let (before, _) = router_memory(pid)?;
    for (i, (stream, id)) in watchers.iter_mut().enumerate() {
        let more = doc! {"getMore": *id, "collection": "c", "$db": "lag"};
        stream
            .write_all(&op_msg(i32::try_from(1000 + i)?, &more)?)
            .await?;
    }
    let mut peak = before;
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(router_memory(pid)?.1);
    }
    println!(
        "router RSS {before} MiB before the getMores, peak {peak} MiB after \
         ({LAGGING_WATCHERS} lagging watchers, {LAGGING_EVENTS_MIB} MiB of events)"
    );
    assert!(
        peak - before < LAGGING_BOUND_MIB,
        "{LAGGING_WATCHERS} lagging watchers took the router from {before} to {peak} MiB"
    );

    // Each reply is whole and in order once read.
    let (stream, _) = &mut watchers[0];
    let mut seen = 0;
    while seen < LAGGING_EVENTS_MIB * 128 {
        let reply = tests::read_op_msg(stream).await?;
        let batch = reply.get_document("cursor")?.get_array("nextBatch")?;
        for event in batch {
            let event = event
                .as_document()
                .ok_or_else(|| anyhow::anyhow!("an event"))?;
            assert_eq!(
                event.get_document("documentKey")?.get_i64("_id")?,
                seen as i64
            );
            seen += 1;
        }
        if seen < LAGGING_EVENTS_MIB * 128 {
            let id = reply.get_document("cursor")?.get_i64("id")?;
            let more = doc! {"getMore": id, "collection": "c", "$db": "lag"};
            stream.write_all(&op_msg(7, &more)?).await?;
        }
    }
    Ok(())
}

/// Streams nobody reads stop holding the router's memory once their replies pass
/// `changeStreamHeldReplyBytesLimit`: the least recently read are parked (their shard cursors
/// killed, their events dropped) and, when read again, re-open where their client stands, so
/// each still gets every event once, in order, with post-batch resume tokens that never go
/// back. (Before, only the 10-minute idle timeout bounded them: 1,773 abandoned streams held
/// 1.75 GB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_nobody_reads_are_parked_past_the_memory_limit_and_lose_nothing()
-> anyhow::Result<()> {
    const STREAMS: usize = 12;
    const EVENTS: i64 = 3_000;
    const LIMIT: i64 = 4 << 20;
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    admin
        .run_command(doc! {"setParameter": 1, "changeStreamHeldReplyBytesLimit": LIMIT})
        .await?;
    let db = client.database("parking");
    db.create_collection("c").await?;
    let coll = db.collection::<Document>("c");
    let opened = tests::open_change_stream(&db, "c", doc! {}).await?;
    let at = opened.get_timestamp("operationTime")?;
    // Streams of their own (each has a start point), every one given its first batch.
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let r = tests::open_change_stream(&db, "c", doc! {"startAtOperationTime": at}).await?;
        streams.push(r.get_document("cursor")?.get_i64("id")?);
    }
    let pad = "x".repeat(1_000);
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(500) {
        let docs: Vec<Document> = chunk
            .iter()
            .map(|&i| doc! {"_id": i, "pad": &pad})
            .collect();
        coll.insert_many(docs).await?;
    }
    let metrics = || async { tests::change_stream_metrics(&admin).await };
    // Every stream's feeds fill up with events nobody reads, then the idle ones are parked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = metrics().await?;
        if m.get_i64("parked")? > 0 && m.get_i64("heldReplyBytes")? <= LIMIT {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the streams still hold {} bytes, {} parked",
            m.get_i64("heldReplyBytes")?,
            m.get_i64("parked")?
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in streams {
        let mut next = 0_i64;
        let mut last_token: Option<Document> = None;
        while next < EVENTS {
            let reply = db
                .run_command(doc! {"getMore": id, "collection": "c", "batchSize": 700, "maxTimeMS": 1000_i64})
                .await?;
            let cursor = reply.get_document("cursor")?;
            for event in cursor.get_array("nextBatch")? {
                let Bson::Document(event) = event else {
                    anyhow::bail!("an event that is not a document");
                };
                let key = event.get_document("documentKey")?;
                let got = match key.get("_id") {
                    Some(Bson::Int64(i)) => *i,
                    Some(Bson::Int32(i)) => i64::from(*i),
                    other => anyhow::bail!("unexpected _id {other:?}"),
                };
                anyhow::ensure!(got == next, "stream {id}: event {got} where {next} belongs");
                next += 1;
            }
            let token = cursor.get_document("postBatchResumeToken")?.clone();
            if let Some(last) = &last_token {
                anyhow::ensure!(
                    token.get_str("_data")? >= last.get_str("_data")?,
                    "stream {id}: the post-batch resume token went back"
                );
            }
            last_token = Some(token);
        }
    }
    anyhow::ensure!(metrics().await?.get_i64("parked")? > 0);
    Ok(())
}
