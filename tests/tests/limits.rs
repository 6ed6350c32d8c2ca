//! Limits against hostile input, through the real driver: each test is named after the limit
//! it holds, and shows the request is refused with MongoDB's error (or bounded) and that the
//! cluster goes on serving afterwards.

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, Timestamp, doc};
use tests::EmbeddedCluster;
use tests::scenarios::{code_of, message_of};
use tests::streams::next_event as next;

/// The cluster's time as a `ping` reply gives it.
async fn operation_time(client: &mongodb::Client) -> anyhow::Result<Timestamp> {
    let reply = client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await?;
    Ok(reply.get_timestamp("operationTime")?)
}

/// A read may not name a time ahead of the cluster's (`atClusterTime`, `afterClusterTime`):
/// the shards would move their clocks there, and every later write would be stamped in the
/// future (and refused by drivers' own drift check). MongoDB answers 72.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_a_future_cluster_time_is_refused_and_moves_no_clock() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("future");
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await?;
    let year_2096 = Timestamp {
        time: 4_000_000_000,
        increment: 1,
    };
    for read_concern in [
        doc! {"level": "snapshot", "atClusterTime": year_2096},
        doc! {"level": "majority", "afterClusterTime": year_2096},
        doc! {"afterClusterTime": year_2096},
    ] {
        let err = db
            .run_command(doc! {"find": "c", "readConcern": read_concern.clone()})
            .await
            .expect_err("a time in 2096");
        assert_eq!(code_of(&err), Some(72), "{read_concern}: {err}");
    }
    // In a transaction too: the first statement's read concern fixes the snapshot.
    let mut session = client.start_session().await?;
    let err = db
        .run_command(doc! {
            "find": "c",
            "lsid": session.id().clone(),
            "txnNumber": 1_i64,
            "startTransaction": true,
            "autocommit": false,
            "readConcern": {"level": "snapshot", "atClusterTime": year_2096},
        })
        .await
        .expect_err("a transaction in 2096");
    assert_eq!(code_of(&err), Some(72), "{err}");
    session.abort_transaction().await.ok();

    let now = operation_time(&client).await?;
    assert!(now.time < 4_000_000_000, "the clock stayed: {now:?}");
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 2})
        .await?;
    // A time the cluster has given out is still a valid snapshot.
    let reply = db
        .run_command(doc! {"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": now}})
        .await?;
    let batch = reply.get_document("cursor")?.get_array("firstBatch")?.len();
    assert_eq!(batch, 1, "as of {now:?}, before the second insert");
    cluster.stop().await;
    Ok(())
}

/// Every reply carries the cluster's time, from the first command a fresh cluster answers:
/// connectors (Debezium) take the start of their change stream from a `ping`'s
/// `operationTime`, which must not be `Timestamp(0, 0)` (a time before all history, 286).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_reply_of_a_fresh_cluster_carries_its_time() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let start = operation_time(&client).await?;
    assert!(start.time > 0, "operationTime {start:?}");
    let c = client.database("fresh").collection::<Document>("c");
    let stream = c
        .watch()
        .start_at_operation_time(start)
        .max_await_time(Duration::from_millis(200))
        .await?;
    c.insert_one(doc! {"_id": "first"}).await?;
    let event = next(&mut stream.with_type::<Document>()).await?;
    assert_eq!(event.get_str("operationType")?, "insert");
    assert_eq!(event.get_document("documentKey")?, &doc! {"_id": "first"});
    cluster.stop().await;
    Ok(())
}

/// A transaction creates only what is not there (48, as MongoDB 7.0), and its statements take
/// no write concern of their own (72): the commit's is the transaction's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_refuses_an_existing_collection_and_a_statement_write_concern()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("txn_limits");
    db.create_collection("there").await?;
    // Outside a transaction, creating it again with the same options is fine (7.0).
    db.run_command(doc! {"create": "there"}).await?;

    let mut session = client.start_session().await?;
    session.start_transaction().await?;
    let err = db
        .run_command(doc! {"create": "there"})
        .session(&mut session)
        .await
        .expect_err("it exists");
    assert_eq!(code_of(&err), Some(48), "{err}");
    session.abort_transaction().await.ok();

    let mut session = client.start_session().await?;
    let lsid = session.id().clone();
    let err = db
        .run_command(doc! {
            "insert": "there",
            "documents": [{"_id": 1}],
            "lsid": lsid,
            "txnNumber": 1_i64,
            "startTransaction": true,
            "autocommit": false,
            "writeConcern": {"w": 1},
        })
        .await
        .expect_err("a statement's write concern");
    assert_eq!(code_of(&err), Some(72), "{err}");
    session.abort_transaction().await.ok();
    let n = db
        .collection::<Document>("there")
        .count_documents(doc! {})
        .await?;
    assert_eq!(n, 0, "the refused insert left nothing");
    cluster.stop().await;
    Ok(())
}

/// `{insert: "c", documents: [{_id: 4, d: <depth levels>}], $db: "depth"}` as BSON bytes,
/// built without recursion (the driver's encoder would need more stack than a test thread has).
fn deep_insert(depth: usize) -> Vec<u8> {
    fn document(elements: &[u8]) -> Vec<u8> {
        let len = i32::try_from(elements.len() + 5).unwrap_or(i32::MAX);
        let mut d = len.to_le_bytes().to_vec();
        d.extend_from_slice(elements);
        d.push(0);
        d
    }
    fn element(kind: u8, name: &str, value: &[u8]) -> Vec<u8> {
        let mut e = vec![kind];
        e.extend_from_slice(name.as_bytes());
        e.push(0);
        e.extend_from_slice(value);
        e
    }
    fn string(s: &str) -> Vec<u8> {
        let mut v = i32::try_from(s.len() + 1)
            .unwrap_or(0)
            .to_le_bytes()
            .to_vec();
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        v
    }
    let mut d = document(&element(0x10, "a", &1_i32.to_le_bytes()));
    for _ in 1..depth {
        d = document(&element(0x03, "a", &d));
    }
    let mut item = element(0x10, "_id", &4_i32.to_le_bytes());
    item.extend(element(0x03, "d", &d));
    let documents = document(&element(0x03, "0", &document(&item)));
    let mut body = element(0x02, "insert", &string("c"));
    body.extend(element(0x04, "documents", &documents));
    body.extend(element(0x02, "$db", &string("depth")));
    document(&body)
}

/// Sends one OP_MSG with `body` on a fresh connection and returns the reply's body.
async fn raw_command(addr: std::net::SocketAddr, body: &[u8]) -> anyhow::Result<Document> {
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    socket.write_all(&tests::op_msg_frame(1, body)?).await?;
    tests::read_op_msg(&mut socket).await
}

/// A document nested `depth` levels deep (`{a: {a: … 1}}`).
fn nested(depth: usize) -> Document {
    let mut d = doc! {"a": 1};
    for _ in 1..depth {
        d = doc! {"a": d};
    }
    d
}

/// Paths and nesting are bounded as MongoDB bounds them: a path of more than 200 components is
/// `FieldPath is too long` (15) wherever it appears (an update's 12,000-part `$set` once
/// overflowed the stack and took the whole process down), a stored document nests at most 180
/// levels (15), and a command at most 200 (15, refused before it is parsed).
#[test]
fn paths_and_nesting_are_bounded_at_mongodb_depths() -> anyhow::Result<()> {
    // The driver encodes and decodes documents 180 levels deep by recursion, which needs more
    // stack than a test thread's 2 MiB in a debug build: the test (and the embedded cluster,
    // as `tributary` itself) runs on threads with a bigger one.
    const STACK: usize = 64 << 20;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(STACK)
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || runtime.block_on(bounded_depths()))?
        .join()
        .map_err(|_| anyhow::anyhow!("the test thread panicked"))?
}

async fn bounded_depths() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("depth").collection::<Document>("c");
    c.insert_one(doc! {"_id": 1}).await?;
    let long = vec!["a"; 12_000].join(".");
    let err = c
        .update_one(doc! {"_id": 1}, doc! {"$set": {&long: 1}})
        .await
        .expect_err("a 12,000-part path");
    assert_eq!(code_of(&err), Some(15), "{err}");
    let err = c
        .find_one(doc! {&long: 1})
        .await
        .expect_err("a 12,000-part filter path");
    assert_eq!(code_of(&err), Some(15), "{err}");
    let err = c
        .find_one(doc! {})
        .sort(doc! {&long: 1})
        .await
        .expect_err("a 12,000-part sort path");
    assert_eq!(code_of(&err), Some(15), "{err}");
    let err = c
        .aggregate(vec![doc! {"$project": {"x": format!("${long}")}}])
        .await
        .expect_err("a 12,000-part expression path");
    assert_eq!(code_of(&err), Some(15), "{err}");

    c.insert_one(doc! {"_id": 2, "d": nested(178)}).await?;
    let err = c
        .insert_one(doc! {"_id": 3, "d": nested(180)})
        .await
        .expect_err("181 levels");
    assert_eq!(code_of(&err), Some(15), "{err}");
    let deep_path = vec!["a"; 178].join(".");
    let err = c
        .update_one(
            doc! {"_id": 2},
            doc! {"$set": {format!("d.{deep_path}"): {"b": {"c": 1}}}},
        )
        .await
        .expect_err("an update to 181 levels");
    assert_eq!(code_of(&err), Some(15), "{err}");
    let reply = raw_command(cluster.addr, &deep_insert(250)).await?;
    assert_eq!(
        reply.get_i32("code").ok(),
        Some(15),
        "a command 250 levels deep: {reply}"
    );
    assert_eq!(
        c.count_documents(doc! {}).await?,
        2,
        "nothing refused was kept"
    );
    // A filter as deep as a stored document may be still matches.
    let found = c.find_one(doc! {"_id": 2, "d": nested(178)}).await?;
    assert!(found.is_some());
    cluster.stop().await;
    Ok(())
}

/// `maxTimeMS` ends a command where its work is, on the router and on the shards: a pipeline
/// that would run for minutes stops with 50 soon after its limit, and a bad `maxTimeMS` is 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_time_ms_ends_a_long_command_with_max_time_ms_expired() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("slow");
    db.collection::<Document>("c")
        .insert_many((0..4).map(|i| doc! {"_id": i}))
        .await?;
    // Minutes of work per document: a million steps, each making a 100-element array.
    let slow = doc! {"$reduce": {
        "input": {"$range": [0, 1_000_000]},
        "initialValue": 0,
        "in": {"$add": ["$$value", {"$size": {"$range": [0, 100]}}]},
    }};
    for pipeline in [
        // On the shards (a per-document stage)...
        vec![doc! {"$project": {"x": slow.clone()}}],
        // ...and on the router ($documents runs there).
        vec![
            doc! {"$documents": [{"a": 1}]},
            doc! {"$project": {"x": slow.clone()}},
        ],
    ] {
        let on: mongodb::bson::Bson = if pipeline.len() == 2 {
            1.into()
        } else {
            "c".into()
        };
        expires_in_time(
            &db,
            doc! {"aggregate": on, "pipeline": pipeline, "cursor": {}, "maxTimeMS": 300},
        )
        .await;
    }
    // A write: a multi-update whose new value takes minutes per document. It stops, and the
    // shards' writers are free for the next write at once.
    expires_in_time(
        &db,
        doc! {
            "update": "c",
            "updates": [{"q": {}, "u": [{"$set": {"x": slow.clone()}}], "multi": true}],
            "maxTimeMS": 300,
        },
    )
    .await;
    let next = std::time::Instant::now();
    db.collection::<Document>("c")
        .insert_many((4..8).map(|i| doc! {"_id": i}))
        .await?;
    assert!(
        next.elapsed() < Duration::from_secs(5),
        "the next write waited {:?}",
        next.elapsed()
    );
    for bad in [
        mongodb::bson::Bson::Int32(-1),
        mongodb::bson::Bson::Double(1.5),
        mongodb::bson::Bson::String("1".into()),
    ] {
        let err = db
            .run_command(doc! {"find": "c", "maxTimeMS": bad.clone()})
            .await
            .expect_err("a bad maxTimeMS");
        assert_eq!(code_of(&err), Some(2), "{bad}: {err}");
    }
    // The cluster goes on: nothing of the stopped work is left holding it.
    let n = db
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await?;
    assert_eq!(n, 8);
    cluster.stop().await;
    Ok(())
}

/// Runs `command` (minutes of work with a `maxTimeMS` of 300): it fails with 50 within 10 s.
async fn expires_in_time(db: &mongodb::Database, command: Document) {
    let started = std::time::Instant::now();
    let err = db
        .run_command(command)
        .await
        .expect_err("minutes of work in 300 ms");
    assert_eq!(code_of(&err), Some(50), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped after {:?}",
        started.elapsed()
    );
}

/// `killSessions` and `endSessions` end what a session holds on every shard: its running
/// transaction is aborted (its writes gone, its keys free for others), and its commit then
/// fails with NoSuchTransaction (251).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_or_ending_a_session_aborts_its_transaction_everywhere() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("kill").collection::<Document>("c");
    c.insert_many([doc! {"_id": 1, "n": 0}, doc! {"_id": 2, "n": 0}])
        .await?;
    for command in ["killSessions", "endSessions"] {
        let mut session = client.start_session().await?;
        session.start_transaction().await?;
        c.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .session(&mut session)
            .await?;
        c.insert_one(doc! {"_id": command})
            .session(&mut session)
            .await?;
        let lsid = session.id().clone();
        client
            .database("admin")
            .run_command(doc! {command: [lsid]})
            .await?;
        // The keys it held are free: a write outside it does not conflict.
        c.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 10}})
            .await?;
        let err = session
            .commit_transaction()
            .await
            .expect_err("the transaction was aborted");
        assert_eq!(code_of(&err), Some(251), "{command}: {err}");
        assert_eq!(
            c.count_documents(doc! {"_id": command}).await?,
            0,
            "{command}: its insert is gone"
        );
    }
    let one = c.find_one(doc! {"_id": 1}).await?.expect("the document");
    assert_eq!(
        one.get_i32("n")?,
        20,
        "only the writes outside the transactions"
    );
    cluster.stop().await;
    Ok(())
}

/// Index specifications are bounded and checked as MongoDB checks them (found by the fuzzer:
/// a 10,000-field key pattern held the writer for seconds, and unknown options were stored):
/// at most 32 key fields (67), no unknown option (197), a numeric TTL; and extreme numbers
/// in a count's or an explain's limit are answered, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_specifications_and_limits_are_bounded() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("specs");
    db.collection::<Document>("c")
        .insert_many((0..5).map(|i| doc! {"_id": i}))
        .await?;
    let mut wide = Document::new();
    for i in 0..33 {
        wide.insert(format!("f{i}"), 1);
    }
    for (spec, want) in [
        (doc! {"key": wide.clone(), "name": "wide"}, 67),
        (doc! {"key": {"a": 1}, "name": "a", "bogus": 1}, 197),
        (
            doc! {"key": {"a": 1}, "name": "a", "expireAfterSeconds": "abc"},
            67,
        ),
        (doc! {"key": {"a": 1}, "name": "a", "unique": "yes"}, 14),
        (doc! {"key": {"x".repeat(3_000): 1}, "name": "long"}, 67),
        (doc! {"key": {"a": 0}, "name": "zero"}, 67),
        (doc! {"key": {}, "name": "empty"}, 67),
    ] {
        let err = db
            .run_command(doc! {"createIndexes": "c", "indexes": [spec.clone()]})
            .await
            .expect_err("refused");
        assert_eq!(code_of(&err), Some(want), "{spec}: {err}");
    }
    let indexes = db
        .run_command(doc! {"listIndexes": "c"})
        .await?
        .get_document("cursor")?
        .get_array("firstBatch")?
        .len();
    assert_eq!(indexes, 1, "only _id: nothing refused was stored");
    let n = db
        .run_command(doc! {"count": "c", "limit": i64::MIN})
        .await?
        .get_i32("n")?;
    assert_eq!(n, 5);
    for limit in [
        mongodb::bson::Bson::Int64(i64::MIN),
        mongodb::bson::Bson::Double(f64::NEG_INFINITY),
    ] {
        db.run_command(doc! {"explain": {"count": "c", "limit": limit.clone()}})
            .await?;
        db.run_command(doc! {"explain": {"find": "c", "limit": limit.clone()}})
            .await?;
    }
    cluster.stop().await;
    Ok(())
}

/// An error message shows at most a kilobyte of a client's value, and a string of it as
/// MongoDB's do (its first 150 bytes past 160): a huge value costs the server a kilobyte to
/// show, not its size (the fuzzer once saw a 481,006-element array rendered into an errmsg).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_messages_show_a_bounded_part_of_a_large_value() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("messages");
    let huge: Vec<i32> = vec![7; 400_000];
    let err = db
        .run_command(
            doc! {"create": "c", "collation": {"locale": "no-such-locale!", "strength": huge}},
        )
        .await
        .expect_err("an invalid locale");
    let message = message_of(&err);
    assert_eq!(code_of(&err), Some(2), "{message}");
    assert!(
        message.starts_with("Field 'locale' is invalid in: ") && message.len() < 1_200,
        "{} bytes: {}",
        message.len(),
        &message[..message.floor_char_boundary(200)]
    );

    let c = db.collection::<Document>("d");
    c.create_index(tests::unique_index(doc! {"s": 1})).await?;
    let long = "s".repeat(500);
    c.insert_one(doc! {"_id": 1, "s": &long}).await?;
    let err = c
        .insert_one(doc! {"_id": 2, "s": &long})
        .await
        .expect_err("a duplicate key");
    let message = message_of(&err);
    assert_eq!(code_of(&err), Some(11000), "{message}");
    assert!(
        message.ends_with(&format!("dup key: {{ s: \"{}...\" }}", "s".repeat(150))),
        "{message}"
    );
    cluster.stop().await;
    Ok(())
}

/// A command document is at most 16 MiB (and 16 KiB more for the server's own fields), as
/// MongoDB's: a 26 MB `ping` (which the fuzzer saw parsed and answered, at over 1 GB of
/// memory) is refused with 10334 before it is parsed, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_over_sixteen_megabytes_is_refused_before_it_is_parsed() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let big = doc! {"ping": 1, "pad": "x".repeat(26 * 1024 * 1024), "$db": "admin"};
    let reply = raw_command(cluster.addr, &big.to_vec()?).await?;
    assert_eq!(
        reply.get_i32("code").ok(),
        Some(10334),
        "{}",
        reply.get_str("errmsg").unwrap_or("")
    );
    let small = doc! {"ping": 1, "pad": "x".repeat(1024 * 1024), "$db": "admin"};
    let reply = raw_command(cluster.addr, &small.to_vec()?).await?;
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply}");
    cluster.stop().await;
    Ok(())
}

/// Every router→shard call has a deadline: with its shards frozen (alive to TCP, answering
/// nothing), a command fails with `NetworkTimeout` once a ping goes unanswered too, instead of
/// hanging; thawed, the cluster answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_shard_fails_commands_with_network_timeout_instead_of_hanging()
-> anyhow::Result<()> {
    let cluster = tests::ProcessCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("frozen").collection::<Document>("c");
    c.insert_one(doc! {"_id": 1}).await?;
    for s in &cluster.shards {
        s.freeze(true)?;
    }
    let started = std::time::Instant::now();
    let found = tokio::time::timeout(Duration::from_secs(120), c.find_one(doc! {})).await;
    for s in &cluster.shards {
        s.freeze(false)?;
    }
    let err = found
        .expect("the command ends by itself")
        .expect_err("no shard answers");
    let code = match *err.kind {
        mongodb::error::ErrorKind::Command(ref e) => e.code,
        _ => 0,
    };
    assert_eq!(code, 89, "NetworkTimeout: {err}");
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "the shard had time to answer"
    );
    assert_eq!(
        c.count_documents(doc! {}).await?,
        1,
        "thawed, it answers again"
    );
    drop(cluster);
    Ok(())
}

/// The commands MongoDB parses strictly refuse a field they do not know (40415) and change
/// nothing; their real options and the generic arguments pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_of_strict_commands_are_refused_with_40415() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("fields");
    let c = db.collection::<Document>("c");
    c.insert_one(doc! {"_id": 1}).await?;
    for (cmd, field) in [
        (doc! {"find": "c", "filer": {"_id": 2}}, "find.filer"),
        (
            doc! {"aggregate": "c", "pipeline": [], "cursor": {}, "alowDiskUse": true},
            "aggregate.alowDiskUse",
        ),
        (doc! {"count": "c", "qeury": {}}, "count.qeury"),
        (
            doc! {"distinct": "c", "key": "a", "filter": {}},
            "distinct.filter",
        ),
        (
            doc! {"insert": "c", "documents": [{"_id": 2}], "ordred": false},
            "insert.ordred",
        ),
        (
            doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"x": 1}}}], "upsert": true},
            "update.upsert",
        ),
        (
            doc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "multi": true},
            "delete.multi",
        ),
        (
            doc! {"findAndModify": "c", "query": {}, "remove": true, "returnNew": true},
            "findAndModify.returnNew",
        ),
        (doc! {"create": "d", "caped": true}, "create.caped"),
        (
            doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}],
            "unique": true},
            "createIndexes.unique",
        ),
        (doc! {"drop": "c", "force": true}, "drop.force"),
        (
            doc! {"dropIndexes": "c", "indexes": "*"},
            "dropIndexes.indexes",
        ),
        (
            doc! {"listCollections": 1, "query": {}},
            "listCollections.query",
        ),
        (
            doc! {"listIndexes": "c", "batchSize": 1},
            "listIndexes.batchSize",
        ),
        (
            doc! {"collMod": "c", "validator": {}, "validate": true},
            "collMod.validate",
        ),
        (
            doc! {"killCursors": "c", "cursors": [], "ids": []},
            "killCursors.ids",
        ),
    ] {
        let err = db
            .run_command(cmd.clone())
            .await
            .expect_err("unknown field");
        assert_eq!(code_of(&err), Some(40415), "{cmd}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("BSON field '{field}' is an unknown field.")),
            "{err}"
        );
    }
    assert_eq!(
        c.find(doc! {}).await?.try_collect::<Vec<_>>().await?,
        vec![doc! {"_id": 1}],
        "nothing was written or deleted"
    );
    assert_eq!(
        db.list_collection_names().await?,
        vec!["c".to_string()],
        "nothing was created or dropped"
    );
    assert_eq!(c.list_index_names().await?, vec!["_id_".to_string()]);
    let ok = db
        .run_command(doc! {
            "find": "c", "filter": {}, "sort": {"_id": 1}, "batchSize": 1, "comment": "ok",
            "maxTimeMS": 10_000, "readConcern": {"level": "local"}, "allowDiskUse": true,
        })
        .await?;
    assert_eq!(ok.get_f64("ok").ok(), Some(1.0), "{ok}");
    Ok(())
}

/// `serverStatus` `metrics.query`: how many runs sorts and groups have spilled.
async fn spills(client: &mongodb::Client) -> anyhow::Result<(i64, i64)> {
    let status = client
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await?;
    let query = status.get_document("metrics")?.get_document("query")?;
    Ok((
        query.get_document("sort")?.get_i64("spillToDisk")?,
        query.get_document("group")?.get_i64("spills")?,
    ))
}

/// The blocking stages' limits these tests set: 1 MiB, as MongoDB's tests do through the same
/// parameters.
const BLOCKING_LIMIT: i64 = 1024 * 1024;
/// Documents of [`insert_padded`]: eight times [`BLOCKING_LIMIT`] in all.
const PADDED: i32 = 4_000;

/// `pipeline` over `c`: refused with 292 without `allowDiskUse` (`why` says what passes the
/// limit), and its results with it.
async fn needs_disk(
    c: &mongodb::Collection<Document>,
    pipeline: Vec<Document>,
    why: &str,
) -> anyhow::Result<Vec<Document>> {
    let err = c.aggregate(pipeline.clone()).await.expect_err(why);
    assert_eq!(code_of(&err), Some(292), "{why}: {err}");
    Ok(c.aggregate(pipeline)
        .allow_disk_use(true)
        .await?
        .try_collect()
        .await?)
}

/// Sets both blocking-stage limits to [`BLOCKING_LIMIT`] and checks they read back.
async fn set_blocking_limits(client: &mongodb::Client) -> anyhow::Result<()> {
    let admin = client.database("admin");
    for name in spill_parameters() {
        admin
            .run_command(doc! {"setParameter": 1, name: BLOCKING_LIMIT})
            .await?;
        let got = admin.run_command(doc! {"getParameter": 1, name: 1}).await?;
        assert_eq!(got.get_i64(name)?, BLOCKING_LIMIT);
    }
    Ok(())
}

fn spill_parameters() -> [&'static str; 2] {
    [
        "internalQueryMaxBlockingSortMemoryUsageBytes",
        "internalDocumentSourceGroupMaxMemoryBytes",
    ]
}

/// [`PADDED`] documents `{_id: i, k: a permutation of i, g: i % 10, pad: 2 KB}` into `c`.
async fn insert_padded(c: &mongodb::Collection<Document>) -> anyhow::Result<()> {
    let pad = "p".repeat(2_000);
    for chunk in (0..PADDED).collect::<Vec<_>>().chunks(1_000) {
        c.insert_many(
            chunk
                .iter()
                .map(|i| doc! {"_id": i, "k": (i * 7_919) % PADDED, "g": i % 10, "pad": &pad}),
        )
        .await?;
    }
    Ok(())
}

/// A `$sort`, `$group` or `$bucket` past its memory limit stops with 292 without
/// `allowDiskUse` and spills sorted runs to disk with it, giving every document in order: shown with the limits
/// set to 1 MiB (as MongoDB's tests do through the same parameters) and eight times that in
/// data, on an unsharded collection (the shard sorts and groups) and a sharded one (each shard
/// sorts its part, the router merges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_stages_past_their_memory_limit_spill_to_disk_with_allow_disk_use()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    set_blocking_limits(&client).await?;
    let bad = admin
        .run_command(doc! {"setParameter": 1, "internalQueryMaxBlockingSortMemoryUsageBytes": -1})
        .await
        .expect_err("a negative limit");
    assert_eq!(code_of(&bad), Some(2), "{bad}");
    tests::shard_collection(&client, "spill.sharded", doc! {"_id": "hashed"}).await?;
    let db = client.database("spill");
    const N: i32 = PADDED;
    for coll in ["plain", "sharded"] {
        let c = db.collection::<Document>(coll);
        insert_padded(&c).await?;
        let sort = vec![doc! {"$sort": {"k": -1}}, doc! {"$project": {"pad": 0}}];
        let group = vec![
            doc! {"$group": {"_id": "$g", "n": {"$sum": 1}, "pads": {"$push": "$pad"}}},
            doc! {"$project": {"n": 1, "pads": {"$size": "$pads"}}},
            doc! {"$sort": {"_id": 1}},
        ];
        let bucket = vec![
            doc! {"$bucket": {
                "groupBy": "$g", "boundaries": [0, 2, 4, 6, 8, 10],
                "output": {"n": {"$sum": 1}, "pads": {"$push": "$pad"}},
            }},
            doc! {"$project": {"n": 1, "pads": {"$size": "$pads"}}},
        ];
        for pipeline in [&sort, &group, &bucket] {
            let err = c
                .aggregate(pipeline.clone())
                .await
                .expect_err("eight times the limit without allowDiskUse");
            assert_eq!(code_of(&err), Some(292), "{coll} {pipeline:?}: {err}");
        }
        let (sorts_before, groups_before) = spills(&client).await?;
        let sorted: Vec<Document> = c
            .aggregate(sort.clone())
            .allow_disk_use(true)
            .await?
            .try_collect()
            .await?;
        let keys: Vec<i32> = sorted.iter().map(|d| d.get_i32("k").unwrap()).collect();
        assert_eq!(keys, (0..N).rev().collect::<Vec<_>>(), "{coll}");
        let groups: Vec<Document> = c
            .aggregate(group.clone())
            .allow_disk_use(true)
            .await?
            .try_collect()
            .await?;
        assert_eq!(
            groups,
            (0..10)
                .map(|g| doc! {"_id": g, "n": N / 10, "pads": N / 10})
                .collect::<Vec<_>>(),
            "{coll}"
        );
        let (sorts, groups) = spills(&client).await?;
        assert!(sorts > sorts_before, "{coll}: the sort spilled");
        assert!(groups > groups_before, "{coll}: the group spilled");
        let buckets: Vec<Document> = c
            .aggregate(bucket.clone())
            .allow_disk_use(true)
            .await?
            .try_collect()
            .await?;
        assert_eq!(
            buckets,
            (0..5)
                .map(|b| doc! {"_id": b * 2, "n": N / 5, "pads": N / 5})
                .collect::<Vec<_>>(),
            "{coll}"
        );
        let (_, after_buckets) = spills(&client).await?;
        assert!(after_buckets > groups, "{coll}: the $bucket spilled");
    }
    cluster.stop().await;
    Ok(())
}

/// The router runs its part of a sharded pipeline over the shards' cursors as the client
/// reads, holding neither the input nor the output whole: with the limits at 1 MiB, a
/// pipeline over eight times that streams through (a gather would have stopped at the limit),
/// a `$sort` + `$limit` keeps its top, and a `$group` past the limit (the shards' partial
/// groups and the router's merge of them) stops with 292 or spills. A pipeline that must
/// gather (a `$lookup` reads on the router) stops at the limit with 292 unless `allowDiskUse`. On a shard, a pipeline with no blocking stage pages its scan as
/// the client reads (a dropped collection ends it with 175, as a find's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_run_pipelines_stream_and_what_the_router_gathers_stops_at_the_limit()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    set_blocking_limits(&client).await?;
    tests::shard_collection(&client, "stream.c", doc! {"_id": "hashed"}).await?;
    let db = client.database("stream");
    let c = db.collection::<Document>("c");
    const N: i32 = PADDED;
    insert_padded(&c).await?;
    db.collection::<Document>("small")
        .insert_one(doc! {"_id": 0, "name": "zero"})
        .await?;

    // Streaming stages over the whole collection, eight times the limit.
    let mut cursor = c
        .aggregate(vec![
            doc! {"$addFields": {"twice": {"$multiply": ["$k", 2]}}},
            doc! {"$sort": {"k": 1}},
            doc! {"$project": {"pad": 0}},
        ])
        .allow_disk_use(true)
        .batch_size(100)
        .await?;
    let mut keys = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        assert_eq!(d.get_i32("twice")?, d.get_i32("k")? * 2);
        keys.push(d.get_i32("k")?);
    }
    assert_eq!(
        keys,
        (0..N).collect::<Vec<_>>(),
        "merged in order, each once"
    );
    let streamed: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"g": {"$lt": 5}}},
            doc! {"$project": {"pad": {"$substrBytes": ["$pad", 0, 1]}, "g": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(streamed.len(), N as usize / 2, "no gather: no 292 at 1 MiB");

    // A $sort + $limit keeps its top only; a $group is a blocking stage.
    let top: Vec<Document> = c
        .aggregate(vec![
            doc! {"$project": {"pad": 0}},
            doc! {"$sort": {"k": -1}},
            doc! {"$limit": 3},
        ])
        .await?
        .try_collect()
        .await?;
    let top: Vec<i32> = top.iter().map(|d| d.get_i32("k").unwrap()).collect();
    assert_eq!(top, vec![N - 1, N - 2, N - 3]);
    let by_id = vec![
        doc! {"$group": {"_id": "$_id", "pad": {"$first": "$pad"}}},
        doc! {"$count": "n"},
    ];
    let counted = needs_disk(&c, by_id, "4,000 groups of 2 KB each past 1 MiB").await?;
    assert_eq!(counted, vec![doc! {"n": N}]);

    // A $lookup runs on the router over what the shards send it, gathered.
    let joined = vec![
        doc! {"$lookup": {"from": "small", "localField": "g", "foreignField": "_id", "as": "j"}},
        doc! {"$match": {"j": {"$ne": []}}},
        doc! {"$count": "n"},
    ];
    let counted = needs_disk(&c, joined, "the gathered input is eight times the limit").await?;
    assert_eq!(counted, vec![doc! {"n": N / 10}]);

    // On a shard, a pipeline with no blocking stage pages its scan as the client reads.
    let plain = db.collection::<Document>("plain");
    plain
        .insert_many((0..3_000).map(|i| doc! {"_id": i, "arr": [i % 3, i % 5]}))
        .await?;
    let mut got: Vec<(i32, i32)> = plain
        .aggregate(vec![
            doc! {"$match": {"_id": {"$gte": 100}}},
            doc! {"$unwind": "$arr"},
            doc! {"$match": {"arr": {"$ne": 0}}},
        ])
        .batch_size(7)
        .await?
        .map_ok(|d| (d.get_i32("_id").unwrap(), d.get_i32("arr").unwrap()))
        .try_collect()
        .await?;
    got.sort();
    let mut expected: Vec<(i32, i32)> = (100..3_000)
        .flat_map(|i| [(i, i % 3), (i, i % 5)])
        .filter(|(_, a)| *a != 0)
        .collect();
    expected.sort();
    assert_eq!(got, expected);
    let limited: Vec<Document> = plain
        .aggregate(vec![doc! {"$skip": 2_990}, doc! {"$limit": 50}])
        .batch_size(3)
        .await?
        .try_collect()
        .await?;
    assert_eq!(limited.len(), 10);
    let mut open = plain
        .aggregate(vec![doc! {"$project": {"arr": 0}}])
        .batch_size(10)
        .await?;
    for _ in 0..10 {
        assert!(open.try_next().await?.is_some());
    }
    plain.drop().await?;
    let err = loop {
        match open.try_next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a dropped collection's cursor ran to its end"),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(175), "QueryPlanKilled: {err}");
    cluster.stop().await;
    Ok(())
}

/// What the router holds for a pipeline that reads other collections is bounded too: with
/// the limits at 1 MiB, a `$lookup` over eight times that spools its input to disk under
/// `allowDiskUse` and joins it a chunk at a time; a `$lookup` whose foreign collection does not
/// fit (and cannot be narrowed to what joins) is 292 without `allowDiskUse` and queries the
/// shards per document with it; a `$graphLookup` whose search reaches more than the limit is
/// 40099 either way (MongoDB 7.0's does not spill); a `$facet` whose sub-pipelines join, a
/// `$unionWith` whose sub-pipeline joins and a `$setWindowFields` partition past the limit
/// are 292 without `allowDiskUse` and go to disk with it; `$out` and `$merge` write results as
/// the router reads them, so copying a collection eight times the limit needs no disk use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_joins_past_the_memory_limit_spool_to_disk_or_query_per_document()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    set_blocking_limits(&client).await?;
    tests::shard_collection(&client, "joins.c", doc! {"_id": "hashed"}).await?;
    let db = client.database("joins");
    let c = db.collection::<Document>("c");
    insert_padded(&c).await?;
    let groups = db.collection::<Document>("groups");
    groups
        .insert_many((0..10).map(|g| doc! {"_id": g, "name": format!("g{g}")}))
        .await?;
    // Two MiB: a chain 0 -> 1 -> ... -> 999, each link 2 KB.
    let wide = db.collection::<Document>("wide");
    let pad = "w".repeat(2_000);
    wide.insert_many((0..1_000).map(|i| doc! {"_id": i, "next": i + 1, "pad": &pad}))
        .await?;

    // Every padded document joined, read back through a cursor in small batches.
    let (sorts_before, _) = spills(&client).await?;
    let mut cursor = c
        .aggregate(vec![doc! {
            "$lookup": {"from": "groups", "localField": "g", "foreignField": "_id", "as": "j"}
        }])
        .allow_disk_use(true)
        .batch_size(50)
        .await?;
    let mut seen = 0;
    while let Some(d) = cursor.try_next().await? {
        let j = d.get_array("j")?;
        let group = doc! {"_id": d.get_i32("g")?, "name": format!("g{}", d.get_i32("g")?)};
        assert_eq!(j, &vec![Bson::Document(group)], "{d}");
        assert_eq!(d.get_str("pad")?.len(), 2_000);
        seen += 1;
    }
    assert_eq!(seen, PADDED);
    let (sorts_after, _) = spills(&client).await?;
    assert!(sorts_after > sorts_before, "the joined input went to disk");

    // A correlated $lookup that cannot say what joins reads its collection whole: past the
    // limit, 292, or a query per document with disk use.
    let per_group = vec![doc! {"$lookup": {
        "from": "wide",
        "let": {"g": "$_id"},
        "pipeline": [
            {"$match": {"$expr": {"$eq": [{"$mod": ["$_id", 10]}, "$$g"]}}},
            {"$count": "n"},
        ],
        "as": "j",
    }}];
    let joined = needs_disk(
        &groups,
        per_group,
        "the foreign collection is twice the limit",
    )
    .await?;
    assert_eq!(joined.len(), 10);
    for d in &joined {
        assert_eq!(
            d.get_array("j")?,
            &vec![Bson::Document(doc! {"n": 100})],
            "{d}"
        );
    }

    // A $graphLookup whose search reaches twice the limit.
    let graph = vec![
        doc! {"$match": {"_id": 0}},
        doc! {"$graphLookup": {
            "from": "wide", "startWith": "$_id", "connectFromField": "next",
            "connectToField": "_id", "as": "reach",
        }},
    ];
    for disk in [false, true] {
        let err = groups
            .aggregate(graph.clone())
            .allow_disk_use(disk)
            .await
            .expect_err("the search reaches twice the limit");
        assert_eq!(code_of(&err), Some(40099), "allowDiskUse {disk}: {err}");
    }
    let shallow: Vec<Document> = groups
        .aggregate(vec![
            doc! {"$match": {"_id": 0}},
            doc! {"$graphLookup": {
                "from": "wide", "startWith": "$_id", "connectFromField": "next",
                "connectToField": "_id", "as": "reach", "maxDepth": 9,
            }},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(shallow[0].get_array("reach")?.len(), 10);

    // A $facet whose sub-pipelines join: its input (eight times the limit, gathered from the
    // shards) waits on disk while each sub-pipeline reads all of it in turn, joining what it
    // joins, from a small collection (`groups`) or one twice the limit (`wide`, which it
    // does not read whole).
    let facet_joining = |from: &str| {
        vec![doc! {"$facet": {
            "joined": [
                {"$lookup": {"from": from, "localField": "g", "foreignField": "_id", "as": "j"}},
                {"$match": {"j._id": 3}},
                {"$count": "n"},
            ],
            "pads": [{"$group": {"_id": null, "bytes": {"$sum": {"$strLenBytes": "$pad"}}}}],
        }}]
    };
    let expected = vec![doc! {
        "joined": [{"n": PADDED / 10}],
        "pads": [{"_id": null, "bytes": PADDED * 2_000}],
    }];
    for joined in ["groups", "wide"] {
        let facets = needs_disk(
            &c,
            facet_joining(joined),
            "the facet's input is eight times the limit",
        )
        .await?;
        assert_eq!(facets, expected, "joining {joined}");
    }

    // A $unionWith whose sub-pipeline joins runs it as an aggregate of its own: its $lookup
    // gathers eight times the limit, and spools it under allowDiskUse.
    let union = vec![doc! {"$unionWith": {"coll": "c", "pipeline": [
        {"$lookup": {"from": "groups", "localField": "g", "foreignField": "_id", "as": "j"}},
        {"$match": {"j.name": "g7"}},
        {"$project": {"pad": 0, "j": 0}},
    ]}}];
    let unioned = needs_disk(
        &groups,
        union,
        "the union's join gathers eight times the limit",
    )
    .await?;
    assert_eq!(unioned.len(), 10 + PADDED as usize / 10);
    assert!(unioned[10..].iter().all(|d| d.get_i32("g").ok() == Some(7)));

    // A $setWindowFields partition of eight times the limit waits on disk while its functions
    // compute.
    let (sorts_before, _) = spills(&client).await?;
    let windowed = needs_disk(
        &c,
        vec![
            doc! {"$setWindowFields": {"sortBy": {"k": 1}, "output": {
                "n": {"$documentNumber": {}},
                "run": {"$sum": "$g", "window": {"documents": ["unbounded", "current"]}},
            }}},
            doc! {"$project": {"pad": 0}},
        ],
        "one partition of eight times the limit",
    )
    .await?;
    let mut run = 0;
    for (i, d) in windowed.iter().enumerate() {
        run += d.get_i32("g")?;
        assert_eq!(d.get_i32("k")?, i as i32, "{d}");
        assert_eq!(d.get_i32("n")?, i as i32 + 1, "{d}");
        assert_eq!(d.get_i32("run")?, run, "{d}");
    }
    assert_eq!(windowed.len(), PADDED as usize);
    let (sorts_after, _) = spills(&client).await?;
    assert!(sorts_after > sorts_before, "the partition went to disk");

    // $out and $merge of the whole padded collection, without disk use.
    c.aggregate(vec![doc! {"$out": "copy"}]).await?;
    let copy = db.collection::<Document>("copy");
    assert_eq!(copy.count_documents(doc! {}).await?, PADDED as u64);
    c.aggregate(vec![
        doc! {"$project": {"pad": 0}},
        doc! {"$merge": {"into": "copy", "whenMatched": "merge"}},
    ])
    .await?;
    assert_eq!(
        copy.count_documents(doc! {"pad": {"$exists": true}})
            .await?,
        PADDED as u64
    );
    cluster.stop().await;
    Ok(())
}

/// A shard holds a `find`'s result within the limits too: with the limits at 1 MiB, an
/// unindexed sort over eight times that is 292 without `allowDiskUse` and spills with it (a
/// sort + limit keeps only its top); an unsorted find in a transaction or at a snapshot
/// (which reads its whole result from one snapshot) spools it instead of failing; `count`
/// counts as it scans; `distinct` holds its values, up to 16 MB (17217 past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_counts_and_distincts_hold_bounded_memory() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    set_blocking_limits(&client).await?;
    let db = client.database("reads");
    let c = db.collection::<Document>("c");
    insert_padded(&c).await?;

    let sorted = doc! {"find": "c", "sort": {"k": 1}, "projection": {"pad": 0}, "batchSize": 10};
    let err = db
        .run_command(sorted.clone())
        .await
        .expect_err("an unindexed sort of eight times the limit");
    assert_eq!(code_of(&err), Some(292), "{err}");
    let (sorts_before, _) = spills(&client).await?;
    let keys: Vec<i32> = c
        .find(doc! {})
        .sort(doc! {"k": 1})
        .projection(doc! {"pad": 0})
        .allow_disk_use(true)
        .batch_size(500)
        .await?
        .map_ok(|d| d.get_i32("k").unwrap())
        .try_collect()
        .await?;
    assert_eq!(keys, (0..PADDED).collect::<Vec<_>>());
    let (sorts_after, _) = spills(&client).await?;
    assert!(sorts_after > sorts_before, "the sort spilled");
    let top: Vec<i32> = c
        .find(doc! {})
        .sort(doc! {"k": -1})
        .skip(2)
        .limit(3)
        .await?
        .map_ok(|d| d.get_i32("k").unwrap())
        .try_collect()
        .await?;
    assert_eq!(
        top,
        vec![PADDED - 3, PADDED - 4, PADDED - 5],
        "a top-k fits"
    );

    let mut session = client.start_session().await?;
    session.start_transaction().await?;
    let mut in_txn = c
        .find(doc! {})
        .batch_size(1_000)
        .session(&mut session)
        .await?;
    let mut n = 0;
    while let Some(d) = in_txn.next(&mut session).await {
        assert_eq!(d?.get_str("pad")?.len(), 2_000);
        n += 1;
    }
    assert_eq!(n, PADDED, "the whole result, spooled");
    session.commit_transaction().await?;

    assert_eq!(
        c.count_documents(doc! {"g": 3}).await?,
        (PADDED / 10) as u64
    );
    let mut distinct = c.distinct("g", doc! {}).await?;
    distinct.sort_by_key(|v| v.as_i32());
    assert_eq!(distinct, (0..10).map(Bson::Int32).collect::<Vec<_>>());
    // 1,000 distinct values of 20 KB each: past 16 MB.
    let big = db.collection::<Document>("big");
    for chunk in (0..1_000).collect::<Vec<i32>>().chunks(100) {
        big.insert_many(
            chunk
                .iter()
                .map(|i| doc! {"_id": i, "v": format!("{i:05}{}", "v".repeat(20_000))}),
        )
        .await?;
    }
    let err = big
        .distinct("v", doc! {})
        .await
        .expect_err("20 MB of distinct values");
    assert_eq!(code_of(&err), Some(17217), "{err}");
    assert_eq!(
        big.distinct("v", doc! {"_id": {"$lt": 10}}).await?.len(),
        10
    );
    cluster.stop().await;
    Ok(())
}

/// A namespace is at most 255 bytes (`db.coll`), as MongoDB's: a longer collection name is 73
/// before the router looks it up, caches it or logs it (the fuzzer's 8 MiB names were each
/// kept by the routing cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_bounded_at_255_bytes() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("ns");
    let ok = "c".repeat(255 - "ns.".len());
    db.collection::<Document>(&ok)
        .insert_one(doc! {"_id": 1})
        .await?;
    let long = "c".repeat(256 - "ns.".len());
    for cmd in [
        doc! {"find": &long},
        doc! {"insert": &long, "documents": [{"_id": 1}]},
        doc! {"aggregate": &long, "pipeline": [], "cursor": {}},
        doc! {"count": &long},
    ] {
        let err = db.run_command(cmd.clone()).await.expect_err("too long");
        assert_eq!(code_of(&err), Some(73), "{err}");
        assert!(err.to_string().contains("namespace is too long"), "{err}");
    }
    assert_eq!(db.list_collection_names().await?, vec![ok]);
    cluster.stop().await;
    Ok(())
}

/// Large batches leave the server to everyone else: each document of a batch the router reads
/// from what it already holds takes a unit of its task's cooperative budget, so while six
/// clients read 16 MiB batches of small documents, a new connection's `ping` is answered
/// within seconds (before, eight such readers kept a `ping` waiting 115 s: a batch was built
/// without yielding, and a few of them held every runtime thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_leave_room_for_a_new_connection() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "batches.tiny", doc! {"_id": "hashed"}).await?;
    let c = client.database("batches").collection::<Document>("tiny");
    const N: i32 = 300_000;
    for start in (0..N).step_by(30_000) {
        c.insert_many((start..start + 30_000).map(|i| doc! {"_id": i, "a": i % 7, "b": "xy"}))
            .await?;
    }
    let readers: Vec<_> = (0..6)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut cursor = c.find(doc! {}).batch_size(1_000_000).await?;
                let mut n = 0;
                while cursor.try_next().await?.is_some() {
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let fresh = cluster.client().await?;
        fresh
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await?;
        worst = worst.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for reader in readers {
        assert_eq!(reader.await??, N);
    }
    assert!(
        worst < Duration::from_secs(5),
        "a new connection's ping waited {worst:?} behind the readers"
    );
    cluster.stop().await;
    Ok(())
}

/// How many retryable-write records on the cluster's shards a `refreshSessions` has touched.
fn refreshed_records(cluster: &EmbeddedCluster) -> anyhow::Result<usize> {
    use shard::storage::{KeyRange, Scan, Table};
    let mut n = 0;
    for s in cluster.shards() {
        let read = s.state().storage.begin_read()?;
        read.scan(Table::Retryable, &KeyRange::all(), false, &mut |_, v| {
            if Document::from_reader(v).is_ok_and(|d| d.contains_key("lastUse")) {
                n += 1;
            }
            Scan::Continue
        })?;
    }
    Ok(n)
}

/// `refreshSessions` through the router reaches the shards under the key the session's own
/// writes used (its owner stamped by the router), so the session's retryable-write record
/// lives on from the refresh; a malformed list is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_sessions_keeps_the_named_sessions_records_alive() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("refresh").collection::<Document>("c");
    let mut session = client.start_session().await?;
    c.insert_one(doc! {"_id": 1}).session(&mut session).await?;
    assert_eq!(refreshed_records(&cluster)?, 0);
    let admin = client.database("admin");
    let other = doc! {"id": mongodb::bson::Uuid::new()};
    admin
        .run_command(doc! {"refreshSessions": [session.id().clone(), other]})
        .await?;
    assert_eq!(
        refreshed_records(&cluster)?,
        1,
        "the session's record, on the shard it wrote to"
    );
    for (bad, code) in [
        (Bson::Int32(1), 14),
        (Bson::Array(vec![doc! {"x": 1}.into()]), 4),
    ] {
        let err = admin
            .run_command(doc! {"refreshSessions": bad.clone()})
            .await
            .expect_err("a malformed list");
        assert_eq!(code_of(&err), Some(code), "{bad}: {err}");
    }
    cluster.stop().await;
    Ok(())
}
