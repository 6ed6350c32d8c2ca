//! Replicated shards as processes (`tributary shard --replSet rs --peers a,b,c`): three
//! members on their own ports elect a primary, which alone takes writes and says so in
//! `hello`; `kill -9` of the primary is followed within seconds by a new one that has every
//! acknowledged write; the killed member, restarted, comes back as a secondary.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use tests::Proc;

/// The member whose `hello` says it is the writable primary, once one does (within `patience`).
async fn primary_among(
    clients: &[Option<wire::Client>],
    patience: Duration,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + patience;
    loop {
        for (i, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            if let Ok(hello) = client.command("admin", &doc! {"hello": 1}).await
                && hello.get_bool("isWritablePrimary").unwrap_or(false)
            {
                return Ok(i);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no primary within {patience:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ok(reply: &Document) -> bool {
    reply.get("ok") == Some(&Bson::Double(1.0)) && !reply.contains_key("writeErrors")
}

#[tokio::test]
async fn a_killed_primary_is_replaced_within_seconds_with_every_acknowledged_write()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ports: Vec<u16> = (0..3)
        .map(|_| tests::free_port())
        .collect::<anyhow::Result<_>>()?;
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let peers = hosts.join(",");
    let mut procs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let args: Vec<String> = [
            "shard",
            "--port",
            &port.to_string(),
            "--dbpath",
            &dir.path().join(format!("m{i}")).display().to_string(),
            "--replSet",
            "rs",
            "--peers",
            &peers,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let addr: SocketAddr = hosts[i].parse()?;
        procs.push(Proc::spawn(args, addr).await?);
    }
    let mut clients: Vec<Option<wire::Client>> = hosts
        .iter()
        .map(|h| Some(wire::Client::new(h.clone())))
        .collect();
    let old = primary_among(&clients, Duration::from_secs(20)).await?;

    // What a secondary says of its set, and what it refuses.
    let secondary = (old + 1) % 3;
    let other = clients[secondary].as_ref().expect("running");
    let hello = other.command("admin", &doc! {"hello": 1}).await?;
    assert_eq!(hello.get_str("setName")?, "rs", "{hello}");
    assert!(!hello.get_bool("isWritablePrimary")?);
    assert!(hello.get_bool("secondary")?);
    assert_eq!(hello.get_str("primary")?, hosts[old]);
    assert_eq!(hello.get_str("me")?, hosts[secondary]);
    let hosts_listed: Vec<&str> = hello
        .get_array("hosts")?
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    assert_eq!(
        hosts_listed,
        hosts.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let refused = other
        .command("app", &doc! {"insert": "c", "documents": [{"_id": -1}]})
        .await?;
    assert_eq!(refused.get_i32("code")?, 10107, "{refused}");
    let primary_hello = clients[old]
        .as_ref()
        .expect("running")
        .command("admin", &doc! {"hello": 1})
        .await?;
    assert!(
        primary_hello.get_object_id("electionId").is_ok(),
        "{primary_hello}"
    );

    let leader = clients[old].as_ref().expect("running");
    for i in 0..50 {
        let r = leader
            .command("app", &doc! {"insert": "c", "documents": [{"_id": i}]})
            .await?;
        assert!(ok(&r), "{r}");
    }

    let killed = Instant::now();
    procs[old].kill();
    clients[old] = None;
    let new = loop {
        let mut took = None;
        for (i, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            if let Ok(r) = client
                .command("app", &doc! {"insert": "c", "documents": [{"_id": 1000}]})
                .await
                && ok(&r)
            {
                took = Some(i);
                break;
            }
        }
        if let Some(i) = took {
            break i;
        }
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(20),
            "no member took a write within 20 s of the primary's kill -9"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "kill -9 of the primary -> first acknowledged write on member {new}: {:?}",
        killed.elapsed()
    );
    let found = clients[new]
        .as_ref()
        .expect("running")
        .command("app", &doc! {"find": "c", "filter": {}, "batchSize": 1000})
        .await?;
    let batch = found.get_document("cursor")?.get_array("firstBatch")?;
    assert_eq!(batch.len(), 51, "every acknowledged write, and the new one");

    // The killed member comes back as a secondary of the new primary.
    procs[old].restart().await?;
    clients[old] = Some(wire::Client::new(hosts[old].clone()));
    let back = clients[old].as_ref().expect("running");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hello = back.command("admin", &doc! {"hello": 1}).await?;
        if hello.get_str("primary").ok() == Some(hosts[new].as_str()) {
            assert!(hello.get_bool("secondary")?, "{hello}");
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the restarted member did not rejoin: {hello}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
