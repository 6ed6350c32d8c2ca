//! The `tributary` binary: the embedded cluster by default, or one shard, or one router; and
//! `tributary status`, a running cluster's state.

mod status;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use router::launch::{self, Running};
use router::{Presentation, RouterOptions, ShardPatience};

/// jemalloc, with background threads that return freed memory to the system within its decay
/// time (10 s): glibc's heap keeps what many streams' buffers once took (BENCHMARKS.md,
/// "Memory after streams close").
/// (The `system-allocator` feature leaves the system's, for heap profilers.)
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// What `--version` says: the version, the commit built and the build profile.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TRIBUTARY_GIT_COMMIT"),
    ", ",
    env!("TRIBUTARY_BUILD_PROFILE"),
    " build)"
);

/// Tributary: a sharded document store that serves MongoDB-compatible change streams.
///
/// With no subcommand it runs the embedded cluster: a router with in-process shards.
#[derive(Parser, Debug)]
#[command(
    name = "tributary",
    version = VERSION,
    args_override_self = true,
    about = "Tributary: a sharded document store that serves MongoDB-compatible change streams.\n\nWith no subcommand it runs the embedded cluster: a router with in-process shards."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// How log lines are written: `text` for people, `json` (one object per line) for log
    /// collectors.
    #[arg(long = "logFormat", global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Settings from a YAML file in mongod's layout (`net.port`, `net.bindIp`,
    /// `storage.dbPath`, `operationProfiling.slowOpThresholdMs`,
    /// `setParameter.enableTestCommands` and `.maxAcceptableLogicalClockDriftSecs`, and
    /// Tributary's own under `tributary:`); flags on the command line win over it.
    #[arg(long = "config", short = 'f', global = true)]
    config: Option<PathBuf>,

    #[command(flatten)]
    embedded: EmbeddedArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug)]
struct EmbeddedArgs {
    /// Port the router listens on.
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Address the router binds to.
    #[arg(long = "bind-ip", default_value = "127.0.0.1")]
    bind_ip: IpAddr,
    /// Number of in-process shards.
    #[arg(long, default_value_t = 3)]
    shards: usize,
    /// Directory for the shards' data (one subdirectory per shard).
    #[arg(long, default_value = "./tributary-data")]
    dbpath: PathBuf,
    /// Members per shard: 1 (one copy), or 3, 5 or 7 to make every in-process shard a
    /// replica set on Raft, its members in this process.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Present the router to drivers as a single-node replica set instead of a mongos.
    #[arg(long = "replSetMode")]
    repl_set_mode: bool,
    /// Enable test-only commands (`configureFailPoint`), as MongoDB's
    /// `--setParameter enableTestCommands=1`.
    #[arg(long = "enableTestCommands")]
    enable_test_commands: bool,
    #[command(flatten)]
    streams: StreamArgs,
    #[command(flatten)]
    oplog: OplogArgs,
    #[command(flatten)]
    ops: OpsArgs,
    #[command(flatten)]
    limits: ClientLimitArgs,
    #[command(flatten)]
    tls: TlsArgs,
}

/// TLS on the listening port and, for a router over remote shards or a shard, to the others.
#[derive(Args, Debug, Clone)]
struct TlsArgs {
    /// disabled, allowTLS (plain and TLS clients; plain to the others), preferTLS (both; TLS
    /// to the others) or requireTLS (TLS only), as mongod's `--tlsMode`.
    #[arg(long = "tlsMode", default_value = "disabled")]
    tls_mode: wire::tls::TlsMode,
    /// PEM file with this server's certificate chain and private key.
    #[arg(long = "tlsCertificateKeyFile")]
    tls_certificate_key_file: Option<PathBuf>,
    /// PEM file with the CA certificates that clients' (and the other servers')
    /// certificates are verified against; with it, clients must present one.
    #[arg(long = "tlsCAFile")]
    tls_ca_file: Option<PathBuf>,
    /// With --tlsCAFile, still accept clients that present no certificate.
    #[arg(long = "tlsAllowConnectionsWithoutCertificates")]
    tls_allow_without_certificates: bool,
}

impl TlsArgs {
    fn files(&self) -> wire::tls::TlsFiles {
        wire::tls::TlsFiles {
            certificate_key: self.tls_certificate_key_file.clone(),
            ca: self.tls_ca_file.clone(),
            allow_without_client_certificate: self.tls_allow_without_certificates,
        }
    }

    /// TLS on the listening port.
    fn server(&self) -> anyhow::Result<Option<Arc<wire::tls::ServerTls>>> {
        wire::tls::ServerTls::new(self.tls_mode, &self.files()).map_err(anyhow::Error::msg)
    }

    /// TLS to the other servers: with `preferTLS` and `requireTLS`, as mongod's cluster
    /// connections.
    fn outgoing(&self) -> anyhow::Result<Option<wire::tls::ClientTls>> {
        use wire::tls::TlsMode;
        match self.tls_mode {
            TlsMode::Prefer | TlsMode::Require => wire::tls::ClientTls::new(&self.files())
                .map(Some)
                .map_err(anyhow::Error::msg),
            TlsMode::Disabled | TlsMode::Allow => Ok(None),
        }
    }
}

/// The cluster's shared key (a router over remote shards, and a shard).
#[derive(Args, Debug, Clone)]
struct KeyFileArgs {
    /// A file holding the cluster's key (6 to 1,024 base64 characters, readable only by its
    /// owner): a shard accepts only connections that log in with it, and routers and shards
    /// log in to shards with it, as MongoDB's internal authentication. On a router it also
    /// turns on --auth.
    #[arg(long = "keyFile")]
    key_file: Option<PathBuf>,
}

impl KeyFileArgs {
    fn read(&self) -> anyhow::Result<Option<Arc<wire::keyfile::KeyFile>>> {
        self.key_file
            .as_deref()
            .map(wire::keyfile::KeyFile::read)
            .transpose()
            .map_err(anyhow::Error::msg)
    }
}

/// Operations: metrics, logs (the embedded cluster and a router).
#[derive(Args, Debug, Clone)]
struct OpsArgs {
    /// Serve Prometheus metrics on this port (`GET /metrics`, on the same address as the
    /// router); off when not given.
    #[arg(long = "metricsPort")]
    metrics_port: Option<u16>,
    /// Serve the HTTP service on this port (on the same address as the router): change feeds
    /// (`GET /v1/changes`, JSON pages or server-sent events), stream bounds (`/v1/bounds`),
    /// the status page (`/`, `/v1/status`) and the metrics; off when not given.
    #[arg(long = "httpPort")]
    http_port: Option<u16>,
    /// Log commands slower than this many milliseconds, as mongod's `slowOpThresholdMs`.
    #[arg(long = "slowms", default_value_t = 100)]
    slow_ms: u64,
    /// Clients must authenticate (SCRAM-SHA-256 or SCRAM-SHA-1) before any other command; the
    /// first user can be created over a loopback connection while there is none.
    #[arg(long = "auth")]
    auth: bool,
    /// How far ahead of this machine's clock a client's `$clusterTime` may be; a command with
    /// one further ahead is refused (ClusterTimeFailsRateLimiter), as MongoDB's
    /// `maxAcceptableLogicalClockDriftSecs`.
    #[arg(long = "maxAcceptableLogicalClockDriftSecs", default_value_t = 365 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_clock_drift_secs: u64,
}

/// What the router bounds for each client (the embedded cluster and a router).
#[derive(Args, Debug, Clone)]
struct ClientLimitArgs {
    /// The most client connections open at once, as mongod's `--maxConns`: past it a new
    /// connection is accepted and closed at once. The limit in force is at most 80% of the
    /// open-files limit (`ulimit -n`), as on mongod, so the default (mongod's 1,000,000) means
    /// "as many as the file descriptors allow".
    #[arg(long = "maxConns", default_value_t = wire::limits::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_conns: u64,
    /// Once the first byte of a message has arrived, the whole message must arrive within this
    /// many milliseconds (and a reply go out, and a TLS handshake finish, within it), else the
    /// connection is closed; a connection idle between messages is never closed.
    #[arg(long = "frameTimeoutMS", default_value_t = wire::limits::DEFAULT_FRAME_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    frame_timeout_ms: u64,
}

impl ClientLimitArgs {
    fn limits(&self) -> wire::limits::Limits {
        wire::limits::Limits {
            max_connections: self.max_conns,
            frame_timeout: Duration::from_millis(self.frame_timeout_ms),
        }
    }
}

/// How much oplog each shard keeps (the embedded cluster's shards, and a lone shard).
#[derive(Args, Debug)]
struct OplogArgs {
    /// The oplog's size, per shard: past it, the oldest entries are truncated (a stream
    /// resuming before them gets ChangeStreamHistoryLost).
    #[arg(long = "oplogSizeMB", default_value_t = 1024)]
    oplog_size_mb: u64,
    /// Entries younger than this are never truncated for size, as MongoDB's
    /// `--oplogMinRetentionHours` (0: no minimum).
    #[arg(long = "oplogMinRetentionHours", default_value_t = 0.0)]
    oplog_min_retention_hours: f64,
}

impl OplogArgs {
    fn retention(&self) -> shard::retention::Retention {
        shard::retention::Retention::from_flags(self.oplog_size_mb, self.oplog_min_retention_hours)
    }
}

/// How the router delivers change streams (the embedded cluster and a router alike).
#[derive(Args, Debug)]
struct StreamArgs {
    /// About how many batches with events a shared change-stream merge sends per second over
    /// all its clients: with many caught-up watchers each one's replies are spaced
    /// (watchers ÷ this) apart, at most 100 ms, so events go out in larger batches; a lone
    /// watcher is never held back. 0 sends every event at once.
    #[arg(long = "streamRepliesPerSecond", default_value_t = router::REPLIES_PER_SECOND)]
    stream_replies_per_second: u32,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a running cluster's state: its shards with their oplog windows and high-water
    /// marks, the open change streams and their lag, the subscriptions (the router's
    /// `tributaryStatus` command).
    Status {
        /// The router to ask.
        #[arg(long, default_value = "mongodb://127.0.0.1:27017")]
        uri: String,
        /// Print the router's reply as JSON instead of tables.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key_file: KeyFileArgs,
    },
    /// Run one shard as its own process.
    #[command(args_override_self = true)]
    Shard {
        /// Port the shard listens on.
        #[arg(long, default_value_t = 27018)]
        port: u16,
        /// Address the shard binds to.
        #[arg(long = "bind-ip", default_value = "127.0.0.1")]
        bind_ip: IpAddr,
        /// Directory for the shard's data.
        #[arg(long)]
        dbpath: PathBuf,
        /// The shard's name in logs.
        #[arg(long, default_value = "shard")]
        name: String,
        /// Run as one member of the replica set NAME (with `--peers`).
        #[arg(long = "replSet", requires = "peers")]
        repl_set: Option<String>,
        /// Every member's HOST:PORT, this one's included, in the same order on every member
        /// (comma-separated, or repeated).
        #[arg(long, value_delimiter = ',', requires = "repl_set")]
        peers: Vec<String>,
        /// Enable test-only commands (the shard's `configureFailPoint`).
        #[arg(long = "enableTestCommands")]
        enable_test_commands: bool,
        #[command(flatten)]
        oplog: OplogArgs,
        #[command(flatten)]
        tls: TlsArgs,
        #[command(flatten)]
        key_file: KeyFileArgs,
    },
    /// Run a router over shards running in other processes.
    #[command(args_override_self = true)]
    Router {
        /// Port the router listens on.
        #[arg(long, default_value_t = 27017)]
        port: u16,
        /// Address the router binds to.
        #[arg(long = "bind-ip", default_value = "127.0.0.1")]
        bind_ip: IpAddr,
        /// A shard's HOST:PORT, or NAME/HOST:PORT,HOST:PORT,... for a replicated shard (its
        /// members, as their --peers list them); repeat for each shard, in the same order on
        /// every router (the first is the config shard).
        #[arg(long = "shard", required = true)]
        shards: Vec<String>,
        /// Present the router to drivers as a single-node replica set instead of a mongos.
        #[arg(long = "replSetMode")]
        repl_set_mode: bool,
        /// Enable test-only commands (`configureFailPoint`).
        #[arg(long = "enableTestCommands")]
        enable_test_commands: bool,
        /// How long a command waits for a shard it cannot connect to (a restarting shard)
        /// before it fails with HostUnreachable, as mongos's host targeting waits.
        #[arg(long = "shardConnectTimeoutMS", default_value_t = 15_000)]
        shard_connect_timeout_ms: u64,
        /// How long an open change stream waits for a lost shard to come back, answering
        /// empty batches meanwhile, before its getMore fails with a resumable error.
        #[arg(long = "shardOutageTimeoutSecs", default_value_t = 60)]
        shard_outage_timeout_secs: u64,
        #[command(flatten)]
        streams: StreamArgs,
        #[command(flatten)]
        ops: OpsArgs,
        #[command(flatten)]
        limits: ClientLimitArgs,
        #[command(flatten)]
        tls: TlsArgs,
        #[command(flatten)]
        key_file: KeyFileArgs,
    },
}

fn presentation(repl_set_mode: bool) -> Presentation {
    if repl_set_mode {
        Presentation::ReplicaSet
    } else {
        Presentation::Mongos
    }
}

/// Runs Tributary; a failure to start (a bad config file, a port in use) is one line on
/// stderr and exit status 1, never a backtrace.
fn main() -> std::process::ExitCode {
    // Commands recurse as deep as their documents nest (200 levels at most, checked before
    // they are parsed): worker threads get room for that in any build.
    let started = tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(16 << 20)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run()));
    match started {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse_from(with_config_file(std::env::args().collect())?);
    {
        use router::stdout_log::CappedStdout;
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error"));
        // `setParameter: {logLevel}` replaces the filter while the process runs.
        let (filter, reload) = tracing_subscriber::reload::Layer::new(filter);
        router::parameters::install_log_reload(move |directive| {
            reload
                .reload(tracing_subscriber::EnvFilter::new(directive))
                .map_err(|e| e.to_string())
        });
        // getLog keeps info and above whatever RUST_LOG shows, as mongod's getLog does.
        let logs = tracing_subscriber::registry().with(
            router::log_buffer::LogBuffer
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        );
        match cli.log_format {
            LogFormat::Text => logs
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(CappedStdout { json: false })
                        .with_filter(filter),
                )
                .init(),
            LogFormat::Json => logs
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .with_writer(CappedStdout { json: true })
                        .with_filter(filter),
                )
                .init(),
        }
    }
    let argv: Vec<String> = std::env::args().collect();
    let mut retention = cli.embedded.oplog.retention();
    let mut metrics = None;
    let mut http = None;
    let running: Running = match cli.command {
        // A client of a running cluster: it prints and is done.
        Some(Command::Status {
            uri,
            json,
            key_file,
        }) => return status::run(&uri, key_file.read()?, json).await,
        None => {
            let e = cli.embedded;
            metrics = e.ops.metrics_port.map(|p| SocketAddr::new(e.bind_ip, p));
            http = e.ops.http_port.map(|p| SocketAddr::new(e.bind_ip, p));
            let options = RouterOptions {
                presentation: presentation(e.repl_set_mode),
                argv,
                enable_test_commands: e.enable_test_commands,
                stream_replies_per_second: e.streams.stream_replies_per_second,
                slow_ms: e.ops.slow_ms,
                auth: e.ops.auth,
                max_clock_drift: Duration::from_secs(e.ops.max_clock_drift_secs),
                tls: e.tls.server()?,
                client_limits: e.limits.limits(),
                ..RouterOptions::default()
            };
            launch::embedded_replicated(
                SocketAddr::new(e.bind_ip, e.port),
                e.shards,
                e.replicas,
                e.dbpath,
                options,
            )
            .await?
        }
        Some(Command::Shard {
            port,
            bind_ip,
            dbpath,
            name,
            repl_set,
            peers,
            enable_test_commands,
            oplog,
            tls,
            key_file,
        }) => {
            retention = oplog.retention();
            let security = launch::ShardSecurity {
                server_tls: tls.server()?,
                peer_tls: tls.outgoing()?,
                key: key_file.read()?,
            };
            let bind = SocketAddr::new(bind_ip, port);
            match repl_set {
                Some(name_of_set) => {
                    let set = launch::ReplSet {
                        name: name_of_set,
                        peers,
                    };
                    launch::shard_member(bind, dbpath, name, set, enable_test_commands, security)
                        .await?
                }
                None => {
                    launch::shard_secured(bind, dbpath, name, enable_test_commands, security)
                        .await?
                }
            }
        }
        Some(Command::Router {
            port,
            bind_ip,
            shards,
            repl_set_mode,
            enable_test_commands,
            shard_connect_timeout_ms,
            shard_outage_timeout_secs,
            streams,
            ops,
            limits,
            tls,
            key_file,
        }) => {
            metrics = ops.metrics_port.map(|p| SocketAddr::new(bind_ip, p));
            http = ops.http_port.map(|p| SocketAddr::new(bind_ip, p));
            let shard_key = key_file.read()?;
            let options = RouterOptions {
                presentation: presentation(repl_set_mode),
                argv,
                enable_test_commands,
                patience: ShardPatience {
                    connect: Duration::from_millis(shard_connect_timeout_ms),
                    stream_outage: Duration::from_secs(shard_outage_timeout_secs),
                },
                stream_replies_per_second: streams.stream_replies_per_second,
                slow_ms: ops.slow_ms,
                // A key file turns on authorization too, as on mongos.
                auth: ops.auth || shard_key.is_some(),
                max_clock_drift: Duration::from_secs(ops.max_clock_drift_secs),
                tls: tls.server()?,
                shard_tls: tls.outgoing()?,
                client_limits: limits.limits(),
                shard_key,
                ..RouterOptions::default()
            };
            launch::router_with(SocketAddr::new(bind_ip, port), shards, options).await?
        }
    };
    running.on_each_shard(move |s| s.set_oplog_retention(retention));
    if let Some(addr) = metrics {
        running
            .serve_http(addr, router::http::Endpoints::Metrics)
            .await?;
    }
    if let Some(addr) = http {
        running
            .serve_http(addr, router::http::Endpoints::All)
            .await?;
    }
    let cancel = running.cancel.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        cancel.cancel();
    });
    running.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// The command line with the flags of its `--config` file (if any) put before its own, so
/// that the command line's win (see `router::config_file`).
fn with_config_file(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    let path = args.iter().enumerate().find_map(|(i, a)| {
        if a == "--config" || a == "-f" {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix("--config=").map(str::to_string)
        }
    });
    let Some(path) = path else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("reading the config file {path}: {e}"))?;
    let sub = args
        .iter()
        .skip(1)
        .position(|a| a == "shard" || a == "router")
        .map(|i| i + 1);
    let component = match sub.map(|i| args[i].as_str()) {
        Some("shard") => router::config_file::Component::Shard,
        Some("router") => router::config_file::Component::Router,
        _ => router::config_file::Component::Embedded,
    };
    let flags = router::config_file::flags(&text, component)
        .map_err(|e| anyhow::anyhow!("config file {path}: {e}"))?;
    let at = sub.map_or(1, |i| i + 1);
    let mut out = args[..at].to_vec();
    out.extend(flags);
    out.extend(args[at..].iter().cloned());
    Ok(out)
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
