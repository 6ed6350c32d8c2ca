//! The drivers' unified CRUD and retryable-writes spec tests (`../shared/spec-tests/crud/` and
//! `../shared/spec-tests/retryable-writes/`, read unchanged) against an embedded cluster
//! started with `--enableTestCommands`, once presented as a mongos and once as a single-node
//! replica set.
//!
//! Invariant: every test that applies to the reported server version passes, except those in
//! `tests/spec-known-failures-crud.txt`, which must fail (so the list stays true). Tests are
//! named `<folder>/<file>`.

use router::Presentation;
use tests::unified::harness::{self, Security};

const SHARDS: usize = 2;
/// As a mongos, two routers: clients with `useMultipleMongoses` get both.
const ROUTERS: usize = 2;

async fn run_all(presentation: Presentation) -> anyhow::Result<()> {
    harness::run_folders(
        "crud",
        &[("crud", 100), ("retryable-writes", 20)],
        "spec-known-failures-crud.txt",
        presentation,
        SHARDS,
        ROUTERS,
        Security::Open,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_crud_and_retryable_writes_as_a_router() -> anyhow::Result<()> {
    run_all(Presentation::Mongos).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_crud_and_retryable_writes_as_a_replica_set() -> anyhow::Result<()> {
    run_all(Presentation::ReplicaSet).await
}
