//! The HTTP feed (`--httpPort`) under faults, with real processes: a shard killed with
//! `kill -9` makes a page 503 (a driver would resume), and the shard back makes it 200 again;
//! an event-stream reader that stops reading holds the router to bounded memory while the
//! writers go on. (Every endpoint and option is checked with plain HTTP clients in
//! `tests/py/http_feed.py`; the status page in headless Chromium in
//! `tests/py/http_status_page.py`.)

use std::time::{Duration, Instant};

use bson::{Document, doc};
use tests::{ProcessCluster, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `GET path` and reads the response head: its status and the stream, positioned at
/// the body.
async fn get(port: u16, path: &str, headers: &str) -> anyhow::Result<(u16, TcpStream)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{headers}\r\n").as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        anyhow::ensure!(
            s.read(&mut byte).await? == 1,
            "the response ended in its head"
        );
        head.push(byte[0]);
        anyhow::ensure!(head.len() < 16 * 1024, "a response head past 16 KiB");
    }
    let head = String::from_utf8_lossy(&head);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head}"))?;
    Ok((status, s))
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_killed_makes_a_page_503_and_back_200() -> anyhow::Result<()> {
    let http = free_port()?;
    let http_arg = http.to_string();
    let mut cluster = ProcessCluster::start_with_router_args(
        2,
        &[
            "--httpPort",
            &http_arg,
            "--shardConnectTimeoutMS",
            "1000",
            "--shardOutageTimeoutSecs",
            "2",
        ],
    )
    .await?;
    let client = cluster.client().await?;
    client
        .database("feed")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await?;
    let (status, _) = get(http, "/v1/changes?ns=feed.c&from=oldest", "").await?;
    assert_eq!(status, 200);
    cluster.shards[1].kill();
    let started = Instant::now();
    let (status, mut body) = get(http, "/v1/changes?ns=feed.c&from=oldest", "").await?;
    let mut text = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), body.read_to_string(&mut text)).await;
    assert_eq!(status, 503, "a shard away is 503: {text}");
    assert!(
        text.contains("\"code\""),
        "the body is MongoDB's error document: {text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered within the patience, not held"
    );
    cluster.shards[1].restart().await?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = get(http, "/v1/changes?ns=feed.c&from=oldest", "").await?;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < until,
            "still {status} 30 s after the shard came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_costs_bounded_memory() -> anyhow::Result<()> {
    let http = free_port()?;
    let http_arg = http.to_string();
    let cluster = ProcessCluster::start_with_router_args(1, &["--httpPort", &http_arg]).await?;
    let router_pid = cluster.router.child.id();
    let client = cluster.client().await?;
    let coll = client.database("feed").collection::<Document>("big");
    coll.insert_one(doc! {"_id": -1}).await?;
    // An event-stream reader that takes the head of the response and then nothing more.
    let (status, stalled) = get(
        http,
        "/v1/changes?ns=feed.big&from=oldest",
        "Accept: text/event-stream\r\n",
    )
    .await?;
    assert_eq!(status, 200);
    let before = rss_bytes(router_pid);
    // 120 MB of events, written while the reader reads none of them.
    let pad = "x".repeat(10_000);
    for batch in 0..120 {
        let docs: Vec<Document> = (0..100)
            .map(|i| doc! {"_id": batch * 100 + i, "pad": &pad})
            .collect();
        coll.insert_many(docs).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss_bytes(router_pid).saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "the router grew {} MB for a reader that stopped (of 120 MB written)",
        grown >> 20
    );
    drop(stalled);
    // The writers were never held up: a write still commits at once.
    let t = Instant::now();
    coll.insert_one(doc! {"_id": "last"}).await?;
    assert!(t.elapsed() < Duration::from_secs(5));
    Ok(())
}
