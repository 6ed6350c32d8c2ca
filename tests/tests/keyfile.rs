//! `--keyFile` in a multi-process cluster: shards refuse connections that have not logged in
//! with the cluster's key, the router and the shards (a cross-shard transaction's coordinator)
//! log in with it, a router with another key is refused, and a key file others can read stops
//! the process at start.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use tests::{Proc, ProcessCluster};

fn key_file(dir: &Path, name: &str, key: &str, mode: u32) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, key)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    Ok(path)
}

use tests::{connect_uri as client, direct_uri as uri};

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

const KEY: &str = "c2VjcmV0LWNsdXN0ZXIta2V5LWZvci10ZXN0cw==\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_admit_only_holders_of_the_key() -> anyhow::Result<()> {
    let keys = tempfile::tempdir()?;
    let key = key_file(keys.path(), "key", KEY, 0o600)?;
    let key = key.display().to_string();
    let cluster =
        ProcessCluster::start_with_args(2, &["--keyFile", &key], &["--keyFile", &key]).await?;

    // A client straight to a shard: the handshake and ping, nothing else.
    let anonymous = client(&uri(cluster.shards[0].addr, "", "")).await?;
    anonymous
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await?;
    let e = anonymous
        .database("app")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("no login");
    assert_eq!(code(&e), Some(13), "{e}");
    let e = anonymous
        .database("local")
        .collection::<Document>("oplog.rs")
        .find_one(doc! {})
        .await
        .expect_err("no login");
    assert_eq!(code(&e), Some(13), "{e}");

    // `__system@local` with the key logs in, with either mechanism; a wrong key does not.
    let password = KEY.trim();
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-1"] {
        let system = client(&uri(
            cluster.shards[0].addr,
            &format!("__system:{}@", urlencoding(password)),
            &format!("&authSource=local&authMechanism={mechanism}"),
        ))
        .await?;
        system
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .await?;
    }
    let wrong = client(&uri(
        cluster.shards[0].addr,
        "__system:bm90LXRoZS1rZXk=@",
        "&authSource=local",
    ))
    .await?;
    let e = wrong
        .database("local")
        .collection::<Document>("oplog.rs")
        .find_one(doc! {})
        .await
        .expect_err("wrong key");
    assert!(
        matches!(*e.kind, mongodb::error::ErrorKind::Authentication { .. }),
        "{e}"
    );

    // Garbage and strangers in the shard's SASL steps: refused, and the connection still
    // answers.
    let raw = wire::client::Client::new(cluster.shards[1].addr.to_string());
    let bytes = |b: &[u8]| mongodb::bson::Binary {
        subtype: mongodb::bson::spec::BinarySubtype::Generic,
        bytes: b.to_vec(),
    };
    for (db, cmd, expected) in [
        (
            "local",
            doc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bytes(b"x")},
            334,
        ),
        (
            "local",
            doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(b"junk")},
            18,
        ),
        (
            "admin",
            doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(b"n,,n=root,r=abc")},
            18,
        ),
        (
            "local",
            doc! {"saslContinue": 1, "conversationId": 1, "payload": bytes(b"c=biws")},
            17,
        ),
    ] {
        let r = raw.command(db, &cmd).await?;
        assert_eq!(r.get_i32("code").ok(), Some(expected), "{cmd}: {r}");
    }
    assert_eq!(
        raw.command("admin", &doc! {"ping": 1})
            .await?
            .get_f64("ok")?,
        1.0
    );

    // The router logs in to the shards, and a key file turns on --auth: the localhost
    // exception, then a user works through it as in any cluster.
    let first = cluster.client().await?;
    let e = first
        .database("app")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("a key file implies --auth");
    assert_eq!(code(&e), Some(13), "{e}");
    first
        .database("admin")
        .run_command(doc! {"createUser": "boss", "pwd": "pw", "roles": ["root"]})
        .await?;
    let boss = client(&uri(cluster.router.addr, "boss:pw@", "")).await?;
    tests::shard_collection(&boss, "app.c", doc! {"_id": "hashed"}).await?;
    let coll = boss.database("app").collection::<Document>("c");
    let mut stream = coll.watch().await?.with_type::<Document>();
    coll.insert_many((0..20).map(|i| doc! {"_id": i})).await?;

    // A transaction over both shards: its coordinator logs in to the other shard.
    let mut session = boss.start_session().await?;
    session.start_transaction().await?;
    for i in 100..110 {
        coll.insert_one(doc! {"_id": i})
            .session(&mut session)
            .await?;
    }
    session.commit_transaction().await?;
    assert_eq!(coll.count_documents(doc! {}).await?, 30);
    let ids: Vec<Document> = coll.find(doc! {}).await?.try_collect().await?;
    assert_eq!(ids.len(), 30);
    for event in tests::streams::next_events(&mut stream, 30).await? {
        assert_eq!(tests::streams::op_type(&event), "insert");
    }

    // A router with another key reaches no shard: a clear error at once, not a wait.
    let other = key_file(
        keys.path(),
        "other",
        "b3RoZXIta2V5LXRoYXQtaXMtd3Jvbmc=",
        0o400,
    )?;
    let port = tests::free_port()?;
    let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
    for s in &cluster.shards {
        args.extend(["--shard".to_string(), s.addr.to_string()]);
    }
    args.extend(["--keyFile".to_string(), other.display().to_string()]);
    let stranger = Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let anonymous = client(&uri(stranger.addr, "", "")).await?;
    let started = std::time::Instant::now();
    let e = anonymous
        .database("admin")
        .run_command(doc! {"createUser": "x", "pwd": "y", "roles": ["root"]})
        .await
        .expect_err("the shards refuse this router");
    // Even its handshake needs the config shard (the cluster time's signing key).
    assert!(
        e.to_string().contains("AuthenticationFailed")
            && e.to_string().contains("refused our key file login"),
        "{e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "refused at once, not after the shard connect timeout"
    );
    Ok(())
}

/// Percent-encodes what a URI's password may not hold.
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_key_file_others_can_read_stops_the_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key = key_file(dir.path(), "key", KEY, 0o644)?;
    let out = std::process::Command::new(tests::tributary_binary()?)
        .args(["shard", "--port", "0", "--dbpath"])
        .arg(dir.path().join("data"))
        .arg("--keyFile")
        .arg(&key)
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("too open"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    let short = key_file(dir.path(), "short", "abc", 0o600)?;
    let out = std::process::Command::new(tests::tributary_binary()?)
        .args([
            "router",
            "--port",
            "0",
            "--shard",
            "127.0.0.1:1",
            "--keyFile",
        ])
        .arg(&short)
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("too short"));
    Ok(())
}
