//! Shared helpers for the integration tests: starting clusters (embedded, in this process; or
//! multi-process, from the `tributary` binary) and connecting the real `mongodb` driver to them.
//!
//! Invariant: every cluster a test starts lives in its own temporary directory and on ports the
//! OS handed out, so tests run in parallel without sharing state; dropping a cluster stops it.

// Test support: a failed expectation should panic with the value, as in a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mongodb::Client;
use mongodb::options::ClientOptions;
use router::Presentation;
use router::launch::{self, Running};
use tempfile::TempDir;

pub mod disk;
pub mod fsm;
pub mod fuzz;
pub mod netns;
pub mod replicated;
pub mod restarts;
pub mod scenarios;
pub mod streams;
pub mod unified;

/// Logs for test runs: `RUST_LOG=debug cargo test` shows the servers' spans.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A driver connected to `addr`, with short timeouts suited to tests.
pub async fn connect(addr: SocketAddr) -> Result<Client> {
    connect_uri(&format!("mongodb://{addr}/?directConnection=true")).await
}

/// `mongodb://<credentials><addr>/?directConnection=true…<options>` (`credentials` is empty or
/// ends with `@`; `options` is empty or starts with `&`), giving up on server selection after
/// 5 s.
pub fn direct_uri(addr: SocketAddr, credentials: &str, options: &str) -> String {
    format!(
        "mongodb://{credentials}{addr}/?directConnection=true&serverSelectionTimeoutMS=5000{options}"
    )
}

pub async fn connect_uri(uri: &str) -> Result<Client> {
    let mut opts = ClientOptions::parse(uri).await?;
    opts.server_selection_timeout
        .get_or_insert(Duration::from_secs(10));
    opts.connect_timeout.get_or_insert(Duration::from_secs(5));
    Ok(Client::with_options(opts)?)
}

/// Members per in-process shard in the tests' embedded clusters: `TRIBUTARY_TEST_REPLICAS`
/// (1, 3, 5 or 7), 1 by default. With more than one, the suites run over replicated shards.
pub fn test_replicas() -> usize {
    std::env::var("TRIBUTARY_TEST_REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// A router with in-process shards, started in this process.
pub struct EmbeddedCluster {
    pub dir: TempDir,
    pub running: Option<Running>,
    pub n_shards: usize,
    pub presentation: Presentation,
    pub addr: SocketAddr,
}

impl EmbeddedCluster {
    pub async fn start(n_shards: usize) -> Result<EmbeddedCluster> {
        Self::start_with(n_shards, Presentation::Mongos).await
    }

    pub async fn start_with(
        n_shards: usize,
        presentation: Presentation,
    ) -> Result<EmbeddedCluster> {
        let options = router::RouterOptions {
            presentation,
            argv: vec!["tributary".into()],
            ..router::RouterOptions::default()
        };
        Self::start_with_options(n_shards, options).await
    }

    /// A cluster whose router has `options`.
    pub async fn start_with_options(
        n_shards: usize,
        options: router::RouterOptions,
    ) -> Result<EmbeddedCluster> {
        init_tracing();
        let presentation = options.presentation;
        let dir = tempfile::tempdir()?;
        let running = launch::embedded_replicated(
            "127.0.0.1:0".parse()?,
            n_shards,
            test_replicas(),
            dir.path().to_path_buf(),
            options,
        )
        .await?;
        let addr = running.addr;
        let cluster = EmbeddedCluster {
            dir,
            running: Some(running),
            n_shards,
            presentation,
            addr,
        };
        cluster.wait_for_primaries().await?;
        Ok(cluster)
    }

    pub async fn client(&self) -> Result<Client> {
        connect(self.addr).await
    }

    /// The in-process shards, for checking where documents landed: with replicated shards,
    /// each set's primary now (a set without one is left out).
    pub fn shards(&self) -> Vec<Arc<shard::Shard>> {
        let Some(running) = &self.running else {
            return Vec::new();
        };
        if running.members().is_empty() {
            return running.shards().to_vec();
        }
        running
            .sets()
            .filter_map(|set| set.iter().find_map(|m| m.primary()))
            .collect()
    }

    /// With replicated shards: waits (up to 20 s) until every set has a primary.
    pub async fn wait_for_primaries(&self) -> Result<()> {
        let Some(running) = &self.running else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while running
            .sets()
            .any(|set| !set.is_empty() && set.iter().all(|m| m.primary().is_none()))
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "a shard has no primary after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Does `f` to every shard in this process, now and (replicated) each one a member opens.
    pub fn on_each_shard(&self, f: impl Fn(&Arc<shard::Shard>) + Send + Sync + 'static) {
        if let Some(running) = &self.running {
            running.on_each_shard(f);
        }
    }

    /// Stops the cluster and starts it again on the same data (a new port).
    pub async fn restart(&mut self) -> Result<()> {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        let options = router::RouterOptions {
            presentation: self.presentation,
            argv: vec!["tributary".into()],
            ..router::RouterOptions::default()
        };
        let running = launch::embedded_replicated(
            "127.0.0.1:0".parse()?,
            self.n_shards,
            test_replicas(),
            self.dir.path().to_path_buf(),
            options,
        )
        .await?;
        self.addr = running.addr;
        self.running = Some(running);
        self.wait_for_primaries().await
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }
}

/// Copies a directory tree (a stopped process's data directory, whole).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// `shardCollection` through a router: `ns` sharded on `key` (e.g. `{_id: "hashed"}`).
pub async fn shard_collection(
    client: &Client,
    ns: &str,
    key: mongodb::bson::Document,
) -> Result<()> {
    client
        .database("admin")
        .run_command(mongodb::bson::doc! {"shardCollection": ns, "key": key})
        .await?;
    Ok(())
}

/// Opens a change stream on `db.coll` with the `$changeStream` stage `spec` by a plain
/// `aggregate` (no driver cursor: the test drives its getMores) and returns the reply.
pub async fn open_change_stream(
    db: &mongodb::Database,
    coll: &str,
    spec: mongodb::bson::Document,
) -> Result<mongodb::bson::Document> {
    let pipeline = vec![mongodb::bson::doc! {"$changeStream": spec}];
    let open = mongodb::bson::doc! {"aggregate": coll, "pipeline": pipeline, "cursor": {}};
    Ok(db.run_command(open).await?)
}

/// A router's change-stream figures: `serverStatus` `metrics.changeStreams` (shared merges,
/// replies held, the shards' split and expanded-event counters), as `admin` answers.
pub async fn change_stream_metrics(admin: &mongodb::Database) -> Result<mongodb::bson::Document> {
    let status = admin
        .run_command(mongodb::bson::doc! {"serverStatus": 1})
        .await?;
    Ok(status
        .get_document("metrics")?
        .get_document("changeStreams")?
        .clone())
}

/// A unique index on `keys`, with its default name.
pub fn unique_index(keys: mongodb::bson::Document) -> mongodb::IndexModel {
    mongodb::IndexModel::builder()
        .keys(keys)
        .options(
            mongodb::options::IndexOptions::builder()
                .unique(true)
                .build(),
        )
        .build()
}

/// The `tributary` binary: `$TRIBUTARY_BIN`, or the one cargo builds beside the test
/// executable (`target/<profile>/tributary`), brought up to date once per test process.
pub fn tributary_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    if let Ok(bin) = std::env::var("TRIBUTARY_BIN") {
        return Ok(PathBuf::from(bin));
    }
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .ok_or("test executable has no target directory")?;
            let release = profile_dir.file_name().is_some_and(|n| n == "release");
            let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            build.args(["build", "--quiet", "-p", "tributary", "--bin", "tributary"]);
            if release {
                build.arg("--release");
            }
            let status = build
                .status()
                .map_err(|e| format!("running cargo build: {e}"))?;
            if !status.success() {
                return Err(format!("cargo build of tributary failed: {status}"));
            }
            Ok(profile_dir.join("tributary"))
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// The `tributary` binary (the embedded default) as this test's child: listening on `port`,
/// its data in `dir`, then `extra` arguments; no stdin, its output discarded (a caller may
/// pipe it instead), killed when dropped.
pub fn tributary_command(port: u16, dir: &Path, extra: &[&str]) -> Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new(tributary_binary()?);
    cmd.args([
        "--port",
        &port.to_string(),
        "--dbpath",
        &dir.display().to_string(),
    ])
    .args(extra)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .kill_on_drop(true);
    Ok(cmd)
}

/// A port that was free a moment ago, below the kernel's ephemeral range (32768 and up on
/// Linux), which the local ends of outgoing connections take: a process restarted on the port
/// later does not find it taken by some test's connection in the meantime (a port from
/// `bind(0)` is an ephemeral one).
pub fn free_port() -> Result<u16> {
    for _ in 0..1000 {
        let port = rand::random_range(10_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET path` on `addr` (a metrics or feed endpoint): the status line and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP head in {out:?}"))?;
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// The value of the Prometheus sample named exactly `series` (name and labels), if present.
pub fn metric_sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
}

/// Waits until process `pid` listens on `addr` and accepts a connection there. Another
/// process on the port does not count: two tests can pick the same free port at once, and the
/// one whose server then fails to bind must not go on talking to the other's.
pub async fn wait_for_listener(pid: u32, addr: SocketAddr, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        if listens(pid, addr.port()) && tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        anyhow::ensure!(
            running(pid),
            "process {pid} ended before listening on {addr} (was the port taken?)"
        );
        anyhow::ensure!(
            start.elapsed() < timeout,
            "process {pid} does not listen on {addr} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4, from Linux's `/proc`,
/// as its network namespace sees it).
fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    // Columns: sl, local address (hex ip:port), remote address, state (0A: listen), ...,
    // inode (the tenth).
    let listening: std::collections::HashSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *fields.get(3)? == "0A").then_some(*fields.get(9)?)
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .is_some_and(|inode| listening.contains(inode))
        })
    })
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name's closing parenthesis.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// A child process killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub args: Vec<String>,
    /// The network namespace it runs in (`netns`), if not this process's.
    pub netns: Option<String>,
}

impl Proc {
    pub async fn spawn(args: Vec<String>, addr: SocketAddr) -> Result<Proc> {
        Proc::spawn_in(None, args, addr).await
    }

    /// [`Proc::spawn`] in network namespace `netns` (`ip netns exec`, which becomes the
    /// process: signals reach it).
    pub async fn spawn_in(
        netns: Option<String>,
        args: Vec<String>,
        addr: SocketAddr,
    ) -> Result<Proc> {
        let binary = tributary_binary()?;
        let mut command = match &netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let child = command
            .args(&args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning tributary {args:?}"))?;
        let p = Proc {
            child,
            addr,
            args,
            netns,
        };
        wait_for_listener(p.child.id(), addr, Duration::from_secs(20)).await?;
        Ok(p)
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the process: a host that hangs with its
    /// connections open.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} failed");
        Ok(())
    }

    /// Starts the same command again (same port, same data).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        *self = Proc::spawn_in(self.netns.clone(), self.args.clone(), self.addr).await?;
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `n` `tributary shard` processes and one `tributary router` over them.
pub struct ProcessCluster {
    pub dir: TempDir,
    pub shards: Vec<Proc>,
    pub router: Proc,
}

impl ProcessCluster {
    pub async fn start(n_shards: usize) -> Result<ProcessCluster> {
        Self::start_with(n_shards, Presentation::Mongos).await
    }

    pub async fn start_with(n_shards: usize, presentation: Presentation) -> Result<ProcessCluster> {
        let args: &[&str] = match presentation {
            Presentation::ReplicaSet => &["--replSetMode"],
            Presentation::Mongos => &[],
        };
        Self::start_with_router_args(n_shards, args).await
    }

    /// A cluster whose router gets `router_args` after its shard list.
    pub async fn start_with_router_args(
        n_shards: usize,
        router_args: &[&str],
    ) -> Result<ProcessCluster> {
        Self::start_with_args(n_shards, &[], router_args).await
    }

    /// A cluster whose shards get `shard_args` and whose router gets `router_args`.
    pub async fn start_with_args(
        n_shards: usize,
        shard_args: &[&str],
        router_args: &[&str],
    ) -> Result<ProcessCluster> {
        Self::start_in(tempfile::tempdir()?, n_shards, shard_args, router_args).await
    }

    /// [`ProcessCluster::start_with_args`] in `dir`: shard `i` keeps its files in `dir/shard<i>`
    /// (which may be prepared beforehand, a small disk mounted there).
    pub async fn start_in(
        dir: TempDir,
        n_shards: usize,
        shard_args: &[&str],
        router_args: &[&str],
    ) -> Result<ProcessCluster> {
        init_tracing();
        let mut shards = Vec::new();
        for i in 0..n_shards {
            let port = free_port()?;
            let dbpath = dir.path().join(format!("shard{i}"));
            let args = vec![
                "shard".to_string(),
                "--port".into(),
                port.to_string(),
                "--dbpath".into(),
                dbpath.display().to_string(),
                "--name".into(),
                format!("shard{i}"),
                "--enableTestCommands".into(),
            ];
            let args = args
                .into_iter()
                .chain(shard_args.iter().map(|a| a.to_string()))
                .collect();
            shards.push(Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?);
        }
        let port = free_port()?;
        let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
        for s in &shards {
            args.push("--shard".into());
            args.push(s.addr.to_string());
        }
        args.extend(router_args.iter().map(|a| a.to_string()));
        let router = Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await?;
        Ok(ProcessCluster {
            dir,
            shards,
            router,
        })
    }

    pub async fn client(&self) -> Result<Client> {
        connect(self.router.addr).await
    }

    /// Another router process over the same shards, on a new port.
    pub async fn start_extra_router(&self) -> Result<Proc> {
        let port = free_port()?;
        let mut args = vec!["router".to_string(), "--port".into(), port.to_string()];
        for s in &self.shards {
            args.push("--shard".into());
            args.push(s.addr.to_string());
        }
        Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await
    }

    /// A driver connected straight to shard `i`.
    pub async fn shard_client(&self, i: usize) -> Result<Client> {
        connect(self.shards[i].addr).await
    }
}

/// Certificates for TLS tests, made with the `openssl` command in `dir`: a CA, a server
/// certificate for `localhost` and `127.0.0.1`, and a client certificate, each PEM file with
/// its key (as `--tlsCertificateKeyFile` and drivers' `tlsCertificateKeyFile` take them).
pub struct TestCertificates {
    pub ca: PathBuf,
    pub server: PathBuf,
    pub client: PathBuf,
}

pub fn test_certificates(dir: &std::path::Path) -> Result<TestCertificates> {
    let run = |args: &[&str]| -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .context("running openssl (the TLS tests need the openssl command)")?;
        anyhow::ensure!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )?;
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=tributary-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ])?;
    for name in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])?;
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ])?;
        let pem = std::fs::read_to_string(dir.join(format!("{name}.crt")))?
            + &std::fs::read_to_string(dir.join(format!("{name}.key")))?;
        std::fs::write(dir.join(format!("{name}.pem")), pem)?;
    }
    Ok(TestCertificates {
        ca: dir.join("ca.pem"),
        server: dir.join("server.pem"),
        client: dir.join("client.pem"),
    })
}

/// One OP_MSG frame with the encoded `body` (tests that speak the wire protocol by hand).
pub fn op_msg_frame(request_id: i32, body: &[u8]) -> Result<Vec<u8>> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&i32::try_from(16 + 4 + 1 + body.len())?.to_le_bytes());
    frame.extend_from_slice(&request_id.to_le_bytes());
    frame.extend_from_slice(&0_i32.to_le_bytes()); // responseTo
    frame.extend_from_slice(&2013_i32.to_le_bytes()); // OP_MSG
    frame.extend_from_slice(&0_u32.to_le_bytes()); // flagBits
    frame.push(0); // a body section
    frame.extend_from_slice(body);
    Ok(frame)
}

/// Reads one OP_MSG reply from `socket` and returns its body.
pub async fn read_op_msg(socket: &mut tokio::net::TcpStream) -> Result<mongodb::bson::Document> {
    use tokio::io::AsyncReadExt;
    let mut header = [0_u8; 16];
    socket.read_exact(&mut header).await?;
    let len = usize::try_from(i32::from_le_bytes([
        header[0], header[1], header[2], header[3],
    ]))?;
    let mut rest = vec![0_u8; len.saturating_sub(16)];
    socket.read_exact(&mut rest).await?;
    // flagBits (4 bytes), then section kind 0 and the body.
    Ok(mongodb::bson::Document::from_reader(
        rest.get(5..).unwrap_or_default(),
    )?)
}
