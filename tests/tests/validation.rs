//! Document validation through the `mongodb` driver: `create` / `collMod` with `validator`,
//! `validationLevel` and `validationAction`; writes refused with `DocumentValidationFailure`
//! (121) and MongoDB 7.0's `errInfo`; `moderate` versus `strict`; `warn`;
//! `bypassDocumentValidation` on inserts, updates, findAndModify and `$out` / `$merge`;
//! `listCollections` options; `$jsonSchema` as a query operator; validators on a sharded
//! collection.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::{ValidationAction, ValidationLevel};
use tests::EmbeddedCluster;

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

/// The `errInfo` of a single-document write's error.
fn err_info(e: &mongodb::error::Error) -> Document {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            assert_eq!(w.code, 121, "{e}");
            assert_eq!(w.message, "Document failed validation");
            w.details.clone().unwrap_or_default()
        }
        _ => panic!("not a write error: {e}"),
    }
}

async fn all(coll: &mongodb::Collection<Document>) -> anyhow::Result<Vec<Document>> {
    Ok(coll
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await?)
}

fn person_schema() -> Document {
    doc! {"$jsonSchema": {
        "bsonType": "object",
        "required": ["name"],
        "properties": {
            "name": {"bsonType": "string", "description": "must be a string"},
            "age": {"bsonType": "int", "minimum": 0},
        },
    }}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_failing_the_validator_get_121_with_err_info_and_leave_nothing()
-> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("val");
    db.run_command(doc! {"create": "people", "validator": person_schema()})
        .await?;
    let people = db.collection::<Document>("people");
    people
        .insert_one(doc! {"_id": 1, "name": "ann", "age": 3})
        .await?;

    let e = people
        .insert_one(doc! {"_id": 2, "age": 4})
        .await
        .expect_err("name is required");
    assert_eq!(
        err_info(&e),
        doc! {
            "failingDocumentId": 2,
            "details": {
                "operatorName": "$jsonSchema",
                "schemaRulesNotSatisfied": [
                    {"operatorName": "required", "specifiedAs": {"required": ["name"]}, "missingProperties": ["name"]},
                ],
            },
        }
    );
    let e = people
        .insert_one(doc! {"_id": 3, "name": 7})
        .await
        .expect_err("name must be a string");
    assert_eq!(
        err_info(&e).get_document("details")?,
        &doc! {
            "operatorName": "$jsonSchema",
            "schemaRulesNotSatisfied": [{"operatorName": "properties", "propertiesNotSatisfied": [
                {"propertyName": "name", "description": "must be a string", "details": [
                    {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
                     "reason": "type did not match", "consideredValue": 7, "consideredType": "int"},
                ]},
            ]}],
        }
    );

    // An ordered insertMany keeps the documents before the failing one, and stops there.
    let e = people
        .insert_many([
            doc! {"_id": 10, "name": "a"},
            doc! {"_id": 11, "name": "b", "age": -1},
            doc! {"_id": 12, "name": "c"},
        ])
        .await
        .expect_err("the second fails");
    let ErrorKind::InsertMany(ref failure) = *e.kind else {
        panic!("{e}")
    };
    let errors = failure.write_errors.clone().unwrap_or_default();
    assert_eq!(errors.len(), 1);
    assert_eq!((errors[0].index, errors[0].code), (1, 121));
    assert_eq!(
        errors[0]
            .details
            .as_ref()
            .and_then(|d| d.get("failingDocumentId")),
        Some(&Bson::Int32(11))
    );
    // Unordered: every valid document goes in.
    let e = people
        .insert_many([doc! {"_id": 20}, doc! {"_id": 21, "name": "d"}])
        .ordered(false)
        .await
        .expect_err("the first fails");
    assert_eq!(code(&e), Some(121));
    let ids: Vec<Bson> = all(&people)
        .await?
        .iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
    assert_eq!(ids, vec![Bson::Int32(1), Bson::Int32(10), Bson::Int32(21)]);
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_replacements_upserts_and_find_and_modify_are_validated() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("val");
    db.run_command(
        doc! {"create": "c", "validator": {"qty": {"$gte": 0}, "sku": {"$type": "string"}}},
    )
    .await?;
    let c = db.collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "qty": 5, "sku": "a"}).await?;

    let e = c
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"qty": -10}})
        .await
        .expect_err("qty would go negative");
    assert_eq!(
        err_info(&e),
        doc! {"failingDocumentId": 1, "details": {"operatorName": "$and", "clausesNotSatisfied": [
            {"index": 0, "details": {"operatorName": "$gte", "specifiedAs": {"qty": {"$gte": 0}},
                                     "reason": "comparison failed", "consideredValue": -5}},
        ]}}
    );
    let e = c
        .replace_one(doc! {"_id": 1}, doc! {"qty": 1})
        .await
        .expect_err("sku is missing");
    assert_eq!(code(&e), Some(121));
    let e = c
        .update_one(doc! {"_id": 9}, doc! {"$set": {"qty": -1, "sku": "z"}})
        .upsert(true)
        .await
        .expect_err("the upserted document fails");
    assert_eq!(code(&e), Some(121));
    let e = c
        .find_one_and_update(doc! {"_id": 1}, doc! {"$set": {"sku": 5}})
        .await
        .expect_err("sku must stay a string");
    assert_eq!(code(&e), Some(121));
    let reply = e.server_response().expect("the server's reply");
    let reply = Document::try_from(reply.as_ref())?;
    assert_eq!(reply.get_str("codeName")?, "DocumentValidationFailure");
    assert_eq!(reply.get_str("errmsg")?, "Document failed validation");
    let info = reply.get_document("errInfo")?;
    assert_eq!(info.get_i32("failingDocumentId")?, 1);
    assert_eq!(
        info.get_document("details")?,
        &doc! {"operatorName": "$and", "clausesNotSatisfied": [
            {"index": 1, "details": {"operatorName": "$type", "specifiedAs": {"sku": {"$type": "string"}},
                                     "reason": "type did not match", "consideredValue": 5, "consideredType": "int"}},
        ]}
    );
    // Nothing of the refused writes is left behind; a valid update goes through.
    assert_eq!(all(&c).await?, vec![doc! {"_id": 1, "qty": 5, "sku": "a"}]);
    c.update_one(doc! {"_id": 1}, doc! {"$inc": {"qty": -5}})
        .await?;
    // Deletes are never validated.
    c.delete_one(doc! {"_id": 1}).await?;

    // A validator's $expr sees $$NOW as the time of the write.
    db.run_command(doc! {"create": "timed", "validator": {"$expr": {"$lte": ["$at", "$$NOW"]}}})
        .await?;
    let timed = db.collection::<Document>("timed");
    let at = |ms: i64| doc! {"at": mongodb::bson::DateTime::from_millis(ms)};
    timed.insert_one(at(946_684_800_000)).await?;
    let e = timed
        .insert_one(at(32_503_680_000_000))
        .await
        .expect_err("the year 3000 is in the future");
    let details = err_info(&e).get_document("details")?.clone();
    assert_eq!(details.get_str("operatorName")?, "$expr");
    assert_eq!(details.get_str("reason")?, "expression did not match");
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moderate_strict_off_and_warn_levels_and_actions() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("val");
    let c = db.collection::<Document>("levels");
    // Documents written before the validator exists may not satisfy it.
    c.insert_many([doc! {"_id": 1, "n": -1}, doc! {"_id": 2, "n": 1}])
        .await?;
    db.run_command(
        doc! {"collMod": "levels", "validator": {"n": {"$gt": 0}}, "validationLevel": "moderate"},
    )
    .await?;

    // moderate: an invalid document may be updated (and stay invalid) ...
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": -2}})
        .await?;
    // ... but a valid one may not become invalid, and inserts are checked.
    let e = c
        .update_one(doc! {"_id": 2}, doc! {"$set": {"n": -2}})
        .await
        .expect_err("valid documents stay valid");
    assert_eq!(code(&e), Some(121));
    assert_eq!(
        code(&c.insert_one(doc! {"_id": 3, "n": 0}).await.unwrap_err()),
        Some(121)
    );

    // strict: the invalid document can no longer be updated unless it becomes valid.
    db.run_command(doc! {"collMod": "levels", "validationLevel": "strict"})
        .await?;
    let e = c
        .update_one(doc! {"_id": 1}, doc! {"$set": {"n": -3}})
        .await
        .expect_err("strict checks every update");
    assert_eq!(code(&e), Some(121));
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 3}})
        .await?;

    // warn: the write goes through.
    db.run_command(doc! {"collMod": "levels", "validationAction": "warn"})
        .await?;
    c.insert_one(doc! {"_id": 4, "n": -4}).await?;
    // off: nothing is checked.
    db.run_command(
        doc! {"collMod": "levels", "validationAction": "error", "validationLevel": "off"},
    )
    .await?;
    c.insert_one(doc! {"_id": 5, "n": -5}).await?;
    db.run_command(doc! {"collMod": "levels", "validationLevel": "strict"})
        .await?;
    assert_eq!(
        code(&c.insert_one(doc! {"_id": 6, "n": -6}).await.unwrap_err()),
        Some(121)
    );
    // An empty validator removes validation.
    db.run_command(doc! {"collMod": "levels", "validator": {}})
        .await?;
    c.insert_one(doc! {"_id": 6, "n": -6}).await?;
    let ids: Vec<Bson> = all(&c)
        .await?
        .iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
    assert_eq!(ids, [1, 2, 4, 5, 6].map(Bson::Int32).to_vec());
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_document_validation_skips_the_validator() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("val");
    db.create_collection("strict")
        .validator(doc! {"ok": true})
        .await?;
    let c = db.collection::<Document>("strict");
    c.insert_one(doc! {"_id": 1, "ok": false})
        .bypass_document_validation(true)
        .await?;
    c.insert_many([doc! {"_id": 2}, doc! {"_id": 3}])
        .bypass_document_validation(true)
        .await?;
    c.update_one(doc! {"_id": 2}, doc! {"$set": {"x": 1}})
        .bypass_document_validation(true)
        .await?;
    c.find_one_and_update(doc! {"_id": 3}, doc! {"$set": {"x": 1}})
        .bypass_document_validation(true)
        .await?;
    assert_eq!(
        code(&c.insert_one(doc! {"_id": 4}).await.unwrap_err()),
        Some(121)
    );

    // $out and $merge write with the target's validator unless the aggregate bypasses it.
    let source = db.collection::<Document>("source");
    source
        .insert_many([doc! {"_id": 10}, doc! {"_id": 11}])
        .await?;
    let e = source
        .aggregate([doc! {"$merge": {"into": "strict"}}])
        .await
        .expect_err("the merged documents fail the validator");
    assert_eq!(code(&e), Some(121));
    source
        .aggregate([doc! {"$merge": {"into": "strict"}}])
        .bypass_document_validation(true)
        .await?;
    assert_eq!(c.count_documents(doc! {}).await?, 5);
    let e = source
        .aggregate([doc! {"$out": "strict"}])
        .await
        .expect_err("$out validates too");
    assert_eq!(code(&e), Some(121));
    assert_eq!(
        c.count_documents(doc! {}).await?,
        5,
        "the target is untouched"
    );
    source
        .aggregate([doc! {"$out": "strict"}])
        .bypass_document_validation(true)
        .await?;
    assert_eq!(c.count_documents(doc! {}).await?, 2);
    // The target keeps its validator through $out's rename.
    assert_eq!(
        code(&c.insert_one(doc! {"_id": 4}).await.unwrap_err()),
        Some(121)
    );
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_collections_shows_the_options_and_bad_validators_are_refused() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("val");
    db.create_collection("opts")
        .validator(doc! {"a": {"$exists": true}})
        .validation_level(ValidationLevel::Moderate)
        .validation_action(ValidationAction::Warn)
        .await?;
    let options = |name: &'static str| {
        let db = db.clone();
        async move {
            let spec = db
                .list_collections()
                .filter(doc! {"name": name})
                .await?
                .try_next()
                .await?
                .expect("listed");
            anyhow::Ok(mongodb::bson::serialize_to_document(&spec.options)?)
        }
    };
    let o = options("opts").await?;
    assert_eq!(o.get_document("validator")?, &doc! {"a": {"$exists": true}});
    assert_eq!(o.get_str("validationLevel")?, "moderate");
    assert_eq!(o.get_str("validationAction")?, "warn");
    db.run_command(
        doc! {"collMod": "opts", "validator": person_schema(), "validationAction": "error"},
    )
    .await?;
    let o = options("opts").await?;
    assert_eq!(o.get_document("validator")?, &person_schema());
    assert_eq!(o.get_str("validationAction")?, "error");

    let refused = [
        (doc! {"validator": {"$where": "this.a"}}, 224),
        (doc! {"validator": {"$text": {"$search": "x"}}}, 224),
        (doc! {"validator": {"loc": {"$near": [0, 0]}}}, 224),
        (doc! {"validator": {"$jsonSchema": {"bogus": 1}}}, 9),
        (doc! {"validator": {"$jsonSchema": {"format": "email"}}}, 9),
        (doc! {"validator": {"a": {"$bogus": 1}}}, 2),
        (doc! {"validator": 5}, 14),
        (doc! {"validationLevel": "sometimes"}, 2),
        (doc! {"validationAction": "shout"}, 2),
    ];
    for (options, want) in refused {
        let mut create = doc! {"create": "refused"};
        create.extend(options.clone());
        let e = db.run_command(create).await.expect_err("refused");
        assert_eq!(code(&e), Some(want), "create {options}: {e}");
        let mut coll_mod = doc! {"collMod": "opts"};
        coll_mod.extend(options.clone());
        let e = db.run_command(coll_mod).await.expect_err("refused");
        assert_eq!(code(&e), Some(want), "collMod {options}: {e}");
    }
    // Views have no validator.
    db.run_command(doc! {"create": "view", "viewOn": "opts", "pipeline": []})
        .await?;
    for options in [
        doc! {"validator": {"a": 1}},
        doc! {"validationLevel": "off"},
    ] {
        let mut coll_mod = doc! {"collMod": "view"};
        coll_mod.extend(options.clone());
        let e = db.run_command(coll_mod).await.expect_err("refused");
        assert_eq!(code(&e), Some(72), "collMod on a view {options}: {e}");
    }
    let e = db
        .run_command(doc! {"create": "view2", "viewOn": "opts", "validator": {"a": 1}})
        .await
        .expect_err("refused");
    assert_eq!(code(&e), Some(72));
    let names = db.list_collection_names().await?;
    assert!(!names.contains(&"refused".to_string()), "{names:?}");
    // The refused collMods changed nothing.
    assert_eq!(
        options("opts").await?.get_document("validator")?,
        &person_schema()
    );
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_works_in_find_and_match() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let c = client.database("val").collection::<Document>("q");
    c.insert_many([
        doc! {"_id": 1, "name": "a", "age": 1},
        doc! {"_id": 2, "name": 2},
        doc! {"_id": 3, "age": 3},
    ])
    .await?;
    let found: Vec<Document> = c
        .find(person_schema())
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await?;
    assert_eq!(found, vec![doc! {"_id": 1, "name": "a", "age": 1}]);
    let matched: Vec<Document> = c
        .aggregate([
            doc! {"$match": {"$jsonSchema": {"required": ["age"]}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await?
        .try_collect()
        .await?;
    assert_eq!(matched.len(), 2);
    let e = c
        .find(doc! {"$jsonSchema": {"unknownKeyword": 1}})
        .await
        .expect_err("bad schema");
    assert_eq!(code(&e), Some(9));
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_collection_validates_on_every_shard() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let db = client.database("valsh");
    db.run_command(doc! {"create": "c", "validator": {"$jsonSchema": {"required": ["v"]}}})
        .await?;
    tests::shard_collection(&client, "valsh.c", doc! {"_id": "hashed"}).await?;
    let c = db.collection::<Document>("c");
    c.insert_many((0..20).map(|i| doc! {"_id": i, "v": i}))
        .await?;
    // An ordered insert across the shards stops at the first invalid document.
    let e = c
        .insert_many((20..30).map(|i| {
            if i == 25 {
                doc! {"_id": i}
            } else {
                doc! {"_id": i, "v": i}
            }
        }))
        .await
        .expect_err("document 25 fails");
    let ErrorKind::InsertMany(ref failure) = *e.kind else {
        panic!("{e}")
    };
    let errors = failure.write_errors.clone().unwrap_or_default();
    assert_eq!((errors.len(), errors[0].index, errors[0].code), (1, 5, 121));
    assert_eq!(c.count_documents(doc! {}).await?, 25);
    // Updates on every shard are validated; bypass works across shards.
    let e = c
        .update_many(doc! {}, doc! {"$unset": {"v": ""}})
        .await
        .expect_err("v is required");
    assert_eq!(code(&e), Some(121));
    c.insert_many((30..40).map(|i| doc! {"_id": i}))
        .bypass_document_validation(true)
        .await?;
    assert_eq!(c.count_documents(doc! {"v": {"$exists": false}}).await?, 10);
    cluster.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_in_a_transaction_aborts_it_and_leaves_nothing() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let db = client.database("valtxn");
    db.run_command(doc! {"create": "c", "validator": {"n": {"$type": "int"}}})
        .await?;
    let c = db.collection::<Document>("c");
    let mut s = client.start_session().await?;
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": 1, "n": 1})
        .session(&mut s)
        .await?;
    let e = c
        .insert_one(doc! {"_id": 2, "n": "two"})
        .session(&mut s)
        .await
        .expect_err("fails validation");
    assert_eq!(code(&e), Some(121));
    assert_eq!(err_info(&e).get("failingDocumentId"), Some(&Bson::Int32(2)));
    let e = s
        .commit_transaction()
        .await
        .expect_err("the transaction is aborted");
    assert_eq!(code(&e), Some(251), "{e}");
    assert_eq!(c.count_documents(doc! {}).await?, 0);

    // With bypassDocumentValidation inside a transaction, it commits.
    s.start_transaction().await?;
    c.insert_one(doc! {"_id": 3, "n": "three"})
        .bypass_document_validation(true)
        .session(&mut s)
        .await?;
    s.commit_transaction().await?;
    assert_eq!(all(&c).await?, vec![doc! {"_id": 3, "n": "three"}]);
    cluster.stop().await;
    Ok(())
}
