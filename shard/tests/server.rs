//! `shard::server` serves `run_command` over the wire protocol.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bson::doc;
use common::*;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_round_trip_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(shard::server::serve(s.clone(), listener, cancel.clone()));
    let client = wire::Client::new(addr.to_string());
    let r = client.command("admin", &doc! {"hello": 1}).await.unwrap();
    assert!(is_ok(&r));
    assert!(r.contains_key("connectionId"));
    let r = client
        .command("db", &doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1);
    assert!(r.contains_key("$clusterTime"));
    let r = client
        .command("local", &doc! {"find": "oplog.rs", "filter": {"op": "i"}})
        .await
        .unwrap();
    assert_eq!(first_batch(&r).len(), 1);
    cancel.cancel();
    let _ = server.await;
    s.shutdown().await;
}
