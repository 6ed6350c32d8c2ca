//! Collations through the `mongodb` driver: `find`, `count`, `distinct`, `update`, `delete`,
//! `findAndModify` and `aggregate` compare strings by the operation's collation (strength 1–3,
//! `caseLevel`, `numericOrdering`, `caseFirst`), also on a sharded collection whose hashed
//! shard key spreads case variants over both shards (the router broadcasts and merges by the
//! collation); a collection's default collation applies unless the operation names one;
//! collated indexes are used under their own collation only, and a collated unique index
//! refuses case variants; bad collations get MongoDB's errors.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::Collation;
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

fn collation(d: Document) -> Collation {
    mongodb::bson::deserialize_from_document(d).expect("a collation document")
}

fn strength2() -> Collation {
    collation(doc! {"locale": "en_US", "strength": 2})
}

async fn names(
    coll: &mongodb::Collection<Document>,
    filter: Document,
    sort: Document,
    c: Option<Collation>,
) -> anyhow::Result<Vec<String>> {
    let mut find = coll.find(filter).sort(sort);
    if let Some(c) = c {
        find = find.collation(c);
    }
    let docs: Vec<Document> = find.await?.try_collect().await?;
    Ok(docs
        .iter()
        .map(|d| d.get_str("name").unwrap_or("?").to_string())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_compare_strings_by_their_collation_across_shards() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    tests::shard_collection(&client, "app.words", doc! {"name": "hashed"}).await?;
    let coll = client.database("app").collection::<Document>("words");
    let words = [
        "ping", "PING", "Ping", "pong", "a9", "a10", "B", "a", "c", "côte", "cote",
    ];
    for (i, w) in words.iter().enumerate() {
        coll.insert_one(doc! {"_id": i as i32, "name": *w, "n": 1})
            .await?;
    }
    // The case variants live on both shards, so a collated equality must reach every shard.
    let mut homes = 0;
    for shard in cluster.shards() {
        let reply = shard
            .run_command(doc! {"find": "words", "filter": {"name": {"$in": ["ping", "PING", "Ping"]}}, "$db": "app"})
            .await;
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .map(Vec::len)
            .unwrap_or(0);
        homes += usize::from(batch > 0);
    }
    assert_eq!(homes, 2, "the variants of 'ping' should span both shards");

    let by_id = doc! {"_id": 1};
    let ping = doc! {"name": "ping"};
    assert_eq!(
        names(&coll, ping.clone(), by_id.clone(), None).await?,
        ["ping"]
    );
    assert_eq!(
        names(&coll, ping.clone(), by_id.clone(), Some(strength2())).await?,
        ["ping", "PING", "Ping"]
    );
    // Strength 1 also ignores accents; strength 3 (the default) sees case.
    let primary = collation(doc! {"locale": "fr", "strength": 1});
    assert_eq!(
        names(&coll, doc! {"name": "COTE"}, by_id.clone(), Some(primary)).await?,
        ["côte", "cote"]
    );
    let tertiary = collation(doc! {"locale": "en"});
    assert_eq!(
        names(&coll, ping.clone(), by_id.clone(), Some(tertiary)).await?,
        ["ping"]
    );
    // caseLevel at strength 1: case counts, accents do not.
    let case_level = collation(doc! {"locale": "en", "strength": 1, "caseLevel": true});
    assert_eq!(
        names(
            &coll,
            doc! {"name": "Ping"},
            by_id.clone(),
            Some(case_level)
        )
        .await?,
        ["Ping"]
    );
    // Ranges compare by the collation too.
    let range = doc! {"name": {"$gte": "b", "$lt": "c"}};
    assert_eq!(
        names(&coll, range.clone(), by_id.clone(), None).await?,
        Vec::<String>::new()
    );
    assert_eq!(
        names(&coll, range, by_id.clone(), Some(strength2())).await?,
        ["B"]
    );

    // Sorts, merged from both shards by the router under the collation.
    let only = doc! {"name": {"$in": ["a", "B", "c", "a9", "a10"]}};
    let asc = doc! {"name": 1};
    assert_eq!(
        names(&coll, only.clone(), asc.clone(), None).await?,
        ["B", "a", "a10", "a9", "c"]
    );
    assert_eq!(
        names(
            &coll,
            only.clone(),
            asc.clone(),
            Some(collation(doc! {"locale": "en"}))
        )
        .await?,
        ["a", "a10", "a9", "B", "c"]
    );
    let numeric = collation(doc! {"locale": "en", "numericOrdering": true});
    assert_eq!(
        names(&coll, only.clone(), asc.clone(), Some(numeric)).await?,
        ["a", "a9", "a10", "B", "c"]
    );
    let upper_first = collation(doc! {"locale": "en", "caseFirst": "upper"});
    assert_eq!(
        names(
            &coll,
            doc! {"name": {"$in": ["ping", "PING", "Ping"]}},
            asc,
            Some(upper_first)
        )
        .await?,
        ["PING", "Ping", "ping"]
    );

    // count, distinct and aggregate.
    let n = coll
        .count_documents(ping.clone())
        .collation(strength2())
        .await?;
    assert_eq!(n, 3);
    let distinct = coll
        .distinct("name", doc! {"name": {"$in": ["ping", "pong"]}})
        .collation(strength2())
        .await?;
    assert_eq!(distinct.len(), 2, "{distinct:?}");
    let grouped: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"name": {"$regex": "^p", "$options": "i"}}},
            doc! {"$group": {"_id": "$name", "n": {"$sum": 1}}},
            doc! {"$sort": {"n": -1}},
        ])
        .collation(strength2())
        .await?
        .try_collect()
        .await?;
    assert_eq!(grouped.len(), 2, "{grouped:?}");
    assert_eq!(grouped[0].get_i32("n")?, 3);
    let matched: Vec<Document> = coll
        .aggregate(vec![doc! {"$match": {"name": "PONG"}}])
        .collation(strength2())
        .await?
        .try_collect()
        .await?;
    assert_eq!(matched.len(), 1);

    // Writes: update and delete statements carry their own collation.
    let updated = coll
        .update_many(ping.clone(), doc! {"$set": {"seen": true}})
        .collation(strength2())
        .await?;
    assert_eq!(updated.modified_count, 3);
    let found = coll
        .find_one_and_update(doc! {"name": "PONG"}, doc! {"$set": {"seen": true}})
        .collation(strength2())
        .await?;
    assert_eq!(
        found.and_then(|d| d.get_str("name").ok().map(str::to_string)),
        Some("pong".into())
    );
    let deleted = coll
        .delete_many(ping.clone())
        .collation(strength2())
        .await?;
    assert_eq!(deleted.deleted_count, 3);
    assert_eq!(coll.count_documents(doc! {"seen": true}).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collections_default_collation_and_collated_indexes() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    db.run_command(doc! {"create": "people", "collation": {"locale": "en", "strength": 2}})
        .await?;
    let listed = db
        .run_command(doc! {"listCollections": 1, "filter": {"name": "people"}})
        .await?;
    let spec = listed
        .get_document("cursor")?
        .get_array("firstBatch")?
        .first()
        .and_then(Bson::as_document)
        .and_then(|c| c.get_document("options").ok())
        .and_then(|o| o.get_document("collation").ok())
        .cloned()
        .unwrap_or_default();
    assert_eq!(spec.get_str("locale")?, "en");
    assert_eq!(spec.get_i32("strength")?, 2);
    assert_eq!(spec.get_str("caseFirst")?, "off");
    assert_eq!(spec.get_str("version")?, "57.1");

    let coll = db.collection::<Document>("people");
    for (i, n) in ["alice", "ALICE", "Bob"].iter().enumerate() {
        coll.insert_one(doc! {"_id": i as i32, "name": *n}).await?;
    }
    // The default applies; an explicit simple collation overrides it.
    assert_eq!(coll.count_documents(doc! {"name": "Alice"}).await?, 2);
    let simple = collation(doc! {"locale": "simple"});
    assert_eq!(
        coll.count_documents(doc! {"name": "Alice"})
            .collation(simple)
            .await?,
        0
    );

    // A new index takes the collection's collation; a collated unique index refuses case
    // variants of one key.
    db.run_command(doc! {"createIndexes": "people", "indexes": [
        {"key": {"name": 1}, "name": "name_1"},
        {"key": {"email": 1}, "name": "email_1", "unique": true, "sparse": true},
        {"key": {"tag": 1}, "name": "tag_1", "collation": {"locale": "simple"}},
    ]})
    .await?;
    let indexes: Vec<Document> = coll
        .list_indexes()
        .await?
        .try_collect::<Vec<_>>()
        .await?
        .into_iter()
        .map(|m| mongodb::bson::serialize_to_document(&m).unwrap_or_default())
        .collect();
    let spec_of = |name: &str| {
        indexes
            .iter()
            .find(|i| i.get_str("name").ok() == Some(name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        spec_of("name_1")
            .get_document("collation")
            .and_then(|c| c.get_i32("strength"))
            .ok(),
        Some(2)
    );
    assert!(!spec_of("tag_1").contains_key("collation"));
    coll.insert_one(doc! {"_id": 10, "email": "x@example.com"})
        .await?;
    let err = coll
        .insert_one(doc! {"_id": 11, "email": "X@Example.com"})
        .await
        .expect_err("a case variant of a unique key");
    assert_eq!(code(&err), Some(11000), "{err}");

    // The collated index serves queries under its own collation, not under another.
    let explain = |c: Document| {
        let db = db.clone();
        async move {
            let mut find = doc! {"find": "people", "filter": {"name": "ALICE"}};
            find.insert("collation", c);
            db.run_command(doc! {"explain": find, "verbosity": "queryPlanner"})
                .await
        }
    };
    let plan = explain(doc! {"locale": "en", "strength": 2})
        .await?
        .to_string();
    assert!(plan.contains("IXSCAN") && plan.contains("name_1"), "{plan}");
    let plan = explain(doc! {"locale": "en", "strength": 1})
        .await?
        .to_string();
    assert!(!plan.contains("IXSCAN"), "{plan}");
    // Update operators compare array elements by the collation too.
    coll.insert_one(doc! {"_id": 20, "tags": ["Red"]}).await?;
    let r = coll
        .update_one(doc! {"_id": 20}, doc! {"$addToSet": {"tags": "RED"}})
        .await?;
    assert_eq!(
        r.modified_count, 0,
        "RED is Red under the default collation"
    );
    coll.update_one(doc! {"_id": 20}, doc! {"$pull": {"tags": "red"}})
        .await?;
    let tags = coll
        .find_one(doc! {"_id": 20})
        .await?
        .and_then(|d| d.get_array("tags").ok().cloned());
    assert_eq!(tags, Some(vec![]));
    coll.update_one(
        doc! {"_id": 20},
        doc! {"$addToSet": {"tags": {"$each": ["a", "b"]}}},
    )
    .collation(collation(doc! {"locale": "simple"}))
    .await?;
    let r = coll
        .update_one(doc! {"_id": 20}, doc! {"$pull": {"tags": "A"}})
        .collation(collation(doc! {"locale": "simple"}))
        .await?;
    assert_eq!(r.modified_count, 0, "A is not a under the simple collation");

    // `$push`'s `$sort`, `$bucket` boundaries and `$setWindowFields` partitions too.
    coll.update_one(
        doc! {"_id": 20},
        doc! {"$push": {"tags": {"$each": ["b", "A", "C"], "$sort": 1}}},
    )
    .await?;
    let tags = coll
        .find_one(doc! {"_id": 20})
        .await?
        .and_then(|d| d.get_array("tags").ok().cloned());
    let strs = |v: &[&str]| v.iter().map(|s| Bson::from(*s)).collect::<Vec<_>>();
    assert_eq!(tags, Some(strs(&["a", "A", "b", "b", "C"])));
    let buckets: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"name": {"$exists": true}}},
            doc! {"$bucket": {"groupBy": "$name", "boundaries": ["a", "b", "z"], "default": 0}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(
        buckets,
        vec![doc! {"_id": "a", "count": 2}, doc! {"_id": "b", "count": 1}],
        "ALICE sorts with alice, not before 'a'"
    );
    let windows: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"name": {"$exists": true}}},
            doc! {"$setWindowFields": {"partitionBy": "$name", "sortBy": {"_id": 1},
            "output": {"n": {"$count": {}}}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    let counts: Vec<i32> = windows.iter().filter_map(|d| d.get_i32("n").ok()).collect();
    assert_eq!(counts, [2, 2, 1]);

    // A collection with a default collation is not sharded (the router would not apply it).
    let err = client
        .database("admin")
        .run_command(doc! {"shardCollection": "app.people", "key": {"_id": 1}})
        .await
        .expect_err("refused");
    assert_eq!(code(&err), Some(2), "{err}");
    let found: Vec<Document> = coll
        .find(doc! {"name": "ALICE"})
        .await?
        .try_collect()
        .await?;
    assert_eq!(found.len(), 2);
    let hinted: Vec<Document> = coll
        .find(doc! {"name": {"$gte": "a", "$lt": "b"}})
        .hint(mongodb::options::Hint::Name("name_1".into()))
        .sort(doc! {"name": 1, "_id": 1})
        .await?
        .try_collect()
        .await?;
    let ids: Vec<Bson> = hinted
        .iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
    assert_eq!(ids, [Bson::Int32(0), Bson::Int32(1)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_collations_get_mongodb_errors() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    db.collection::<Document>("c")
        .insert_one(doc! {"x": 1})
        .await?;
    let find_with = |c: Bson| {
        let db = db.clone();
        async move {
            db.run_command(doc! {"find": "c", "filter": {}, "collation": c})
                .await
                .expect_err("refused")
        }
    };
    assert_eq!(
        code(&find_with(doc! {"locale": "xx"}.into()).await),
        Some(2)
    );
    assert_eq!(
        code(&find_with(doc! {"strength": 2}.into()).await),
        Some(40414)
    );
    assert_eq!(
        code(&find_with(doc! {"locale": "en", "strength": 9}.into()).await),
        Some(51024)
    );
    assert_eq!(
        code(&find_with(doc! {"locale": "en", "backwards": true}.into()).await),
        Some(2)
    );
    assert_eq!(code(&find_with(Bson::Int32(1)).await), Some(14));
    let err = db
        .run_command(doc! {"create": "d", "collation": {"locale": "en", "nope": 1}})
        .await
        .expect_err("refused");
    assert_eq!(code(&err), Some(40415));
    Ok(())
}
