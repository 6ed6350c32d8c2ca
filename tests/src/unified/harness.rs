//! What the spec-test files (`tests/tests/spec_*.rs`) share: the embedded cluster they run
//! against, the spec folders and known-failures lists, and the report of one run per topology
//! (printed past the test harness's capture and written to `target/spec-results/`).
//!
//! Invariant: [`run_folders`] fails when any test fails that is not listed, or a listed test
//! passes or is skipped (see [`super::summarize`]), so every list stays true.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use router::Presentation;
use router::launch::{self, Running};

use super::{KnownFailure, Outcome};

/// An embedded cluster with test commands on, and the URI drivers use for it.
pub struct SpecCluster {
    _dir: tempfile::TempDir,
    pub running: Running,
    /// More routers over the same shards (mongos presentation only).
    pub more_routers: Vec<Running>,
    /// Every router's address (`mongodb://r1,r2/`): clients with `useMultipleMongoses` use
    /// them all, others the first.
    pub uri: String,
}

impl SpecCluster {
    pub async fn shutdown(self) {
        for r in self.more_routers {
            r.shutdown().await;
        }
        self.running.shutdown().await;
    }
}

/// How the runner reaches the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// Plain TCP, no authentication.
    Open,
    /// `--auth` and `requireTLS`: every client logs in as a `root` user over TLS.
    AuthAndTls,
}

/// The user the runner logs in as with [`Security::AuthAndTls`].
const RUNNER_USER: &str = "runner";
const RUNNER_PASSWORD: &str = "runner-pw";

/// Starts `shards` in-process shards and `routers` routers presented as `presentation` (a
/// replica set has one), with `--enableTestCommands`.
pub async fn start(
    presentation: Presentation,
    shards: usize,
    routers: usize,
) -> Result<SpecCluster> {
    start_secured(presentation, shards, routers, Security::Open).await
}

/// [`start`], with `security`.
pub async fn start_secured(
    presentation: Presentation,
    shards: usize,
    routers: usize,
    security: Security,
) -> Result<SpecCluster> {
    crate::init_tracing();
    let dir = tempfile::tempdir()?;
    let mut options = router::RouterOptions {
        presentation,
        argv: vec!["tributary".into(), "--enableTestCommands".into()],
        enable_test_commands: true,
        ..router::RouterOptions::default()
    };
    let mut tls_query = String::new();
    if security == Security::AuthAndTls {
        let certs = crate::test_certificates(dir.path())?;
        options.auth = true;
        options.tls = wire::tls::ServerTls::new(
            wire::tls::TlsMode::Require,
            &wire::tls::TlsFiles {
                certificate_key: Some(certs.server.clone()),
                ca: None,
                allow_without_client_certificate: false,
            },
        )
        .map_err(anyhow::Error::msg)?;
        tls_query = format!("?tls=true&tlsCAFile={}", certs.ca.display());
    }
    let running = launch::embedded_with(
        "127.0.0.1:0".parse()?,
        shards,
        dir.path().to_path_buf(),
        options.clone(),
    )
    .await?;
    let mut more_routers = Vec::new();
    if presentation == Presentation::Mongos {
        for _ in 1..routers {
            more_routers.push(
                launch::router_beside("127.0.0.1:0".parse()?, &running, options.clone()).await?,
            );
        }
    }
    // No directConnection: the driver discovers the topology (mongos, or replica set through
    // `hosts`) as it would against MongoDB.
    let hosts: Vec<String> = std::iter::once(&running)
        .chain(&more_routers)
        .map(|r| r.addr.to_string())
        .collect();
    let uri = match security {
        Security::Open => format!("mongodb://{}/", hosts.join(",")),
        Security::AuthAndTls => {
            // The first user, through the localhost exception, then every client as it.
            let first = format!("mongodb://{}/{tls_query}&directConnection=true", hosts[0]);
            let client = mongodb::Client::with_uri_str(&first).await?;
            client
                .database("admin")
                .run_command(mongodb::bson::doc! {
                    "createUser": RUNNER_USER, "pwd": RUNNER_PASSWORD, "roles": ["root"],
                })
                .await?;
            super::close(client).await;
            format!(
                "mongodb://{RUNNER_USER}:{RUNNER_PASSWORD}@{}/{tls_query}",
                hosts.join(",")
            )
        }
    };
    Ok(SpecCluster {
        _dir: dir,
        running,
        more_routers,
        uri,
    })
}

/// A known-failures list of the tests crate (`tests/<file>`).
pub fn known_failures(file: &str) -> Result<Vec<KnownFailure>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading tests/{file}"))?;
    KnownFailure::parse_list(&text).with_context(|| format!("parsing tests/{file}"))
}

/// A folder of `../shared/spec-tests/`.
pub fn spec_dir(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/spec-tests")
        .join(folder)
}

/// Runs every file of `folders` on a fresh cluster presented as `presentation` and reports
/// it as `target/spec-results/<kind>-<topology>.txt`. Files are named `<folder>/<file>` when
/// there is more than one folder (names may repeat across them).
pub async fn run_folders(
    kind: &str,
    folders: &[(&str, usize)],
    known_list: &str,
    presentation: Presentation,
    shards: usize,
    routers: usize,
    security: Security,
) -> Result<()> {
    let cluster = start_secured(presentation, shards, routers, security).await?;
    let kind = match security {
        Security::Open => kind.to_string(),
        Security::AuthAndTls => format!("{kind} with auth and TLS"),
    };
    let kind = kind.as_str();
    let server = super::probe(&cluster.uri).await?;
    let expected = match presentation {
        Presentation::Mongos => "sharded",
        Presentation::ReplicaSet => "replicaset",
    };
    ensure!(
        server.topology == expected,
        "driver-visible topology {}",
        server.topology
    );
    let known = known_failures(known_list)?;
    let (mut all, mut lines) = (Vec::new(), Vec::new());
    for &(folder, at_least) in folders {
        let mut files: Vec<PathBuf> = std::fs::read_dir(spec_dir(folder))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        ensure!(
            files.len() >= at_least,
            "spec files not found in {}",
            spec_dir(folder).display()
        );
        for file in &files {
            let base = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = if folders.len() > 1 {
                format!("{folder}/{base}")
            } else {
                base
            };
            let mut results = super::run_file(&cluster.uri, &server, file).await?;
            for r in &mut results {
                r.file = name.clone();
            }
            let s = super::summarize(&server.topology, &results, &known);
            lines.push(format!("[{}] {name}: {s}", server.topology));
            for r in &results {
                match &r.outcome {
                    Outcome::Failed(why) => {
                        let listed = known
                            .iter()
                            .any(|k| k.applies(&server.topology, &r.file, &r.description));
                        let tag = if listed { "known failure" } else { "FAILED" };
                        lines.push(format!("    {tag}: {:?}: {why}", r.description));
                    }
                    // Skips say why, so a skip is never silent.
                    Outcome::Skipped(why) => {
                        lines.push(format!("    skipped: {:?}: {why}", r.description));
                    }
                    Outcome::Passed => {}
                }
            }
            all.extend(results);
        }
    }
    let total = super::summarize(&server.topology, &all, &known);
    lines.push(format!(
        "spec {kind} [{}] (known failures: {}): {total}",
        server.topology, total.known
    ));
    lines.push(format!("[{}] {total}", server.topology));
    report(kind, &server.topology, &lines);
    cluster.shutdown().await;
    ensure!(
        total.problems.is_empty(),
        "spec tests as {}:\n{}",
        server.topology,
        total.problems.join("\n")
    );
    Ok(())
}

/// Prints past the test harness's capture and into `target/spec-results/`, so CI logs show it.
fn report(kind: &str, topology: &str, lines: &[String]) {
    let text = lines.join("\n") + "\n";
    let _ = std::io::stdout().write_all(text.as_bytes());
    if let Some(target) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
    {
        let dir = target.join("spec-results");
        let _ = std::fs::create_dir_all(&dir);
        // Runs over replicated shards keep their own results.
        let replicas = match crate::test_replicas() {
            1 => String::new(),
            n => format!("-{n}-members"),
        };
        let file = format!("{kind}-{topology}{replicas}.txt").replace(' ', "-");
        let _ = std::fs::write(dir.join(file), text);
    }
}
