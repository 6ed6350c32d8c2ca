//! The drivers' unified CRUD and retryable-writes spec tests (`../shared/spec-tests/crud/` and
//! `../shared/spec-tests/retryable-writes/`, read unchanged) against an embedded cluster
//! started with `--enableTestCommands`, presented as a mongos and as a single-node replica
//! set, and as a mongos with `--auth` and `requireTLS` (where `handshakeError.json` runs: its
//! fail points break the connection handshake's `saslContinue`).
//!
//! Invariant: every test that applies to the reported server version passes, except those in
//! `tests/spec-known-failures-crud.txt`, which must fail (so the list stays true). Tests are
//! named `<folder>/<file>`.

use mongodb::bson::{Document, doc};
use router::Presentation;
use tests::unified::harness::{self, Security};
use tests::unified::{self, Outcome};

const SHARDS: usize = 2;
/// As a mongos, two routers: clients with `useMultipleMongoses` get both.
const ROUTERS: usize = 2;

async fn run_all(presentation: Presentation, security: Security) -> anyhow::Result<()> {
    harness::run_folders(
        "crud",
        &[("crud", 100), ("retryable-writes", 20)],
        "spec-known-failures-crud.txt",
        presentation,
        SHARDS,
        ROUTERS,
        security,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_crud_and_retryable_writes_as_a_router() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::Open).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_crud_and_retryable_writes_as_a_replica_set() -> anyhow::Result<()> {
    run_all(Presentation::ReplicaSet, Security::Open).await
}

/// The same files with `--auth` and `requireTLS`: the runner's clients log in as a `root`
/// user over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_crud_and_retryable_writes_with_auth_and_tls() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::AuthAndTls).await
}

// ----- the runner's own checks ---------------------------------------------------------------

/// A one-test file whose client observes connection check-outs and command starts.
fn cmap_file(expect_events: Vec<Document>) -> Document {
    doc! {
        "description": "runner self-test",
        "schemaVersion": "1.21",
        "createEntities": [
            {"client": {"id": "client0", "useMultipleMongoses": false,
                "observeEvents": ["connectionCheckOutStartedEvent", "commandStartedEvent"]}},
            {"database": {"id": "database0", "client": "client0", "databaseName": "selftest"}},
            {"collection": {"id": "collection0", "database": "database0", "collectionName": "c"}},
        ],
        "initialData": [{"collectionName": "c", "databaseName": "selftest", "documents": []}],
        "tests": [{
            "description": "case",
            "operations": [{"object": "collection0", "name": "insertOne",
                "arguments": {"document": {"_id": 1}}}],
            "expectEvents": expect_events,
        }],
    }
}

fn checkouts(n: usize) -> Document {
    let events: Vec<Document> = (0..n)
        .map(|_| doc! {"connectionCheckOutStartedEvent": {}})
        .collect();
    doc! {"client": "client0", "eventType": "cmap", "events": events}
}

/// CMAP expectations (`eventType: cmap`) are checked, not accepted blindly: one insert on a
/// fresh client checks out one connection, and tests that say otherwise fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_checks_connection_pool_events() -> anyhow::Result<()> {
    let cluster = harness::start(Presentation::Mongos, 1, 1).await?;
    let uri = cluster.uri.clone();
    let server = unified::probe(&uri).await?;
    let outcome = |events: Vec<Document>| {
        let (uri, server) = (uri.clone(), server.clone());
        async move {
            let results = unified::run_document(&uri, &server, "selftest.json", &cmap_file(events))
                .await
                .expect("the runner runs the file");
            results
                .into_iter()
                .next()
                .map(|r| r.outcome)
                .expect("one result")
        }
    };
    let inserted = doc! {"client": "client0", "events": [
        {"commandStartedEvent": {"commandName": "insert"}},
    ]};
    assert_eq!(
        outcome(vec![checkouts(1), inserted.clone()]).await,
        Outcome::Passed
    );
    let must_fail: Vec<(&str, Vec<Document>)> = vec![
        ("one check-out too many", vec![checkouts(2)]),
        ("no check-out", vec![checkouts(0)]),
        (
            "a check-in where a check-out started",
            vec![doc! {"client": "client0", "eventType": "cmap",
            "events": [{"connectionCheckedInEvent": {}}]}],
        ),
    ];
    for (why, events) in must_fail {
        assert!(
            matches!(outcome(events).await, Outcome::Failed(_)),
            "a test with {why} passed"
        );
    }
    cluster.shutdown().await;
    Ok(())
}
