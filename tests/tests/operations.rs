//! What operators see: the Prometheus endpoint (`--metricsPort`) moving with the work done, and
//! the logs (`--logFormat json`, slow operations over `--slowms`), on the real binary.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use tests::{ProcessCluster, http_get, metric_sample as sample};
use tokio::io::AsyncReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_commands_writes_and_streams_and_show_each_shard() -> anyhow::Result<()> {
    let port = tests::free_port()?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], port));
    let cluster =
        ProcessCluster::start_with_router_args(2, &["--metricsPort", &port.to_string()]).await?;
    tests::wait_for_listener(cluster.router.child.id(), metrics, Duration::from_secs(10)).await?;
    let client = cluster.client().await?;
    let c = client.database("ops").collection::<Document>("c");
    let mut stream = c.watch().await?;
    c.insert_many((0..5).map(|i| doc! {"_id": i})).await?;
    c.update_many(doc! {}, doc! {"$set": {"x": 1}}).await?;
    c.delete_one(doc! {"_id": 0}).await?;
    let mut seen = 0;
    while seen < 11 {
        if stream.try_next().await?.is_some() {
            seen += 1;
        }
    }
    let _ = client
        .database("ops")
        .run_command(doc! {"noSuchCommand": 1})
        .await
        .expect_err("an unknown command");
    let _: Vec<Document> = c.find(doc! {}).await?.try_collect().await?;

    let (status, body) = http_get(metrics, "/metrics").await?;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let at = |series: &str| sample(&body, series).unwrap_or(0.0);
    assert_eq!(
        at(r#"tributary_documents_written_total{op="insert"}"#),
        5.0,
        "{body}"
    );
    assert_eq!(at(r#"tributary_documents_written_total{op="update"}"#), 5.0);
    assert_eq!(at(r#"tributary_documents_written_total{op="delete"}"#), 1.0);
    assert!(at(r#"tributary_commands_total{command="insert",outcome="ok"}"#) >= 1.0);
    assert!(at(r#"tributary_commands_total{command="find",outcome="ok"}"#) >= 1.0);
    assert_eq!(
        at(r#"tributary_commands_total{command="other",outcome="CommandNotFound"}"#),
        1.0,
        "an unknown command name is not a label"
    );
    assert!(!body.contains("noSuchCommand"));
    assert!(at(r#"tributary_command_duration_seconds_count{command="insert"}"#) >= 1.0);
    assert!(at("tributary_change_stream_events_delivered_total") >= 11.0);
    assert_eq!(at("tributary_change_stream_cursors_open"), 1.0);
    assert!(at("tributary_connections") >= 1.0);
    for shard in ["shard0", "shard1"] {
        assert_eq!(
            at(&format!(r#"tributary_shard_up{{shard="{shard}"}}"#)),
            1.0
        );
        assert!(
            at(&format!(
                r#"tributary_high_water_mark_seconds{{shard="{shard}"}}"#
            )) > 0.0
        );
    }
    let entries: f64 = ["shard0", "shard1"]
        .iter()
        .map(|s| at(&format!(r#"tributary_oplog_entries{{shard="{s}"}}"#)))
        .sum();
    assert!(entries >= 11.0, "the oplog entries of the writes: {body}");

    // A $lookup reads only the foreign documents its input joins (routed by the foreign
    // shard key), a $graphLookup only what its search reaches; a correlated lookup the router
    // cannot narrow reads the collection whole; a $unionWith's sub-pipeline runs on the shards (no document
    // of the collection reaches the router, only its count).
    tests::shard_collection(&client, "ops.foreign", doc! {"k": 1}).await?;
    let foreign = client.database("ops").collection::<Document>("foreign");
    foreign
        .insert_many((0..200).map(|i| doc! {"_id": i, "k": i % 50}))
        .await?;
    let joined: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"_id": {"$in": [1, 2]}}},
            doc! {"$lookup": {"from": "foreign", "localField": "_id", "foreignField": "k", "as": "f"}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    let sizes: Vec<usize> = joined
        .iter()
        .map(|d| d.get_array("f").map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, vec![4, 4], "{joined:?}");
    let union: Vec<Document> = c
        .aggregate(vec![
            doc! {"$unionWith": {"coll": "foreign", "pipeline": [{"$count": "n"}]}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(union.len(), 4 + 1);
    assert_eq!(union[4], doc! {"n": 200});
    let graph: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"_id": 1}},
            // 150 (k 0), then 0 (k 0): two documents reached.
            doc! {"$graphLookup": {"from": "foreign", "startWith": 150, "connectFromField": "k", "connectToField": "_id", "as": "g"}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(graph[0].get_array("g")?.len(), 2, "{graph:?}");
    // A correlated $eq on a let variable is narrowed as a join is; the same join as a range
    // is not.
    for filter in [
        doc! {"$eq": ["$k", "$$i"]},
        doc! {"$and": [{"$gte": ["$k", "$$i"]}, {"$lte": ["$k", "$$i"]}]},
    ] {
        let correlated: Vec<Document> = c
            .aggregate(vec![
                doc! {"$match": {"_id": 1}},
                doc! {"$lookup": {"from": "foreign", "let": {"i": "$_id"}, "pipeline": [{"$match": {"$expr": filter}}], "as": "f"}},
            ])
            .await?
            .try_collect()
            .await?;
        assert_eq!(correlated[0].get_array("f")?.len(), 4);
    }
    let (_, read) = http_get(metrics, "/metrics").await?;
    let at = |series: &str| sample(&read, series).unwrap_or(0.0);
    assert_eq!(
        at(r#"tributary_foreign_documents_read_total{read="joined"}"#),
        8.0 + 2.0 + 4.0,
        "the 8 and 4 joined and 2 reached documents, not the 200: {read}"
    );
    assert_eq!(
        at(r#"tributary_foreign_documents_read_total{read="whole"}"#),
        200.0
    );

    // More work, and the counters move.
    c.insert_one(doc! {"_id": 100}).await?;
    drop(stream);
    let (_, again) = http_get(metrics, "/metrics").await?;
    assert_eq!(
        sample(&again, r#"tributary_documents_written_total{op="insert"}"#),
        Some(206.0)
    );
    let (status, _) = http_get(metrics, "/other").await?;
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_record_slow_operations() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = tests::free_port()?;
    let mut child =
        tests::tributary_command(port, dir.path(), &["--logFormat", "json", "--slowms", "0"])?
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .spawn()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pid = child.id().expect("the server runs");
    tests::wait_for_listener(pid, addr, Duration::from_secs(20)).await?;
    let client = tests::connect(addr).await?;
    client
        .database("logs")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await?;
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.start_kill()?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).await?;
    }
    let _ = child.wait().await;
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("a log line that is not JSON ({e}): {out}"))?;
    assert!(!lines.is_empty(), "no log lines");
    let slow = lines
        .iter()
        .find(|l| l["fields"]["message"] == "Slow query" && l["fields"]["command"] == "insert")
        .ok_or_else(|| anyhow::anyhow!("no slow-query line for the insert: {out}"))?;
    assert_eq!(slow["fields"]["ns"], "logs.c");
    assert_eq!(slow["fields"]["outcome"], "ok");
    assert!(slow["fields"]["duration_ms"].is_u64());
    assert_eq!(slow["level"], "INFO");
    Ok(())
}

/// A client cannot move the cluster clock further ahead of the router's wall clock than
/// `--maxAcceptableLogicalClockDriftSecs` allows (205), without auth too; within it, it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_future_cluster_time_is_refused() -> anyhow::Result<()> {
    let cluster = tests::EmbeddedCluster::start(1).await?;
    let raw = wire::client::Client::new(cluster.addr.to_string());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as u32;
    let with_time = |secs: u32| {
        doc! {
            "ping": 1,
            "$clusterTime": {
                "clusterTime": mongodb::bson::Timestamp { time: secs, increment: 1 },
                "signature": {"hash": mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64},
            },
        }
    };
    let far = raw
        .command("admin", &with_time(now + 2 * 365 * 24 * 3600))
        .await?;
    assert_eq!(far.get_f64("ok").ok(), Some(0.0), "{far}");
    assert_eq!(far.get_i32("code").ok(), Some(205), "{far}");
    assert_eq!(
        far.get_str("codeName").ok(),
        Some("ClusterTimeFailsRateLimiter")
    );
    let later = raw.command("admin", &doc! {"ping": 1}).await?;
    let gossip = later
        .get_document("$clusterTime")?
        .get_timestamp("clusterTime")?;
    assert!(
        gossip.time < now + 3600,
        "the refused time was not adopted: {later}"
    );
    let near = raw.command("admin", &with_time(now + 60)).await?;
    assert_eq!(near.get_f64("ok").ok(), Some(1.0), "{near}");
    cluster.stop().await;
    Ok(())
}

/// `dbStats`, `collStats` and `$collStats` add up every shard's part of a sharded collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_add_up_the_shards() -> anyhow::Result<()> {
    let cluster = tests::EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "st.h", doc! {"_id": "hashed"}).await?;
    let db = client.database("st");
    db.collection::<Document>("h")
        .insert_many((0..300).map(|i| doc! {"_id": i, "pad": "x".repeat(100)}))
        .await?;
    db.collection::<Document>("u")
        .insert_many((0..10).map(|i| doc! {"_id": i}))
        .await?;

    let stats = db.run_command(doc! {"dbStats": 1}).await?;
    assert_eq!(stats.get_i64("objects")?, 310, "{stats}");
    assert_eq!(stats.get_i64("collections")?, 2);
    assert_eq!(stats.get_document("raw")?.len(), 3);
    assert!(stats.get_f64("dataSize")? > 300.0 * 100.0);

    let h = db.run_command(doc! {"collStats": "h"}).await?;
    assert!(h.get_bool("sharded")?, "{h}");
    assert_eq!(h.get_i64("count")?, 300);
    assert_eq!(
        h.get_document("shards")?.len(),
        3,
        "every shard holds a part"
    );
    let per_shard: i64 = h
        .get_document("shards")?
        .values()
        .filter_map(|s| s.as_document()?.get_i64("count").ok())
        .sum();
    assert_eq!(per_shard, 300);
    let u = db.run_command(doc! {"collStats": "u"}).await?;
    assert!(!u.get_bool("sharded")?);
    assert_eq!(u.get_i64("count")?, 10);
    let missing = db.run_command(doc! {"collStats": "nothing"}).await?;
    assert_eq!(missing.get_i64("count")?, 0, "no collection: zeros, as 7.0");

    let per_shard: Vec<Document> = db
        .collection::<Document>("h")
        .aggregate([doc! {"$collStats": {"count": {}, "storageStats": {}}}])
        .await?
        .try_collect()
        .await?;
    assert_eq!(per_shard.len(), 3);
    let counted: i64 = per_shard
        .iter()
        .filter_map(|d| d.get_i64("count").ok())
        .sum();
    assert_eq!(counted, 300);
    assert!(
        per_shard
            .iter()
            .all(|d| d.get_document("storageStats").is_ok())
    );
    let total: Vec<Document> = db
        .collection::<Document>("h")
        .aggregate([
            doc! {"$collStats": {"count": {}}},
            doc! {"$group": {"_id": 1, "n": {"$sum": "$count"}}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(total[0].get_i64("n")?, 300);
    let err = db
        .collection::<Document>("nothing")
        .aggregate([doc! {"$collStats": {"count": {}}}])
        .await
        .expect_err("no such collection");
    assert_eq!(tests::scenarios::code_of(&err), Some(26));
    cluster.stop().await;
    Ok(())
}

/// `--config` reads mongod's YAML layout; a flag on the command line wins over the file; a
/// setting Tributary does not have is refused by name, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_configures_the_cluster() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = tests::free_port()?;
    let data = dir.path().join("data");
    let config = dir.path().join("tributary.yaml");
    std::fs::write(
        &config,
        format!(
            "net:\n  port: 1\n  bindIp: 127.0.0.1\nstorage:\n  dbPath: {}\ntributary:\n  shards: 2\n",
            data.display()
        ),
    )?;
    let mut child = tokio::process::Command::new(tests::tributary_binary()?)
        .args([
            "--config",
            &config.display().to_string(),
            "--port",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pid = child.id().expect("the server runs");
    tests::wait_for_listener(pid, addr, Duration::from_secs(20)).await?;
    let client = tests::connect(addr).await?;
    let shards = client
        .database("admin")
        .run_command(doc! {"listShards": 1})
        .await?;
    assert_eq!(shards.get_array("shards")?.len(), 2, "{shards}");
    assert!(data.join("shard1").is_dir(), "the file's dbPath");
    child.start_kill()?;
    let _ = child.wait().await;

    std::fs::write(&config, "security:\n  keyFile: /etc/tributary.key\n")?;
    let refused = tokio::process::Command::new(tests::tributary_binary()?)
        .args(["--config", &config.display().to_string()])
        .stdin(Stdio::null())
        .output()
        .await?;
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("security.keyFile"), "{message}");
    Ok(())
}

/// `currentOp` lists the operations in flight, and `killOp` interrupts one: a change-stream
/// `getMore` waiting for events answers `Interrupted` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_op_interrupts_an_operation_current_op_lists() -> anyhow::Result<()> {
    let cluster = tests::EmbeddedCluster::start(1).await?;
    let waiter = wire::client::Client::new(cluster.addr.to_string());
    let admin = wire::client::Client::new(cluster.addr.to_string());
    let opened = waiter
        .command(
            "ops",
            &doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}},
        )
        .await?;
    let id = opened.get_document("cursor")?.get_i64("id")?;
    let waiting = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let reply = waiter
            .command(
                "ops",
                &doc! {"getMore": id, "collection": "c", "maxTimeMS": 30_000},
            )
            .await;
        (reply, started.elapsed())
    });
    let mut opid = None;
    for _ in 0..100 {
        let ops = admin.command("admin", &doc! {"currentOp": 1}).await?;
        opid = ops.get_array("inprog")?.iter().find_map(|op| {
            let op = op.as_document()?;
            (op.get_document("command").ok()?.get_i64("getMore").ok()? == id)
                .then(|| op.get_i64("opid").ok())
                .flatten()
        });
        if opid.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opid = opid.ok_or_else(|| anyhow::anyhow!("currentOp never listed the getMore"))?;
    let killed = admin
        .command("admin", &doc! {"killOp": 1, "op": opid})
        .await?;
    assert_eq!(killed.get_f64("ok").ok(), Some(1.0), "{killed}");
    let (reply, took) = waiting.await?;
    let reply = reply?;
    assert_eq!(reply.get_i32("code").ok(), Some(11601), "{reply}");
    assert!(
        took < Duration::from_secs(20),
        "interrupted, not timed out: {took:?}"
    );
    let again = admin
        .command("ops", &doc! {"getMore": id, "collection": "c"})
        .await?;
    assert_eq!(
        again.get_i32("code").ok(),
        Some(43),
        "the cursor ended with it: {again}"
    );
    let after = admin.command("admin", &doc! {"currentOp": 1}).await?;
    assert!(
        !after
            .get_array("inprog")?
            .iter()
            .any(|op| op.as_document().and_then(|o| o.get_i64("opid").ok()) == Some(opid)),
        "the killed operation is gone: {after}"
    );
    cluster.stop().await;
    Ok(())
}

/// `killOp` on the router reaches the shards: the work a killed aggregate started on its shard
/// stops there too (`clientOperationKey`, `_killOperations`), instead of running to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_op_stops_the_operations_work_on_its_shard() -> anyhow::Result<()> {
    a_slow_aggregate_is_stopped_on_its_shard_by(|opid, _| doc! {"killOp": 1, "op": opid}).await
}

/// `killSessions` stops the operations running in the sessions it names, on the shards too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_sessions_stops_the_sessions_operations_on_their_shard() -> anyhow::Result<()> {
    a_slow_aggregate_is_stopped_on_its_shard_by(|_, lsid| doc! {"killSessions": [lsid]}).await
}

/// Starts an aggregate (in a session) that would work for minutes on its shard, sends the
/// command `kill(opid, lsid)` makes, and checks the aggregate answers `Interrupted` and the
/// shard stops its part. Router and shard are separate processes, so the router's answers
/// never wait behind the shard's work.
async fn a_slow_aggregate_is_stopped_on_its_shard_by(
    kill: impl FnOnce(i64, Document) -> Document,
) -> anyhow::Result<()> {
    let cluster = ProcessCluster::start(1).await?;
    let client = wire::client::Client::new(cluster.router.addr.to_string());
    let admin = wire::client::Client::new(cluster.router.addr.to_string());
    let shard = wire::client::Client::new(cluster.shards[0].addr.to_string());
    let docs: Vec<Document> = (0..2_000).map(|i| doc! {"_id": i}).collect();
    client
        .command("ops", &doc! {"insert": "slow", "documents": docs})
        .await?;
    let lsid = doc! {"id": mongodb::bson::Uuid::new()};
    // Minutes of work on the shard: a 200,000-element array built for every document.
    let slow = doc! {
        "aggregate": "slow",
        "pipeline": [{"$match": {"$expr": {"$gt": [{"$size": {"$range": [0, 200_000]}}, 0]}}}],
        "cursor": {},
        "lsid": lsid.clone(),
    };
    let running = tokio::spawn(async move { client.command("ops", &slow).await });
    let on_shard = || async {
        let status = shard.command("admin", &doc! {"serverStatus": 1}).await?;
        anyhow::Ok(
            status
                .get_array("clientOperations")?
                .iter()
                .any(|c| c.as_str() == Some("aggregate")),
        )
    };
    let mut opid = None;
    for _ in 0..500 {
        let ops = admin.command("admin", &doc! {"currentOp": 1}).await?;
        opid = ops.get_array("inprog")?.iter().find_map(|op| {
            let op = op.as_document()?;
            (op.get_document("command").ok()?.get_str("aggregate").ok()? == "slow")
                .then(|| op.get_i64("opid").ok())
                .flatten()
        });
        if opid.is_some() && on_shard().await? {
            break;
        }
        anyhow::ensure!(
            !running.is_finished(),
            "the aggregate ended by itself: {:?}",
            running.await?
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opid = opid.ok_or_else(|| anyhow::anyhow!("currentOp never listed the aggregate"))?;
    assert!(on_shard().await?, "the shard runs its part");
    let killed = admin.command("admin", &kill(opid, lsid)).await?;
    assert_eq!(killed.get_f64("ok").ok(), Some(1.0), "{killed}");
    let reply = running.await??;
    assert_eq!(reply.get_i32("code").ok(), Some(11601), "{reply}");
    let mut still = true;
    for _ in 0..250 {
        still = on_shard().await?;
        if !still {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!still, "the shard stopped the killed operation's work");
    Ok(())
}

/// `getLog: "global"` shows the process's recent log lines, as mongod's structured lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_log_shows_recent_lines() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = tests::free_port()?;
    let args = vec![
        "--port".to_string(),
        port.to_string(),
        "--dbpath".into(),
        dir.path().join("data").display().to_string(),
        "--slowms".into(),
        "0".into(),
    ];
    let p = tests::Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let raw = wire::client::Client::new(p.addr.to_string());
    raw.command("logs", &doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await?;
    let names = raw.command("admin", &doc! {"getLog": "*"}).await?;
    assert_eq!(names.get_array("names")?.len(), 2, "{names}");
    let global = raw.command("admin", &doc! {"getLog": "global"}).await?;
    let lines = global.get_array("log")?;
    assert!(global.get_i64("totalLinesWritten")? >= lines.len() as i64);
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| l.as_str())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert!(
        parsed
            .iter()
            .any(|l| l["msg"] == "Slow query" && l["attr"]["command"] == "insert"),
        "{global}"
    );
    assert!(
        parsed
            .iter()
            .all(|l| l["t"]["$date"].is_string() && l["s"].is_string())
    );
    let bad = raw.command("admin", &doc! {"getLog": "nope"}).await?;
    assert_eq!(bad.get_i32("code").ok(), Some(2), "{bad}");
    Ok(())
}
