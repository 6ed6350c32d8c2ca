//! Pre- and post-images through the router with the Rust driver (reference §7): a collection
//! with `changeStreamPreAndPostImages` keeps each update's, replace's and delete's pre-image in
//! the write's own commit, and streams with `fullDocumentBeforeChange` / `fullDocument:
//! whenAvailable | required` get the exact documents before and after each event, on a hashed
//! collection spread over three shards, in and out of (cross-shard) transactions.

use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType};
use tests::EmbeddedCluster;
use tests::scenarios::{code_of, code_of_any};
use tests::streams::next_event as next;

/// Creates `db.name` recording pre-images (`changeStreamPreAndPostImages: {enabled: true}`).
async fn create_recording(db: &mongodb::Database, name: &str) -> anyhow::Result<()> {
    db.run_command(doc! {"create": name, "changeStreamPreAndPostImages": {"enabled": true}})
        .await?;
    Ok(())
}

/// A stream on `c` with these images, ending with `$changeStreamSplitLargeEvent` when `split`.
async fn watch_large(
    c: &mongodb::Collection<Document>,
    split: bool,
    after: FullDocumentType,
    before: Option<FullDocumentBeforeChangeType>,
) -> anyhow::Result<mongodb::change_stream::ChangeStream<Document>> {
    let pipeline = if split {
        vec![doc! {"$changeStreamSplitLargeEvent": {}}]
    } else {
        Vec::new()
    };
    Ok(c.watch()
        .pipeline(pipeline)
        .full_document(after)
        .full_document_before_change(before.unwrap_or(FullDocumentBeforeChangeType::Off))
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>())
}

/// The next two events of `stream`, checked to be fragments 1 and 2 of one split event.
async fn two_fragments(
    stream: &mut mongodb::change_stream::ChangeStream<Document>,
) -> anyhow::Result<(Document, Document)> {
    let first = next(stream).await?;
    let second = next(stream).await?;
    assert_eq!(
        first.get_document("splitEvent")?,
        &doc! {"fragment": 1, "of": 2}
    );
    assert_eq!(
        second.get_document("splitEvent")?,
        &doc! {"fragment": 2, "of": 2}
    );
    Ok((first, second))
}

/// An expected event: its type, and its document before and after.
type Expected = (&'static str, Option<Document>, Option<Document>);

fn image(event: &Document, field: &str) -> Option<Document> {
    event.get_document(field).ok().cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_image_mode_gets_the_exact_documents_around_each_event() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(3).await?;
    let client = cluster.client().await?;
    let db = client.database("images");
    db.create_collection("on")
        .change_stream_pre_and_post_images(
            mongodb::options::ChangeStreamPreAndPostImages::builder()
                .enabled(true)
                .build(),
        )
        .await?;
    tests::shard_collection(&client, "images.on", doc! {"_id": "hashed"}).await?;
    let on = db.collection::<Document>("on");
    let docs: Vec<Document> = (0..6)
        .map(|i| doc! {"_id": i, "n": i, "tags": [i]})
        .collect();
    on.insert_many(docs).await?;

    let watch = |before: Option<FullDocumentBeforeChangeType>, after: Option<FullDocumentType>| {
        let on = on.clone();
        async move {
            let mut w = on.watch().max_await_time(Duration::from_millis(200));
            if let Some(b) = before {
                w = w.full_document_before_change(b);
            }
            if let Some(a) = after {
                w = w.full_document(a);
            }
            anyhow::Ok(w.await?.with_type::<Document>())
        }
    };
    let mut required = watch(
        Some(FullDocumentBeforeChangeType::Required),
        Some(FullDocumentType::Required),
    )
    .await?;
    let mut when_available = watch(
        Some(FullDocumentBeforeChangeType::WhenAvailable),
        Some(FullDocumentType::WhenAvailable),
    )
    .await?;
    let mut plain = watch(None, None).await?;

    // Outside transactions: an update on every shard, a replace, a delete.
    for i in 0..6 {
        on.update_one(
            doc! {"_id": i},
            doc! {"$inc": {"n": 10}, "$push": {"tags": "x"}},
        )
        .await?;
    }
    on.replace_one(doc! {"_id": 0}, doc! {"_id": 0, "replaced": true})
        .await?;
    on.delete_one(doc! {"_id": 1}).await?;
    // A transaction across shards (a two-phase commit: the pre-images ride with the prepared
    // transaction until its commit): an update, a delete.
    let mut holders = 0;
    for shard in cluster.shards() {
        let r = shard
            .run_command(doc! {"find": "on", "filter": {"_id": {"$in": [2, 3]}}, "$db": "images"})
            .await;
        let n = r.get_document("cursor")?.get_array("firstBatch")?.len();
        holders += usize::from(n > 0);
    }
    assert_eq!(holders, 2, "the transaction's documents are on two shards");
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    on.update_one(doc! {"_id": 2}, doc! {"$set": {"in_txn": 1}})
        .session(&mut s)
        .await?;
    on.delete_one(doc! {"_id": 3}).session(&mut s).await?;
    s.commit_transaction().await?;

    let after_update =
        |i: i32| doc! {"_id": i, "n": i + 10, "tags": [Bson::Int32(i), Bson::String("x".into())]};
    let mut expected: Vec<Expected> = (0..6)
        .map(|i| {
            (
                "update",
                Some(doc! {"_id": i, "n": i, "tags": [i]}),
                Some(after_update(i)),
            )
        })
        .collect();
    expected.push((
        "replace",
        Some(after_update(0)),
        Some(doc! {"_id": 0, "replaced": true}),
    ));
    expected.push(("delete", Some(after_update(1)), None));
    let mut in_txn = after_update(2);
    in_txn.insert("in_txn", 1);
    expected.push(("update", Some(after_update(2)), Some(in_txn)));
    expected.push(("delete", Some(after_update(3)), None));

    // Events of different shards interleave by cluster time: compare by document key.
    let mut seen_required = Vec::new();
    let mut seen_available = Vec::new();
    for _ in 0..expected.len() {
        seen_required.push(next(&mut required).await?);
        seen_available.push(next(&mut when_available).await?);
        let p = next(&mut plain).await?;
        assert!(
            !p.contains_key("fullDocumentBeforeChange"),
            "no image unless asked: {p}"
        );
        if p.get_str("operationType")? == "update" {
            assert!(!p.contains_key("fullDocument"), "{p}");
        }
    }
    // Each event, matched exactly. Events of different shards interleave by cluster time;
    // those of one document come in its order.
    for seen in [&seen_required, &seen_available] {
        let mut by_id: std::collections::BTreeMap<String, Vec<&Document>> = Default::default();
        for e in seen {
            let id = e
                .get_document("documentKey")?
                .get("_id")
                .cloned()
                .unwrap_or(Bson::Null);
            by_id.entry(id.to_string()).or_default().push(e);
        }
        let mut want: std::collections::BTreeMap<String, Vec<&Expected>> = Default::default();
        for x in &expected {
            let id =
                x.1.as_ref()
                    .and_then(|b| b.get("_id").cloned())
                    .unwrap_or(Bson::Null);
            want.entry(id.to_string()).or_default().push(x);
        }
        assert_eq!(by_id.len(), want.len());
        for (id, events) in &by_id {
            let wanted = &want[id];
            assert_eq!(events.len(), wanted.len(), "events of {id}");
            for (e, (kind, before, after)) in events.iter().zip(wanted.iter().copied()) {
                assert_eq!(e.get_str("operationType")?, *kind, "{e}");
                assert_eq!(image(e, "fullDocumentBeforeChange"), *before, "before: {e}");
                if *kind != "delete" {
                    assert_eq!(image(e, "fullDocument"), *after, "after: {e}");
                }
            }
        }
    }
    cluster.stop().await;
    Ok(())
}

/// A collection without the option has no pre-images: `whenAvailable` answers `null`, and
/// `required` fails the stream with `NoMatchingDocument` (47). The option shows in
/// `listCollections`, is refused on `admin` and `config`, and can be turned on with `collMod`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pre_images_when_available_is_null_and_required_fails() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("images");
    let off = db.collection::<Document>("off");
    off.insert_one(doc! {"_id": 1, "n": 1}).await?;
    let mut available = off
        .watch()
        .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
        .full_document(FullDocumentType::WhenAvailable)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let mut required = off
        .watch()
        .full_document_before_change(FullDocumentBeforeChangeType::Required)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    off.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 2}})
        .await?;
    let e = next(&mut available).await?;
    assert_eq!(e.get("fullDocumentBeforeChange"), Some(&Bson::Null), "{e}");
    assert_eq!(e.get("fullDocument"), Some(&Bson::Null), "{e}");
    let err = next(&mut required).await.expect_err("no pre-image");
    let code = code_of_any(&err);
    assert_eq!(code, Some(47), "{err}");

    // collMod turns it on: the next update has its images.
    db.run_command(doc! {"collMod": "off", "changeStreamPreAndPostImages": {"enabled": true}})
        .await?;
    let listed = db
        .run_command(doc! {"listCollections": 1, "filter": {"name": "off"}})
        .await?;
    let options = listed.get_document("cursor")?.get_array("firstBatch")?[0]
        .as_document()
        .and_then(|c| c.get_document("options").ok())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        options.get_document("changeStreamPreAndPostImages")?,
        &doc! {"enabled": true}
    );
    off.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 3}})
        .await?;
    let e = next(&mut available).await?;
    assert_eq!(
        image(&e, "fullDocumentBeforeChange"),
        Some(doc! {"_id": 1, "n": 2})
    );
    assert_eq!(image(&e, "fullDocument"), Some(doc! {"_id": 1, "n": 3}));

    for bad in ["admin", "config"] {
        let r = client
            .database(bad)
            .run_command(doc! {"create": "x", "changeStreamPreAndPostImages": {"enabled": true}})
            .await
            .expect_err("refused");
        assert!(code_of(&r) == Some(72), "{r}");
    }
    let r = db
        .run_command(doc! {"create": "y", "changeStreamPreAndPostImages": true})
        .await
        .expect_err("not a document");
    assert_eq!(code_of(&r), Some(14));
    cluster.stop().await;
    Ok(())
}

/// Expiry (reference §7): `changeStreamOptions.preAndPostImages.expireAfterSeconds` through
/// `setClusterParameter` / `getClusterParameter`; the purge (run now through the shard's test
/// hook, as it runs every 10 s) removes pre-images past that age, and those of entries the
/// oplog no longer has, and a stream reading such an event then gets `null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_pre_images_are_purged() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let admin = client.database("admin");
    let db = client.database("images");
    create_recording(&db, "exp").await?;
    let c = db.collection::<Document>("exp");
    let expire_after = |reply: Document| -> anyhow::Result<Bson> {
        let p = reply.get_array("clusterParameters")?[0]
            .as_document()
            .cloned()
            .unwrap_or_default();
        Ok(p.get_document("preAndPostImages")?
            .get("expireAfterSeconds")
            .cloned()
            .unwrap_or(Bson::Null))
    };
    let get = doc! {"getClusterParameter": "changeStreamOptions"};
    assert_eq!(
        expire_after(admin.run_command(get.clone()).await?)?,
        Bson::String("off".into())
    );
    let set = |v: Bson| {
        doc! {"setClusterParameter": {"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": v}}}}
    };
    for (bad, code) in [(Bson::Int32(0), 2), (Bson::String("soon".into()), 2)] {
        let e = admin.run_command(set(bad)).await.expect_err("refused");
        assert_eq!(code_of(&e), Some(code), "{e}");
    }
    let e = admin
        .run_command(doc! {"setClusterParameter": {"noSuchParameter": {}}})
        .await
        .expect_err("unknown");
    assert_eq!(code_of(&e), Some(4), "{e}");
    let e = db
        .run_command(set(Bson::Int32(1)))
        .await
        .expect_err("admin only");
    assert_eq!(code_of(&e), Some(13), "{e}");

    let shard = cluster.shards()[0].clone();
    let count = |s: &shard::Shard| shard::preimages::stats(s).map(|(n, _)| n);
    let mut watcher = c
        .watch()
        .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    c.insert_one(doc! {"_id": 1, "n": 0}).await?;
    let insert = next(&mut watcher).await?;
    let after_insert = insert.get_document("_id")?.clone();
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 1}})
        .await?;
    let update = next(&mut watcher).await?;
    assert_eq!(
        image(&update, "fullDocumentBeforeChange"),
        Some(doc! {"_id": 1, "n": 0})
    );
    assert_eq!(count(&shard)?, 1);
    assert_eq!(shard.purge_expired_pre_images().await?, 0, "still needed");

    admin.run_command(set(Bson::Int64(1))).await?;
    assert_eq!(
        expire_after(admin.run_command(get.clone()).await?)?,
        Bson::Int64(1)
    );
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(shard.purge_expired_pre_images().await?, 1, "older than 1 s");
    assert_eq!(count(&shard)?, 0);
    let mut resumed = c
        .watch()
        .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
        .resume_after(mongodb::bson::deserialize_from_document::<
            mongodb::change_stream::event::ResumeToken,
        >(after_insert)?)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let again = next(&mut resumed).await?;
    assert_eq!(again.get_str("operationType")?, "update");
    assert_eq!(again.get("fullDocumentBeforeChange"), Some(&Bson::Null));

    // With expiry off, a pre-image goes once the oplog no longer has its entry.
    admin.run_command(set(Bson::String("off".into()))).await?;
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 2}})
        .await?;
    assert_eq!(count(&shard)?, 1);
    assert_eq!(shard.purge_expired_pre_images().await?, 0);
    shard.set_oplog_retention(shard::retention::Retention::bytes(1));
    c.insert_one(doc! {"_id": 2}).await?;
    assert_eq!(
        shard.purge_expired_pre_images().await?,
        1,
        "its entry was truncated"
    );
    assert_eq!(count(&shard)?, 0);
    cluster.stop().await;
    Ok(())
}

/// Large events (reference §8): an update of a ~7 MB document with both images is a ~21 MB
/// event. Without `$changeStreamSplitLargeEvent` the stream fails with 10334; with it, the event
/// comes as fragments with `splitEvent` and tokens of their own, and a stream resumed after
/// fragment 1 goes on with fragment 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_megabyte_event_with_both_images_is_split_into_fragments() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("large");
    create_recording(&db, "c").await?;
    let c = db.collection::<Document>("c");
    let big = |ch: &str| ch.repeat(7 * 1024 * 1024);
    let images = Some(FullDocumentBeforeChangeType::Required);
    let mut whole = watch_large(&c, false, FullDocumentType::Required, images.clone()).await?;
    let mut split = watch_large(&c, true, FullDocumentType::Required, images).await?;
    c.insert_one(doc! {"_id": 1, "a": big("x")}).await?;
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"a": big("y")}})
        .await?;

    let insert = next(&mut split).await?;
    assert_eq!(insert.get_str("operationType")?, "insert");
    let (first, second) = two_fragments(&mut split).await?;
    // Between them, the fragments carry the whole event: both images and the update.
    let fields: Vec<&String> = first.keys().chain(second.keys()).collect();
    for f in [
        "operationType",
        "updateDescription",
        "fullDocument",
        "fullDocumentBeforeChange",
    ] {
        assert!(fields.iter().any(|k| *k == f), "{f} in a fragment");
    }
    let image_of = |f: &str| {
        first
            .get_document(f)
            .or_else(|_| second.get_document(f))
            .ok()
            .and_then(|d| d.get_str("a").ok().map(|a| a.as_bytes()[0]))
    };
    assert_eq!(image_of("fullDocumentBeforeChange"), Some(b'x'));
    assert_eq!(image_of("fullDocument"), Some(b'y'));

    // The stream without the split fails (in the batch that would hold the update: the insert
    // before it may go down with it, as in MongoDB, whose getMore fails whole).
    let err = loop {
        match next(&mut whole).await {
            Ok(e) => assert_eq!(e.get_str("operationType")?, "insert"),
            Err(e) => break e,
        }
    };
    let code = code_of_any(&err);
    assert_eq!(code, Some(10334), "{err}");
    let counters = tests::change_stream_metrics(&client.database("admin")).await?;
    assert!(counters.get_i64("largeEventsSplit")? >= 1, "{counters}");
    assert!(counters.get_i64("largeEventsFailed")? >= 1, "{counters}");

    let token = mongodb::bson::deserialize_from_document::<
        mongodb::change_stream::event::ResumeToken,
    >(first.get_document("_id")?.clone())?;
    let mut resumed = c
        .watch()
        .pipeline(vec![doc! {"$changeStreamSplitLargeEvent": {}}])
        .full_document(FullDocumentType::Required)
        .full_document_before_change(FullDocumentBeforeChangeType::Required)
        .resume_after(token)
        .max_await_time(Duration::from_millis(200))
        .await?
        .with_type::<Document>();
    let after = next(&mut resumed).await?;
    assert_eq!(
        after.get_document("splitEvent")?,
        &doc! {"fragment": 2, "of": 2}
    );
    assert_eq!(after.get_document("_id")?, second.get_document("_id")?);

    // A fragment's token needs the split stage to resume from: without it, 280.
    let token = mongodb::bson::deserialize_from_document::<
        mongodb::change_stream::event::ResumeToken,
    >(first.get_document("_id")?.clone())?;
    let refused = async {
        let mut s = c
            .watch()
            .full_document(FullDocumentType::Required)
            .full_document_before_change(FullDocumentBeforeChangeType::Required)
            .resume_after(token)
            .max_await_time(Duration::from_millis(200))
            .await?
            .with_type::<Document>();
        next(&mut s).await
    }
    .await
    .expect_err("no split stage");
    let code = code_of_any(&refused);
    assert_eq!(code, Some(280), "{refused}");
    cluster.stop().await;
    Ok(())
}

/// `fullDocument: updateLookup` is added on the shard, before the 16 MiB check and the split,
/// as in MongoDB 7.0: an update whose looked-up document takes its event past 16 MiB (an
/// 11 MiB `$set` plus the 11 MiB document) fails a stream without `$changeStreamSplitLargeEvent`
/// with 10334, and comes as fragments, the current document among them, with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_lookup_past_sixteen_megabytes_is_split_or_refused() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let c = client.database("lookup").collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "a": "x"}).await?;
    let mut whole = watch_large(&c, false, FullDocumentType::UpdateLookup, None).await?;
    let mut split = watch_large(&c, true, FullDocumentType::UpdateLookup, None).await?;
    let big = "y".repeat(11 * 1024 * 1024);
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"a": &big}})
        .await?;

    let (first, second) = two_fragments(&mut split).await?;
    let looked_up = first
        .get_document("fullDocument")
        .or_else(|_| second.get_document("fullDocument"))?;
    assert_eq!(looked_up.get_str("a")?.len(), big.len());

    let err = next(&mut whole).await.expect_err("a 22 MiB event");
    assert_eq!(code_of_any(&err), Some(10334), "{err}");
    cluster.stop().await;
    Ok(())
}
