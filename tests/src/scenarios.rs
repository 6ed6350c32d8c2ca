//! Driver-level scenarios that must pass against every deployment (embedded and
//! multi-process): each takes a connected `mongodb::Client` and a database name of its own.

use anyhow::{Result, ensure};
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;
use mongodb::{Client, IndexModel};

/// The server error code of a failed driver call carried in an `anyhow` error.
pub fn code_of_any(e: &anyhow::Error) -> Option<i32> {
    e.downcast_ref::<mongodb::error::Error>().and_then(code_of)
}

/// The server error code of a failed driver call.
pub fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map(|w| w.code),
        _ => None,
    }
}

/// The server's error message of a failed driver call (empty when it carries none).
pub fn message_of(e: &mongodb::error::Error) -> String {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => c.message.clone(),
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.message.clone(),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => w.message.clone(),
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map(|w| w.message.clone())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The handshake and harness commands answer as a 7.0 mongos does.
pub async fn handshake_and_admin(client: &Client) -> Result<()> {
    let admin = client.database("admin");
    let hello = admin.run_command(doc! {"hello": 1}).await?;
    ensure!(hello.get_bool("isWritablePrimary")?, "{hello}");
    ensure!(hello.get_i32("maxWireVersion")? == 21, "{hello}");
    ensure!(
        hello.contains_key("logicalSessionTimeoutMinutes"),
        "{hello}"
    );
    let legacy = admin.run_command(doc! {"isMaster": 1}).await?;
    ensure!(legacy.get_bool("ismaster")?, "{legacy}");
    let build = admin.run_command(doc! {"buildInfo": 1}).await?;
    ensure!(build.get_str("version")? == "7.0.0", "{build}");
    admin.run_command(doc! {"ping": 1}).await?;
    let params = admin.run_command(doc! {"getParameter": "*"}).await?;
    ensure!(params.contains_key("enableTestCommands"), "{params}");
    let opts = admin.run_command(doc! {"getCmdLineOpts": 1}).await?;
    ensure!(
        opts.contains_key("argv") && opts.contains_key("parsed"),
        "{opts}"
    );
    let status = admin.run_command(doc! {"serverStatus": 1}).await?;
    ensure!(
        status.get_document("storageEngine")?.contains_key("name"),
        "{status}"
    );
    admin.run_command(doc! {"endSessions": []}).await?;
    admin.run_command(doc! {"killAllSessions": []}).await?;
    let err = admin
        .run_command(doc! {"noSuchCommand": 1})
        .await
        .unwrap_err();
    ensure!(code_of(&err) == Some(59), "unknown command gave {err}");
    // The connection survives the error.
    admin.run_command(doc! {"ping": 1}).await?;
    let reply = admin.run_command(doc! {"ping": 1}).await?;
    ensure!(
        reply.contains_key("$clusterTime") && reply.contains_key("operationTime"),
        "{reply}"
    );
    Ok(())
}

/// insert/find/update/delete/findAndModify/count/distinct/aggregate on one collection.
pub async fn crud(client: &Client, db_name: &str) -> Result<()> {
    let db = client.database(db_name);
    let c = db.collection::<Document>("people");
    c.insert_many(
        (0..250).map(|i| doc! {"_id": i, "n": i, "g": i % 5, "tags": ["a", format!("t{}", i % 3)]}),
    )
    .await?;

    // Duplicate _id: ordered stops at the error, unordered goes on.
    let err = c
        .insert_many(vec![
            doc! {"_id": 1000},
            doc! {"_id": 1},
            doc! {"_id": 1001},
        ])
        .await
        .unwrap_err();
    ensure!(
        format!("{err}").contains("11000") || format!("{err:?}").contains("11000"),
        "{err}"
    );
    ensure!(c.count_documents(doc! {"_id": {"$gte": 1000}}).await? == 1);
    let err = c
        .insert_many(vec![
            doc! {"_id": 2000},
            doc! {"_id": 2},
            doc! {"_id": 2001},
        ])
        .ordered(false)
        .await
        .unwrap_err();
    ensure!(format!("{err:?}").contains("11000"), "{err:?}");
    ensure!(c.count_documents(doc! {"_id": {"$gte": 2000}}).await? == 2);
    c.delete_many(doc! {"_id": {"$gte": 1000}}).await?;

    // find: filter, projection, sort, skip, limit, batchSize with getMore.
    let docs: Vec<Document> = c
        .find(doc! {"g": 2})
        .sort(doc! {"n": -1})
        .skip(3)
        .limit(20)
        .projection(doc! {"n": 1, "_id": 0})
        .batch_size(7)
        .await?
        .try_collect()
        .await?;
    ensure!(docs.len() == 20, "got {}", docs.len());
    let ns: Vec<i32> = docs.iter().map(|d| d.get_i32("n").unwrap_or(-1)).collect();
    let expected: Vec<i32> = (0..250)
        .rev()
        .filter(|i| i % 5 == 2)
        .skip(3)
        .take(20)
        .collect();
    ensure!(ns == expected, "{ns:?} != {expected:?}");
    ensure!(
        docs.iter().all(|d| d.len() == 1),
        "projection kept extra fields: {docs:?}"
    );
    let all: Vec<Document> = c.find(doc! {}).batch_size(10).await?.try_collect().await?;
    ensure!(all.len() == 250);
    let tagged = c.count_documents(doc! {"tags": "t1"}).await?;
    ensure!(tagged == 83, "tags: t1 matched {tagged}");

    // updates with operators, upsert, multi.
    let r = c
        .update_one(doc! {"_id": 7}, doc! {"$set": {"x.y": 1}, "$inc": {"n": 10}, "$push": {"tags": {"$each": ["z"], "$slice": -2}}})
        .await?;
    ensure!(r.matched_count == 1 && r.modified_count == 1);
    let d = c.find_one(doc! {"_id": 7}).await?.unwrap_or_default();
    ensure!(d.get_i32("n")? == 17, "{d}");
    ensure!(d.get_document("x")?.get_i32("y")? == 1, "{d}");
    ensure!(d.get_array("tags")?.len() == 2, "{d}");
    let noop = c
        .update_one(doc! {"_id": 7}, doc! {"$set": {"n": 17}})
        .await?;
    ensure!(
        noop.matched_count == 1 && noop.modified_count == 0,
        "{noop:?}"
    );
    let up = c
        .update_one(
            doc! {"_id": 5000},
            doc! {"$set": {"n": 1}, "$setOnInsert": {"new": true}},
        )
        .upsert(true)
        .await?;
    ensure!(up.upserted_id == Some(Bson::Int32(5000)), "{up:?}");
    let many = c
        .update_many(doc! {"g": 0}, doc! {"$mul": {"n": 2}})
        .await?;
    ensure!(
        many.matched_count == 50 && many.modified_count == 49,
        "{many:?}"
    );
    let rep = c
        .replace_one(doc! {"_id": 8}, doc! {"replaced": true})
        .await?;
    ensure!(rep.modified_count == 1);
    let d = c.find_one(doc! {"_id": 8}).await?.unwrap_or_default();
    ensure!(d == doc! {"_id": 8, "replaced": true}, "{d}");

    // findAndModify.
    let before = c
        .find_one_and_update(doc! {"_id": 9}, doc! {"$set": {"f": 1}})
        .await?
        .unwrap_or_default();
    ensure!(!before.contains_key("f"));
    let after = c
        .find_one_and_update(doc! {"_id": 9}, doc! {"$inc": {"f": 1}})
        .return_document(ReturnDocument::After)
        .await?
        .unwrap_or_default();
    ensure!(after.get_i32("f")? == 2, "{after}");
    let removed = c.find_one_and_delete(doc! {"_id": 9}).await?;
    ensure!(removed.is_some());

    // count, distinct, aggregate.
    ensure!(
        c.estimated_document_count().await? == 250,
        "estimated count"
    );
    ensure!(c.count_documents(doc! {"g": 1}).await? == 50);
    let mut gs = c.distinct("g", doc! {}).await?;
    gs.sort_by_key(|b| b.as_i32());
    ensure!(
        gs == vec![
            Bson::Int32(0),
            Bson::Int32(1),
            Bson::Int32(2),
            Bson::Int32(3),
            Bson::Int32(4)
        ],
        "{gs:?}"
    );
    let groups: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"n": {"$lt": 100}}},
            doc! {"$unwind": "$tags"},
            doc! {"$match": {"tags": "a"}},
            doc! {"$group": {"_id": "$g", "count": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$skip": 1},
            doc! {"$limit": 3},
            doc! {"$project": {"count": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    ensure!(groups.len() == 3, "{groups:?}");
    ensure!(groups[0].get_i32("_id")? == 1, "{groups:?}");
    let counted: Vec<Document> = c
        .aggregate(vec![doc! {"$match": {"g": 3}}, doc! {"$count": "k"}])
        .await?
        .try_collect()
        .await?;
    // _id 8 (g: 3) was replaced by a document without `g` above.
    ensure!(counted == vec![doc! {"k": 49}], "{counted:?}");

    // deletes.
    ensure!(c.delete_one(doc! {"g": 4}).await?.deleted_count == 1);
    // _id 9 (g: 4) was deleted by findAndModify above.
    ensure!(c.delete_many(doc! {"g": 4}).await?.deleted_count == 48);
    ensure!(c.count_documents(doc! {"g": 4}).await? == 0);
    Ok(())
}

/// create/listCollections/indexes/collMod/rename/drop/dropDatabase.
pub async fn ddl(client: &Client, db_name: &str) -> Result<()> {
    let db = client.database(db_name);
    db.create_collection("a").await?;
    // MongoDB 7.0: creating it again with the same options succeeds, with others it fails.
    db.create_collection("a").await?;
    let err = db
        .run_command(doc! {"create": "a", "validator": {"x": {"$exists": true}}})
        .await
        .unwrap_err();
    ensure!(
        code_of(&err) == Some(48),
        "create with other options: {err}"
    );
    let c = db.collection::<Document>("a");
    c.insert_one(doc! {"k": 1}).await?;
    c.create_index(IndexModel::builder().keys(doc! {"k": 1}).build())
        .await?;
    let mut names = c.list_index_names().await?;
    names.sort();
    ensure!(
        names == vec!["_id_".to_string(), "k_1".to_string()],
        "{names:?}"
    );
    db.run_command(doc! {"collMod": "a", "validationLevel": "moderate"})
        .await?;
    c.drop_index("k_1").await?;
    ensure!(c.list_index_names().await? == vec!["_id_".to_string()]);
    client
        .database("admin")
        .run_command(
            doc! {"renameCollection": format!("{db_name}.a"), "to": format!("{db_name}.b")},
        )
        .await?;
    let mut colls = db.list_collection_names().await?;
    colls.sort();
    ensure!(colls == vec!["b".to_string()], "{colls:?}");
    ensure!(
        db.collection::<Document>("b")
            .count_documents(doc! {})
            .await?
            == 1
    );
    db.collection::<Document>("b").drop().await?;
    ensure!(db.list_collection_names().await?.is_empty());
    db.collection::<Document>("c").insert_one(doc! {}).await?;
    let dbs = client.list_database_names().await?;
    ensure!(dbs.contains(&db_name.to_string()), "{dbs:?}");
    db.drop().await?;
    let dbs = client.list_database_names().await?;
    ensure!(!dbs.contains(&db_name.to_string()), "{dbs:?}");
    Ok(())
}

/// Shards a collection by `key` and checks reads and writes through the router.
pub async fn sharded_crud(client: &Client, db_name: &str, key: Document) -> Result<()> {
    let admin = client.database("admin");
    admin.run_command(doc! {"enableSharding": db_name}).await?;
    let ns = format!("{db_name}.s");
    admin
        .run_command(doc! {"shardCollection": &ns, "key": key.clone()})
        .await?;
    // Sharding again with the same key is a no-op; another key is refused.
    admin
        .run_command(doc! {"shardCollection": &ns, "key": key})
        .await?;
    let err = admin
        .run_command(doc! {"shardCollection": &ns, "key": {"other": 1}})
        .await
        .unwrap_err();
    ensure!(code_of(&err) == Some(23), "{err}");
    let c = client.database(db_name).collection::<Document>("s");
    c.insert_many((0..300).map(|i| doc! {"_id": i, "sk": i, "v": i % 7}))
        .await?;
    ensure!(c.count_documents(doc! {}).await? == 300);
    let sorted: Vec<Document> = c
        .find(doc! {"v": 3})
        .sort(doc! {"_id": 1})
        .skip(2)
        .limit(5)
        .await?
        .try_collect()
        .await?;
    let ids: Vec<i32> = sorted
        .iter()
        .filter_map(|d| d.get_i32("_id").ok())
        .collect();
    let expected: Vec<i32> = (0..300).filter(|i| i % 7 == 3).skip(2).take(5).collect();
    ensure!(ids == expected, "{ids:?} != {expected:?}");
    let desc: Vec<Document> = c
        .find(doc! {})
        .sort(doc! {"sk": -1})
        .projection(doc! {"sk": 1})
        .batch_size(17)
        .await?
        .try_collect()
        .await?;
    ensure!(desc.len() == 300);
    ensure!(
        desc.windows(2)
            .all(|w| w[0].get_i32("sk").unwrap_or(0) > w[1].get_i32("sk").unwrap_or(0))
    );
    let one = c.find_one(doc! {"_id": 42, "sk": 42}).await?;
    ensure!(one.is_some_and(|d| d.get_i32("v").ok() == Some(0)));
    let r = c
        .update_many(doc! {"v": 1}, doc! {"$set": {"touched": true}})
        .await?;
    ensure!(r.modified_count == 43, "{r:?}");
    let r = c
        .update_one(doc! {"_id": 5, "sk": 5}, doc! {"$inc": {"v": 100}})
        .await?;
    ensure!(r.modified_count == 1);
    let r = c
        .update_one(doc! {"_id": 6}, doc! {"$inc": {"v": 100}})
        .await?;
    ensure!(
        r.modified_count == 1,
        "single update without the shard key: {r:?}"
    );
    ensure!(c.count_documents(doc! {"v": {"$gte": 100}}).await? == 2);
    let mut vs = c.distinct("v", doc! {"v": {"$lt": 7}}).await?;
    vs.sort_by_key(|b| b.as_i32());
    ensure!(vs.len() == 7, "{vs:?}");
    let agg: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"v": {"$lt": 7}}},
            doc! {"$group": {"_id": null, "total": {"$sum": "$v"}}},
        ])
        .await?
        .try_collect()
        .await?;
    ensure!(agg.len() == 1, "{agg:?}");
    ensure!(c.delete_many(doc! {"v": 2}).await?.deleted_count == 43);
    ensure!(c.count_documents(doc! {}).await? == 257);
    c.drop().await?;
    ensure!(c.count_documents(doc! {}).await? == 0);
    Ok(())
}

/// A retried write (same session and txnNumber) returns the first result and applies once.
pub async fn retryable_write_dedupe(client: &Client, db_name: &str) -> Result<()> {
    let db = client.database(db_name);
    // The driver may hand out a pooled server session that already ran retryable writes with
    // small txnNumbers; ours start far above them.
    let mut session = client.start_session().await?;
    let base = 1_000_000_i64;
    let insert = doc! {
        "insert": "r",
        "documents": [{"_id": 1}, {"_id": 2}],
        "txnNumber": base + 1,
    };
    let first = db.run_command(insert.clone()).session(&mut session).await?;
    let second = db.run_command(insert).session(&mut session).await?;
    ensure!(
        first.get_i32("n").ok() == second.get_i32("n").ok(),
        "{first} vs {second}"
    );
    ensure!(
        !second.contains_key("writeErrors"),
        "retry reported {second}"
    );
    let update = doc! {
        "update": "r",
        "updates": [{"q": {"_id": 1}, "u": {"$inc": {"x": 1}}}],
        "txnNumber": base + 2,
    };
    db.run_command(update.clone()).session(&mut session).await?;
    let again = db.run_command(update).session(&mut session).await?;
    let n_modified = again
        .get_i32("nModified")
        .map(i64::from)
        .or_else(|_| again.get_i64("nModified"));
    ensure!(
        n_modified.ok() == Some(1),
        "the retry did not return the first result: {again}"
    );
    let d = db
        .collection::<Document>("r")
        .find_one(doc! {"_id": 1})
        .await?
        .unwrap_or_default();
    ensure!(d.get_i32("x")? == 1, "update applied twice: {d}");
    ensure!(
        db.collection::<Document>("r")
            .count_documents(doc! {})
            .await?
            == 2
    );
    let stale = db
        .run_command(doc! {"insert": "r", "documents": [{"_id": 3}], "txnNumber": base + 1})
        .session(&mut session)
        .await
        .unwrap_err();
    ensure!(
        code_of(&stale) == Some(225),
        "an older txnNumber must be refused: {stale}"
    );
    Ok(())
}

/// Bad input gets MongoDB's error codes, and the connection keeps working.
pub async fn bad_input(client: &Client, db_name: &str) -> Result<()> {
    let db = client.database(db_name);
    let c = db.collection::<Document>("bad");
    let err = c.find(doc! {"a": {"$foo": 1}}).await.unwrap_err();
    ensure!(code_of(&err) == Some(2), "unknown query operator: {err}");
    let err = c
        .update_one(doc! {}, doc! {"$foo": {"a": 1}})
        .upsert(true)
        .await
        .unwrap_err();
    ensure!(
        format!("{err:?}").contains("9"),
        "unknown update operator: {err:?}"
    );
    let err = db
        .run_command(doc! {"find": "bad", "filter": 5})
        .await
        .unwrap_err();
    ensure!(code_of(&err) == Some(14), "wrong field type: {err}");
    // As MongoDB 5.0+: `$`-prefixed names are stored, except inside `_id` (InvalidIdField).
    let err = db
        .run_command(doc! {"insert": "bad", "documents": [{"_id": {"$x": 1}}]})
        .await;
    let text = match err {
        Ok(reply) => reply.to_string(),
        Err(e) => format!("{e:?}"),
    };
    ensure!(
        text.contains("53") && text.contains("$x"),
        "$-prefixed field in _id accepted: {text}"
    );
    let big = "x".repeat(16 * 1024 * 1024);
    let err = db
        .run_command(doc! {"insert": "bad", "documents": [{"big": big}]})
        .await;
    let text = match err {
        Ok(reply) => reply.to_string(),
        Err(e) => format!("{e:?}"),
    };
    ensure!(
        text.contains("10334"),
        "oversize document: {}",
        &text[..text.len().min(300)]
    );
    let err = c.aggregate(vec![doc! {"$nope": {}}]).await.unwrap_err();
    ensure!(code_of(&err) == Some(40324), "unknown stage: {err}");
    db.run_command(doc! {"ping": 1}).await?;
    Ok(())
}

/// The labels of a failed driver call.
fn has_label(e: &mongodb::error::Error, label: &str) -> bool {
    e.contains_label(label)
}

/// The `_id`s stored in `c`, sorted.
async fn stored_ids(c: &mongodb::Collection<Document>) -> Result<Vec<Bson>> {
    let mut ids: Vec<Bson> = c.distinct("_id", doc! {}).await?;
    ids.sort_by_key(|b| b.to_string());
    Ok(ids)
}

/// Multi-document transactions on one shard: a commit makes every write visible at once, an
/// abort leaves nothing, a transaction reads its own writes on a stable snapshot, and writes
/// that conflict fail with WriteConflict labelled TransientTransactionError.
pub async fn transactions(client: &Client, db_name: &str) -> Result<()> {
    let db = client.database(db_name);
    let c = db.collection::<Document>("txn");
    c.insert_one(doc! {"_id": "outside", "n": 0}).await?;

    // Commit: the writes are invisible outside until the commit, then all there.
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": "a", "n": 1})
        .session(&mut s)
        .await?;
    c.insert_one(doc! {"_id": "b", "n": 2})
        .session(&mut s)
        .await?;
    c.update_one(doc! {"_id": "outside"}, doc! {"$inc": {"n": 10}})
        .session(&mut s)
        .await?;
    let inside: Vec<Document> = c
        .find(doc! {})
        .session(&mut s)
        .await?
        .stream(&mut s)
        .try_collect()
        .await?;
    ensure!(
        inside.len() == 3,
        "the transaction reads its own writes: {inside:?}"
    );
    ensure!(
        stored_ids(&c).await? == vec![Bson::String("outside".into())],
        "nothing is visible outside before the commit"
    );
    s.commit_transaction().await?;
    s.commit_transaction().await?; // a retried commit answers the same
    ensure!(stored_ids(&c).await?.len() == 3, "committed");
    let outside = c
        .find_one(doc! {"_id": "outside"})
        .await?
        .unwrap_or_default();
    ensure!(outside.get_i32("n")? == 10, "{outside}");

    // Abort: nothing stays.
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": "aborted"})
        .session(&mut s)
        .await?;
    c.delete_one(doc! {"_id": "a"}).session(&mut s).await?;
    s.abort_transaction().await?;
    ensure!(
        stored_ids(&c).await?.len() == 3,
        "an aborted transaction leaves nothing"
    );

    // A stable snapshot: a write committed outside after the transaction's first read is not
    // seen by the transaction.
    s.start_transaction().await?;
    let before = c
        .find_one(doc! {"_id": "b"})
        .session(&mut s)
        .await?
        .unwrap_or_default();
    c.update_one(doc! {"_id": "b"}, doc! {"$set": {"n": 99}})
        .await?;
    let again = c
        .find_one(doc! {"_id": "b"})
        .session(&mut s)
        .await?
        .unwrap_or_default();
    ensure!(before == again, "snapshot moved: {before} then {again}");
    // ... and writing that document now conflicts.
    let err = c
        .update_one(doc! {"_id": "b"}, doc! {"$set": {"n": 3}})
        .session(&mut s)
        .await
        .expect_err("a write to a document changed since the snapshot must conflict");
    ensure!(code_of(&err) == Some(112), "write conflict: {err}");
    ensure!(has_label(&err, "TransientTransactionError"), "{err}");
    let err = s
        .commit_transaction()
        .await
        .expect_err("the conflict aborted the transaction");
    ensure!(code_of(&err) == Some(251), "commit after a conflict: {err}");

    // Two transactions writing one document: the second writer conflicts at once.
    let mut s2 = client.start_session().await?;
    s.start_transaction().await?;
    s2.start_transaction().await?;
    c.update_one(doc! {"_id": "a"}, doc! {"$set": {"by": 1}})
        .session(&mut s)
        .await?;
    let err = c
        .update_one(doc! {"_id": "a"}, doc! {"$set": {"by": 2}})
        .session(&mut s2)
        .await
        .expect_err("the second transaction's write must conflict");
    ensure!(code_of(&err) == Some(112), "{err}");
    ensure!(has_label(&err, "TransientTransactionError"), "{err}");
    let _ = s2.abort_transaction().await;
    s.commit_transaction().await?;

    // A write outside any transaction never waits: the transaction fails its commit instead.
    s.start_transaction().await?;
    c.update_one(doc! {"_id": "a"}, doc! {"$set": {"by": 3}})
        .session(&mut s)
        .await?;
    c.update_one(doc! {"_id": "a"}, doc! {"$set": {"by": 4}})
        .await?;
    let err = s
        .commit_transaction()
        .await
        .expect_err("the commit must conflict");
    ensure!(code_of(&err) == Some(112), "{err}");
    ensure!(has_label(&err, "TransientTransactionError"), "{err}");
    let a = c.find_one(doc! {"_id": "a"}).await?.unwrap_or_default();
    ensure!(a.get_i32("by")? == 4, "{a}");

    // A command continuing a transaction nobody started, and a commit of one, are refused.
    let err = db
        .run_command(doc! {"find": "txn", "lsid": {"id": mongodb::bson::Uuid::new()}, "txnNumber": 1_i64, "autocommit": false})
        .await
        .expect_err("a statement of a transaction nobody started");
    ensure!(code_of(&err) == Some(251), "autocommit false: {err}");
    let err = client
        .database("admin")
        .run_command(doc! {"commitTransaction": 1, "lsid": {"id": mongodb::bson::Uuid::new()}, "txnNumber": 1_i64, "autocommit": false})
        .await
        .expect_err("a commit of a transaction nobody started");
    ensure!(code_of(&err) == Some(251), "commitTransaction: {err}");
    Ok(())
}

/// A transaction over a hashed collection spread on every shard: its two-phase commit makes
/// every write visible at once; its abort leaves nothing.
pub async fn cross_shard_transaction(client: &Client, db_name: &str) -> Result<()> {
    let ns = format!("{db_name}.spread");
    crate::shard_collection(client, &ns, doc! {"_id": "hashed"}).await?;
    let c = client.database(db_name).collection::<Document>("spread");
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    for i in 0..20 {
        c.insert_one(doc! {"_id": i, "n": i})
            .session(&mut s)
            .await?;
    }
    ensure!(
        c.count_documents(doc! {}).await? == 0,
        "visible before the commit"
    );
    s.commit_transaction().await?;
    ensure!(
        c.count_documents(doc! {}).await? == 20,
        "committed on every shard"
    );
    s.start_transaction().await?;
    c.delete_many(doc! {}).session(&mut s).await?;
    s.abort_transaction().await?;
    ensure!(
        c.count_documents(doc! {}).await? == 20,
        "an abort leaves everything"
    );
    Ok(())
}
