//! The drivers' unified transaction spec tests (`../shared/spec-tests/transactions/` and
//! `../shared/spec-tests/transactions-convenient-api/`, read unchanged) against an embedded
//! cluster started with `--enableTestCommands`, once presented as a mongos and once as a
//! single-node replica set; and the runner's own checks of what these files added to it
//! (sessions, transactions, `withTransaction`, `outcome`), hand-made tests that must fail.
//!
//! Invariant: every test that applies to the reported server version passes, except those in
//! `tests/spec-known-failures-transactions.txt`, which must fail (so the list stays true).
//! Tests are named `<folder>/<file>` here, since both folders have a `commit.json` and a
//! `transaction-options.json`.

use mongodb::bson::{Bson, Document, doc};
use router::Presentation;
use tests::unified::harness::Security;
use tests::unified::{self, KnownFailure, Outcome, ServerInfo, harness};

const SHARDS: usize = 2;
/// As a mongos, two routers: clients with `useMultipleMongoses` get both, so a commit retried
/// on the other router is one that does not know the transaction.
const ROUTERS: usize = 2;

async fn run_all(presentation: Presentation, security: Security) -> anyhow::Result<()> {
    harness::run_folders(
        "transactions",
        &[("transactions", 10), ("transactions-convenient-api", 10)],
        "spec-known-failures-transactions.txt",
        presentation,
        SHARDS,
        ROUTERS,
        security,
    )
    .await
}

/// The known-failures list of these files.
fn known_failures() -> Vec<KnownFailure> {
    harness::known_failures("spec-known-failures-transactions.txt")
        .expect("the known-failures list parses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_transactions_pass_as_a_router() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::Open).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_transactions_pass_as_a_replica_set() -> anyhow::Result<()> {
    run_all(Presentation::ReplicaSet, Security::Open).await
}

/// The same files with `--auth` and `requireTLS`: the runner's clients log in as a `root`
/// user over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_transactions_pass_with_auth_and_tls() -> anyhow::Result<()> {
    run_all(Presentation::Mongos, Security::AuthAndTls).await
}

// ----- the runner's own checks ---------------------------------------------------------------

/// A one-test file in the shape of the transaction spec files, with `test` as its only test.
fn file_with(test: Document) -> Document {
    doc! {
        "description": "runner self-test",
        "schemaVersion": "1.9",
        "createEntities": [
            {"client": {"id": "client0", "useMultipleMongoses": false, "observeEvents": ["commandStartedEvent"]}},
            {"database": {"id": "database0", "client": "client0", "databaseName": "selftest"}},
            {"collection": {"id": "collection0", "database": "database0", "collectionName": "c"}},
            {"session": {"id": "session0", "client": "client0"}},
            {"session": {"id": "session1", "client": "client0"}},
        ],
        "initialData": [{"collectionName": "c", "databaseName": "selftest", "documents": [{"_id": 1}]}],
        "tests": [test],
    }
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

fn op(object: &str, name: &str, arguments: Document) -> Bson {
    Bson::Document(doc! {"object": object, "name": name, "arguments": arguments})
}

fn insert_in(session: &str, id: i32) -> Bson {
    op(
        "collection0",
        "insertOne",
        doc! {"session": session, "document": {"_id": id}},
    )
}

fn test(ops: Vec<Bson>, extra: Document) -> Document {
    let mut t = doc! {"description": "case", "operations": ops};
    t.extend(extra);
    t
}

/// What the control test's insert must look like, with `lsid` from `session`.
fn insert_event(session: &str) -> Document {
    doc! {"commandStartedEvent": {"commandName": "insert", "databaseName": "selftest", "command": {
        "insert": "c", "documents": [{"_id": 2}], "lsid": {"$$sessionLsid": session},
        "txnNumber": 1_i64, "startTransaction": true, "autocommit": false,
    }}}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_fails_hand_made_transaction_tests_that_must_fail() -> anyhow::Result<()> {
    let cluster = harness::start(Presentation::Mongos, 1, 1).await?;
    let uri = cluster.uri.clone();
    let server = unified::probe(&uri).await?;
    let transaction = || {
        vec![
            op("session0", "startTransaction", doc! {}),
            insert_in("session0", 2),
            op("session0", "commitTransaction", doc! {}),
        ]
    };
    let committed = doc! {"outcome": [{"collectionName": "c", "databaseName": "selftest",
    "documents": [{"_id": 1}, {"_id": 2}]}]};

    // The controls: correct tests pass.
    let mut good = committed.clone();
    good.insert(
        "expectEvents",
        vec![Bson::Document(
            doc! {"client": "client0", "ignoreExtraEvents": true,
            "events": [insert_event("session0")]},
        )],
    );
    assert_eq!(
        outcome_of(&uri, &server, test(transaction(), good)).await,
        Outcome::Passed
    );
    let convenient = vec![Bson::Document(doc! {
        "object": "session0", "name": "withTransaction",
        "arguments": {"callback": [insert_in("session0", 2)]},
    })];
    assert_eq!(
        outcome_of(&uri, &server, test(convenient, committed.clone())).await,
        Outcome::Passed
    );
    let aborted = vec![
        op("session0", "startTransaction", doc! {}),
        insert_in("session0", 2),
        op("session0", "abortTransaction", doc! {}),
    ];
    let unchanged = doc! {"outcome": [{"collectionName": "c", "databaseName": "selftest",
    "documents": [{"_id": 1}]}]};
    assert_eq!(
        outcome_of(&uri, &server, test(aborted, unchanged.clone())).await,
        Outcome::Passed
    );

    let must_fail: Vec<(&str, Document)> = vec![
        (
            "an outcome with a document the transaction did not write",
            test(
                transaction(),
                doc! {"outcome": [{"collectionName": "c", "databaseName": "selftest",
                "documents": [{"_id": 1}, {"_id": 2}, {"_id": 3}]}]},
            ),
        ),
        (
            "an outcome missing the committed document",
            test(transaction(), unchanged.clone()),
        ),
        (
            "$$sessionLsid naming the other session",
            test(
                transaction(),
                doc! {"expectEvents": [{"client": "client0", "ignoreExtraEvents": true,
                "events": [insert_event("session1")]}]},
            ),
        ),
        (
            "$$sessionLsid naming no session",
            test(
                transaction(),
                doc! {"expectEvents": [{"client": "client0", "ignoreExtraEvents": true,
                "events": [insert_event("nosuchsession")]}]},
            ),
        ),
        (
            "a wrong expectResult inside a withTransaction callback",
            test(
                vec![Bson::Document(doc! {
                    "object": "session0", "name": "withTransaction",
                    "arguments": {"callback": [{
                        "object": "collection0", "name": "insertOne",
                        "arguments": {"session": "session0", "document": {"_id": 2}},
                        "expectResult": {"insertedId": 3},
                    }]},
                })],
                doc! {},
            ),
        ),
        (
            "an expected error that a callback operation does not raise",
            test(
                vec![Bson::Document(doc! {
                    "object": "session0", "name": "withTransaction",
                    "arguments": {"callback": [{
                        "object": "collection0", "name": "insertOne",
                        "arguments": {"session": "session0", "document": {"_id": 2}},
                        "expectError": {"isError": true},
                    }]},
                })],
                doc! {},
            ),
        ),
        (
            "a duplicate key inside a callback expected to succeed",
            test(
                vec![Bson::Document(doc! {
                    "object": "session0", "name": "withTransaction",
                    "arguments": {"callback": [insert_in("session0", 1)]},
                })],
                doc! {},
            ),
        ),
        (
            "commit after abort is a client error, not success",
            test(
                vec![
                    op("session0", "startTransaction", doc! {}),
                    insert_in("session0", 2),
                    op("session0", "abortTransaction", doc! {}),
                    op("session0", "commitTransaction", doc! {}),
                ],
                doc! {},
            ),
        ),
        (
            "a wrong errorLabelsContain",
            test(
                vec![
                    op("session0", "startTransaction", doc! {}),
                    Bson::Document(doc! {
                        "object": "collection0", "name": "insertOne",
                        "arguments": {"session": "session0", "document": {"_id": 1}},
                        "expectError": {"errorLabelsContain": ["TransientTransactionError"]},
                    }),
                ],
                doc! {},
            ),
        ),
        (
            "an operation on an ended session",
            test(
                vec![
                    op("session0", "endSession", doc! {}),
                    insert_in("session0", 2),
                ],
                doc! {},
            ),
        ),
        (
            "an unknown session option",
            test(
                vec![Bson::Document(
                    doc! {"object": "testRunner", "name": "createEntities",
                    "arguments": {"entities": [{"session": {"id": "s", "client": "client0",
                    "sessionOptions": {"frobnicate": true}}}]}},
                )],
                doc! {},
            ),
        ),
    ];
    for (what, t) in must_fail {
        let outcome = outcome_of(&uri, &server, t).await;
        assert!(
            matches!(outcome, Outcome::Failed(_)),
            "{what}: expected a failure, got {outcome:?}"
        );
    }

    // What the driver cannot show or do skips, after everything else held; it never passes.
    let pinned = test(
        vec![
            op("session0", "startTransaction", doc! {}),
            insert_in("session0", 2),
            Bson::Document(doc! {"object": "testRunner", "name": "assertSessionPinned",
            "arguments": {"session": "session0"}}),
            op("session0", "commitTransaction", doc! {}),
        ],
        committed.clone(),
    );
    assert!(matches!(
        outcome_of(&uri, &server, pinned).await,
        Outcome::Skipped(_)
    ));
    let pinned_but_wrong = test(
        vec![
            op("session0", "startTransaction", doc! {}),
            Bson::Document(doc! {"object": "testRunner", "name": "assertSessionPinned",
            "arguments": {"session": "session0"}}),
            insert_in("session0", 1),
        ],
        doc! {},
    );
    assert!(matches!(
        outcome_of(&uri, &server, pinned_but_wrong).await,
        Outcome::Failed(_)
    ));
    // The runner's collection-level bulkWrite runs in the operation's session: its insert
    // commits with the transaction, and an aborted one leaves nothing.
    let bulk_in = |end: &str| {
        vec![
            op("session0", "startTransaction", doc! {}),
            op(
                "collection0",
                "bulkWrite",
                doc! {"session": "session0", "requests": [{"insertOne": {"document": {"_id": 2}}}]},
            ),
            op("session0", end, doc! {}),
        ]
    };
    assert_eq!(
        outcome_of(
            &uri,
            &server,
            test(bulk_in("commitTransaction"), committed.clone())
        )
        .await,
        Outcome::Passed
    );
    assert!(matches!(
        outcome_of(
            &uri,
            &server,
            test(bulk_in("abortTransaction"), committed.clone())
        )
        .await,
        Outcome::Failed(_)
    ));

    cluster.shutdown().await;
    Ok(())
}

#[test]
fn known_failures_list_parses() {
    known_failures();
}
