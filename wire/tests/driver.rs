//! Interop with a real driver: the Rust `mongodb` crate (3.x) handshakes with `serve`,
//! negotiates zstd, and runs commands whose OP_MSG requests and (compressed) replies go through
//! this crate's framing both ways.

#![allow(clippy::unwrap_used)] // tests may unwrap (common rules)

use std::sync::{Arc, Mutex};

use bson::{Bson, doc};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::{ConnectionInfo, Handler, Reply, Request};

/// Just enough of a standalone server for a driver: hello, ping, insert.
#[derive(Default)]
struct MiniServer {
    seen: Mutex<Vec<Request>>,
}

#[async_trait::async_trait]
impl Handler for MiniServer {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply {
        self.seen.lock().unwrap().push(req.clone());
        let reply = match req.command_name() {
            "hello" | "isMaster" | "ismaster" => doc! {
                "ok": 1.0,
                "isWritablePrimary": true,
                "ismaster": true,
                "helloOk": true,
                "maxBsonObjectSize": wire::MAX_BSON_OBJECT_SIZE as i32,
                "maxMessageSizeBytes": wire::MAX_MESSAGE_SIZE as i32,
                "maxWriteBatchSize": 100_000,
                "localTime": bson::DateTime::now(),
                "minWireVersion": 0,
                "maxWireVersion": 21,
                "connectionId": conn.id as i64,
                "readOnly": false,
            },
            "insert" => {
                let n = req.body.get_array("documents").map_or(0, |d| d.len());
                doc! { "ok": 1.0, "n": n as i32 }
            }
            "ping" | "endSessions" => doc! { "ok": 1.0 },
            other => {
                doc! { "ok": 0.0, "code": 59, "codeName": "CommandNotFound", "errmsg": format!("no such command: '{other}'") }
            }
        };
        Reply::Document(reply)
    }
}

#[tokio::test]
async fn rust_driver_handshakes_negotiates_zstd_and_runs_commands() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Arc::new(MiniServer::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(wire::serve(listener, Arc::clone(&server), cancel.clone()));

    let uri = format!("mongodb://{addr}/?directConnection=true&compressors=zstd");
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let db = client.database("test");
    let pong = db.run_command(doc! { "ping": 1 }).await.unwrap();
    assert_eq!(pong.get_f64("ok").unwrap(), 1.0);
    // Several documents go as a kind-1 sequence and come back merged into the body.
    let coll = db.collection::<bson::Document>("c");
    let res = coll
        .insert_many(vec![
            doc! { "_id": 1 },
            doc! { "_id": 2 },
            doc! { "_id": 3 },
        ])
        .await
        .unwrap();
    assert_eq!(res.inserted_ids.len(), 3);

    {
        let seen = server.seen.lock().unwrap();
        let hello = seen
            .iter()
            .find(|r| matches!(r.command_name(), "hello" | "isMaster" | "ismaster"))
            .unwrap();
        assert_eq!(
            hello.body.get_array("compression").unwrap(),
            &vec![Bson::from("zstd")]
        );
        let insert = seen.iter().find(|r| r.command_name() == "insert").unwrap();
        assert_eq!(insert.db, "test");
        assert_eq!(insert.body.get_array("documents").unwrap().len(), 3);
    }
    client.shutdown().await;
    cancel.cancel();
    task.await.unwrap();
}
