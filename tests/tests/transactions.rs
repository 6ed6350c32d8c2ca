//! Multi-document transactions through the router with the Rust driver: the change events a
//! committed transaction produces (and an aborted one does not), resuming inside one, and the
//! driver's convenient API.

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::event::ResumeToken;
use tests::EmbeddedCluster;
use tests::streams::next_event as next;

fn id_of(event: &Document) -> anyhow::Result<Bson> {
    Ok(event
        .get_document("documentKey")?
        .get("_id")
        .cloned()
        .unwrap_or(Bson::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_is_one_event_per_operation_and_an_aborted_one_none()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let c = client.database("events").collection::<Document>("c");
    c.insert_one(doc! {"_id": 0}).await?;
    let mut stream = c
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();

    let mut aborted = client.start_session().await?;
    aborted.start_transaction().await?;
    c.insert_one(doc! {"_id": "never"})
        .session(&mut aborted)
        .await?;
    aborted.abort_transaction().await?;

    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    for i in 1..=5 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    c.update_one(doc! {"_id": 0}, doc! {"$set": {"x": 1}})
        .session(&mut s)
        .await?;
    c.delete_one(doc! {"_id": 5}).session(&mut s).await?;
    s.commit_transaction().await?;
    c.insert_one(doc! {"_id": "after"}).await?;

    let mut events = Vec::new();
    for _ in 0..8 {
        events.push(next(&mut stream).await?);
    }
    let ops: Vec<(&str, Bson)> = events
        .iter()
        .map(|e| Ok((e.get_str("operationType")?, id_of(e)?)))
        .collect::<anyhow::Result<_>>()?;
    let expected: Vec<(&str, Bson)> = vec![
        ("insert", Bson::Int32(1)),
        ("insert", Bson::Int32(2)),
        ("insert", Bson::Int32(3)),
        ("insert", Bson::Int32(4)),
        ("insert", Bson::Int32(5)),
        ("update", Bson::Int32(0)),
        ("delete", Bson::Int32(5)),
        ("insert", Bson::String("after".into())),
    ];
    assert_eq!(ops, expected, "the aborted insert never shows");
    let txn = &events[..7];
    let time = txn[0].get("clusterTime").cloned();
    for e in txn {
        assert_eq!(e.get("clusterTime").cloned(), time, "one commit time: {e}");
        assert!(e.get_i64("txnNumber").is_ok(), "txnNumber: {e}");
        assert!(e.get_document("lsid").is_ok(), "lsid: {e}");
    }
    assert!(!events[7].contains_key("txnNumber"), "{}", events[7]);

    // Resuming after the 2nd operation goes on with the 3rd.
    let token: ResumeToken =
        mongodb::bson::deserialize_from_document(txn[1].get_document("_id")?.clone())?;
    let mut resumed = c
        .watch()
        .resume_after(token)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let third = next(&mut resumed).await?;
    assert_eq!(id_of(&third)?, Bson::Int32(3), "{third}");
    assert_eq!(third.get("clusterTime").cloned(), time);
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drivers_convenient_api_commits_and_a_statement_error_aborts() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let c = client.database("convenient").collection::<Document>("c");
    c.insert_one(doc! {"_id": "taken"}).await?;
    let mut s = client.start_session().await?;
    s.start_transaction()
        .and_run(c.clone(), |session, c| {
            Box::pin(async move {
                c.insert_one(doc! {"_id": "x"})
                    .session(&mut *session)
                    .await?;
                c.insert_one(doc! {"_id": "y"})
                    .session(&mut *session)
                    .await?;
                Ok(())
            })
        })
        .await?;
    assert_eq!(c.count_documents(doc! {}).await?, 3);

    // A duplicate key inside a transaction aborts it: the commit answers NoSuchTransaction and
    // the earlier insert is gone.
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": "z"}).session(&mut s).await?;
    let dup = c
        .insert_one(doc! {"_id": "taken"})
        .session(&mut s)
        .await
        .expect_err("a duplicate key");
    assert_eq!(tests::scenarios::code_of(&dup), Some(11000), "{dup}");
    let err = s
        .commit_transaction()
        .await
        .expect_err("the transaction was aborted");
    assert_eq!(tests::scenarios::code_of(&err), Some(251), "{err}");
    assert!(err.contains_label("TransientTransactionError"), "{err}");
    assert_eq!(c.count_documents(doc! {"_id": "z"}).await?, 0);
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_across_three_shards_commits_whole_or_not_at_all() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "spread.c", doc! {"_id": "hashed"}).await?;
    let c = client.database("spread").collection::<Document>("c");
    c.insert_one(doc! {"_id": -1}).await?;
    let mut stream = c
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();

    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    for i in 0..30 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    assert_eq!(c.count_documents(doc! {}).session(&mut s).await?, 31);
    assert_eq!(
        c.count_documents(doc! {}).await?,
        1,
        "nothing visible before the commit"
    );
    s.commit_transaction().await?;
    assert_eq!(c.count_documents(doc! {}).await?, 31);
    // Each shard's part arrives as one event per operation with the transaction's lsid and
    // txnNumber, in order within each shard.
    let mut seen = Vec::new();
    for _ in 0..30 {
        let e = next(&mut stream).await?;
        assert!(e.get_i64("txnNumber").is_ok(), "{e}");
        seen.push(id_of(&e)?);
    }
    seen.sort_by_key(|b| b.as_i32());
    assert_eq!(seen, (0..30).map(Bson::Int32).collect::<Vec<_>>());

    // An abort across shards leaves nothing, and a statement error aborts every participant.
    s.start_transaction().await?;
    for i in 100..110 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    s.abort_transaction().await?;
    assert_eq!(c.count_documents(doc! {"_id": {"$gte": 100}}).await?, 0);
    s.start_transaction().await?;
    for i in 200..210 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    c.insert_one(doc! {"_id": 0})
        .session(&mut s)
        .await
        .expect_err("a duplicate key");
    let err = s
        .commit_transaction()
        .await
        .expect_err("aborted by the duplicate");
    assert!(err.contains_label("TransientTransactionError"), "{err}");
    assert_eq!(c.count_documents(doc! {"_id": {"$gte": 200}}).await?, 0);
    cluster.stop().await;
    Ok(())
}

/// Transfers between accounts on different shards, in transactions, while snapshot reads and
/// transactional reads check that the total never changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_shard_transfers_keep_the_total_in_every_snapshot() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "bank.accounts", doc! {"_id": "hashed"}).await?;
    let db = client.database("bank");
    let accounts = db.collection::<Document>("accounts");
    let docs: Vec<Document> = (0..12).map(|i| doc! {"_id": i, "balance": 100}).collect();
    accounts.insert_many(docs).await?;
    let total = |docs: &[Document]| -> i64 {
        docs.iter()
            .map(|d| i64::from(d.get_i32("balance").unwrap_or(0)))
            .sum()
    };
    let mut workers = Vec::new();
    for w in 0..2_i32 {
        let client = client.clone();
        let accounts = accounts.clone();
        workers.push(tokio::spawn(async move {
            let mut s = client.start_session().await?;
            let mut committed = 0;
            for i in 0..25_i32 {
                let from = (i * 5 + w) % 12;
                let to = (i * 7 + w * 3 + 1) % 12;
                if from == to {
                    continue;
                }
                s.start_transaction()
                    .and_run(accounts.clone(), |session, accounts| {
                        Box::pin(async move {
                            accounts
                                .update_one(doc! {"_id": from}, doc! {"$inc": {"balance": -3}})
                                .session(&mut *session)
                                .await?;
                            accounts
                                .update_one(doc! {"_id": to}, doc! {"$inc": {"balance": 3}})
                                .session(&mut *session)
                                .await?;
                            Ok(())
                        })
                    })
                    .await?;
                committed += 1;
            }
            anyhow::Ok(committed)
        }));
    }
    let mut checks = 0;
    while !workers.iter().all(|w| w.is_finished()) {
        let reply = db
            .run_command(doc! {"find": "accounts", "readConcern": {"level": "snapshot"}})
            .await?;
        let batch: Vec<Document> = reply
            .get_document("cursor")?
            .get_array("firstBatch")?
            .iter()
            .filter_map(|d| d.as_document().cloned())
            .collect();
        assert_eq!(batch.len(), 12);
        assert_eq!(
            total(&batch),
            1200,
            "a snapshot saw half a transfer: {batch:?}"
        );
        // (A read outside a transaction without a snapshot may see part of a cross-shard
        // transaction, as in MongoDB; one inside a transaction may not.)
        let mut s = client.start_session().await?;
        s.start_transaction().await?;
        let inside: Vec<Document> = accounts
            .find(doc! {})
            .session(&mut s)
            .await?
            .stream(&mut s)
            .try_collect()
            .await?;
        s.commit_transaction().await?;
        assert_eq!(
            total(&inside),
            1200,
            "a transaction saw half a transfer: {inside:?}"
        );
        checks += 1;
    }
    let mut committed = 0;
    for w in workers {
        committed += w.await??;
    }
    assert!(committed > 20, "{committed} transfers committed");
    assert!(checks > 0);
    let end: Vec<Document> = accounts.find(doc! {}).await?.try_collect().await?;
    assert_eq!(total(&end), 1200);
    cluster.stop().await;
    Ok(())
}

/// A session's id as the router sends it to the shards: `{id, uid}` (`$listLocalSessions`).
async fn own_session(client: &mongodb::Client, lsid: &Document) -> anyhow::Result<Document> {
    let listed: Vec<Document> = client
        .database("admin")
        .aggregate([doc! {"$listLocalSessions": {}}])
        .await?
        .try_collect()
        .await?;
    let id = lsid.get("id");
    listed
        .into_iter()
        .map(|s| s.get_document("_id").cloned())
        .find(|s| s.as_ref().is_ok_and(|s| s.get("id") == id))
        .ok_or_else(|| anyhow::anyhow!("session {lsid} is not listed"))?
        .map_err(Into::into)
}

/// A prepared transaction survives its shards' restart: it still holds each shard's
/// high-water mark below its prepare time, and the coordinator's decision, delivered after the
/// restart, commits it everywhere at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_survives_a_restart_and_commits_after_it() -> anyhow::Result<()> {
    let mut cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "prep.c", doc! {"_id": "hashed"}).await?;
    let c = client.database("prep").collection::<Document>("c");
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    for i in 0..12 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    // Play the coordinator's first phase by hand, on every shard the transaction reached,
    // with the session as the router stamps it (its `uid`: the owner, as `$listLocalSessions`
    // shows it).
    let lsid = own_session(&client, s.id()).await?;
    // A fresh client's first transaction on its first session is number 1.
    let txn_number = 1_i64;
    let session_fields =
        doc! {"lsid": lsid.clone(), "txnNumber": txn_number, "autocommit": false, "$db": "admin"};
    let mut prepare_times = Vec::new();
    for shard in cluster.shards() {
        let mut cmd = doc! {"prepareTransaction": 1};
        cmd.extend(session_fields.clone());
        let reply = shard.run_command(cmd).await;
        prepare_times.push((
            shard.name().to_string(),
            reply.get_timestamp("prepareTimestamp")?,
        ));
    }
    // An abort from anyone but its coordinator cannot undo a prepared transaction (the driver,
    // dropping the session, sends one and ignores its error, as drivers do).
    let mut abort = doc! {"abortTransaction": 1};
    abort.extend(session_fields.clone());
    let refused = cluster.shards()[0].run_command(abort).await;
    assert_eq!(refused.get_i32("code").ok(), Some(267), "{refused}");
    drop(s);
    drop(client);
    cluster.restart().await?;
    for shard in cluster.shards() {
        let p = prepare_times
            .iter()
            .find(|(n, _)| n == shard.name())
            .map(|(_, t)| *t)
            .ok_or_else(|| anyhow::anyhow!("no prepare time for {}", shard.name()))?;
        assert!(
            shard.high_water_mark().timestamp() < p,
            "{}: the hold survives the restart (high-water mark {:?}, prepared at {p:?})",
            shard.name(),
            shard.high_water_mark()
        );
    }
    let commit_ts =
        prepare_times
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(mongodb::bson::Timestamp {
                time: 0,
                increment: 0,
            });
    for shard in cluster.shards() {
        let mut cmd = doc! {"commitTransaction": 1, "commitTimestamp": commit_ts};
        cmd.extend(session_fields.clone());
        let reply = shard.run_command(cmd).await;
        assert_eq!(
            reply.get_f64("ok").ok(),
            Some(1.0),
            "{}: {reply}",
            shard.name()
        );
    }
    let client = cluster.client().await?;
    let c = client.database("prep").collection::<Document>("c");
    assert_eq!(c.count_documents(doc! {}).await?, 12);
    // A retried commit answers the same.
    for shard in cluster.shards() {
        let mut cmd = doc! {"commitTransaction": 1, "commitTimestamp": commit_ts};
        cmd.extend(session_fields.clone());
        let reply = shard.run_command(cmd).await;
        assert_eq!(
            reply.get_f64("ok").ok(),
            Some(1.0),
            "{}: {reply}",
            shard.name()
        );
    }
    cluster.stop().await;
    Ok(())
}

/// As in MongoDB 7.0: a transaction may create a collection and index it, all visible at the
/// commit (and gone with an abort); it may not index a collection that existed before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_and_their_indexes_are_created_inside_a_transaction() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let db = client.database("ddl_txn");
    db.collection::<Document>("old")
        .insert_one(doc! {"_id": 1})
        .await?;
    let names = |db: mongodb::Database| async move { db.list_collection_names().await };

    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    db.create_collection("made").session(&mut s).await?;
    let made = db.collection::<Document>("made");
    made.create_index(tests::unique_index(doc! {"k": 1}))
        .session(&mut s)
        .await?;
    made.insert_one(doc! {"_id": 1, "k": 1})
        .session(&mut s)
        .await?;
    let dup = made
        .insert_one(doc! {"_id": 2, "k": 1})
        .session(&mut s)
        .await
        .expect_err("the transaction's own unique index holds");
    assert_eq!(tests::scenarios::code_of(&dup), Some(11000), "{dup}");
    let _ = s.abort_transaction().await;
    assert!(
        !names(db.clone()).await?.contains(&"made".to_string()),
        "aborted: no collection"
    );

    s.start_transaction().await?;
    db.create_collection("made").session(&mut s).await?;
    made.insert_one(doc! {"_id": 1, "k": 1})
        .session(&mut s)
        .await?;
    assert!(
        !names(db.clone()).await?.contains(&"made".to_string()),
        "not before the commit"
    );
    s.commit_transaction().await?;
    assert!(names(db.clone()).await?.contains(&"made".to_string()));
    assert_eq!(made.count_documents(doc! {}).await?, 1);

    s.start_transaction().await?;
    let err = db
        .collection::<Document>("old")
        .create_index(mongodb::IndexModel::builder().keys(doc! {"x": 1}).build())
        .session(&mut s)
        .await
        .expect_err("an existing collection is not indexed inside a transaction");
    assert_eq!(tests::scenarios::code_of(&err), Some(263), "{err}");
    cluster.stop().await;
    Ok(())
}

/// The registry's transaction rule, through the driver: a command that is no statement of a
/// transaction is refused inside one with 263, whether the router runs it alone
/// (`listDatabases`) or a shard would (`count`), and the refusal aborts the transaction; the
/// handshake commands MongoDB allows there still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_are_no_statement_are_refused_inside_a_transaction() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("rule");
    let c = db.collection::<Document>("c");
    c.insert_one(doc! {"_id": 0}).await?;
    let mut s = client.start_session().await?;
    for refused in [
        doc! {"listDatabases": 1},
        doc! {"count": "c"},
        doc! {"serverStatus": 1},
    ] {
        s.start_transaction().await?;
        c.insert_one(doc! {"_id": refused.keys().next().cloned()})
            .session(&mut s)
            .await?;
        let on = if refused.contains_key("count") {
            "rule"
        } else {
            "admin"
        };
        let err = client
            .database(on)
            .run_command(refused.clone())
            .session(&mut s)
            .await
            .expect_err("not a statement of a transaction");
        let commit = s
            .commit_transaction()
            .await
            .expect_err("the refusal aborted it");
        let codes = [&err, &commit].map(tests::scenarios::code_of);
        assert_eq!(codes, [Some(263), Some(251)], "{refused}: {err}; {commit}");
    }
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": "beside"}).session(&mut s).await?;
    client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .session(&mut s)
        .await?;
    s.commit_transaction().await?;
    let ids: Vec<Bson> = c
        .find(doc! {})
        .await?
        .try_collect::<Vec<_>>()
        .await?
        .into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
    assert_eq!(
        ids.len(),
        2,
        "only the first insert and the last transaction's: {ids:?}"
    );
    cluster.stop().await;
    Ok(())
}

/// A transaction over 16 MB is written as a chain of `applyOps` entries (`partialTxn`, linked
/// by `prevOpTime`) in one commit, and a change stream shows all of its operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_megabyte_transaction_is_a_partial_txn_chain() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let c = client.database("big").collection::<Document>("c");
    c.insert_one(doc! {"_id": "first"}).await?;
    let mut stream = c
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let pad = "x".repeat(1 << 20);
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    for i in 0..20 {
        c.insert_one(doc! {"_id": i, "pad": &pad})
            .session(&mut s)
            .await?;
    }
    s.commit_transaction().await?;
    for i in 0..20 {
        let e = next(&mut stream).await?;
        assert_eq!(id_of(&e)?, Bson::Int32(i));
    }
    let mut partial = 0;
    for shard in cluster.shards() {
        let reply = shard
            .run_command(
                doc! {"find": "oplog.rs", "filter": {"o.partialTxn": true}, "$db": "local"},
            )
            .await;
        partial += reply.get_document("cursor")?.get_array("firstBatch")?.len();
    }
    assert!(
        partial >= 1,
        "the transaction's oplog is a chain: {partial} partial entries"
    );
    cluster.stop().await;
    Ok(())
}

/// A multi-process cluster of `shards` shards and a client of its router, with `db.c` sharded
/// on a hashed `_id` (so a transaction's writes spread over the shards).
async fn hashed_process_cluster(
    shards: usize,
    db: &str,
) -> anyhow::Result<(
    tests::ProcessCluster,
    mongodb::Client,
    mongodb::Collection<Document>,
)> {
    let cluster = tests::ProcessCluster::start(shards).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, &format!("{db}.c"), doc! {"_id": "hashed"}).await?;
    let c = client.database(db).collection::<Document>("c");
    Ok((cluster, client, c))
}

/// The shard holding `_id` (an unsharded probe through each shard's own driver).
async fn shard_of(cluster: &tests::ProcessCluster, db: &str, id: i32) -> anyhow::Result<usize> {
    for i in 0..cluster.shards.len() {
        let c = cluster.shard_client(i).await?;
        if c.database(db)
            .collection::<Document>("c")
            .count_documents(doc! {"_id": id})
            .await?
            == 1
        {
            return Ok(i);
        }
    }
    anyhow::bail!("no shard holds {id}")
}

async fn fail_point(cluster: &tests::ProcessCluster, on: bool) -> anyhow::Result<()> {
    set_fail_point(cluster, "hangAfterCommitDecision", on).await
}

async fn set_fail_point(
    cluster: &tests::ProcessCluster,
    name: &str,
    on: bool,
) -> anyhow::Result<()> {
    for i in 0..cluster.shards.len() {
        cluster
            .shard_client(i)
            .await?
            .database("admin")
            .run_command(
                doc! {"configureFailPoint": name, "mode": if on { "alwaysOn" } else { "off" }},
            )
            .await?;
    }
    Ok(())
}

/// A transaction over `c` (already holding `{_id: 0, n: 0}`), not yet committed: `n` set to 1
/// (its first statement, so `_id` 0's shard coordinates) and twelve inserts spread over the
/// shards.
async fn an_update_and_twelve_inserts(
    client: &mongodb::Client,
    c: &mongodb::Collection<Document>,
) -> anyhow::Result<mongodb::ClientSession> {
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    c.update_one(doc! {"_id": 0}, doc! {"$set": {"n": 1}})
        .session(&mut s)
        .await?;
    for i in 1..=12 {
        c.insert_one(doc! {"_id": i}).session(&mut s).await?;
    }
    Ok(s)
}

/// The transaction of [`an_update_and_twelve_inserts`] is committed on every shard,
/// once the reads no longer wait for it.
async fn assert_committed_everywhere(
    c: &mongodb::Collection<Document>,
    why: &str,
) -> anyhow::Result<()> {
    assert_eq!(count_once_readable(c).await, Some(13), "{why}");
    assert_eq!(c.count_documents(doc! {"n": 1}).await?, 1, "{why}");
    Ok(())
}

/// `c`'s count once a read of its latest state no longer waits for a prepared transaction
/// (`None` if it still waits after about 40 s).
async fn count_once_readable(c: &mongodb::Collection<Document>) -> Option<u64> {
    for _ in 0..100 {
        match c
            .count_documents(doc! {})
            .max_time(Duration::from_millis(300))
            .await
        {
            Ok(n) => return Some(n),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    None
}

/// A coordinator whose participants do not take its decision keeps telling them, in the
/// background, after it has answered the router: the transaction ends committed on every
/// shard without any restart, as soon as they can be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_the_participants_missed_is_delivered_again_without_a_restart()
-> anyhow::Result<()> {
    let (cluster, client, c) = hashed_process_cluster(3, "redeliver").await?;
    c.insert_one(doc! {"_id": 0, "n": 0}).await?;
    set_fail_point(&cluster, "failCoordinatorDelivery", true).await?;
    an_update_and_twelve_inserts(&client, &c)
        .await?
        .commit_transaction()
        .await?;
    // Decided, durable and answered, but no participant has been told: they are prepared.
    let undecided = c
        .count_documents(doc! {})
        .max_time(Duration::from_millis(300))
        .await;
    assert!(
        undecided.is_err(),
        "a read waits for the prepared participants: {undecided:?}"
    );
    set_fail_point(&cluster, "failCoordinatorDelivery", false).await?;
    assert_committed_everywhere(&c, "committed on every shard").await?;
    drop(cluster);
    Ok(())
}

/// A participant that is not told the decision asks its coordinator for it: with the
/// coordinator's delivery failing throughout, every participant commits within a few of its
/// asking intervals (`askCoordinatorAfterSecs`, here 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_not_told_the_decision_asks_its_coordinator() -> anyhow::Result<()> {
    let (cluster, client, c) = hashed_process_cluster(3, "ask").await?;
    c.insert_one(doc! {"_id": 0, "n": 0}).await?;
    set_fail_point(&cluster, "failCoordinatorDelivery", true).await?;
    for i in 0..cluster.shards.len() {
        cluster
            .shard_client(i)
            .await?
            .database("admin")
            .run_command(doc! {"setParameter": 1, "askCoordinatorAfterSecs": 1})
            .await?;
    }
    an_update_and_twelve_inserts(&client, &c)
        .await?
        .commit_transaction()
        .await?;
    assert_committed_everywhere(
        &c,
        "every participant asked and committed, delivery failing",
    )
    .await?;
    drop(cluster);
    Ok(())
}

/// A commit recovered through another router (the driver retries `commitTransaction` there
/// when its router dies mid-commit) is answered once the participants have the decision, as
/// the coordinator's own answer is: the client's next transaction then comes after this one in
/// every stream. (The soak once saw a thread's later transfer ahead of an earlier,
/// acknowledged one: the recovery had answered from the durable decision while a participant
/// was still prepared.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_commit_is_answered_once_the_participants_have_it() -> anyhow::Result<()> {
    let (cluster, _, c) = hashed_process_cluster(3, "recovered").await?;
    let other = cluster.start_extra_router().await?;
    let a = wire::Client::new(cluster.router.addr.to_string());
    let b = wire::Client::new(other.addr.to_string());
    let lsid = doc! {"id": Bson::Binary(mongodb::bson::Binary {
        subtype: mongodb::bson::spec::BinarySubtype::Uuid,
        bytes: vec![43; 16],
    })};
    let docs: Vec<Document> = (0..13).map(|i| doc! {"_id": i}).collect();
    let reply = a
        .command(
            "recovered",
            &doc! {"insert": "c", "documents": docs, "lsid": lsid.clone(), "txnNumber": 1_i64,
            "autocommit": false, "startTransaction": true},
        )
        .await?;
    let token = reply.get_document("recoveryToken")?.clone();
    let commit = doc! {"commitTransaction": 1, "lsid": lsid, "txnNumber": 1_i64,
    "autocommit": false, "recoveryToken": token};
    // The coordinator makes its decision durable and holds there, before telling anyone.
    fail_point(&cluster, true).await?;
    let first = {
        let commit = commit.clone();
        tokio::spawn(async move { a.command("admin", &commit).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    let recovered = b.command("admin", &commit).await?;
    assert_eq!(recovered.get_f64("ok").ok(), Some(1.0), "{recovered}");
    let now = c
        .count_documents(doc! {})
        .max_time(Duration::from_millis(300))
        .await;
    assert_eq!(
        now.ok(),
        Some(13),
        "answered only once every participant committed"
    );
    fail_point(&cluster, false).await?;
    let first = tokio::time::timeout(Duration::from_secs(60), first).await???;
    assert_eq!(first.get_f64("ok").ok(), Some(1.0), "{first}");
    drop(other);
    drop(cluster);
    Ok(())
}

/// A two-phase commit is acknowledged with a cluster time past every participant's commit
/// entry, even a participant whose clock ran ahead of the coordinator's (each writes its
/// commit entry at its own time): the client's next write, which carries that time, follows
/// the whole transaction in every change stream wherever it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_acknowledged_past_every_participants_commit_entry() -> anyhow::Result<()> {
    let (cluster, _, c) = hashed_process_cluster(2, "gossip").await?;
    let docs: Vec<Document> = (0..13).map(|i| doc! {"_id": i, "n": 0}).collect();
    c.insert_many(docs).await?;
    let coordinator = shard_of(&cluster, "gossip", 0).await?;
    let mut other = None;
    for id in 1..13 {
        let at = shard_of(&cluster, "gossip", id).await?;
        if at != coordinator {
            other = Some((id, at));
            break;
        }
    }
    let Some((id, participant)) = other else {
        anyhow::bail!("every document hashed to one shard");
    };
    let router = wire::Client::new(cluster.router.addr.to_string());
    let lsid = doc! {"id": Bson::Binary(mongodb::bson::Binary {
        subtype: mongodb::bson::spec::BinarySubtype::Uuid,
        bytes: vec![44; 16],
    })};
    let txn = doc! {"lsid": lsid.clone(), "txnNumber": 1_i64, "autocommit": false};
    for (k, filter) in [doc! {"_id": 0}, doc! {"_id": id}].into_iter().enumerate() {
        let mut update = doc! {"update": "c", "updates": [{"q": filter, "u": {"$set": {"n": 1}}}]};
        update.extend(txn.clone());
        if k == 0 {
            update.insert("startTransaction", true);
        }
        let reply = router.command("gossip", &update).await?;
        assert_eq!(reply.get_i32("nModified").ok(), Some(1), "{reply}");
    }
    let mut commit = doc! {"commitTransaction": 1};
    commit.extend(txn);
    // The coordinator holds after its decision; meanwhile the participant's clock runs ahead.
    fail_point(&cluster, true).await?;
    let committing = tokio::spawn(async move { router.command("admin", &commit).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let ahead = mongodb::bson::Timestamp {
        time: u32::try_from(std::time::UNIX_EPOCH.elapsed()?.as_secs())? + 100,
        increment: 1,
    };
    wire::Client::new(cluster.shards[participant].addr.to_string())
        .command(
            "admin",
            &doc! {"ping": 1, "$clusterTime": {"clusterTime": ahead, "signature": {
                "hash": mongodb::bson::Binary {
                    subtype: mongodb::bson::spec::BinarySubtype::Generic,
                    bytes: vec![0; 20],
                },
                "keyId": 0_i64,
            }}},
        )
        .await?;
    fail_point(&cluster, false).await?;
    let reply = tokio::time::timeout(Duration::from_secs(60), committing).await???;
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply}");
    let acknowledged = reply
        .get_document("$clusterTime")?
        .get_timestamp("clusterTime")?;
    let entry = cluster
        .shard_client(participant)
        .await?
        .database("local")
        .collection::<Document>("oplog.rs")
        .find_one(doc! {"o.commitTransaction": 1})
        .sort(doc! {"$natural": -1})
        .await?
        .ok_or_else(|| anyhow::anyhow!("no commit entry on the participant"))?;
    let committed = entry.get_timestamp("ts")?;
    let at = |t: mongodb::bson::Timestamp| (t.time, t.increment);
    assert!(
        at(committed) > at(ahead),
        "the participant committed after its clock ran ahead: {committed:?}"
    );
    assert!(
        at(acknowledged) >= at(committed),
        "acknowledged at {acknowledged:?}, before the participant's commit entry {committed:?}"
    );
    drop(cluster);
    Ok(())
}

/// `kill -9` between a two-phase commit's decision and its delivery, of the coordinator or of
/// another participant (multi-process cluster): after the restart the transaction is committed
/// on every shard, and a watcher sees every one of its operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_the_decision_and_the_commit_resolves_the_same_everywhere()
-> anyhow::Result<()> {
    for kill_coordinator in [true, false] {
        let (mut cluster, client, c) = hashed_process_cluster(3, "kill2pc").await?;
        c.insert_one(doc! {"_id": 0, "n": 0}).await?;
        let coordinator = shard_of(&cluster, "kill2pc", 0).await?;
        let mut stream = c
            .watch()
            .max_await_time(Duration::from_millis(200))
            .await?
            .with_type::<Document>();
        fail_point(&cluster, true).await?;
        let mut s = an_update_and_twelve_inserts(&client, &c).await?;
        let commit = tokio::spawn(async move {
            let mut last = None;
            for _ in 0..20 {
                match s.commit_transaction().await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.contains_label("UnknownTransactionCommitResult") => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.unwrap_or_else(unreachable_error))
        });
        // The coordinator now holds its durable decision and waits at the fail point.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let victim = if kill_coordinator {
            coordinator
        } else {
            (coordinator + 1) % 3
        };
        cluster.shards[victim].kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.shards[victim].restart().await?;
        if !kill_coordinator {
            fail_point(&cluster, false).await?;
        }
        tokio::time::timeout(Duration::from_secs(60), commit).await???;
        assert_eq!(
            c.count_documents(doc! {}).await?,
            13,
            "committed on every shard (killed {})",
            if kill_coordinator {
                "the coordinator"
            } else {
                "a participant"
            }
        );
        assert_eq!(c.count_documents(doc! {"n": 1}).await?, 1);
        let mut seen = 0;
        while seen < 13 {
            let e = next(&mut stream).await?;
            assert!(e.get_i64("txnNumber").is_ok(), "{e}");
            seen += 1;
        }
    }
    Ok(())
}

/// A shard that restarts in the middle of a transaction has lost the statements it ran: the
/// transaction's next statement there is refused (`NoSuchTransaction`, retryable whole), not
/// run as a fresh transaction that the commit would then commit without the earlier ones. (The
/// soak once lost half a transfer this way: the debit ran before a `kill -9`, the credit, on
/// the same shard, after the restart, and the commit committed only the credit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_restarted_mid_transaction_refuses_its_later_statements() -> anyhow::Result<()> {
    let (mut cluster, client, c) = hashed_process_cluster(2, "midtxn").await?;
    c.insert_many((0..16).map(|i| doc! {"_id": i, "n": 0}))
        .await?;
    // Two documents on the same shard.
    let first = shard_of(&cluster, "midtxn", 0).await?;
    let mut second = None;
    for i in 1..16 {
        if shard_of(&cluster, "midtxn", i).await? == first {
            second = Some(i);
            break;
        }
    }
    let second = second.ok_or_else(|| anyhow::anyhow!("no two documents share a shard"))?;
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    c.update_one(doc! {"_id": 0}, doc! {"$inc": {"n": -5}})
        .session(&mut s)
        .await?;
    cluster.shards[first].kill();
    cluster.shards[first].restart().await?;
    let later = c
        .update_one(doc! {"_id": second}, doc! {"$inc": {"n": 5}})
        .session(&mut s)
        .await;
    // The router may still hold a connection the restart closed: the driver then sees a
    // network error (also retryable whole) before the shard is asked at all.
    let refused = match later {
        Ok(r) => anyhow::bail!("the later statement ran as a fresh transaction: {r:?}"),
        Err(e) => e,
    };
    assert!(
        refused.contains_label("TransientTransactionError"),
        "{refused}"
    );
    if let mongodb::error::ErrorKind::Command(e) = &*refused.kind {
        assert_eq!((e.code, e.code_name.as_str()), (251, "NoSuchTransaction"));
    }
    let commit = s.commit_transaction().await;
    assert!(commit.is_err(), "nothing is left to commit: {commit:?}");
    assert_eq!(
        c.count_documents(doc! {"n": {"$ne": 0}}).await?,
        0,
        "neither statement took effect"
    );
    drop(cluster);
    Ok(())
}

fn unreachable_error() -> mongodb::error::Error {
    mongodb::error::Error::custom("the commit was never tried")
}

/// A router that does not know a transaction (another router's, or its own before a restart)
/// recovers its commit's outcome from the shard its `recoveryToken` names and never commits it
/// from the token alone: a transaction that spans shards and never began its commit is aborted
/// (NoSuchTransaction, so the driver retries it whole), never committed on one shard only; one
/// that committed answers `ok` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_router_recovers_a_commit_and_never_commits_part_of_a_transaction()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "recover.c", doc! {"_id": "hashed"}).await?;
    let c = client.database("recover").collection::<Document>("c");
    let running = cluster
        .running
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the cluster runs"))?;
    let other = router::launch::router_beside(
        "127.0.0.1:0".parse()?,
        running,
        router::RouterOptions::default(),
    )
    .await?;
    let a = wire::Client::new(cluster.addr.to_string());
    let b = wire::Client::new(other.addr.to_string());
    let lsid = doc! {"id": Bson::Binary(mongodb::bson::Binary {
        subtype: mongodb::bson::spec::BinarySubtype::Uuid,
        bytes: vec![42; 16],
    })};
    let insert = |txn: i64| {
        let docs: Vec<Document> = (0..20).map(|i| doc! {"_id": txn * 100 + i}).collect();
        doc! {"insert": "c", "documents": docs, "lsid": lsid.clone(), "txnNumber": txn,
        "autocommit": false, "startTransaction": true}
    };
    let commit = |txn: i64, token: &Document| {
        doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": txn,
        "autocommit": false, "recoveryToken": token.clone()}
    };

    // Transaction 1 writes on every shard through router a; its commit reaches only b.
    let reply = a.command("recover", &insert(1)).await?;
    let n = reply.get("n").and_then(|n| match n {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    });
    assert_eq!(n, Some(20), "{reply}");
    let token = reply.get_document("recoveryToken")?.clone();
    let refused = b.command("admin", &commit(1, &token)).await?;
    assert_eq!(refused.get_i32("code").ok(), Some(251), "{refused}");
    let labels = refused.get_array("errorLabels")?;
    assert!(
        labels.contains(&Bson::String("TransientTransactionError".into())),
        "{refused}"
    );
    // It is aborted everywhere: router a cannot commit it any more, and nothing is stored.
    let late = a.command("admin", &commit(1, &token)).await?;
    assert_eq!(late.get_i32("code").ok(), Some(251), "{late}");
    assert_eq!(c.count_documents(doc! {}).await?, 0);

    // Transaction 2 commits through a; the commit retried through b answers ok.
    let reply = a.command("recover", &insert(2)).await?;
    let token = reply.get_document("recoveryToken")?.clone();
    let committed = a.command("admin", &commit(2, &token)).await?;
    assert_eq!(committed.get_f64("ok").ok(), Some(1.0), "{committed}");
    let again = b.command("admin", &commit(2, &token)).await?;
    assert_eq!(again.get_f64("ok").ok(), Some(1.0), "{again}");
    assert_eq!(c.count_documents(doc! {}).await?, 20);
    other.shutdown().await;
    cluster.stop().await;
    Ok(())
}

/// With `showExpandedEvents`, the DDL a transaction runs shows as its expanded events, in the
/// transaction's order and with its `lsid` and `txnNumber`, as in MongoDB 7.0; without it,
/// only the insert shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_inside_a_transaction_shows_as_expanded_events() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let db = client.database("ddl_events");
    db.collection::<Document>("old")
        .insert_one(doc! {"_id": 0})
        .await?;
    let mut expanded = db
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let mut plain = db
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();

    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    db.create_collection("made").session(&mut s).await?;
    let made = db.collection::<Document>("made");
    made.create_index(mongodb::IndexModel::builder().keys(doc! {"k": 1}).build())
        .session(&mut s)
        .await?;
    made.insert_one(doc! {"_id": 1, "k": 1})
        .session(&mut s)
        .await?;
    s.commit_transaction().await?;

    let mut kinds = Vec::new();
    for _ in 0..3 {
        let e = next(&mut expanded).await?;
        assert!(e.contains_key("lsid") && e.contains_key("txnNumber"), "{e}");
        assert_eq!(e.get_document("ns")?.get_str("coll")?, "made", "{e}");
        kinds.push(e.get_str("operationType")?.to_string());
    }
    assert_eq!(kinds, ["create", "createIndexes", "insert"]);
    let only = next(&mut plain).await?;
    assert_eq!(only.get_str("operationType")?, "insert", "{only}");
    cluster.stop().await;
    Ok(())
}
