//! Replicated shards as processes, for the tests: a replica set of `tributary shard --replSet`
//! members on their own ports ([`ReplicaSetProcs`]), and a router process over such sets
//! ([`ReplicatedCluster`], `--shard NAME/h1:p1,h2:p2,h3:p3`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use bson::doc;
use tempfile::TempDir;

use crate::{Proc, connect, free_port, init_tracing};

/// One replica set's member processes.
pub struct ReplicaSetProcs {
    pub name: String,
    pub hosts: Vec<String>,
    /// `None` while a test keeps a member stopped.
    pub members: Vec<Proc>,
}

impl ReplicaSetProcs {
    /// `n` members of set `name`, storing under `dir/NAME-m<i>`, each with `extra` arguments.
    pub async fn start(
        dir: &Path,
        name: &str,
        n: usize,
        extra: &[&str],
    ) -> Result<ReplicaSetProcs> {
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_>>()?;
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let peers = hosts.join(",");
        let mut members = Vec::with_capacity(n);
        for (i, port) in ports.iter().enumerate() {
            let args = member_args(dir, name, i, *port, &peers, extra);
            let addr: SocketAddr = hosts[i].parse()?;
            members.push(Proc::spawn(args, addr).await?);
        }
        Ok(ReplicaSetProcs {
            name: name.to_string(),
            hosts,
            members,
        })
    }

    /// A new member, started to join the set (`replSetReconfig` adds it): it lists the set's
    /// members and then itself, and stores under `dir/NAME-m<n>`. Returns it and its host.
    pub async fn join(&self, dir: &Path) -> Result<(Proc, String)> {
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let peers = format!("{},{host}", self.hosts.join(","));
        let args = member_args(dir, &self.name, self.hosts.len(), port, &peers, &[]);
        Ok((Proc::spawn(args, host.parse()?).await?, host))
    }

    /// A driver client of the set (`?replicaSet=NAME`): it finds the primary itself.
    pub async fn driver(&self) -> Result<mongodb::Client> {
        crate::connect_uri(&format!(
            "mongodb://{}/?replicaSet={}&serverSelectionTimeoutMS=20000",
            self.hosts.join(","),
            self.name
        ))
        .await
    }

    /// `NAME/h1:p1,h2:p2,...`, as a router's `--shard` takes it.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.name, self.hosts.join(","))
    }

    /// A command client to member `i`.
    pub fn client(&self, i: usize) -> wire::Client {
        wire::Client::new(self.hosts[i].clone())
    }

    /// The member whose `hello` says it is the writable primary, once one does (within
    /// `patience`), skipping the members in `down`.
    pub async fn primary(&self, down: &[usize], patience: Duration) -> Result<usize> {
        let deadline = Instant::now() + patience;
        loop {
            for i in (0..self.hosts.len()).filter(|i| !down.contains(i)) {
                let hello = tokio::time::timeout(
                    Duration::from_millis(500),
                    self.client(i).command("admin", &doc! {"hello": 1}),
                )
                .await;
                if let Ok(Ok(hello)) = hello
                    && hello.get_bool("isWritablePrimary").unwrap_or(false)
                {
                    return Ok(i);
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "no primary within {patience:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The arguments of member `i` of set `name` on `port`, listing `peers`.
fn member_args(
    dir: &Path,
    name: &str,
    i: usize,
    port: u16,
    peers: &str,
    extra: &[&str],
) -> Vec<String> {
    let dbpath = dir.join(format!("{name}-m{i}")).display().to_string();
    [
        "shard",
        "--port",
        &port.to_string(),
        "--dbpath",
        &dbpath,
        "--name",
        name,
        "--replSet",
        name,
        "--peers",
        peers,
        "--enableTestCommands",
    ]
    .iter()
    .chain(extra)
    .map(ToString::to_string)
    .collect()
}

/// Replicated shards and one router over them.
pub struct ReplicatedCluster {
    pub dir: TempDir,
    pub sets: Vec<ReplicaSetProcs>,
    pub router: Proc,
}

impl ReplicatedCluster {
    /// `n_shards` sets (`rs0`, `rs1`, ...) of `members` each, and a router over them.
    pub async fn start(n_shards: usize, members: usize) -> Result<ReplicatedCluster> {
        init_tracing();
        let dir = tempfile::tempdir()?;
        let mut sets = Vec::with_capacity(n_shards);
        for i in 0..n_shards {
            sets.push(ReplicaSetProcs::start(dir.path(), &format!("rs{i}"), members, &[]).await?);
        }
        let router = Self::router_over(&sets).await?;
        Ok(ReplicatedCluster { dir, sets, router })
    }

    /// A router process over `sets`, on a new port.
    pub async fn router_over(sets: &[ReplicaSetProcs]) -> Result<Proc> {
        let port = free_port()?;
        let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
        for s in sets {
            args.push("--shard".into());
            args.push(s.spec());
        }
        args.push("--enableTestCommands".into());
        Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await
    }

    pub async fn client(&self) -> Result<mongodb::Client> {
        connect(self.router.addr).await
    }
}
