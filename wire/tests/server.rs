//! The connection loop and the client over real sockets: `serve` on 127.0.0.1:0 with an echo
//! handler, driven by `Client` and by hand-built frames.

#![allow(clippy::unwrap_used)] // tests may unwrap (common rules)

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Document, RawDocumentBuf, doc, rawdoc};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use wire::connection::Connection;
use wire::frame::encode_to_vec;
use wire::message::{Compressor, Message, MsgFlags, Op, OpMsg, opcode, to_document};
use wire::{Client, ClientError, ConnectionInfo, Handler, Reply, Request};

/// Echoes every request back as `{ok: 1, echo: body, db, conn, legacy}`; `fail` answers `ok: 0`,
/// `closeMe` closes the connection, and every request is recorded.
#[derive(Default)]
struct Echo {
    seen: Mutex<Vec<Request>>,
}

#[async_trait::async_trait]
impl Handler for Echo {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply {
        self.seen.lock().unwrap().push(req.clone());
        match req.command_name() {
            "closeMe" => Reply::CloseConnection,
            "fail" => Reply::Document(
                doc! { "ok": 0.0, "code": 2, "codeName": "BadValue", "errmsg": "asked to" },
            ),
            _ => Reply::Document(doc! {
                "ok": 1.0,
                "echo": req.body.clone(),
                "db": req.db.clone(),
                "conn": conn.id as i64,
                "legacy": req.legacy_op_query,
                "exhaustAllowed": req.exhaust_allowed,
            }),
        }
    }
}

struct Server {
    addr: SocketAddr,
    echo: Arc<Echo>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let echo = Arc::new(Echo::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(wire::serve(listener, Arc::clone(&echo), cancel.clone()));
    Server {
        addr,
        echo,
        cancel,
        task,
    }
}

const WAIT: Duration = Duration::from_secs(5);

async fn connect(addr: SocketAddr) -> Connection {
    Connection::new(TcpStream::connect(addr).await.unwrap())
}

async fn read(conn: &mut Connection) -> Option<Message> {
    tokio::time::timeout(WAIT, conn.read_message())
        .await
        .expect("server did not answer in time")
        .unwrap()
}

fn body_of(m: &Message) -> Document {
    match &m.op {
        Op::Msg(msg) => to_document(&msg.body).unwrap(),
        Op::Reply(r) => to_document(&r.documents[0]).unwrap(),
        Op::Query(_) => panic!("server sent OP_QUERY"),
    }
}

fn msg(
    request_id: i32,
    body: RawDocumentBuf,
    flags: u32,
    compressor: Option<Compressor>,
) -> Message {
    let mut op = OpMsg::new(body);
    op.flags = MsgFlags(flags);
    Message {
        request_id,
        response_to: 0,
        compressor,
        op: Op::Msg(op),
    }
}

/// A hand-built OP_QUERY frame (no use of the encoder), as pymongo and Node send it.
fn op_query_bytes(request_id: i32, ns: &str, query: &RawDocumentBuf) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(ns.as_bytes());
    payload.push(0);
    payload.extend_from_slice(&0i32.to_le_bytes());
    payload.extend_from_slice(&(-1i32).to_le_bytes());
    payload.extend_from_slice(query.as_bytes());
    let mut frame = ((16 + payload.len()) as i32).to_le_bytes().to_vec();
    frame.extend_from_slice(&request_id.to_le_bytes());
    frame.extend_from_slice(&0i32.to_le_bytes());
    frame.extend_from_slice(&opcode::OP_QUERY.to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// Asserts the server closed the connection (EOF), without hanging.
async fn assert_closed(conn: &mut Connection) {
    let next = tokio::time::timeout(WAIT, conn.read_message())
        .await
        .expect("connection was not closed");
    assert!(
        matches!(next, Ok(None) | Err(_)),
        "expected close, got {next:?}"
    );
}

#[tokio::test]
async fn client_gets_replies_and_reuses_its_connection() {
    let server = start().await;
    let client = Client::new(server.addr.to_string());
    let r1 = client.command("test", &doc! { "ping": 1 }).await.unwrap();
    assert_eq!(r1.get_f64("ok").unwrap(), 1.0);
    assert_eq!(r1.get_str("db").unwrap(), "test");
    assert_eq!(
        r1.get_document("echo").unwrap().get_str("$db").unwrap(),
        "test"
    );
    let r2 = client.command("other", &doc! { "ping": 2 }).await.unwrap();
    assert_eq!(
        r1.get_i64("conn").unwrap(),
        r2.get_i64("conn").unwrap(),
        "pooled connection reused"
    );
    assert_eq!(client.idle_connections(), 1);

    // Concurrent commands open more connections on demand.
    let (three, four) = (doc! { "ping": 3 }, doc! { "ping": 4 });
    let (a, b) = tokio::join!(
        client.command("test", &three),
        client.command("test", &four)
    );
    assert_ne!(
        a.unwrap().get_i64("conn").unwrap(),
        b.unwrap().get_i64("conn").unwrap()
    );
    assert_eq!(client.idle_connections(), 2);
}

#[tokio::test]
async fn ok_zero_replies_are_documents_not_errors() {
    let server = start().await;
    let client = Client::new(server.addr.to_string());
    let reply = client.command("test", &doc! { "fail": 1 }).await.unwrap();
    assert_eq!(reply.get_i32("code").unwrap(), 2);
    assert_eq!(client.idle_connections(), 1);
}

#[tokio::test]
async fn close_connection_reply_closes_without_answer_and_is_not_pooled() {
    let server = start().await;
    let client = Client::new(server.addr.to_string());
    let err = client
        .command("test", &doc! { "closeMe": 1 })
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Closed { .. } | ClientError::Io { .. }),
        "{err:?}"
    );
    assert_eq!(err.to_mongo_error().code, 9001);
    assert_eq!(client.idle_connections(), 0);
    // The client recovers on a new connection.
    assert!(client.command("test", &doc! { "ping": 1 }).await.is_ok());
}

#[tokio::test]
async fn client_reports_connect_failures() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = Client::new(addr.to_string())
        .command("test", &doc! { "ping": 1 })
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
    assert_eq!(err.to_mongo_error().code, 6);
}

#[tokio::test]
async fn sequences_are_merged_into_the_body() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let mut m = msg(
        11,
        rawdoc! { "insert": "c", "$db": "test" },
        MsgFlags::EXHAUST_ALLOWED,
        None,
    );
    if let Op::Msg(op) = &mut m.op {
        op.sequences.push(wire::DocumentSequence {
            identifier: "documents".into(),
            documents: vec![rawdoc! { "_id": 1 }, rawdoc! { "_id": 2 }],
        });
    }
    conn.write_message(&m).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 11);
    let Op::Msg(op) = &reply.op else {
        panic!("expected OP_MSG")
    };
    assert_eq!(op.flags, MsgFlags(0));
    let body = body_of(&reply);
    let docs = body
        .get_document("echo")
        .unwrap()
        .get_array("documents")
        .unwrap();
    assert_eq!(docs.len(), 2);
    assert!(body.get_bool("exhaustAllowed").unwrap());
}

#[tokio::test]
async fn legacy_op_query_hello_is_answered_with_op_reply() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let query = rawdoc! { "$query": { "ismaster": 1, "helloOk": true }, "$readPreference": { "mode": "primaryPreferred" } };
    conn.write_raw(&op_query_bytes(77, "admin.$cmd", &query))
        .await
        .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 77);
    assert_eq!(reply.compressor, None);
    let Op::Reply(r) = &reply.op else {
        panic!("expected OP_REPLY, got {reply:?}")
    };
    assert_eq!(
        (
            r.response_flags,
            r.cursor_id,
            r.starting_from,
            r.documents.len()
        ),
        (8, 0, 0, 1)
    );
    let body = body_of(&reply);
    assert_eq!(
        body.get_document("echo").unwrap(),
        &doc! { "ismaster": 1, "helloOk": true }
    );
    assert_eq!(body.get_str("db").unwrap(), "admin");
    assert!(body.get_bool("legacy").unwrap());

    // Other commands over OP_QUERY are refused like mongod 7.0 does, and the connection lives on.
    conn.write_raw(&op_query_bytes(78, "test.$cmd", &rawdoc! { "find": "c" }))
        .await
        .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert!(matches!(reply.op, Op::Reply(_)));
    assert_eq!(body_of(&reply).get_i32("code").unwrap(), 352);
    conn.write_message(&msg(79, rawdoc! { "ping": 1, "$db": "a" }, 0, None))
        .await
        .unwrap();
    assert_eq!(read(&mut conn).await.unwrap().response_to, 79);
}

#[tokio::test]
async fn compression_is_negotiated_and_used() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let hello = rawdoc! { "hello": 1, "compression": ["bogus", "zstd", "snappy"], "$db": "admin" };
    conn.write_message(&msg(1, hello, 0, None)).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    let body = body_of(&reply);
    assert_eq!(
        body.get_array("compression").unwrap(),
        &vec!["zstd".into(), "snappy".into()]
    );
    // The handler never saw the negotiation; the loop added it.
    assert!(!body.get_document("echo").unwrap().is_empty());

    // A compressed request gets a reply compressed the same way.
    conn.write_message(&msg(
        2,
        rawdoc! { "ping": 1, "$db": "a" },
        0,
        Some(Compressor::Zstd),
    ))
    .await
    .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 2);
    assert_eq!(reply.compressor, Some(Compressor::Zstd));
    assert_eq!(
        body_of(&reply)
            .get_document("echo")
            .unwrap()
            .get_i32("ping")
            .unwrap(),
        1
    );

    // hello is never compressed, even when sent compressed.
    conn.write_message(&msg(
        3,
        rawdoc! { "hello": 1, "$db": "admin" },
        0,
        Some(Compressor::Snappy),
    ))
    .await
    .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.compressor, None);
    assert!(!body_of(&reply).contains_key("compression"));

    // Nothing in common: the field is left out.
    let hello = rawdoc! { "isMaster": 1, "compression": ["lz4"], "$db": "admin" };
    conn.write_message(&msg(4, hello, 0, None)).await.unwrap();
    assert!(!body_of(&read(&mut conn).await.unwrap()).contains_key("compression"));
}

#[tokio::test]
async fn more_to_come_requests_get_no_reply() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let w0 = rawdoc! { "insert": "c", "documents": [{ "_id": 1 }], "writeConcern": { "w": 0 }, "$db": "test" };
    conn.write_message(&msg(5, w0, MsgFlags::MORE_TO_COME, None))
        .await
        .unwrap();
    conn.write_message(&msg(6, rawdoc! { "ping": 1, "$db": "test" }, 0, None))
        .await
        .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(
        reply.response_to, 6,
        "the first reply on the wire answers the ping"
    );
    let seen = server.echo.seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].more_to_come);
    assert!(!seen[1].more_to_come);
}

#[tokio::test]
async fn oversize_frame_gets_an_error_then_close() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let mut frame = 100_000_000i32.to_le_bytes().to_vec();
    frame.extend_from_slice(&31i32.to_le_bytes());
    frame.extend_from_slice(&0i32.to_le_bytes());
    frame.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
    conn.write_raw(&frame).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 31);
    let body = body_of(&reply);
    assert_eq!(body.get_f64("ok").unwrap(), 0.0);
    assert_eq!(body.get_i32("code").unwrap(), 17);
    assert_eq!(body.get_str("codeName").unwrap(), "ProtocolError");
    assert_closed(&mut conn).await;
}

#[tokio::test]
async fn checksummed_requests_get_checksummed_replies() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let ping = rawdoc! { "ping": 1, "$db": "a" };
    conn.write_message(&msg(41, ping, MsgFlags::CHECKSUM_PRESENT, None))
        .await
        .unwrap();
    // The decoder verified the CRC; the flag says it was there.
    let reply = read(&mut conn).await.unwrap();
    let Op::Msg(op) = &reply.op else {
        panic!("expected OP_MSG")
    };
    assert!(op.flags.checksum_present());
}

#[tokio::test]
async fn bad_checksum_gets_an_error_then_close() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    let mut bytes = encode_to_vec(&msg(
        40,
        rawdoc! { "ping": 1, "$db": "a" },
        MsgFlags::CHECKSUM_PRESENT,
        None,
    ))
    .unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    conn.write_raw(&bytes).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 40);
    assert_eq!(body_of(&reply).get_i32("code").unwrap(), 288);
    assert_closed(&mut conn).await;
}

#[tokio::test]
async fn short_length_closes_without_hanging() {
    let server = start().await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, &5i32.to_le_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    // No request id was readable, so no reply: just EOF.
    let n = tokio::time::timeout(WAIT, stream.read_to_end(&mut buf))
        .await
        .unwrap();
    assert!(n.is_err() || buf.is_empty(), "unexpected bytes {buf:?}");
}

#[tokio::test]
async fn invalid_bson_and_unknown_opcodes_get_errors_and_the_connection_lives_on() {
    let server = start().await;
    let mut conn = connect(server.addr).await;

    // A well-framed OP_MSG whose body has a bad element type (0x7e).
    let bad_body: &[u8] = &[12, 0, 0, 0, 0x7e, b'a', 0, 1, 0, 0, 0, 0];
    let mut payload = 0u32.to_le_bytes().to_vec();
    payload.push(0);
    payload.extend_from_slice(bad_body);
    let mut frame = ((16 + payload.len()) as i32).to_le_bytes().to_vec();
    frame.extend_from_slice(&50i32.to_le_bytes());
    frame.extend_from_slice(&0i32.to_le_bytes());
    frame.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
    frame.extend_from_slice(&payload);
    conn.write_raw(&frame).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 50);
    assert_eq!(body_of(&reply).get_i32("code").unwrap(), 22);

    // OP_DELETE (2006): not served, but the frame length is fine, so carry on.
    let mut frame = 20i32.to_le_bytes().to_vec();
    frame.extend_from_slice(&51i32.to_le_bytes());
    frame.extend_from_slice(&0i32.to_le_bytes());
    frame.extend_from_slice(&2006i32.to_le_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    conn.write_raw(&frame).await.unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 51);
    assert!(matches!(reply.op, Op::Msg(_)));
    assert_eq!(body_of(&reply).get_i32("code").unwrap(), 17);

    // A body without $db.
    conn.write_message(&msg(52, rawdoc! { "ping": 1 }, 0, None))
        .await
        .unwrap();
    assert_eq!(
        body_of(&read(&mut conn).await.unwrap())
            .get_i32("code")
            .unwrap(),
        40571
    );

    conn.write_message(&msg(53, rawdoc! { "ping": 1, "$db": "a" }, 0, None))
        .await
        .unwrap();
    let reply = read(&mut conn).await.unwrap();
    assert_eq!(reply.response_to, 53);
    assert_eq!(body_of(&reply).get_f64("ok").unwrap(), 1.0);
    assert_eq!(
        server.echo.seen.lock().unwrap().len(),
        1,
        "bad requests never reach the handler"
    );
}

#[tokio::test]
async fn garbage_then_close_never_panics() {
    let server = start().await;
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xff; 64][..],
        &[16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 7, 0, 0][..],
    ] {
        let mut conn = connect(server.addr).await;
        conn.write_raw(garbage).await.unwrap();
        // Whatever the reply, the server must close or keep serving, never hang or crash.
        let _ = tokio::time::timeout(Duration::from_millis(500), conn.read_message()).await;
    }
    // The server is still up.
    let client = Client::new(server.addr.to_string());
    assert!(client.command("a", &doc! { "ping": 1 }).await.is_ok());
}

#[tokio::test]
async fn serve_stops_on_cancel_and_closes_connections() {
    let server = start().await;
    let mut conn = connect(server.addr).await;
    conn.write_message(&msg(1, rawdoc! { "ping": 1, "$db": "a" }, 0, None))
        .await
        .unwrap();
    read(&mut conn).await.unwrap();
    server.cancel.cancel();
    tokio::time::timeout(WAIT, server.task)
        .await
        .expect("serve did not stop")
        .unwrap();
    assert_closed(&mut conn).await;
}

#[tokio::test]
async fn client_skips_pooled_connections_the_server_has_closed() {
    // A server that answers one request per connection, then hangs up.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((stream, _)) = listener.accept().await {
            let mut conn = Connection::new(stream);
            let request = conn.read_message().await.unwrap().unwrap();
            served += 1;
            let reply = Message {
                request_id: 1000,
                response_to: request.request_id,
                compressor: None,
                op: Op::Msg(OpMsg::new(rawdoc! { "ok": 1.0, "served": served })),
            };
            conn.write_message(&reply).await.unwrap();
            conn.shutdown().await.unwrap();
        }
    });
    let client = Client::new(addr.to_string());
    assert_eq!(
        client
            .command("a", &doc! { "ping": 1 })
            .await
            .unwrap()
            .get_i32("served")
            .unwrap(),
        1
    );
    assert_eq!(client.idle_connections(), 1);
    // Let the FIN arrive; the pooled connection is then recognised as dead and replaced.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        client
            .command("a", &doc! { "ping": 1 })
            .await
            .unwrap()
            .get_i32("served")
            .unwrap(),
        2
    );
}
