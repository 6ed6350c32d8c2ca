//! Aggregations that read other collections, through the `mongodb` driver: `$lookup` (both
//! forms and their combination), `$unionWith`, `$graphLookup`, over unsharded and sharded
//! collections on either side, inside a transaction; `aggregate: 1` with `$documents` and
//! `$listLocalSessions`; and the split of a sharded pipeline between shards and router, which
//! must answer what the whole pipeline answers over all documents.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

async fn run(
    coll: &mongodb::Collection<Document>,
    pipeline: Vec<Document>,
) -> anyhow::Result<Vec<Document>> {
    Ok(coll.aggregate(pipeline).await?.try_collect().await?)
}

async fn run_db(db: &mongodb::Database, pipeline: Vec<Document>) -> anyhow::Result<Vec<Document>> {
    Ok(db.aggregate(pipeline).await?.try_collect().await?)
}

/// `_id`s of the documents in `d[field]`, sorted.
fn ids(d: &Document, field: &str) -> Vec<i32> {
    let mut out: Vec<i32> = d
        .get_array(field)
        .expect("an array")
        .iter()
        .map(|x| {
            x.as_document()
                .expect("a document")
                .get_i32("_id")
                .expect("an int _id")
        })
        .collect();
    out.sort();
    out
}

/// MongoDB's documented `$lookup` example data: orders and inventory.
async fn orders_and_inventory(db: &mongodb::Database) -> anyhow::Result<()> {
    db.collection::<Document>("orders")
        .insert_many([
            doc! {"_id": 1, "item": "almonds", "price": 12, "quantity": 2},
            doc! {"_id": 2, "item": "pecans", "price": 20, "quantity": 1},
            doc! {"_id": 3},
        ])
        .await?;
    db.collection::<Document>("inventory")
        .insert_many([
            doc! {"_id": 1, "sku": "almonds", "description": "product 1", "instock": 120},
            doc! {"_id": 2, "sku": "bread", "description": "product 2", "instock": 80},
            doc! {"_id": 3, "sku": "cashews", "description": "product 3", "instock": 60},
            doc! {"_id": 4, "sku": "pecans", "description": "product 4", "instock": 70},
            doc! {"_id": 5, "sku": null, "description": "Incomplete"},
            doc! {"_id": 6},
        ])
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_joins_across_sharded_and_unsharded_collections() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    // Every combination of a sharded or unsharded local and foreign collection.
    for (i, (shard_orders, shard_inventory)) in
        [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
    {
        let db = client.database(&format!("shop{i}"));
        let db_name = db.name().to_string();
        if shard_orders {
            tests::shard_collection(
                &client,
                &format!("{db_name}.orders"),
                doc! {"_id": "hashed"},
            )
            .await?;
        }
        if shard_inventory {
            tests::shard_collection(
                &client,
                &format!("{db_name}.inventory"),
                doc! {"_id": "hashed"},
            )
            .await?;
        }
        orders_and_inventory(&db).await?;
        let orders = db.collection::<Document>("orders");

        let out = run(
            &orders,
            vec![
                doc! {"$lookup": {"from": "inventory", "localField": "item", "foreignField": "sku", "as": "inventory_docs"}},
                doc! {"$sort": {"_id": 1}},
            ],
        )
        .await?;
        let joined: Vec<Vec<i32>> = out.iter().map(|d| ids(d, "inventory_docs")).collect();
        // Order 3 has no item: it joins the inventory documents whose sku is null or missing.
        assert_eq!(joined, vec![vec![1], vec![4], vec![5, 6]], "case {i}");

        // let + pipeline: the local document reaches the foreign pipeline as variables.
        let out = run(
            &orders,
            vec![
                doc! {"$match": {"item": {"$exists": true}}},
                doc! {"$lookup": {
                    "from": "inventory",
                    "let": {"want": "$item", "qty": "$quantity"},
                    "pipeline": [
                        {"$match": {"$expr": {"$and": [
                            {"$eq": ["$sku", "$$want"]},
                            {"$gte": ["$instock", {"$multiply": ["$$qty", 50]}]},
                        ]}}},
                        {"$project": {"_id": 0, "instock": 1}},
                    ],
                    "as": "stock",
                }},
                doc! {"$sort": {"_id": 1}},
                doc! {"$project": {"stock": 1}},
            ],
        )
        .await?;
        assert_eq!(
            out,
            vec![
                doc! {"_id": 1, "stock": [{"instock": 120}]},
                doc! {"_id": 2, "stock": [{"instock": 70}]},
            ],
            "case {i}"
        );

        // The 5.0 combination: the equality join, then the pipeline over the matches.
        let out = run(
            &orders,
            vec![
                doc! {"$lookup": {
                    "from": "inventory", "localField": "item", "foreignField": "sku",
                    "let": {"q": "$quantity"},
                    "pipeline": [{"$project": {"_id": 0, "left": {"$subtract": ["$instock", "$$q"]}}}],
                    "as": "after",
                }},
                doc! {"$match": {"_id": {"$lte": 2}}},
                doc! {"$sort": {"_id": 1}},
                doc! {"$project": {"after": 1}},
            ],
        )
        .await?;
        assert_eq!(
            out,
            vec![
                doc! {"_id": 1, "after": [{"left": 118}]},
                doc! {"_id": 2, "after": [{"left": 69}]},
            ],
            "case {i}"
        );

        // A foreign collection that does not exist is empty.
        let out = run(
            &orders,
            vec![
                doc! {"$lookup": {"from": "nothing", "localField": "item", "foreignField": "sku", "as": "none"}},
                doc! {"$match": {"none": {"$size": 0}}},
                doc! {"$count": "n"},
            ],
        )
        .await?;
        assert_eq!(out, vec![doc! {"n": 3}], "case {i}");
    }

    // Arrays: a local array matches any element; so does a foreign array.
    let db = client.database("school");
    db.collection::<Document>("classes")
        .insert_many([
            doc! {"_id": 1, "title": "Reading is ...", "enrollmentlist": ["giraffe2", "pandabear", "artie"]},
            doc! {"_id": 2, "title": "But Writing ...", "enrollmentlist": ["giraffe1", "artie"]},
        ])
        .await?;
    db.collection::<Document>("members")
        .insert_many([
            doc! {"_id": 1, "name": "artie"},
            doc! {"_id": 2, "name": ["giraffe1", "x"]},
            doc! {"_id": 3, "name": "giraffe2"},
            doc! {"_id": 4, "name": "pandabear"},
            doc! {"_id": 5, "name": "nobody"},
        ])
        .await?;
    let out = run(
        &db.collection("classes"),
        vec![
            doc! {"$lookup": {"from": "members", "localField": "enrollmentlist", "foreignField": "name", "as": "enrollee_info"}},
            doc! {"$sort": {"_id": 1}},
        ],
    )
    .await?;
    assert_eq!(ids(&out[0], "enrollee_info"), vec![1, 3, 4]);
    assert_eq!(ids(&out[1], "enrollee_info"), vec![1, 2]);

    // Even over an unsharded collection, the $lookup runs on the router: explain shows the cut.
    let e = db
        .run_command(doc! {"aggregate": "classes", "pipeline": [
            {"$match": {"_id": 1}},
            {"$lookup": {"from": "members", "localField": "enrollmentlist", "foreignField": "name", "as": "m"}},
        ], "explain": true})
        .await?;
    let split = e.get_document("splitPipeline")?;
    assert_eq!(
        split.get_array("shardsPart")?,
        &vec![Bson::Document(doc! {"$match": {"_id": 1}})]
    );
    let merger = split.get_array("mergerPart")?;
    assert_eq!(merger.len(), 1);
    assert!(
        merger[0]
            .as_document()
            .is_some_and(|d| d.contains_key("$lookup"))
    );

    // Bad specifications answer MongoDB's codes.
    let err = run(
        &db.collection("classes"),
        vec![doc! {"$lookup": {"from": "members", "localField": "a", "as": "x"}}],
    )
    .await
    .unwrap_err();
    assert_eq!(code(err.downcast_ref().expect("a driver error")), Some(9));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_with_and_graph_lookup_read_sharded_collections() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("app");
    tests::shard_collection(&client, "app.sales_2019", doc! {"_id": "hashed"}).await?;
    tests::shard_collection(&client, "app.employees", doc! {"_id": "hashed"}).await?;
    db.collection::<Document>("sales_2017")
        .insert_many([
            doc! {"store": "A", "item": "Chocolates", "quantity": 150},
            doc! {"store": "B", "item": "Chocolates", "quantity": 50},
        ])
        .await?;
    db.collection::<Document>("sales_2018")
        .insert_many([doc! {"store": "A", "item": "Cookies", "quantity": 100}])
        .await?;
    db.collection::<Document>("sales_2019")
        .insert_many((0..20).map(
            |i| doc! {"store": if i % 2 == 0 { "A" } else { "C" }, "item": "Pie", "quantity": 5},
        ))
        .await?;
    let out = run(
        &db.collection("sales_2017"),
        vec![
            doc! {"$set": {"_id": "$store"}},
            doc! {"$unionWith": {"coll": "sales_2018", "pipeline": [{"$set": {"_id": "$store"}}]}},
            doc! {"$unionWith": "sales_2019"},
            doc! {"$group": {"_id": "$store", "quantity": {"$sum": "$quantity"}}},
            doc! {"$sort": {"_id": 1}},
        ],
    )
    .await?;
    assert_eq!(
        out,
        vec![
            doc! {"_id": "A", "quantity": 300},
            doc! {"_id": "B", "quantity": 50},
            doc! {"_id": "C", "quantity": 50},
        ]
    );

    // MongoDB's documented reporting hierarchy, the foreign collection sharded.
    let employees = db.collection::<Document>("employees");
    employees
        .insert_many([
            doc! {"_id": 1, "name": "Dev"},
            doc! {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
            doc! {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
            doc! {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
            doc! {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
            doc! {"_id": 6, "name": "Dan", "reportsTo": "Andrew"},
        ])
        .await?;
    let out = run(
        &employees,
        vec![
            doc! {"$graphLookup": {
                "from": "employees", "startWith": "$reportsTo", "connectFromField": "reportsTo",
                "connectToField": "name", "as": "reportingHierarchy", "depthField": "depth",
            }},
            doc! {"$sort": {"_id": 1}},
        ],
    )
    .await?;
    assert_eq!(
        ids(&out[4], "reportingHierarchy"),
        vec![1, 2, 3],
        "Asya's chain"
    );
    let depth_of = |d: &Document, name: &str| {
        d.get_array("reportingHierarchy")
            .expect("array")
            .iter()
            .filter_map(Bson::as_document)
            .find(|e| e.get_str("name").ok() == Some(name))
            .and_then(|e| e.get_i64("depth").ok())
    };
    assert_eq!(depth_of(&out[4], "Ron"), Some(0));
    assert_eq!(depth_of(&out[4], "Dev"), Some(2));
    assert_eq!(ids(&out[0], "reportingHierarchy"), Vec::<i32>::new());
    let out = run(
        &employees,
        vec![
            doc! {"$match": {"name": "Dan"}},
            doc! {"$graphLookup": {
                "from": "employees", "startWith": "$reportsTo", "connectFromField": "reportsTo",
                "connectToField": "name", "as": "chain", "maxDepth": 1,
                "restrictSearchWithMatch": {"name": {"$ne": "Dev"}},
            }},
        ],
    )
    .await?;
    assert_eq!(ids(&out[0], "chain"), vec![2, 4]);

    // A $lookup nested in a $unionWith's pipeline reads its own collection too.
    let out = run(
        &db.collection("sales_2018"),
        vec![
            doc! {"$unionWith": {"coll": "employees", "pipeline": [
                {"$match": {"name": "Asya"}},
                {"$lookup": {"from": "employees", "localField": "reportsTo", "foreignField": "name", "as": "boss"}},
                {"$project": {"_id": 0, "boss": "$boss.name"}},
            ]}},
            doc! {"$match": {"boss": {"$exists": true}}},
        ],
    )
    .await?;
    assert_eq!(out, vec![doc! {"boss": ["Ron"]}]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_in_a_transaction_reads_its_own_writes() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("txn");
    tests::shard_collection(&client, "txn.parts", doc! {"_id": "hashed"}).await?;
    let orders = db.collection::<Document>("orders");
    let parts = db.collection::<Document>("parts");
    orders.insert_one(doc! {"_id": 1, "part": "p1"}).await?;
    parts.insert_one(doc! {"_id": "p0", "name": "p0"}).await?;

    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    parts
        .insert_one(doc! {"_id": "p1", "name": "p1"})
        .session(&mut s)
        .await?;
    let inside: Vec<Document> = orders
        .aggregate(vec![doc! {"$lookup": {"from": "parts", "localField": "part", "foreignField": "name", "as": "p"}}])
        .session(&mut s)
        .await?
        .stream(&mut s)
        .try_collect()
        .await?;
    assert_eq!(
        inside,
        vec![doc! {"_id": 1, "part": "p1", "p": [{"_id": "p1", "name": "p1"}]}]
    );
    // Outside the transaction the write is not visible yet.
    let outside = run(
        &orders,
        vec![doc! {"$lookup": {"from": "parts", "localField": "part", "foreignField": "name", "as": "p"}}],
    )
    .await?;
    assert_eq!(outside, vec![doc! {"_id": 1, "part": "p1", "p": []}]);
    s.commit_transaction().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_one_makes_documents_and_lists_sessions() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("docs");
    tests::shard_collection(&client, "docs.names", doc! {"_id": "hashed"}).await?;
    db.collection::<Document>("names")
        .insert_many((0..10).map(|i| doc! {"_id": i, "id_name": i, "name": format!("name_{i}")}))
        .await?;

    let out = run_db(&db, vec![doc! {"$documents": [{"a1": 1}, {"a1": 2}]}]).await?;
    assert_eq!(out, vec![doc! {"a1": 1}, doc! {"a1": 2}]);
    let out = run_db(
        &db,
        vec![
            doc! {"$documents": {"$map": {"input": {"$range": [0, 3]}, "in": {"x": "$$this"}}}},
            doc! {"$lookup": {"from": "names", "localField": "x", "foreignField": "id_name", "as": "n"}},
            doc! {"$project": {"x": 1, "name": {"$first": "$n.name"}}},
        ],
    )
    .await?;
    assert_eq!(
        out,
        vec![
            doc! {"x": 0, "name": "name_0"},
            doc! {"x": 1, "name": "name_1"},
            doc! {"x": 2, "name": "name_2"},
        ]
    );
    // $documents inside a collection's $lookup, no `from`.
    let out = run(
        &db.collection("names"),
        vec![
            doc! {"$lookup": {"let": {"id": "$id_name"}, "pipeline": [
                {"$documents": [{"xx": 1}, {"xx": 2}]},
                {"$match": {"$expr": {"$eq": ["$$id", "$xx"]}}},
            ], "as": "names"}},
            doc! {"$match": {"names": {"$ne": []}}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$project": {"_id": 0, "name": 1, "names": 1}},
        ],
    )
    .await?;
    assert_eq!(
        out,
        vec![
            doc! {"name": "name_1", "names": [{"xx": 1}]},
            doc! {"name": "name_2", "names": [{"xx": 2}]},
        ]
    );

    // `explain` shows the stages the router runs; a pipeline it would refuse is refused.
    let explained = db
        .run_command(doc! {"explain": {"aggregate": 1, "pipeline": [{"$documents": [{"a": 1}]}, {"$match": {"a": 1}}], "cursor": {}}})
        .await?;
    assert_eq!(explained.get_array("stages")?.len(), 2, "{explained}");
    let e = db
        .run_command(doc! {"explain": {"aggregate": 1, "pipeline": [{"$match": {}}], "cursor": {}}})
        .await
        .expect_err("a collection is required");
    assert_eq!(code(&e), Some(73), "{e}");

    let refused = |e: anyhow::Error| code(e.downcast_ref().expect("a driver error"));
    let e = run_db(&db, vec![doc! {"$match": {}}]).await.unwrap_err();
    assert_eq!(refused(e), Some(73));
    let e = run_db(&db, vec![doc! {"$documents": "string"}])
        .await
        .unwrap_err();
    assert_eq!(refused(e), Some(5858203));
    let e = run_db(&db, vec![doc! {"$documents": [1, 2]}])
        .await
        .unwrap_err();
    assert_eq!(refused(e), Some(40228));
    let e = run(
        &db.collection("names"),
        vec![doc! {"$documents": [{"a": 1}]}],
    )
    .await
    .unwrap_err();
    assert_eq!(refused(e), Some(73));
    let e = run_db(&db, vec![doc! {"$documents": []}, doc! {"$documents": []}])
        .await
        .unwrap_err();
    assert_eq!(refused(e), Some(40602));

    // A session the driver used is in the router's cache; startSession's too.
    let mut s = client.start_session().await?;
    db.collection::<Document>("names")
        .find_one(doc! {})
        .session(&mut s)
        .await?;
    let mine = s.id().get("id").cloned().expect("a session id");
    let started = client
        .database("admin")
        .run_command(doc! {"startSession": 1})
        .await?;
    let started_id = started.get_document("id")?.get("id").cloned().expect("id");
    let admin = client.database("admin");
    let listed = run_db(
        &admin,
        vec![doc! {"$listLocalSessions": {"allUsers": true}}],
    )
    .await?;
    let listed_ids: Vec<Bson> = listed
        .iter()
        .filter_map(|d| d.get_document("_id").ok()?.get("id").cloned())
        .collect();
    assert!(listed_ids.contains(&mine), "{listed:?}");
    assert!(listed_ids.contains(&started_id), "{listed:?}");
    let mine_only = run_db(
        &admin,
        vec![
            doc! {"$listLocalSessions": {}},
            doc! {"$match": {"_id.id": mine.clone()}},
        ],
    )
    .await?;
    assert_eq!(mine_only.len(), 1);
    assert!(mine_only[0].get_datetime("lastUse").is_ok());
    let e = run_db(&admin, vec![doc! {"$listLocalSessions": {"bogus": 1}}])
        .await
        .unwrap_err();
    assert_eq!(refused(e), Some(40415));
    // Ended sessions leave the cache.
    admin
        .run_command(doc! {"endSessions": [{"id": started_id.clone()}]})
        .await?;
    let listed = run_db(
        &admin,
        vec![
            doc! {"$listLocalSessions": {"allUsers": true}},
            doc! {"$match": {"_id.id": started_id}},
        ],
    )
    .await?;
    assert!(listed.is_empty(), "{listed:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_pipeline_answers_as_the_whole_pipeline_does() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("split");
    tests::shard_collection(&client, "split.spread", doc! {"_id": "hashed"}).await?;
    let docs: Vec<Document> = (0..200)
        .map(|i| doc! {"_id": i, "g": i % 7, "x": (i * 37) % 101, "tag": format!("t{}", i % 3)})
        .collect();
    let spread = db.collection::<Document>("spread");
    let flat = db.collection::<Document>("flat");
    spread.insert_many(docs.clone()).await?;
    flat.insert_many(docs).await?;

    let pipelines = vec![
        vec![
            doc! {"$match": {"x": {"$gte": 10}}},
            doc! {"$project": {"g": 1, "x": 1, "double": {"$multiply": ["$x", 2]}}},
            doc! {"$sort": {"x": -1, "_id": 1}},
            doc! {"$limit": 25},
            doc! {"$group": {"_id": "$g", "n": {"$sum": 1}, "top": {"$max": "$double"}, "first": {"$first": "$_id"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![
            doc! {"$match": {"tag": {"$ne": "t1"}}},
            doc! {"$group": {"_id": {"g": "$g", "tag": "$tag"}, "n": {"$count": {}}, "sum": {"$sum": "$x"}, "lo": {"$min": "$x"}, "hi": {"$max": "$x"}}},
            doc! {"$sort": {"_id.g": 1, "_id.tag": 1}},
        ],
        vec![
            doc! {"$set": {"bucket": {"$mod": ["$x", 5]}}},
            doc! {"$sort": {"bucket": 1, "x": 1, "_id": 1}},
            doc! {"$skip": 3},
            doc! {"$limit": 40},
            doc! {"$project": {"_id": 1, "bucket": 1, "x": 1}},
        ],
        vec![
            doc! {"$group": {"_id": "$tag", "avg": {"$avg": "$x"}, "all": {"$push": "$_id"}}},
            doc! {"$project": {"avg": 1, "n": {"$size": "$all"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![
            doc! {"$unwind": {"path": "$tag"}},
            doc! {"$bucket": {"groupBy": "$x", "boundaries": [0, 20, 50, 90], "default": "high", "output": {"n": {"$sum": 1}, "avg": {"$avg": "$g"}, "tags": {"$addToSet": "$tag"}}}},
            doc! {"$set": {"tags": {"$size": "$tags"}}},
        ],
        vec![
            doc! {"$sortByCount": "$g"},
            doc! {"$sort": {"count": -1, "_id": 1}},
        ],
        vec![doc! {"$match": {"g": 3}}, doc! {"$count": "n"}],
    ];
    for p in pipelines {
        let split = run(&spread, p.clone()).await?;
        let whole = run(&flat, p.clone()).await?;
        assert_eq!(split, whole, "{p:?}");
        assert!(!split.is_empty());
    }

    // explain shows where the pipeline is cut: the $sort and a copy of the $limit on the shards.
    let e = db
        .run_command(doc! {"aggregate": "spread", "pipeline": [
            {"$match": {"x": 1}}, {"$sort": {"x": 1}}, {"$limit": 3}, {"$count": "n"},
        ], "explain": true})
        .await?;
    // Both shards hold part of the collection, and both run the shards' part.
    assert_eq!(e.get_document("shards")?.len(), 2);
    let split = e.get_document("splitPipeline")?;
    assert_eq!(
        split.get_array("shardsPart")?,
        &vec![
            Bson::Document(doc! {"$match": {"x": 1}}),
            Bson::Document(doc! {"$sort": {"x": 1}}),
            Bson::Document(doc! {"$limit": 3}),
        ]
    );
    assert_eq!(
        split.get_array("mergerPart")?,
        &vec![
            Bson::Document(doc! {"$limit": 3}),
            Bson::Document(doc! {"$count": "n"}),
        ]
    );
    Ok(())
}
