//! Replicated shards as processes (`tributary shard --replSet rs --peers a,b,c`): three
//! members on their own ports elect a primary, which alone takes writes and says so in
//! `hello`; `kill -9` of the primary is followed within seconds by a new one that has every
//! acknowledged write; the killed member, restarted, comes back as a secondary.

use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use futures::StreamExt;
use tests::replicated::{ReplicaSetProcs, ReplicatedCluster};

/// The member of `clients` whose `hello` says it is the writable primary, once one does
/// (within `patience`).
async fn primary_among(
    clients: &[Option<wire::Client>],
    patience: Duration,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + patience;
    loop {
        for (i, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            if let Ok(hello) = client.command("admin", &doc! {"hello": 1}).await
                && hello.get_bool("isWritablePrimary").unwrap_or(false)
            {
                return Ok(i);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no primary within {patience:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ok(reply: &Document) -> bool {
    reply.get("ok") == Some(&Bson::Double(1.0)) && !reply.contains_key("writeErrors")
}

#[tokio::test]
async fn a_killed_primary_is_replaced_within_seconds_with_every_acknowledged_write()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let (hosts, mut procs) = (set.hosts.clone(), set.members);
    let mut clients: Vec<Option<wire::Client>> = hosts
        .iter()
        .map(|h| Some(wire::Client::new(h.clone())))
        .collect();
    let old = primary_among(&clients, Duration::from_secs(20)).await?;

    // What a secondary says of its set, and what it refuses.
    let secondary = (old + 1) % 3;
    let other = clients[secondary].as_ref().expect("running");
    let deadline = Instant::now() + Duration::from_secs(10);
    let hello = loop {
        // A member says it is a secondary once it serves reads (its storage open).
        let hello = other.command("admin", &doc! {"hello": 1}).await?;
        if hello.get_bool("secondary")? || Instant::now() > deadline {
            break hello;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(hello.get_str("setName")?, "rs", "{hello}");
    assert!(!hello.get_bool("isWritablePrimary")?);
    assert!(hello.get_bool("secondary")?);
    assert_eq!(hello.get_str("primary")?, hosts[old]);
    assert_eq!(hello.get_str("me")?, hosts[secondary]);
    let hosts_listed: Vec<&str> = hello
        .get_array("hosts")?
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    assert_eq!(
        hosts_listed,
        hosts.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let refused = other
        .command("app", &doc! {"insert": "c", "documents": [{"_id": -1}]})
        .await?;
    assert_eq!(refused.get_i32("code")?, 10107, "{refused}");
    let primary_hello = clients[old]
        .as_ref()
        .expect("running")
        .command("admin", &doc! {"hello": 1})
        .await?;
    assert!(
        primary_hello.get_object_id("electionId").is_ok(),
        "{primary_hello}"
    );

    let leader = clients[old].as_ref().expect("running");
    for i in 0..50 {
        let r = leader
            .command("app", &doc! {"insert": "c", "documents": [{"_id": i}]})
            .await?;
        assert!(ok(&r), "{r}");
    }

    let killed = Instant::now();
    procs[old].kill();
    clients[old] = None;
    let new = loop {
        let mut took = None;
        for (i, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            if let Ok(r) = client
                .command("app", &doc! {"insert": "c", "documents": [{"_id": 1000}]})
                .await
                && ok(&r)
            {
                took = Some(i);
                break;
            }
        }
        if let Some(i) = took {
            break i;
        }
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(20),
            "no member took a write within 20 s of the primary's kill -9"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "kill -9 of the primary -> first acknowledged write on member {new}: {:?}",
        killed.elapsed()
    );
    let found = clients[new]
        .as_ref()
        .expect("running")
        .command("app", &doc! {"find": "c", "filter": {}, "batchSize": 1000})
        .await?;
    let batch = found.get_document("cursor")?.get_array("firstBatch")?;
    assert_eq!(batch.len(), 51, "every acknowledged write, and the new one");

    // A retryable write of two statements in the new term: the second entry's prevOpTime
    // names the first by its ts and its term.
    let primary = clients[new].as_ref().expect("running");
    let lsid = doc! {"id": Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: vec![7; 16],
    })};
    let r = primary
        .command(
            "app",
            &doc! {"insert": "c", "documents": [{"_id": "r1"}, {"_id": "r2"}],
            "lsid": lsid.clone(), "txnNumber": 1_i64},
        )
        .await?;
    assert!(ok(&r), "{r}");
    let chain = primary
        .command(
            "local",
            &doc! {"find": "oplog.rs", "filter": {"lsid": lsid, "txnNumber": 1_i64},
            "sort": {"$natural": 1}},
        )
        .await?;
    let chain = chain.get_document("cursor")?.get_array("firstBatch")?;
    let entry = |i: usize| chain.get(i).and_then(Bson::as_document);
    let (Some(first), Some(second)) = (entry(0), entry(1)) else {
        anyhow::bail!("two entries of the retryable write: {chain:?}");
    };
    assert!(first.get_i64("t")? > 1, "a later term: {first}");
    assert_eq!(
        second.get_document("prevOpTime")?,
        &doc! {"ts": first.get_timestamp("ts")?, "t": first.get_i64("t")?},
        "{second}"
    );

    // The killed member comes back as a secondary of the new primary (one that serves reads
    // once it has opened its storage again).
    procs[old].restart().await?;
    clients[old] = Some(wire::Client::new(hosts[old].clone()));
    let back = clients[old].as_ref().expect("running");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hello = back.command("admin", &doc! {"hello": 1}).await?;
        if hello.get_str("primary").ok() == Some(hosts[new].as_str())
            && hello.get_bool("secondary")?
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the restarted member did not rejoin: {hello}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// What a writer saw of one insert: when it was acknowledged.
struct Acked {
    id: i64,
    at: Instant,
}

/// Inserts `{_id: id}` through the router until it is acknowledged (a repeat after an
/// unknown outcome may find it written already: duplicate key), within 30 s.
async fn insert_until_acked(
    coll: &mongodb::Collection<Document>,
    id: i64,
) -> anyhow::Result<Acked> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match coll.insert_one(doc! {"_id": id}).await {
            Ok(_) => {
                return Ok(Acked {
                    id,
                    at: Instant::now(),
                });
            }
            Err(e) if e.to_string().contains("E11000") => {
                return Ok(Acked {
                    id,
                    at: Instant::now(),
                });
            }
            Err(e) => {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "insert {id} not acknowledged: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_router_follows_a_failover_losing_no_write_and_no_event_repeating_none()
-> anyhow::Result<()> {
    let mut cluster = ReplicatedCluster::start(1, 3).await?;
    let client = cluster.client().await?;
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_one(doc! {"_id": -1}).await?;

    // A watcher, from before the first write below, collecting each event's _id.
    let mut stream = coll.watch().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { break };
            let id = event.document_key.and_then(|k| k.get_i64("_id").ok());
            if tx.send((id, Instant::now())).is_err() {
                break;
            }
        }
    });

    let (before, after) = (30, 60);
    let mut acked = Vec::new();
    for id in 0..before {
        acked.push(insert_until_acked(&coll, id).await?);
    }
    let set = &mut cluster.sets[0];
    let old = set.primary(&[], Duration::from_secs(10)).await?;
    let killed = Instant::now();
    set.members[old].kill();
    for id in before..after {
        acked.push(insert_until_acked(&coll, id).await?);
    }
    let first_ack = acked[usize::try_from(before)?].at - killed;

    // Every acknowledged write is there, on the new primary.
    let found: Vec<Document> = coll
        .find(doc! {"_id": {"$gte": 0}})
        .await?
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let ids: Vec<i64> = found.iter().filter_map(|d| d.get_i64("_id").ok()).collect();
    assert_eq!(
        ids,
        (0..after).collect::<Vec<_>>(),
        "every acknowledged insert"
    );

    // The stream saw each insert once, in order.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < acked.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(event)) => seen.push(event),
            _ => anyhow::bail!(
                "the stream delivered {} of {} events",
                seen.len(),
                acked.len()
            ),
        }
    }
    let seen_ids: Vec<Option<i64>> = seen.iter().map(|(id, _)| *id).collect();
    let expected: Vec<Option<i64>> = acked.iter().map(|a| Some(a.id)).collect();
    assert_eq!(
        seen_ids, expected,
        "no event missing, repeated or out of order"
    );
    let first_event = seen[usize::try_from(before)?].1 - killed;
    println!(
        "kill -9 of the primary -> first acknowledged write through the router {first_ack:?}, \
         its event delivered {first_event:?}"
    );
    assert!(first_ack < Duration::from_secs(10), "{first_ack:?}");
    watcher.abort();
    Ok(())
}

#[tokio::test]
async fn a_member_reports_its_set_steps_down_on_request_and_wakes_awaitable_hellos()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let old = set.primary(&[], Duration::from_secs(20)).await?;
    let primary = set.client(old);
    let r = primary
        .command("app", &doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await?;
    assert!(ok(&r), "{r}");

    // Every member's hello has its last write: at or past the insert's op time (a member
    // applies only committed entries, so its majority op time is the same), in a term.
    let op_time = |hello: &Document| -> Option<((u32, u32), i64)> {
        let last = hello.get_document("lastWrite").ok()?;
        let op = last.get_document("opTime").ok()?;
        last.get_datetime("lastWriteDate").ok()?;
        assert_eq!(
            last.get_document("majorityOpTime").ok(),
            Some(op),
            "{hello}"
        );
        let ts = op.get_timestamp("ts").ok()?;
        Some(((ts.time, ts.increment), op.get_i64("t").ok()?))
    };
    let wrote = r.get_timestamp("operationTime")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for m in 0..3 {
        loop {
            let hello = set.client(m).command("admin", &doc! {"hello": 1}).await?;
            if let Some((ts, t)) = op_time(&hello)
                && ts >= (wrote.time, wrote.increment)
            {
                assert!(t >= 1, "{hello}");
                break;
            }
            assert!(Instant::now() < deadline, "member {m}: {hello}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // replSetGetStatus on the primary: every member, each in its state, with positions.
    let status = primary
        .command("admin", &doc! {"replSetGetStatus": 1})
        .await?;
    assert!(ok(&status), "{status}");
    assert_eq!(status.get_str("set")?, "rs");
    assert_eq!(status.get_i32("myState")?, 1, "{status}");
    let members = status.get_array("members")?;
    assert_eq!(members.len(), 3, "{status}");
    let states: Vec<&str> = members
        .iter()
        .filter_map(|m| m.as_document()?.get_str("stateStr").ok())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "PRIMARY").count(),
        1,
        "{status}"
    );
    assert_eq!(
        states.iter().filter(|s| **s == "SECONDARY").count(),
        2,
        "{status}"
    );
    let applied = status
        .get_document("optimes")?
        .get_document("appliedOpTime")?
        .get_i64("index")?;
    assert!(applied > 0, "{status}");

    // An awaitable hello waits out its time while nothing changes...
    let hello = set
        .client((old + 1) % 3)
        .command("admin", &doc! {"hello": 1})
        .await?;
    let topology = hello.get_document("topologyVersion")?.clone();
    let waited = Instant::now();
    let again = set
        .client((old + 1) % 3)
        .command(
            "admin",
            &doc! {"hello": 1, "topologyVersion": topology.clone(), "maxAwaitTimeMS": 300},
        )
        .await?;
    assert!(waited.elapsed() >= Duration::from_millis(300), "{again}");
    assert_eq!(again.get_document("topologyVersion")?, &topology);

    // ... and answers as soon as the primary steps down.
    let watcher = set.client((old + 1) % 3);
    let awaiting = tokio::spawn(async move {
        let cmd = doc! {"hello": 1, "topologyVersion": topology, "maxAwaitTimeMS": 20_000};
        let started = Instant::now();
        let reply = watcher.command("admin", &cmd).await;
        (reply, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stepped = primary
        .command(
            "admin",
            &doc! {"replSetStepDown": 60, "secondaryCatchUpPeriodSecs": 10},
        )
        .await?;
    assert!(ok(&stepped), "{stepped}");
    let (woken, took) = awaiting.await?;
    let woken = woken?;
    assert!(took < Duration::from_secs(10), "{took:?}: {woken}");
    let counter = |h: &Document| -> anyhow::Result<i64> {
        Ok(h.get_document("topologyVersion")?.get_i64("counter")?)
    };
    assert!(counter(&woken)? > counter(&hello)?, "{woken}");
    let new = set.primary(&[], Duration::from_secs(10)).await?;
    assert_ne!(new, old, "leadership moved to another member");
    let refused = primary
        .command("app", &doc! {"insert": "c", "documents": [{"_id": 2}]})
        .await?;
    assert_eq!(refused.get_i32("code")?, 10107, "{refused}");

    // Bad awaitable hellos are refused with MongoDB's codes.
    let lone = set.client(new);
    let r = lone
        .command("admin", &doc! {"hello": 1, "maxAwaitTimeMS": 10})
        .await?;
    assert_eq!(r.get_i32("code")?, 31368, "{r}");
    let r = lone
        .command(
            "admin",
            &doc! {"hello": 1, "topologyVersion": hello.get_document("topologyVersion")?.clone(), "maxAwaitTimeMS": -1},
        )
        .await?;
    assert_eq!(r.get_i32("code")?, 31373, "{r}");
    // A secondary cannot step down.
    let r = set
        .client((new + 1) % 3)
        .command("admin", &doc! {"replSetStepDown": 60})
        .await?;
    assert_eq!(r.get_i32("code")?, 10107, "{r}");

    // The old primary is not electable for its 60 s; the third member frozen too, and the
    // primary killed, nobody stands; the freeze lifted, the third is elected.
    let third = (0..3).find(|&m| m != old && m != new).unwrap_or(0);
    let r = set
        .client(third)
        .command("admin", &doc! {"replSetFreeze": 60})
        .await?;
    assert!(ok(&r), "{r}");
    let r = lone.command("admin", &doc! {"replSetFreeze": 60}).await?;
    assert_eq!(r.get_i32("code")?, 95, "a primary cannot freeze: {r}");
    set.members[new].kill();
    let quiet = Instant::now() + Duration::from_secs(4);
    while Instant::now() < quiet {
        for m in [old, third] {
            let hello = set.client(m).command("admin", &doc! {"hello": 1}).await?;
            assert!(
                !hello.get_bool("isWritablePrimary")?,
                "member {m} was elected while frozen: {hello}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = set
        .client(third)
        .command("admin", &doc! {"replSetFreeze": 0})
        .await?;
    assert_eq!(r.get_str("info").ok(), Some("unfreezing"), "{r}");
    let elected = set.primary(&[new], Duration::from_secs(10)).await?;
    assert_eq!(elected, third, "the member no longer frozen is elected");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_cluster_with_three_replicas_per_shard_commits_across_shards_and_fails_over()
-> anyhow::Result<()> {
    tests::init_tracing();
    let dir = tempfile::tempdir()?;
    let options = router::RouterOptions {
        argv: vec!["tributary".into()],
        enable_test_commands: true,
        ..router::RouterOptions::default()
    };
    let running = router::launch::embedded_replicated(
        "127.0.0.1:0".parse()?,
        2,
        3,
        dir.path().to_path_buf(),
        options,
    )
    .await?;
    assert_eq!(running.members().len(), 6);
    let client = tests::connect(running.addr).await?;
    tests::shard_collection(&client, "app.c", doc! {"_id": "hashed"}).await?;
    let coll = client.database("app").collection::<Document>("c");
    let mut stream = coll.watch().await?;

    // A transaction across both shards: a two-phase commit between replicated shards.
    let mut session = client.start_session().await?;
    session.start_transaction().await?;
    for id in 0..10_i64 {
        coll.insert_one(doc! {"_id": id})
            .session(&mut session)
            .await?;
    }
    session.commit_transaction().await?;

    // Shard 0's primary steps down; writes and the stream go on.
    let members = running.members();
    let old = members[..3]
        .iter()
        .position(|m| m.primary().is_some())
        .expect("shard0 has a primary");
    let stepped = members[old]
        .run_command(doc! {"replSetStepDown": 60, "$db": "admin"})
        .await;
    assert_eq!(stepped.get_f64("ok").ok(), Some(1.0), "{stepped}");
    for id in 10..20_i64 {
        insert_until_acked(&coll, id).await?;
    }
    let new = members[..3]
        .iter()
        .position(|m| m.primary().is_some())
        .expect("shard0 has a new primary");
    assert_ne!(new, old);
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await?
            .expect("the stream goes on")?;
        seen.push(event.document_key.expect("documentKey").get_i64("_id")?);
    }
    let (mut first, mut second) = (seen[..10].to_vec(), seen[10..].to_vec());
    first.sort_unstable();
    second.sort_unstable();
    assert_eq!(
        first,
        (0..10).collect::<Vec<_>>(),
        "the transaction's events, once each"
    );
    assert_eq!(
        second,
        (10..20).collect::<Vec<_>>(),
        "the later inserts, once each"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_driver_given_the_set_writes_to_its_primary_and_follows_a_failover() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let client = set.driver().await?;
    let coll = client.database("app").collection::<Document>("c");
    for id in 0..10 {
        insert_until_acked(&coll, id).await?;
    }
    let old = set.primary(&[], Duration::from_secs(10)).await?;
    set.members[old].kill();
    for id in 10..20 {
        insert_until_acked(&coll, id).await?;
    }
    let found: Vec<Document> = coll
        .find(doc! {})
        .await?
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut ids: Vec<i64> = found.iter().filter_map(|d| d.get_i64("_id").ok()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..20).collect::<Vec<_>>(),
        "every acknowledged insert, once"
    );
    Ok(())
}

/// A write concern's `writeConcernError`, if the reply has one: (code, codeName, errInfo).
fn write_concern_error(reply: &Document) -> Option<(i32, String, Option<Document>)> {
    let wce = reply.get_document("writeConcernError").ok()?;
    Some((
        wce.get_i32("code").ok()?,
        wce.get_str("codeName").ok()?.to_string(),
        wce.get_document("errInfo").ok().cloned(),
    ))
}

#[tokio::test]
async fn w_n_waits_for_n_members_and_says_so_when_they_do_not_come() -> anyhow::Result<()> {
    let mut cluster = ReplicatedCluster::start(1, 3).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let insert = |id: i64, w: Bson, wtimeout: i32| {
        doc! {"insert": "c", "documents": [{"_id": id}], "writeConcern": {"w": w, "wtimeout": wtimeout}}
    };

    // Every member up: w up to the set's size is met, with nothing to report.
    for (id, w) in [
        (1, Bson::Int32(2)),
        (2, Bson::Int32(3)),
        (3, Bson::String("majority".into())),
    ] {
        let reply = db.run_command(insert(id, w.clone(), 10_000)).await?;
        assert_eq!(reply.get_i32("n")?, 1, "w: {w}");
        assert_eq!(write_concern_error(&reply), None, "w: {w}: {reply}");
    }
    // More than the set has: the write is made, the write concern is unsatisfiable (100).
    let reply = db.run_command(insert(4, Bson::Int32(4), 1_000)).await?;
    assert_eq!(reply.get_i32("n")?, 1);
    let (code, name, _) = write_concern_error(&reply).expect("a writeConcernError");
    assert_eq!((code, name.as_str()), (100, "UnsatisfiableWriteConcern"));

    // A secondary down: w: 2 is still met at once; w: 3 times out after its wtimeout with
    // MongoDB's writeConcernError, the write made all the same.
    let set = &mut cluster.sets[0];
    let primary = set.primary(&[], Duration::from_secs(10)).await?;
    let secondary = (primary + 1) % 3;
    set.members[secondary].kill();
    let reply = db.run_command(insert(5, Bson::Int32(2), 10_000)).await?;
    assert_eq!(write_concern_error(&reply), None, "{reply}");
    let started = Instant::now();
    let reply = db.run_command(insert(6, Bson::Int32(3), 500)).await?;
    let waited = started.elapsed();
    assert_eq!(reply.get_i32("n")?, 1, "{reply}");
    let (code, name, info) = write_concern_error(&reply).expect("a writeConcernError");
    assert_eq!((code, name.as_str()), (64, "WriteConcernFailed"), "{reply}");
    let info = info.expect("errInfo");
    assert!(info.get_bool("wtimeout")?, "{info}");
    assert_eq!(
        info.get_document("writeConcern")?.get_i64("w")?,
        3,
        "{info}"
    );
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "waited {waited:?} for a wtimeout of 500 ms"
    );
    let written = db
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await?;
    assert_eq!(written, 6, "every write was made");
    Ok(())
}

/// The `replSetGetConfig` document of `client`'s member.
async fn set_config(client: &wire::Client) -> anyhow::Result<Document> {
    let reply = client
        .command("admin", &doc! {"replSetGetConfig": 1})
        .await?;
    Ok(reply.get_document("config")?.clone())
}

/// `replSetReconfig` adds a member, which catches up as a learner and then votes, and removes
/// another: `replSetGetConfig`, `hello` and `replSetGetStatus` follow, `w: 4` counts the new
/// member, a driver given the set follows, and the new member, elected after the primary is
/// killed, holds every acknowledged write.
#[tokio::test]
async fn a_reconfig_adds_a_member_that_catches_up_and_removes_another() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let client = set.driver().await?;
    let coll = client.database("app").collection::<Document>("c");
    for id in 0..50 {
        insert_until_acked(&coll, id).await?;
    }
    // A router given the first three members only.
    let router = ReplicatedCluster::router_over(std::slice::from_ref(&set)).await?;

    // A fourth member, started to join: it lists the set and itself, last.
    let (joined, host) = set.join(dir.path()).await?;
    let fresh = wire::Client::new(host.clone());

    let primary = set.primary(&[], Duration::from_secs(10)).await?;
    let config = set_config(&set.client(primary)).await?;
    let version = config.get_i64("version")?;
    let mut members = config.get_array("members")?.clone();
    assert_eq!(members.len(), 3, "{config}");
    members.push(Bson::Document(doc! {"_id": 3, "host": &host}));
    let reconfig = |members: Vec<Bson>, version: i64| {
        doc! {"replSetReconfig": {"_id": "rs", "version": version, "members": members}}
    };
    let reply = set
        .client(primary)
        .command("admin", &reconfig(members.clone(), version + 1))
        .await?;
    assert!(ok(&reply), "{reply}");
    // Its version is now above what was sent: sending the same again is refused.
    let again = set
        .client(primary)
        .command("admin", &reconfig(members.clone(), version + 1))
        .await?;
    assert_eq!(again.get_i32("code").ok(), Some(103), "{again}");

    let config = set_config(&set.client(primary)).await?;
    assert!(config.get_i64("version")? > version, "{config}");
    let voters = config
        .get_array("members")?
        .iter()
        .filter_map(Bson::as_document)
        .filter(|m| m.get_i32("votes").ok() == Some(1))
        .count();
    assert_eq!(voters, 4, "the new member votes once caught up: {config}");
    // The new member learns the configuration as it applies the log.
    let deadline = Instant::now() + Duration::from_secs(10);
    let hello = loop {
        let hello = fresh.command("admin", &doc! {"hello": 1}).await?;
        let serving = hello.get_bool("secondary").unwrap_or(false);
        if hello.get_array("hosts")?.len() == 4 && serving || Instant::now() > deadline {
            break hello;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(hello.get_array("hosts")?.len(), 4, "{hello}");
    assert_eq!(hello.get_str("me")?, host, "{hello}");
    assert!(hello.get_bool("secondary")?, "{hello}");

    // w: 4 is met with the new member, which holds what the others hold.
    let reply = client
        .database("app")
        .run_command(doc! {"insert": "c", "documents": [{"_id": 50}],
        "writeConcern": {"w": 4, "wtimeout": 10_000}})
        .await?;
    assert_eq!(reply.get_i32("n")?, 1, "{reply}");
    assert!(!reply.contains_key("writeConcernError"), "{reply}");
    let status = set
        .client(primary)
        .command("admin", &doc! {"replSetGetStatus": 1})
        .await?;
    let listed: Vec<&Document> = status
        .get_array("members")?
        .iter()
        .filter_map(Bson::as_document)
        .collect();
    assert_eq!(listed.len(), 4, "{status}");
    assert!(
        listed
            .iter()
            .any(|m| m.get_str("name").ok() == Some(host.as_str())
                && m.get_i32("state").ok() == Some(2)),
        "the new member is a secondary: {status}"
    );

    // A secondary removed: three voters are left, the new member among them.
    let removed = (0..3).find(|&i| i != primary).unwrap_or(0);
    let kept: Vec<Bson> = members
        .iter()
        .filter(|m| {
            m.as_document()
                .and_then(|m| m.get_str("host").ok())
                .is_some_and(|h| h != set.hosts[removed])
        })
        .cloned()
        .collect();
    let version = set_config(&set.client(primary)).await?.get_i64("version")?;
    let reply = set
        .client(primary)
        .command("admin", &reconfig(kept, version + 1))
        .await?;
    assert!(ok(&reply), "{reply}");
    let hello = set
        .client(primary)
        .command("admin", &doc! {"hello": 1})
        .await?;
    let hosts: Vec<&str> = hello
        .get_array("hosts")?
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    assert_eq!(hosts.len(), 3, "{hello}");
    assert!(!hosts.contains(&set.hosts[removed].as_str()), "{hello}");
    assert!(hosts.contains(&host.as_str()), "{hello}");
    set.members[removed].kill();

    // Leadership handed to the new member (a step-down picks the most caught-up voter, the
    // last listed on a tie): the router, given only the first three members, finds it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let hello = fresh.command("admin", &doc! {"hello": 1}).await?;
        if hello.get_bool("isWritablePrimary").unwrap_or(false) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the new member was never elected"
        );
        let now = set.primary(&[removed], Duration::from_secs(10)).await?;
        let _ = set
            .client(now)
            .command(
                "admin",
                &doc! {"replSetStepDown": 10, "secondaryCatchUpPeriodSecs": 5},
            )
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let routed = tests::connect(router.addr)
        .await?
        .database("app")
        .collection::<Document>("c");
    for id in 51..60 {
        insert_until_acked(&routed, id).await?;
    }

    // The old primary killed: of the two voters left, one leads, and the driver writes on.
    set.members[primary].kill();
    for id in 60..70 {
        insert_until_acked(&coll, id).await?;
    }
    let written = routed.count_documents(doc! {}).await?;
    assert_eq!(written, 70, "every acknowledged write, once");
    drop(joined);
    Ok(())
}

/// The `{index, t}` of `optimes.<field>` in a member's `replSetGetStatus`, if it has one.
async fn optime(client: &wire::Client, field: &str) -> anyhow::Result<Option<(i64, i64)>> {
    let status = client
        .command("admin", &doc! {"replSetGetStatus": 1})
        .await?;
    let optimes = status.get_document("optimes")?;
    Ok(optimes
        .get_document(field)
        .ok()
        .map(|p| (p.get_i64("index").unwrap_or(0), p.get_i64("t").unwrap_or(0))))
}

/// A member whose data directory was wiped rejoins from the primary's snapshot, its log having
/// been purged past the start by then (a snapshot every 5,000 entries, 1,000 kept). The
/// snapshot is over 100 MB, twice the largest message, so it travels in pieces; the member
/// ends holding the primary's last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_rejoins_from_a_snapshot_larger_than_a_message() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let client = set.driver().await?;
    let coll = client.database("app").collection::<Document>("c");
    let pad = "x".repeat(1 << 20);
    for id in 0..60 {
        coll.insert_one(doc! {"_id": id, "pad": &pad}).await?;
    }
    // Enough entries for a snapshot and a purge: one write after another, each its own entry.
    for id in 1_000..6_200 {
        coll.insert_one(doc! {"_id": id}).await?;
    }
    let primary = set.primary(&[], Duration::from_secs(10)).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let purged = loop {
        if let Some((index, _)) = optime(&set.client(primary), "purgedOpTime").await? {
            break index;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the primary never purged its log"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The first member when it is a secondary: the one that starts the set when its log is
    // empty, and must not start another.
    let victim = if primary == 0 { 1 } else { 0 };
    set.members[victim].kill();
    std::fs::remove_dir_all(dir.path().join(format!("rs-m{victim}")))?;
    set.members[victim].restart().await?;
    coll.insert_one(doc! {"_id": "after"}).await?;
    let wanted = set
        .client(primary)
        .command("admin", &doc! {"hello": 1})
        .await?
        .get_document("lastWrite")?
        .get_document("opTime")?
        .clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let hello = set
            .client(victim)
            .command("admin", &doc! {"hello": 1})
            .await?;
        let op_time = hello
            .get_document("lastWrite")
            .and_then(|w| w.get_document("opTime"))
            .ok();
        // The snapshot's data lands before Raft reports it installed (a snapshot built for
        // the member may already hold the last write): both, then.
        let snapshot = optime(&set.client(victim), "snapshotOpTime").await?;
        if op_time == Some(&wanted) && snapshot.is_some() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the wiped member did not catch up from a snapshot: {op_time:?} (the primary at \
             {wanted}), snapshot {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let snapshot = optime(&set.client(victim), "snapshotOpTime").await?;
    assert!(
        snapshot.is_some_and(|(index, _)| index > purged),
        "the member's state came from a snapshot past the purged log ({purged}): {snapshot:?}"
    );
    let peak = |m: usize| peak_rss_mb(set.members[m].child.id());
    eprintln!(
        "peak RSS: primary {} MB, rejoined member {} MB",
        peak(primary)?,
        peak(victim)?
    );
    Ok(())
}

/// The most resident memory process `pid` has held (`VmHWM`), in MB.
fn peak_rss_mb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM for {pid}"))?;
    Ok(kb / 1024)
}

/// A member whose data directory was wiped, restarted while its peers are down, waits for
/// them before it takes any part in its set: when they come, the one it hears from has history,
/// so it rejoins and votes only once caught up. Otherwise it would vote with a log that forgot
/// what it had acknowledged, and could elect a member that lacks an acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_never_helps_elect_a_member_that_lacks_an_acknowledged_write()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let primary = set.primary(&[], Duration::from_secs(20)).await?;
    let (lagging, holder) = ((primary + 1) % 3, (primary + 2) % 3);
    let insert = |id: i32, w: Bson| {
        doc! {"insert": "c", "documents": [{"_id": id}], "writeConcern": {"w": w}}
    };
    let reply = set
        .client(primary)
        .command("app", &insert(0, Bson::Int32(3)))
        .await?;
    anyhow::ensure!(ok(&reply), "{reply}");
    // A write on the primary and `holder` only; then both go down, the primary losing its data.
    set.members[lagging].kill();
    let reply = set
        .client(primary)
        .command("app", &insert(1, Bson::String("majority".into())))
        .await?;
    anyhow::ensure!(ok(&reply), "{reply}");
    set.members[holder].kill();
    set.members[primary].kill();
    std::fs::remove_dir_all(dir.path().join(format!("rs-m{primary}")))?;

    // The wiped member alone first (no peer answers it), then the member lacking the write.
    set.members[primary].restart().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    set.members[lagging].restart().await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        for m in [lagging, primary] {
            let hello = set.client(m).command("admin", &doc! {"hello": 1}).await?;
            anyhow::ensure!(
                !hello.get_bool("isWritablePrimary").unwrap_or(false),
                "member {m} became primary while the write's only copy was down"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    set.members[holder].restart().await?;
    let now = set.primary(&[], Duration::from_secs(30)).await?;
    let found = set
        .client(now)
        .command("app", &doc! {"find": "c", "filter": {"_id": 1}})
        .await?;
    let batch = found.get_document("cursor")?.get_array("firstBatch")?;
    anyhow::ensure!(batch.len() == 1, "the acknowledged write was lost: {found}");
    Ok(())
}

/// The error code of a reply, if it is an error.
fn code(reply: &Document) -> Option<i32> {
    (reply.get("ok") != Some(&Bson::Double(1.0))).then(|| reply.get_i32("code").unwrap_or(0))
}

/// A change stream's events and position on one member: `getMore`s of `cursor` on `client`
/// until `n` events came (within 20 s); returns their ids, their tokens and the last
/// post-batch resume token.
async fn stream_events(
    client: &wire::Client,
    cursor: i64,
    n: usize,
) -> anyhow::Result<(Vec<Bson>, Vec<Document>, Document)> {
    let (mut ids, mut tokens) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let more = client
            .command(
                "app",
                &doc! {"getMore": cursor, "collection": "c", "maxTimeMS": 200},
            )
            .await?;
        anyhow::ensure!(code(&more).is_none(), "getMore: {more}");
        let c = more.get_document("cursor")?;
        for event in c.get_array("nextBatch")? {
            let event = event.as_document().expect("an event");
            ids.push(
                event
                    .get_document("documentKey")?
                    .get("_id")
                    .cloned()
                    .unwrap_or(Bson::Null),
            );
            tokens.push(event.get_document("_id")?.clone());
        }
        if ids.len() >= n {
            return Ok((ids, tokens, c.get_document("postBatchResumeToken")?.clone()));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {n} events: {ids:?}",
            ids.len()
        );
    }
}

/// Opens a change stream on `db.c` on `client` (as a secondary is asked, with a read
/// preference that accepts one), from `start`, with an empty first batch; returns its cursor
/// id.
async fn open_stream(client: &wire::Client, start: Document) -> anyhow::Result<i64> {
    let opened = client
        .command(
            "app",
            &doc! {
                "aggregate": "c",
                "pipeline": [{"$changeStream": start}],
                "cursor": {"batchSize": 0},
                "$readPreference": {"mode": "secondaryPreferred"},
            },
        )
        .await?;
    anyhow::ensure!(code(&opened).is_none(), "aggregate: {opened}");
    Ok(opened.get_document("cursor")?.get_i64("id")?)
}

#[tokio::test]
async fn a_secondary_serves_reads_and_streams_whose_tokens_resume_on_any_member()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let set = ReplicaSetProcs::start(dir.path(), "rs", 3, &[]).await?;
    let p = set.primary(&[], Duration::from_secs(20)).await?;
    let (s, other) = ((p + 1) % 3, (p + 2) % 3);
    let (primary, secondary) = (set.client(p), set.client(s));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !secondary
        .command("admin", &doc! {"hello": 1})
        .await?
        .get_bool("secondary")
        .unwrap_or(false)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "member {s} never said it is a secondary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stream = open_stream(&secondary, doc! {}).await?;

    let mut wrote = None;
    for id in 0..5 {
        let r = primary
            .command("app", &doc! {"insert": "c", "documents": [{"_id": id}]})
            .await?;
        assert!(ok(&r), "{r}");
        wrote = Some(r.get_timestamp("operationTime")?);
    }
    let secondary_read = |rc: Document| {
        doc! {
            "find": "c",
            "readConcern": rc,
            "$readPreference": {"mode": "secondary"},
        }
    };
    // A read after the last write's time waits until this member applied it: all five.
    let found = secondary
        .command("app", &secondary_read(doc! {"afterClusterTime": wrote}))
        .await?;
    assert_eq!(code(&found), None, "{found}");
    let batch = found.get_document("cursor")?.get_array("firstBatch")?;
    assert_eq!(
        batch.len(),
        5,
        "a causally consistent read on a secondary: {found}"
    );
    // What a secondary refuses, with MongoDB's codes.
    let refused = |cmd: Document, expected: i32| {
        let secondary = &secondary;
        async move {
            let r = secondary.command("app", &cmd).await?;
            anyhow::ensure!(code(&r) == Some(expected), "{cmd} answered {r}");
            Ok::<_, anyhow::Error>(())
        }
    };
    refused(doc! {"find": "c"}, 13435).await?;
    refused(
        doc! {"insert": "c", "documents": [{"_id": 9}], "$readPreference": {"mode": "secondary"}},
        10107,
    )
    .await?;
    refused(secondary_read(doc! {"level": "snapshot"}), 246).await?;
    refused(
        doc! {"aggregate": "c", "pipeline": [{"$out": "d"}], "cursor": {}, "$readPreference": {"mode": "secondary"}},
        10107,
    )
    .await?;

    // The secondary's stream has the five events, in order; its cursor is the secondary's.
    let (ids, tokens, _) = stream_events(&secondary, stream, 5).await?;
    assert_eq!(ids, (0..5).map(Bson::Int32).collect::<Vec<_>>());
    let status = secondary
        .command("admin", &doc! {"serverStatus": 1})
        .await?;
    let open = status
        .get_document("metrics")?
        .get_document("cursor")?
        .get_document("open")?
        .get_i64("total")?;
    assert!(
        open >= 1,
        "the stream's cursor is on the secondary: {status}"
    );

    // Its tokens resume on the primary and on the other secondary, at the next event.
    let on_primary = open_stream(&primary, doc! {"resumeAfter": tokens[1].clone()}).await?;

    let (ids, resumed, _) = stream_events(&primary, on_primary, 3).await?;
    assert_eq!(ids, (2..5).map(Bson::Int32).collect::<Vec<_>>());
    assert_eq!(
        resumed,
        tokens[2..].to_vec(),
        "the same tokens on every member"
    );
    let third = set.client(other);
    let on_other = open_stream(&third, doc! {"resumeAfter": tokens[3].clone()}).await?;
    let (ids, _, _) = stream_events(&third, on_other, 1).await?;
    assert_eq!(ids, vec![Bson::Int32(4)]);

    // With nothing written, the secondary's stream still moves on: the primary's clock
    // renewals carry its promises to the members that apply them.
    let (_, _, before) = stream_events(&secondary, stream, 0).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, _, after) = stream_events(&secondary, stream, 0).await?;
    let data = |t: &Document| t.get_str("_data").map(str::to_string);
    assert!(
        data(&after)? > data(&before)?,
        "an idle set's secondary stream advanced: {before} then {after}"
    );
    Ok(())
}

/// How many cursors the members of `set` other than its primary hold open.
async fn secondaries_cursors(set: &ReplicaSetProcs) -> anyhow::Result<i64> {
    let p = set.primary(&[], Duration::from_secs(10)).await?;
    let mut total = 0;
    for m in (0..set.hosts.len()).filter(|&m| m != p) {
        let status = set
            .client(m)
            .command("admin", &doc! {"serverStatus": 1})
            .await?;
        total += status
            .get_document("metrics")?
            .get_document("cursor")?
            .get_document("open")?
            .get_i64("total")?;
    }
    Ok(total)
}

#[tokio::test]
async fn a_router_reads_and_watches_on_the_secondaries_a_client_prefers() -> anyhow::Result<()> {
    let cluster = ReplicatedCluster::start(1, 3).await?;
    let set = &cluster.sets[0];
    let router = wire::Client::new(cluster.router.addr.to_string());
    let secondary = doc! {"mode": "secondary"};
    let r = router
        .command("app", &doc! {"insert": "c", "documents": [{"_id": -1}]})
        .await?;
    assert!(ok(&r), "{r}");
    let cursors_before = secondaries_cursors(set).await?;
    let opened = router
        .command(
            "app",
            &doc! {
                "aggregate": "c",
                "pipeline": [{"$changeStream": {}}],
                "cursor": {},
                "$readPreference": secondary.clone(),
            },
        )
        .await?;
    assert_eq!(code(&opened), None, "{opened}");
    let stream = opened.get_document("cursor")?.get_i64("id")?;
    assert_eq!(
        secondaries_cursors(set).await?,
        cursors_before + 1,
        "the stream reads the shard on a secondary"
    );
    let mut wrote = None;
    for id in 0..5 {
        let r = router
            .command("app", &doc! {"insert": "c", "documents": [{"_id": id}]})
            .await?;
        assert!(ok(&r), "{r}");
        wrote = Some(r.get_timestamp("operationTime")?);
    }
    let (ids, _, _) = stream_events(&router, stream, 5).await?;
    assert_eq!(ids, (0..5).map(Bson::Int32).collect::<Vec<_>>());

    // A find on a secondary, in batches of one: its getMores go to the member holding its
    // cursor.
    let found = router
        .command(
            "app",
            &doc! {
                "find": "c",
                "filter": {"_id": {"$gte": 0}},
                "sort": {"_id": 1},
                "batchSize": 1,
                "readConcern": {"afterClusterTime": wrote},
                "$readPreference": secondary.clone(),
            },
        )
        .await?;
    assert_eq!(code(&found), None, "{found}");
    let cursor = found.get_document("cursor")?;
    let mut ids: Vec<Bson> = cursor.get_array("firstBatch")?.clone();
    let id = cursor.get_i64("id")?;
    assert_eq!(
        secondaries_cursors(set).await?,
        cursors_before + 2,
        "the find's cursor is on a secondary"
    );
    let more = router
        .command("app", &doc! {"getMore": id, "collection": "c"})
        .await?;
    assert_eq!(code(&more), None, "{more}");
    ids.extend(
        more.get_document("cursor")?
            .get_array("nextBatch")?
            .iter()
            .cloned(),
    );
    let ids: Vec<i32> = ids
        .iter()
        .filter_map(|d| d.as_document()?.get_i32("_id").ok())
        .collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 3, 4],
        "every document, through the pinned getMores"
    );
    Ok(())
}
