//! Aggregations that write, and commands with `let`, through the `mongodb` driver: `$out`
//! replaces its target whole (keeping the target's indexes) or, on failure, not at all;
//! `$merge`'s `on` / `whenMatched` / `whenNotMatched` modes, into a sharded collection too;
//! `let` variables in find, update, delete and aggregate.

use mongodb::bson::{Document, doc};
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

async fn all(coll: &mongodb::Collection<Document>) -> anyhow::Result<Vec<Document>> {
    use futures::TryStreamExt;
    let found = coll
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await?;
    Ok(found)
}

/// Two shards, and `app.<coll>` sharded on a hashed `_id` holding `docs`.
async fn sharded(
    coll: &str,
    docs: impl IntoIterator<Item = Document>,
) -> anyhow::Result<(
    EmbeddedCluster,
    mongodb::Database,
    mongodb::Collection<Document>,
)> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, &format!("app.{coll}"), doc! {"_id": "hashed"}).await?;
    let db = client.database("app");
    let c = db.collection::<Document>(coll);
    c.insert_many(docs).await?;
    Ok((cluster, db, c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_replaces_the_target_whole_or_not_at_all() -> anyhow::Result<()> {
    let (_cluster, db, source) =
        sharded("source", (0..20).map(|i| doc! {"_id": i, "x": i % 4})).await?;
    let target = db.collection::<Document>("report");
    target
        .insert_many([doc! {"_id": "old", "k": 1}, doc! {"_id": "older", "k": 2}])
        .await?;
    db.run_command(doc! {"createIndexes": "report", "indexes": [{"key": {"k": 1}, "name": "k_1", "unique": true, "sparse": true}]})
        .await?;

    // From a sharded source: the shards' documents, grouped on the router, replace the target.
    let out = source
        .aggregate([
            doc! {"$group": {"_id": "$x", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$out": "report"},
        ])
        .await?;
    drop(out);
    assert_eq!(
        all(&target).await?,
        (0..4).map(|x| doc! {"_id": x, "n": 5}).collect::<Vec<_>>()
    );
    // The target's index came along (and is enforced: `k` is unique where present).
    let indexes = db
        .run_command(doc! {"listIndexes": "report", "cursor": {}})
        .await?;
    let names: Vec<String> = indexes
        .get_document("cursor")?
        .get_array("firstBatch")?
        .iter()
        .filter_map(|i| i.as_document()?.get_str("name").ok().map(String::from))
        .collect();
    assert!(names.contains(&"k_1".to_string()), "{names:?}");

    // A failing $out (two results break the unique index) leaves the target as it was, and
    // no temporary collection behind.
    let err = source
        .aggregate([
            doc! {"$project": {"k": {"$literal": 7}}},
            doc! {"$out": "report"},
        ])
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    assert_eq!(all(&target).await?.len(), 4);
    let names = db.list_collection_names().await?;
    assert!(
        names.iter().all(|n| !n.starts_with("tmp.agg_out")),
        "{names:?}"
    );

    // Not last, or to a sharded collection: refused.
    let err = source
        .aggregate([doc! {"$out": "report"}, doc! {"$match": {}}])
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(40601), "{err}");
    let err = source
        .aggregate([doc! {"$out": "source"}])
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(28769), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_modes_write_as_mongodb_does() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let source = db.collection::<Document>("src");
    source
        .insert_many([doc! {"_id": 1, "a": 10}, doc! {"_id": 2, "a": 20}])
        .await?;
    tests::shard_collection(&client, "app.dst", doc! {"_id": "hashed"}).await?;
    let dst = db.collection::<Document>("dst");
    let reset = || async {
        dst.delete_many(doc! {}).await?;
        dst.insert_one(doc! {"_id": 1, "a": 1, "b": 1}).await?;
        anyhow::Ok(())
    };
    let merge = |spec: Document| {
        let source = source.clone();
        async move { source.aggregate([doc! {"$merge": spec}]).await.map(drop) }
    };

    // The default: merge fields into a match, insert the rest.
    reset().await?;
    merge(doc! {"into": "dst"}).await?;
    assert_eq!(
        all(&dst).await?,
        vec![doc! {"_id": 1, "a": 10, "b": 1}, doc! {"_id": 2, "a": 20}]
    );
    // replace + discard: the match is replaced, nothing new is written.
    reset().await?;
    merge(doc! {"into": "dst", "whenMatched": "replace", "whenNotMatched": "discard"}).await?;
    assert_eq!(all(&dst).await?, vec![doc! {"_id": 1, "a": 10}]);
    // keepExisting: the match stays as it was.
    reset().await?;
    merge(doc! {"into": "dst", "whenMatched": "keepExisting"}).await?;
    assert_eq!(
        all(&dst).await?,
        vec![doc! {"_id": 1, "a": 1, "b": 1}, doc! {"_id": 2, "a": 20}]
    );
    // fail on a match; fail when a result has no match.
    reset().await?;
    let err = merge(doc! {"into": "dst", "whenMatched": "fail"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(11000), "{err}");
    reset().await?;
    let err = merge(doc! {"into": "dst", "whenNotMatched": "fail"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(13113), "{err}");
    // A pipeline updates the match, reading the result as `$$new` (or `let` variables);
    // an unmatched result is inserted as it is.
    reset().await?;
    merge(doc! {"into": "dst", "whenMatched": [{"$set": {"a": {"$add": ["$a", "$$new.a"]}}}]})
        .await?;
    assert_eq!(
        all(&dst).await?,
        vec![doc! {"_id": 1, "a": 11, "b": 1}, doc! {"_id": 2, "a": 20}]
    );
    reset().await?;
    merge(
        doc! {"into": "dst", "let": {"twice": {"$multiply": ["$a", 2]}},
        "whenMatched": [{"$set": {"c": "$$twice"}}], "whenNotMatched": "discard"},
    )
    .await?;
    assert_eq!(
        all(&dst).await?,
        vec![doc! {"_id": 1, "a": 1, "b": 1, "c": 20}]
    );
    let err = merge(doc! {"into": "dst", "let": {"x": 1}, "whenMatched": "merge"})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(51199), "{err}");
    // `on` fields need a unique index on exactly them; a result lacking one is refused.
    let err = merge(doc! {"into": "dst", "on": "nope"}).await.unwrap_err();
    assert_eq!(code(&err), Some(51183), "{err}");
    let keyed = db.collection::<Document>("keyed");
    keyed
        .create_index(tests::unique_index(doc! {"k": 1}))
        .await?;
    let err = merge(doc! {"into": "keyed", "on": "k"}).await.unwrap_err();
    assert_eq!(code(&err), Some(51132), "{err}");
    Ok(())
}

/// A `$merge` into the collection it reads inserts each result once: its results are all read
/// before it writes, so the scan never reads what the merge inserted (a new `_id` each time
/// would otherwise be read, merged and inserted again, without end). A `$merge` elsewhere and
/// `$out` write as they read, so a copy larger than the memory limit needs no disk use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_into_its_own_source_reads_everything_first() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    let c = db.collection::<Document>("grow");
    c.insert_many((0..3_000).map(|i| doc! {"_id": i, "v": i}))
        .await?;
    c.aggregate([
        doc! {"$project": {"_id": 0, "v": 1}},
        doc! {"$merge": {"into": "grow", "whenNotMatched": "insert"}},
    ])
    .await?;
    assert_eq!(
        c.count_documents(doc! {}).await?,
        6_000,
        "each result inserted once"
    );
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn let_variables_reach_filters_updates_and_pipelines() -> anyhow::Result<()> {
    let (_cluster, db, people) =
        sharded("people", (0..10).map(|i| doc! {"_id": i, "age": 20 + i})).await?;
    let older = doc! {"$expr": {"$gte": ["$age", "$$min"]}};

    let found = db
        .run_command(doc! {"find": "people", "filter": older.clone(), "let": {"min": 27}, "sort": {"_id": 1}})
        .await?;
    let batch = found.get_document("cursor")?.get_array("firstBatch")?;
    assert_eq!(batch.len(), 3);

    // A pipeline update reads the variable, on every shard.
    let updated = db
        .run_command(doc! {
            "update": "people",
            "updates": [{"q": older.clone(), "u": [{"$set": {"tag": "$$tag"}}], "multi": true}],
            "let": {"min": 28, "tag": "senior"},
        })
        .await?;
    assert_eq!(updated.get_i32("nModified")?, 2);
    assert_eq!(people.count_documents(doc! {"tag": "senior"}).await?, 2);

    // An aggregate the router runs itself (a sharded collection) and one with `$literal`.
    use futures::TryStreamExt;
    let out: Vec<Document> = people
        .aggregate([
            doc! {"$match": older.clone()},
            doc! {"$group": {"_id": null, "n": {"$sum": 1}}},
            doc! {"$project": {"_id": 0, "n": 1, "label": "$$label"}},
        ])
        .let_vars(doc! {"min": 29, "label": {"$literal": "$x"}})
        .await?
        .try_collect()
        .await?;
    assert_eq!(out, vec![doc! {"n": 1, "label": "$x"}]);

    let deleted = db
        .run_command(
            doc! {"delete": "people", "deletes": [{"q": older, "limit": 0}], "let": {"min": 25}},
        )
        .await?;
    assert_eq!(deleted.get_i32("n")?, 5);

    // $$NOW is the command's time, in a filter, an update pipeline and an aggregate (the
    // fuzzer found it InternalError outside `let` and validators).
    let started = mongodb::bson::DateTime::now();
    db.run_command(doc! {
        "update": "people",
        "updates": [{"q": {}, "u": [{"$set": {"seen": "$$NOW"}}], "multi": true}],
    })
    .await?;
    let seen = people
        .count_documents(doc! {"$expr": {"$lte": ["$seen", "$$NOW"]}, "seen": {"$gte": started}})
        .await?;
    assert_eq!(seen, 5, "the undeleted five, stamped before now");
    let now: Vec<Document> = people
        .aggregate([
            doc! {"$limit": 1},
            doc! {"$project": {"_id": 0, "now": "$$NOW"}},
        ])
        .await?
        .try_collect()
        .await?;
    assert!(now[0].get_datetime("now")? >= &started, "{now:?}");

    // An undefined variable and a bad name are errors.
    let err = db
        .run_command(doc! {"find": "people", "filter": {"$expr": {"$eq": ["$_id", "$$nope"]}}})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(17276), "{err}");
    let err = db
        .run_command(doc! {"find": "people", "filter": {}, "let": {"Bad": 1}})
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(16867), "{err}");
    Ok(())
}
