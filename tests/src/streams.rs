//! Change-stream scenarios with the real driver's `watch()`, shared by the embedded and the
//! multi-process tests.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::{Client, Collection};

use crate::scenarios::code_of;

/// How long a test waits for one event before calling the stream stuck.
pub const EVENT_WAIT: Duration = Duration::from_secs(15);

/// The next event, or an error if none comes within [`EVENT_WAIT`].
pub async fn next_event(stream: &mut ChangeStream<Document>) -> Result<Document> {
    tokio::time::timeout(EVENT_WAIT, stream.next())
        .await
        .context("no event within the wait")?
        .context("the stream ended")?
        .context("the stream failed")
}

/// `n` events.
pub async fn next_events(stream: &mut ChangeStream<Document>, n: usize) -> Result<Vec<Document>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next_event(stream).await?);
    }
    Ok(out)
}

pub fn token_of(event: &Document) -> Result<ResumeToken> {
    let id = event.get("_id").cloned().context("event without _id")?;
    Ok(mongodb::bson::deserialize_from_bson(id)?)
}

pub fn op_type(event: &Document) -> &str {
    event.get_str("operationType").unwrap_or("?")
}

fn token_data(event: &Document) -> String {
    event
        .get_document("_id")
        .and_then(|t| t.get_str("_data"))
        .unwrap_or("")
        .to_string()
}

/// A collection stream sees every CRUD event with MongoDB's fields, and `updateLookup` fills
/// `fullDocument` with the document as it is at or after the update.
pub async fn crud_events(client: &Client, db: &str) -> Result<()> {
    let coll: Collection<Document> = client.database(db).collection("c");
    coll.insert_one(doc! {"_id": 0}).await?;
    let mut stream = coll
        .watch()
        .full_document(mongodb::options::FullDocumentType::UpdateLookup)
        .await?
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1, "a": 1, "arr": ["foo", {"a": "bar"}, 1, 2, 3]})
        .await?;
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"a": 2, "n.x": 1}, "$unset": {"zz": 1}},
    )
    .await?;
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$unset": {"a": 1}, "$pop": {"arr": 1}},
    )
    .await?;
    // A pipeline update that shrinks an array is logged as a truncation.
    coll.update_one(
        doc! {"_id": 1},
        vec![doc! {"$set": {"arr": ["foo", {"a": "bar"}]}}],
    )
    .await?;
    coll.replace_one(doc! {"_id": 1}, doc! {"b": 1}).await?;
    coll.delete_one(doc! {"_id": 1}).await?;
    let events = next_events(&mut stream, 6).await?;
    let kinds: Vec<&str> = events.iter().map(op_type).collect();
    ensure!(
        kinds == ["insert", "update", "update", "update", "replace", "delete"],
        "{kinds:?}"
    );
    let insert = &events[0];
    ensure!(
        insert.get_document("ns")? == &doc! {"db": db, "coll": "c"},
        "{insert}"
    );
    ensure!(
        insert.get_document("documentKey")? == &doc! {"_id": 1},
        "{insert}"
    );
    ensure!(
        insert.get_document("fullDocument")?
            == &doc! {"_id": 1, "a": 1, "arr": ["foo", {"a": "bar"}, 1, 2, 3]},
        "{insert}"
    );
    ensure!(
        matches!(insert.get("clusterTime"), Some(Bson::Timestamp(_))),
        "{insert}"
    );
    ensure!(
        matches!(insert.get("wallTime"), Some(Bson::DateTime(_))),
        "{insert}"
    );
    let description = |i: usize| events[i].get_document("updateDescription").cloned();
    ensure!(
        description(1)?
            == doc! {"updatedFields": {"a": 2, "n": {"x": 1}}, "removedFields": [], "truncatedArrays": []},
        "{}",
        events[1]
    );
    // updateLookup returns the document as the shard finds it when it makes the event: this
    // update's result or a later version, or null once it is deleted; never an earlier one.
    let versions = [
        Bson::Document(
            doc! {"_id": 1, "a": 2, "arr": ["foo", {"a": "bar"}, 1, 2, 3], "n": {"x": 1}},
        ),
        Bson::Document(doc! {"_id": 1, "arr": ["foo", {"a": "bar"}, 1, 2], "n": {"x": 1}}),
        Bson::Document(doc! {"_id": 1, "arr": ["foo", {"a": "bar"}], "n": {"x": 1}}),
        Bson::Document(doc! {"_id": 1, "b": 1}),
        Bson::Null,
    ];
    for (i, event) in events.iter().enumerate().take(4).skip(1) {
        let found = event.get("fullDocument");
        ensure!(
            found.is_some_and(|d| versions[i - 1..].contains(d)),
            "event {i}: {event}"
        );
    }
    // $pop logs the whole new array, as MongoDB does.
    ensure!(
        description(2)?
            == doc! {"updatedFields": {"arr": ["foo", {"a": "bar"}, 1, 2]}, "removedFields": ["a"], "truncatedArrays": []},
        "{}",
        events[2]
    );
    ensure!(
        description(3)?
            == doc! {"updatedFields": {}, "removedFields": [], "truncatedArrays": [{"field": "arr", "newSize": 2}]},
        "{}",
        events[3]
    );
    ensure!(
        events[4].get_document("fullDocument")? == &doc! {"_id": 1, "b": 1},
        "{}",
        events[4]
    );
    ensure!(
        events[5].get_document("documentKey")? == &doc! {"_id": 1},
        "{}",
        events[5]
    );
    ensure!(!events[5].contains_key("fullDocument"), "{}", events[5]);
    // Tokens strictly increase.
    let tokens: Vec<String> = events.iter().map(token_data).collect();
    ensure!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    Ok(())
}

/// `updateLookup` while the document still exists returns it.
pub async fn update_lookup_finds_current_document(client: &Client, db: &str) -> Result<()> {
    let coll: Collection<Document> = client.database(db).collection("lookup");
    let mut stream = coll
        .watch()
        .full_document(mongodb::options::FullDocumentType::UpdateLookup)
        .await?
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1, "v": 1}).await?;
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"v": 1}})
        .await?;
    let events = next_events(&mut stream, 2).await?;
    ensure!(
        events[1].get_document("fullDocument")? == &doc! {"_id": 1, "v": 2},
        "{}",
        events[1]
    );
    Ok(())
}

/// Drop and rename invalidate a collection stream; `startAfter` the invalidate continues;
/// `resumeAfter` it is refused with 260.
pub async fn invalidate_and_start_after(client: &Client, db: &str) -> Result<()> {
    let database = client.database(db);
    let coll: Collection<Document> = database.collection("inv");
    coll.insert_one(doc! {"_id": 0}).await?;
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await?;
    coll.drop().await?;
    let events = next_events(&mut stream, 3).await?;
    let kinds: Vec<&str> = events.iter().map(op_type).collect();
    ensure!(kinds == ["insert", "drop", "invalidate"], "{kinds:?}");
    let invalidate = token_of(&events[2])?;
    ensure!(
        tokio::time::timeout(EVENT_WAIT, stream.next())
            .await?
            .is_none(),
        "an invalidated stream must end"
    );
    coll.insert_one(doc! {"_id": 2}).await?;
    let mut after = coll
        .watch()
        .start_after(invalidate.clone())
        .await?
        .with_type::<Document>();
    let e = next_event(&mut after).await?;
    ensure!(
        op_type(&e) == "insert" && e.get_document("documentKey")? == &doc! {"_id": 2},
        "{e}"
    );
    let err = coll
        .watch()
        .resume_after(invalidate)
        .await
        .err()
        .context("resumeAfter an invalidate")?;
    ensure!(code_of(&err) == Some(260), "{err}");

    // A rename invalidates a stream on the source.
    let src: Collection<Document> = database.collection("src");
    src.insert_one(doc! {"_id": 1}).await?;
    let mut stream = src.watch().await?.with_type::<Document>();
    client
        .database("admin")
        .run_command(doc! {"renameCollection": format!("{db}.src"), "to": format!("{db}.dst")})
        .await?;
    let events = next_events(&mut stream, 2).await?;
    ensure!(op_type(&events[0]) == "rename", "{}", events[0]);
    ensure!(
        events[0].get_document("to")? == &doc! {"db": db, "coll": "dst"},
        "{}",
        events[0]
    );
    ensure!(op_type(&events[1]) == "invalidate", "{}", events[1]);
    Ok(())
}

/// Database and cluster streams see several collections, ordered by cluster time, and a
/// database stream ends with `dropDatabase` then `invalidate`.
pub async fn database_and_cluster_streams(client: &Client, db: &str) -> Result<()> {
    let database = client.database(db);
    database
        .collection::<Document>("a")
        .insert_one(doc! {"_id": 0})
        .await?;
    let mut db_stream = database.watch().await?.with_type::<Document>();
    let mut cluster_stream = client.watch().await?.with_type::<Document>();
    database
        .collection::<Document>("a")
        .insert_one(doc! {"_id": 1})
        .await?;
    database
        .collection::<Document>("b")
        .insert_one(doc! {"_id": 2})
        .await?;
    database
        .collection::<Document>("a")
        .insert_one(doc! {"_id": 3})
        .await?;
    for stream in [&mut db_stream, &mut cluster_stream] {
        let events = next_events(stream, 3).await?;
        let seen: Vec<(String, Bson)> = events
            .iter()
            .map(|e| {
                let coll = e
                    .get_document("ns")
                    .and_then(|n| n.get_str("coll"))
                    .unwrap_or("")
                    .to_string();
                let id = e
                    .get_document("documentKey")
                    .ok()
                    .and_then(|k| k.get("_id").cloned())
                    .unwrap_or(Bson::Null);
                (coll, id)
            })
            .collect();
        ensure!(
            seen == vec![
                ("a".into(), Bson::Int32(1)),
                ("b".into(), Bson::Int32(2)),
                ("a".into(), Bson::Int32(3))
            ],
            "{seen:?}"
        );
    }
    database.drop().await?;
    let mut kinds = Vec::new();
    loop {
        let e = next_event(&mut db_stream).await?;
        kinds.push(op_type(&e).to_string());
        if op_type(&e) == "invalidate" {
            break;
        }
    }
    ensure!(
        kinds.iter().filter(|k| *k == "drop").count() == 2,
        "{kinds:?}"
    );
    ensure!(
        kinds[kinds.len() - 2..] == ["dropDatabase".to_string(), "invalidate".to_string()],
        "{kinds:?}"
    );
    Ok(())
}

/// Writes to a hashed collection land on every shard; the merged stream has them all, once,
/// in token order (and so in cluster-time order).
pub async fn merged_in_cluster_time_order(client: &Client, db: &str) -> Result<Vec<Document>> {
    crate::shard_collection(client, &format!("{db}.h"), doc! {"_id": "hashed"}).await?;
    let coll: Collection<Document> = client.database(db).collection("h");
    let mut stream = coll.watch().await?.with_type::<Document>();
    let n = 60;
    let mut writers = Vec::new();
    for w in 0..3 {
        let coll = coll.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..n / 3 {
                coll.insert_one(doc! {"_id": w * 1000 + i, "w": w}).await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in writers {
        w.await??;
    }
    coll.update_many(doc! {"w": 1}, doc! {"$set": {"touched": true}})
        .await?;
    let events = next_events(&mut stream, n as usize + (n as usize / 3)).await?;
    let tokens: Vec<String> = events.iter().map(token_data).collect();
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing"
    );
    let times: Vec<(u32, u32)> = events
        .iter()
        .map(|e| match e.get("clusterTime") {
            Some(Bson::Timestamp(t)) => (t.time, t.increment),
            _ => (0, 0),
        })
        .collect();
    ensure!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "clusterTime went backwards: {times:?}"
    );
    let mut ids: Vec<i32> = events
        .iter()
        .filter(|e| op_type(e) == "insert")
        .filter_map(|e| e.get_document("documentKey").ok()?.get_i32("_id").ok())
        .collect();
    ids.sort();
    ids.dedup();
    ensure!(
        ids.len() == n as usize,
        "expected {n} distinct inserts, got {}",
        ids.len()
    );
    Ok(events)
}

/// Resuming from any token of a recorded stream yields exactly the suffix after it.
pub async fn resume_from_every_token(
    client: &Client,
    db: &str,
    recorded: &[Document],
) -> Result<()> {
    let coll: Collection<Document> = client.database(db).collection("h");
    for (i, event) in recorded.iter().enumerate() {
        let token = token_of(event)?;
        let mut resumed = coll
            .watch()
            .resume_after(token)
            .await?
            .with_type::<Document>();
        let rest = next_events(&mut resumed, recorded.len() - i - 1).await?;
        ensure!(
            rest == recorded[i + 1..],
            "the suffix after event {i} differs"
        );
    }
    // startAtOperationTime is inclusive: from the first event's time, the whole stream again.
    if let Some(Bson::Timestamp(t)) = recorded.first().and_then(|e| e.get("clusterTime")) {
        let mut from = coll
            .watch()
            .start_at_operation_time(*t)
            .await?
            .with_type::<Document>();
        let all = next_events(&mut from, recorded.len()).await?;
        ensure!(
            all == recorded,
            "startAtOperationTime did not replay the stream"
        );
    }
    Ok(())
}

/// With no writes, the post-batch resume token still advances, so resuming from it is "now".
pub async fn idle_token_advances(client: &Client, db: &str) -> Result<()> {
    let coll: Collection<Document> = client.database(db).collection("idle");
    let mut stream = coll.watch().await?.with_type::<Document>();
    ensure!(stream.next_if_any().await?.is_none());
    let first = stream.resume_token().context("a token before any event")?;
    let data = |t: &ResumeToken| -> Result<String> {
        let b = mongodb::bson::serialize_to_bson(t)?;
        Ok(b.as_document()
            .and_then(|d| d.get_str("_data").ok())
            .unwrap_or("")
            .to_string())
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Idle getMores until it has moved: on a loaded machine a shard's newer promise may miss
    // the first of them, but it must come.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let later = loop {
        ensure!(stream.next_if_any().await?.is_none());
        let later = stream
            .resume_token()
            .context("a token after an idle getMore")?;
        if data(&later)? > data(&first)? || tokio::time::Instant::now() >= deadline {
            break later;
        }
    };
    ensure!(
        data(&later)? > data(&first)?,
        "the idle token did not advance within 10 s"
    );
    coll.insert_one(doc! {"_id": "after"}).await?;
    let mut resumed = coll
        .watch()
        .resume_after(later)
        .await?
        .with_type::<Document>();
    let e = next_event(&mut resumed).await?;
    ensure!(
        e.get_document("documentKey")? == &doc! {"_id": "after"},
        "{e}"
    );
    Ok(())
}

/// Errors with MongoDB's codes: a pipeline that is not allowed, a token that is not found,
/// and a stage that changes `_id`.
pub async fn error_codes(client: &Client, db: &str) -> Result<()> {
    let coll: Collection<Document> = client.database(db).collection("err");
    coll.insert_one(doc! {"_id": 1}).await?;
    let err = coll
        .watch()
        .pipeline([doc! {"$group": {"_id": 1}}])
        .await
        .err()
        .context("$group allowed")?;
    ensure!(code_of(&err) == Some(20), "{err}");
    let err = coll
        .watch()
        .pipeline([doc! {"$unsupported": "foo"}])
        .await
        .err()
        .context("unknown stage")?;
    ensure!(code_of(&err) == Some(40324), "{err}");
    let err = client
        .database(db)
        .run_command(doc! {"aggregate": "err", "pipeline": [{"$match": {}}, {"$changeStream": {}}], "cursor": {}})
        .await
        .err()
        .context("$changeStream second")?;
    ensure!(code_of(&err) == Some(40602), "{err}");
    let mut stream = coll
        .watch()
        .pipeline([doc! {"$project": {"_id": 0}}])
        .await?
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 2}).await?;
    let err = tokio::time::timeout(EVENT_WAIT, stream.next())
        .await?
        .context("stream ended")?
        .err()
        .context("an event without _id was returned")?;
    ensure!(code_of(&err) == Some(280), "{err}");
    ensure!(err.contains_label("NonResumableChangeStreamError"), "{err}");
    // A token from another collection's stream is not found in this one.
    let other: Collection<Document> = client.database(db).collection("other");
    let mut s = other.watch().await?.with_type::<Document>();
    other.insert_one(doc! {"_id": 1}).await?;
    let foreign = token_of(&next_event(&mut s).await?)?;
    coll.insert_one(doc! {"_id": 3}).await?;
    // The aggregate itself may already pass the token; else the first getMore does.
    let err = match coll.watch().resume_after(foreign).await {
        Err(e) => e,
        Ok(stream) => {
            let mut resumed = stream.with_type::<Document>();
            tokio::time::timeout(EVENT_WAIT, resumed.next())
                .await?
                .context("stream ended")?
                .err()
                .context("a foreign token resumed")?
        }
    };
    ensure!(code_of(&err) == Some(280), "{err}");
    Ok(())
}

/// `showExpandedEvents` shows DDL: create, createIndexes, dropIndexes, modify, shardCollection.
pub async fn expanded_events(client: &Client, db: &str) -> Result<()> {
    let database = client.database(db);
    let mut stream = database
        .watch()
        .show_expanded_events(true)
        .await?
        .with_type::<Document>();
    database.create_collection("x").await?;
    let x: Collection<Document> = database.collection("x");
    x.create_index(mongodb::IndexModel::builder().keys(doc! {"k": 1}).build())
        .await?;
    x.drop_index("k_1").await?;
    database
        .run_command(doc! {"collMod": "x", "validationLevel": "moderate"})
        .await?;
    client
        .database("admin")
        .run_command(doc! {"shardCollection": format!("{db}.y"), "key": {"_id": 1}})
        .await?;
    let events = next_events(&mut stream, 6).await?;
    let kinds: Vec<&str> = events.iter().map(op_type).collect();
    // One `create` for `y`, from its primary shard, though every shard creates it.
    ensure!(
        kinds
            == [
                "create",
                "createIndexes",
                "dropIndexes",
                "modify",
                "create",
                "shardCollection"
            ],
        "{kinds:?}"
    );
    ensure!(
        events.iter().all(|e| e.contains_key("collectionUUID")),
        "{events:?}"
    );
    ensure!(
        events[1]
            .get_document("operationDescription")?
            .contains_key("indexes"),
        "{}",
        events[1]
    );
    Ok(())
}

/// Causality across shards: a write acknowledged on one shard before a write is sent to another
/// has the smaller cluster time, so a cluster stream shows sequential writes to databases on
/// different shards in the order they were made.
pub async fn sequential_writes_across_shards_keep_their_order(client: &Client) -> Result<()> {
    let dbs = ["causal_a", "causal_b", "causal_c"];
    for db in dbs {
        client
            .database(db)
            .collection::<Document>("c")
            .insert_one(doc! {"_id": -1})
            .await?;
    }
    let primaries: Vec<String> = {
        let mut out = Vec::new();
        for db in dbs {
            let entry = client
                .database("config")
                .collection::<Document>("databases")
                .find_one(doc! {"_id": db})
                .await?
                .context("database entry")?;
            out.push(entry.get_str("primary")?.to_string());
        }
        out
    };
    let mut distinct = primaries.clone();
    distinct.sort();
    distinct.dedup();
    ensure!(
        distinct.len() > 1,
        "the databases share one primary: {primaries:?}"
    );
    let mut stream = client.watch().await?.with_type::<Document>();
    let mut written = Vec::new();
    for i in 0..30 {
        let db = dbs[i % dbs.len()];
        client
            .database(db)
            .collection::<Document>("c")
            .insert_one(doc! {"_id": i as i32})
            .await?;
        written.push((db.to_string(), i as i32));
    }
    let events = next_events(&mut stream, written.len()).await?;
    let seen: Vec<(String, i32)> = events
        .iter()
        .map(|e| {
            let db = e
                .get_document("ns")
                .and_then(|n| n.get_str("db"))
                .unwrap_or("")
                .to_string();
            let id = e
                .get_document("documentKey")
                .and_then(|k| k.get_i32("_id"))
                .unwrap_or(-2);
            (db, id)
        })
        .collect();
    ensure!(
        seen == written,
        "cluster stream order differs from write order: {seen:?}"
    );
    let times: Vec<(u32, u32)> = events
        .iter()
        .filter_map(|e| match e.get("clusterTime") {
            Some(Bson::Timestamp(t)) => Some((t.time, t.increment)),
            _ => None,
        })
        .collect();
    ensure!(
        times.windows(2).all(|w| w[0] < w[1]),
        "cluster times not increasing: {times:?}"
    );
    Ok(())
}
