//! TLS on every listener, with the `mongodb` driver: required (a plain client is refused),
//! allowed beside plain, client certificates against a CA, and a multi-process cluster whose
//! router, shards and two-phase commits all speak TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use mongodb::options::ClientOptions;
use tests::{Proc, TestCertificates};

fn uri(addr: SocketAddr, tls: Option<(&TestCertificates, bool)>) -> String {
    let mut uri = format!("mongodb://{addr}/?serverSelectionTimeoutMS=3000&directConnection=true");
    if let Some((certs, with_client_cert)) = tls {
        uri.push_str(&format!("&tls=true&tlsCAFile={}", certs.ca.display()));
        if with_client_cert {
            uri.push_str(&format!(
                "&tlsCertificateKeyFile={}",
                certs.client.display()
            ));
        }
    }
    uri
}

/// The server's certificate-key file and the CA file, as arguments.
fn paths(certs: &TestCertificates) -> (String, String) {
    (
        certs.server.display().to_string(),
        certs.ca.display().to_string(),
    )
}

async fn client(uri: &str) -> anyhow::Result<mongodb::Client> {
    Ok(mongodb::Client::with_options(
        ClientOptions::parse(uri).await?,
    )?)
}

/// Writes, reads and watches through `uri`; an error when the server cannot be used.
async fn works(uri: &str) -> anyhow::Result<()> {
    let c = client(uri).await?;
    let coll = c.database("tls").collection::<Document>("c");
    let mut stream = coll.watch().await?;
    let id = mongodb::bson::oid::ObjectId::new();
    coll.insert_one(doc! {"_id": id}).await?;
    let found: Vec<Document> = coll.find(doc! {"_id": id}).await?.try_collect().await?;
    anyhow::ensure!(found.len() == 1, "the document was not found");
    let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await??
        .ok_or_else(|| anyhow::anyhow!("no event"))?;
    anyhow::ensure!(event.document_key == Some(doc! {"_id": id}));
    Ok(())
}

/// Whether a plain ping gets through.
async fn answers(uri: &str) -> bool {
    match client(uri).await {
        Ok(c) => c
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .is_ok(),
        Err(_) => false,
    }
}

/// An embedded server that requires TLS with the test certificates, and `extra` arguments.
async fn requiring_tls(
    dir: &Path,
    certs: &TestCertificates,
    extra: &[&str],
) -> anyhow::Result<Proc> {
    let (server, _) = paths(certs);
    let mut args = vec![
        "--tlsMode",
        "requireTLS",
        "--tlsCertificateKeyFile",
        &server,
    ];
    args.extend_from_slice(extra);
    embedded(dir, &args).await
}

async fn embedded(dir: &Path, tls_args: &[&str]) -> anyhow::Result<Proc> {
    let port = tests::free_port()?;
    let mut args = vec![
        "--port".to_string(),
        port.to_string(),
        "--dbpath".into(),
        dir.join("data").display().to_string(),
    ];
    args.extend(tls_args.iter().map(|a| a.to_string()));
    Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tls_serves_tls_clients_and_refuses_plain_ones() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let p = requiring_tls(dir.path(), &certs, &[]).await?;
    works(&uri(p.addr, Some((&certs, false)))).await?;
    assert!(
        !answers(&uri(p.addr, None)).await,
        "a plain client is refused"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_tls_serves_both_on_one_port() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let server = certs.server.display().to_string();
    let p = embedded(
        dir.path(),
        &["--tlsMode", "allowTLS", "--tlsCertificateKeyFile", &server],
    )
    .await?;
    works(&uri(p.addr, Some((&certs, false)))).await?;
    works(&uri(p.addr, None)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_asks_clients_for_certificates() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let (server, ca) = paths(&certs);
    let required = embedded(
        dir.path(),
        &[
            "--tlsMode",
            "requireTLS",
            "--tlsCertificateKeyFile",
            &server,
            "--tlsCAFile",
            &ca,
        ],
    )
    .await?;
    works(&uri(required.addr, Some((&certs, true)))).await?;
    assert!(
        !answers(&uri(required.addr, Some((&certs, false)))).await,
        "a client without a certificate is refused"
    );
    drop(required);
    let optional_dir = tempfile::tempdir()?;
    let optional = embedded(
        optional_dir.path(),
        &[
            "--tlsMode",
            "requireTLS",
            "--tlsCertificateKeyFile",
            &server,
            "--tlsCAFile",
            &ca,
            "--tlsAllowConnectionsWithoutCertificates",
        ],
    )
    .await?;
    works(&uri(optional.addr, Some((&certs, false)))).await?;
    works(&uri(optional.addr, Some((&certs, true)))).await?;
    Ok(())
}

/// Router and shards as processes, every connection TLS with certificates: the driver to the
/// router, the router to the shards, a transaction's coordinator to the other shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_processes_speaks_tls_throughout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let (server, ca) = paths(&certs);
    let tls = [
        "--tlsMode",
        "requireTLS",
        "--tlsCertificateKeyFile",
        &server,
        "--tlsCAFile",
        &ca,
    ];
    let mut shards = Vec::new();
    for i in 0..2 {
        let port = tests::free_port()?;
        let mut args = vec![
            "shard".to_string(),
            "--port".into(),
            port.to_string(),
            "--dbpath".into(),
            dir.path().join(format!("shard{i}")).display().to_string(),
            "--name".into(),
            format!("shard{i}"),
        ];
        args.extend(tls.iter().map(|a| a.to_string()));
        shards.push(Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?);
    }
    let port = tests::free_port()?;
    let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
    for s in &shards {
        args.push("--shard".into());
        args.push(s.addr.to_string());
    }
    args.extend(tls.iter().map(|a| a.to_string()));
    let router = Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let through = uri(router.addr, Some((&certs, true)));
    works(&through).await?;
    assert!(
        !answers(&uri(shards[0].addr, None)).await,
        "a shard refuses a plain connection"
    );

    // A transaction over both shards: its coordinator reaches the other shard over TLS.
    let c = client(&through).await?;
    tests::shard_collection(&c, "tls.bank", doc! {"_id": "hashed"}).await?;
    let bank = c.database("tls").collection::<Document>("bank");
    let mut session = c.start_session().await?;
    session.start_transaction().await?;
    for i in 0..20 {
        bank.insert_one(doc! {"_id": i})
            .session(&mut session)
            .await?;
    }
    session.commit_transaction().await?;
    assert_eq!(bank.count_documents(doc! {}).await?, 20);
    Ok(())
}

/// A connection still in its TLS handshake counts: the metrics' connections gauge reads the
/// listener's own count, as `serverStatus.connections.current` does, so clients that stall a
/// handshake are seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_in_their_tls_handshake_are_counted() -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let metrics_port = tests::free_port()?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let port_arg = metrics_port.to_string();
    let p = requiring_tls(dir.path(), &certs, &["--metricsPort", &port_arg]).await?;
    tests::wait_for_listener(p.child.id(), metrics, Duration::from_secs(10)).await?;
    let gauge = || async {
        let (_, body) = tests::http_get(metrics, "/metrics").await?;
        anyhow::Ok(tests::metric_sample(&body, "tributary_connections").unwrap_or(0.0))
    };
    // Three clients that begin a handshake (a TLS record's first byte) and go no further; no
    // other client connects, so the gauge must reach three. (A baseline read first could
    // include the start-up probe's connection, which may close at any moment.)
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(p.addr).await?;
        s.write_all(&[0x16]).await?;
        stalled.push(s);
    }
    // Generous: a loaded CI machine (the whole suite in parallel, debug builds) once took more
    // than 5 s to show them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while gauge().await? < 3.0 {
        if tokio::time::Instant::now() >= deadline {
            let (_, body) = tests::http_get(metrics, "/metrics").await?;
            anyhow::bail!("the stalled handshakes were not counted; the metrics:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(stalled);
    Ok(())
}

/// A ping as an OP_MSG frame.
fn ping_frame() -> Vec<u8> {
    let mut body = Vec::new();
    doc! {"ping": 1, "$db": "admin"}
        .to_writer(&mut body)
        .expect("a small document");
    let len = (16 + 4 + 1 + body.len()) as i32;
    let mut frame = Vec::new();
    for word in [len, 1, 0, 2013, 0] {
        frame.extend_from_slice(&word.to_le_bytes());
    }
    frame.push(0);
    frame.extend_from_slice(&body);
    frame
}

/// A TLS client driven by hand (blocking I/O), its handshake done.
fn tls_client(
    addr: SocketAddr,
    ca: &Path,
) -> anyhow::Result<(rustls::ClientConnection, std::net::TcpStream)> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let mut tcp = std::net::TcpStream::connect(addr)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    Ok((conn, tcp))
}

/// Sends a ping through `conn` and reads its reply's length.
fn ping(conn: &mut rustls::ClientConnection, tcp: &mut std::net::TcpStream) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    conn.writer().write_all(&ping_frame())?;
    while conn.wants_write() {
        conn.write_tls(tcp)?;
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.reader().read(&mut buf) {
            Ok(n) if n > 0 => reply.extend_from_slice(&buf[..n]),
            Ok(_) => anyhow::bail!("the server closed the connection"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                conn.complete_io(tcp)?;
            }
            Err(e) => return Err(e.into()),
        }
        if reply.len() >= 4
            && reply.len() >= i32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]) as usize
        {
            return Ok(());
        }
    }
}

/// Sends the ciphertext of a ping one byte every 100 ms, all but its last byte, and returns how
/// long after the first byte the server closed the connection (`None`: it never did).
fn trickle(
    conn: &mut rustls::ClientConnection,
    tcp: &mut std::net::TcpStream,
) -> anyhow::Result<Option<Duration>> {
    use std::io::{Read, Write};
    conn.writer().write_all(&ping_frame())?;
    let mut cipher = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut cipher)?;
    }
    tcp.set_read_timeout(Some(Duration::from_millis(100)))?;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    for byte in &cipher[..cipher.len() - 1] {
        if tcp.write_all(&[*byte]).is_err() {
            return Ok(Some(started.elapsed()));
        }
        match tcp.read(&mut buf) {
            Ok(0) => return Ok(Some(started.elapsed())),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Ok(Some(started.elapsed())),
            Ok(_) => {}
        }
    }
    Ok(None)
}

/// Over TLS a frame begins with its first record's first byte: a client that trickles a
/// record (no whole record, so nothing the server can read yet) is closed at the frame timeout,
/// as one trickling a plain frame is, while a client idle between frames for longer is still
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_a_tls_record_is_closed_at_the_frame_timeout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let certs = tests::test_certificates(dir.path())?;
    let p = requiring_tls(dir.path(), &certs, &["--frameTimeoutMS", "1000"]).await?;
    let (addr, ca) = (p.addr, certs.ca.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let (mut conn, mut tcp) = tls_client(addr, &ca)?;
        ping(&mut conn, &mut tcp)?;
        std::thread::sleep(Duration::from_millis(2_500));
        ping(&mut conn, &mut tcp)?;

        let (mut conn, mut tcp) = tls_client(addr, &ca)?;
        let closed = trickle(&mut conn, &mut tcp)?
            .ok_or_else(|| anyhow::anyhow!("the trickling client was never closed"))?;
        anyhow::ensure!(
            closed >= Duration::from_millis(900) && closed < Duration::from_secs(4),
            "closed {closed:?} after its first byte"
        );
        Ok(())
    })
    .await??;
    drop(p);
    Ok(())
}
