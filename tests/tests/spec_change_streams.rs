//! The drivers' unified change-stream spec tests (`../shared/spec-tests/change-streams/`, read
//! unchanged) against an embedded cluster started with `--enableTestCommands`, once presented
//! as a mongos and once as a single-node replica set; and the runner's own checks, hand-made
//! tests that must fail; and the server's test surface the spec files use (fail points, write
//! concern errors).
//!
//! Invariant: every test that applies to the reported server version passes, except those in
//! `tests/spec-known-failures.txt`, which must fail (so the list stays true).

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use router::Presentation;
use tests::unified::harness::Security;
use tests::unified::{self, KnownFailure, Outcome, ServerInfo, harness};

const SHARDS: usize = 2;

async fn run_all(presentation: Presentation, security: Security) -> anyhow::Result<()> {
    harness::run_folders(
        "change-streams",
        &[("change-streams", 9)],
        "spec-known-failures.txt",
        presentation,
        SHARDS,
        1,
        security,
    )
    .await
}

/// The known-failures list of these files.
fn known_failures() -> Vec<KnownFailure> {
    harness::known_failures("spec-known-failures.txt").expect("the known-failures list parses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_change_streams_pass_as_a_router() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::Open).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_change_streams_pass_as_a_replica_set() -> anyhow::Result<()> {
    run_all(Presentation::ReplicaSet, Security::Open).await
}

/// The same files with `--auth` and `requireTLS`: the runner's clients log in as a `root`
/// user over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_change_streams_pass_with_auth_and_tls() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::AuthAndTls).await
}

// ----- the runner's own checks ---------------------------------------------------------------

/// A one-test file in the shape of the spec files, with `test` as its only test.
fn file_with(test: Document) -> Document {
    doc! {
        "description": "runner self-test",
        "schemaVersion": "1.7",
        "createEntities": [
            {"client": {"id": "client0", "observeEvents": ["commandStartedEvent"], "ignoreCommandMonitoringEvents": ["killCursors"]}},
            {"client": {"id": "globalClient"}},
            {"database": {"id": "database0", "client": "client0", "databaseName": "selftest"}},
            {"collection": {"id": "collection0", "database": "database0", "collectionName": "c"}},
            {"database": {"id": "globalDatabase0", "client": "globalClient", "databaseName": "selftest"}},
            {"collection": {"id": "globalCollection0", "database": "globalDatabase0", "collectionName": "c"}},
        ],
        "initialData": [{"collectionName": "c", "databaseName": "selftest", "documents": []}],
        "tests": [test],
    }
}

fn stream_then(iterate: Document, extra_ops: Vec<Document>, events: Option<Document>) -> Document {
    let mut ops: Vec<Bson> = vec![Bson::Document(doc! {
        "name": "createChangeStream", "object": "collection0",
        "arguments": {"pipeline": []}, "saveResultAsEntity": "changeStream0",
    })];
    ops.extend(extra_ops.into_iter().map(Bson::Document));
    ops.push(Bson::Document(iterate));
    let mut test = doc! {"description": "case", "operations": ops};
    if let Some(e) = events {
        test.insert("expectEvents", vec![Bson::Document(e)]);
    }
    test
}

fn insert_x(x: i32) -> Document {
    doc! {"name": "insertOne", "object": "globalCollection0", "arguments": {"document": {"x": x}}}
}

async fn outcome_of(uri: &str, server: &ServerInfo, test: Document) -> Outcome {
    let results = unified::run_document(uri, server, "selftest.json", &file_with(test))
        .await
        .expect("the runner runs the file");
    assert_eq!(results.len(), 1);
    results
        .into_iter()
        .next()
        .map(|r| r.outcome)
        .expect("one result")
}

fn iterate_expecting(result: Document) -> Document {
    doc! {"name": "iterateUntilDocumentOrError", "object": "changeStream0", "expectResult": result}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_fails_hand_made_tests_that_must_fail() -> anyhow::Result<()> {
    let cluster = harness::start(Presentation::Mongos, 1, 1).await?;
    let uri = cluster.uri.clone();
    let server = unified::probe(&uri).await?;

    // The control: a correct test passes.
    let good = stream_then(
        iterate_expecting(
            doc! {"operationType": "insert", "ns": {"db": "selftest", "coll": "c"}, "fullDocument": {"x": 1, "_id": {"$$exists": true}}},
        ),
        vec![insert_x(1)],
        Some(
            doc! {"client": "client0", "ignoreExtraEvents": true, "events": [
                {"commandStartedEvent": {"commandName": "aggregate", "databaseName": "selftest",
                 "command": {"aggregate": "c", "pipeline": [{"$changeStream": {}}]}}},
            ]},
        ),
    );
    assert_eq!(outcome_of(&uri, &server, good).await, Outcome::Passed);

    let must_fail: Vec<(&str, Document)> = vec![
        (
            "wrong value in the event",
            stream_then(
                iterate_expecting(doc! {"fullDocument": {"x": 2, "_id": {"$$exists": true}}}),
                vec![insert_x(1)],
                None,
            ),
        ),
        (
            "extra key in a nested document",
            stream_then(
                iterate_expecting(doc! {"ns": {"db": "selftest"}}),
                vec![insert_x(1)],
                None,
            ),
        ),
        (
            "$$exists false on a present field",
            stream_then(
                iterate_expecting(doc! {"clusterTime": {"$$exists": false}}),
                vec![insert_x(1)],
                None,
            ),
        ),
        (
            "$$type mismatch",
            stream_then(
                iterate_expecting(doc! {"clusterTime": {"$$type": "long"}}),
                vec![insert_x(1)],
                None,
            ),
        ),
        (
            "expectError when the operation succeeds",
            stream_then(
                doc! {"name": "iterateUntilDocumentOrError", "object": "changeStream0", "expectError": {"errorCode": 6}},
                vec![insert_x(1)],
                None,
            ),
        ),
        (
            "wrong error code",
            doc! {"description": "case", "operations": [
                {"name": "failPoint", "object": "testRunner", "arguments": {"client": "globalClient", "failPoint": {
                    "configureFailPoint": "failCommand", "mode": {"times": 1},
                    "data": {"failCommands": ["insert"], "errorCode": 216}}}},
                {"name": "insertOne", "object": "collection0", "arguments": {"document": {"x": 1}},
                 "expectError": {"errorCode": 217}},
            ]},
        ),
        (
            "isClientError on a server error",
            doc! {"description": "case", "operations": [
                {"name": "failPoint", "object": "testRunner", "arguments": {"client": "globalClient", "failPoint": {
                    "configureFailPoint": "failCommand", "mode": {"times": 1},
                    "data": {"failCommands": ["insert"], "errorCode": 216}}}},
                {"name": "insertOne", "object": "collection0", "arguments": {"document": {"x": 1}},
                 "expectError": {"isClientError": true}},
            ]},
        ),
        (
            "an exact event list with an event missing",
            stream_then(
                doc! {"name": "iterateUntilDocumentOrError", "object": "changeStream0"},
                vec![insert_x(1)],
                Some(doc! {"client": "client0", "events": []}),
            ),
        ),
        (
            "an expected event that never happened",
            stream_then(
                doc! {"name": "iterateUntilDocumentOrError", "object": "changeStream0"},
                vec![insert_x(1)],
                Some(
                    doc! {"client": "client0", "ignoreExtraEvents": true, "events": [
                        {"commandStartedEvent": {"commandName": "aggregate"}},
                        {"commandStartedEvent": {"commandName": "find"}},
                    ]},
                ),
            ),
        ),
        (
            "an unsupported operation",
            doc! {"description": "case", "operations": [
                {"name": "findOneAndFrobnicate", "object": "collection0", "arguments": {}},
            ]},
        ),
    ];
    for (what, test) in must_fail {
        let outcome = outcome_of(&uri, &server, test).await;
        assert!(
            matches!(outcome, Outcome::Failed(_)),
            "{what}: expected a failure, got {outcome:?}"
        );
    }

    // Requirements: a test for a newer server is skipped, not run.
    let newer = doc! {"description": "case", "runOnRequirements": [{"minServerVersion": "99.0"}],
    "operations": [{"name": "findOneAndFrobnicate", "object": "collection0"}]};
    assert!(matches!(
        outcome_of(&uri, &server, newer).await,
        Outcome::Skipped(_)
    ));

    // Fail points are turned off after each test: this insert succeeds.
    let after = doc! {"description": "case", "operations": [insert_x(5)]};
    assert_eq!(outcome_of(&uri, &server, after).await, Outcome::Passed);

    cluster.shutdown().await;
    Ok(())
}

#[test]
fn known_failures_list_must_stay_true() {
    let known = KnownFailure::parse_list("sharded | f.json | t | needs X\n").unwrap();
    let result = |outcome| unified::TestResult {
        file: "f.json".into(),
        description: "t".into(),
        outcome,
    };
    let failed = unified::summarize("sharded", &[result(Outcome::Failed("x".into()))], &known);
    assert!(failed.problems.is_empty());
    assert_eq!(failed.to_string(), "0 passed, 1 failed, 0 skipped");
    let passed = unified::summarize("sharded", &[result(Outcome::Passed)], &known);
    assert_eq!(
        passed.problems.len(),
        1,
        "a listed test that passes is a problem"
    );
    let other = unified::summarize("replicaset", &[result(Outcome::Failed("x".into()))], &known);
    assert_eq!(other.problems.len(), 1, "the entry is for another topology");
    assert!(
        KnownFailure::parse_list("sharded | f.json | t |\n").is_err(),
        "reason required"
    );
    // The real list parses.
    known_failures();
}

/// As in MongoDB: without `--enableTestCommands` there is no `configureFailPoint` and
/// `getParameter` says so; with it, the parameter is true and fail points work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_points_exist_only_with_enable_test_commands() -> anyhow::Result<()> {
    let plain = tests::EmbeddedCluster::start(1).await?;
    let client = plain.client().await?;
    let admin = client.database("admin");
    let params = admin.run_command(doc! {"getParameter": "*"}).await?;
    assert!(!params.get_bool("enableTestCommands")?);
    let err = admin
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"})
        .await
        .expect_err("configureFailPoint without --enableTestCommands");
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref c) => assert_eq!(c.code, 59, "{c:?}"),
        ref other => panic!("expected CommandNotFound, got {other:?}"),
    }
    plain.stop().await;

    let cluster = harness::start(Presentation::Mongos, 1, 1).await?;
    let client = tests::connect_uri(&cluster.uri).await?;
    let admin = client.database("admin");
    let params = admin.run_command(doc! {"getParameter": "*"}).await?;
    assert!(params.get_bool("enableTestCommands")?);
    // Only on admin.
    let err = client
        .database("other")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"})
        .await
        .expect_err("configureFailPoint outside admin");
    assert!(matches!(*err.kind, mongodb::error::ErrorKind::Command(ref c) if c.code == 13));
    admin
        .run_command(
            doc! {"configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["ping"], "errorCode": 91}},
        )
        .await?;
    let err = admin
        .run_command(doc! {"ping": 1})
        .await
        .expect_err("injected");
    assert!(
        matches!(*err.kind, mongodb::error::ErrorKind::Command(ref c) if c.code == 91 && c.code_name == "ShutdownInProgress")
    );
    admin.run_command(doc! {"ping": 1}).await?;
    cluster.shutdown().await;
    Ok(())
}

/// The test surface retryable-write and transaction tests use, through the Rust driver:
/// `onPrimaryTransactionalWrite` loses a retryable write's reply after it committed (the
/// driver's retry is answered from the session's record, and the document is stored once) or
/// fails it before (the retry stores it; failing twice stores nothing);
/// `maxTimeAlwaysTimeOut` fails commands with a `maxTimeMS`; `w` above one node is a
/// `writeConcernError` 100 after the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_write_fail_points_and_unsatisfiable_write_concerns() -> anyhow::Result<()> {
    let cluster = harness::start(Presentation::ReplicaSet, 1, 1).await?;
    let client = tests::connect_uri(&cluster.uri).await?;
    let admin = client.database("admin");
    let c = client.database("rw").collection::<Document>("c");
    let fail_point = |mode: Bson, data: Document| {
        doc! {"configureFailPoint": "onPrimaryTransactionalWrite", "mode": mode, "data": data}
    };
    // Committed, then the connection closes: retried, answered once.
    admin
        .run_command(fail_point(doc! {"times": 1}.into(), doc! {}))
        .await?;
    c.insert_one(doc! {"_id": 1}).await?;
    // Failed before the commit: the retry writes it.
    admin
        .run_command(fail_point(
            doc! {"times": 1}.into(),
            doc! {"failBeforeCommitExceptionCode": 1},
        ))
        .await?;
    c.insert_one(doc! {"_id": 2}).await?;
    // Failed on both attempts: an error, nothing written.
    admin
        .run_command(fail_point(
            doc! {"times": 2}.into(),
            doc! {"failBeforeCommitExceptionCode": 1},
        ))
        .await?;
    c.insert_one(doc! {"_id": 3})
        .await
        .expect_err("both attempts fail");
    let ids: Vec<Document> = c
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await?;
    assert_eq!(ids, vec![doc! {"_id": 1}, doc! {"_id": 2}]);

    admin
        .run_command(doc! {"configureFailPoint": "maxTimeAlwaysTimeOut", "mode": "alwaysOn"})
        .await?;
    let err = c
        .find(doc! {})
        .max_time(std::time::Duration::from_secs(5))
        .await
        .expect_err("maxTimeMS always times out");
    assert!(matches!(*err.kind, mongodb::error::ErrorKind::Command(ref e) if e.code == 50));
    assert_eq!(
        c.count_documents(doc! {}).await?,
        2,
        "no maxTimeMS, no fail"
    );
    admin
        .run_command(doc! {"configureFailPoint": "maxTimeAlwaysTimeOut", "mode": "off"})
        .await?;

    let reply = client
        .database("rw")
        .run_command(doc! {"insert": "c", "documents": [{"_id": 4}], "writeConcern": {"w": 3}})
        .await?;
    let wce = reply.get_document("writeConcernError")?;
    assert_eq!(wce.get_i32("code")?, 100, "{reply}");
    assert_eq!(wce.get_str("codeName")?, "UnsatisfiableWriteConcern");
    assert_eq!(
        c.count_documents(doc! {"_id": 4}).await?,
        1,
        "the write ran"
    );
    let reply = client
        .database("rw")
        .run_command(doc! {"insert": "c", "documents": [{"_id": 5}], "writeConcern": {"w": "dc2"}})
        .await?;
    assert_eq!(
        reply.get_document("writeConcernError")?.get_i32("code")?,
        79
    );
    cluster.shutdown().await;
    Ok(())
}
