//! `resmoke`: runs a change-stream FSM suite from `tests/suites/`.
//!
//! ```text
//! cargo run -p tests --bin resmoke -- --suite change_stream_fsm [--seed N] [--workload NAME]
//!     [--duration SECS] [--inject drop-event|dup-event|swap-events] [--list]
//! ```
//!
//! Exits 0 when every workload, hook and stream check passed, 1 otherwise; a failed run prints
//! its seed and the command that replays it.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use tests::fsm::suite::{self, Inject, Overrides};

fn usage() -> &'static str {
    "usage: resmoke --suite NAME|PATH [--seed N] [--workload NAME] [--duration SECS] \
     [--inject drop-event|dup-event|swap-events] [--list]"
}

fn parse(args: &[String]) -> Result<(Option<String>, Overrides, bool)> {
    let mut suite = None;
    let mut ov = Overrides::default();
    let mut list = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--suite" => suite = Some(value()?),
            "--seed" => ov.seed = Some(value()?.parse().context("--seed")?),
            "--workload" => ov.workload = Some(value()?),
            "--duration" => ov.duration_secs = Some(value()?.parse().context("--duration")?),
            "--inject" => ov.inject = Some(Inject::parse(&value()?)?),
            "--list" => list = true,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{}", usage()),
        }
    }
    Ok((suite, ov, list))
}

/// Multi-process fixtures spawn the `tributary` binary named by `$TRIBUTARY_BIN`. When it is not
/// set, build it (it sits beside this binary in cargo's target directory) and run this program
/// again with the variable set.
fn ensure_tributary_bin(args: &[String]) -> Result<Option<ExitCode>> {
    if std::env::var_os("TRIBUTARY_BIN").is_some() {
        return Ok(None);
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("this binary has no directory")?;
    let release = dir.file_name().is_some_and(|n| n == "release");
    let mut build =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.args(["build", "--quiet", "-p", "tributary", "--bin", "tributary"]);
    if release {
        build.arg("--release");
    }
    let status = build
        .status()
        .context("running cargo build for tributary")?;
    if !status.success() {
        bail!("building tributary failed: {status}");
    }
    let status = std::process::Command::new(&exe)
        .args(args)
        .env("TRIBUTARY_BIN", dir.join("tributary"))
        .status()?;
    Ok(Some(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8,
    )))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match ensure_tributary_bin(&args) {
        Ok(Some(code)) => return code,
        Ok(None) => {}
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::FAILURE;
        }
    }
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => {
            eprintln!("starting tokio: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Vec<String>) -> ExitCode {
    let (name, ov, list) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    if list {
        if let Ok(dir) = std::fs::read_dir(suite::suites_dir()) {
            let mut names: Vec<String> = dir
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_suffix(".yml")
                        .map(String::from)
                })
                .collect();
            names.sort();
            for n in names {
                println!("{n}");
            }
        }
        return ExitCode::SUCCESS;
    }
    let Some(name) = name else {
        eprintln!("{}", usage());
        return ExitCode::from(2);
    };
    let s = match suite::load(&name) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let result = suite::run(&s, &ov).await;
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok((seed, reports)) => {
            let failed: Vec<_> = reports.iter().filter(|r| !r.failures.is_empty()).collect();
            let passed = reports.len() - failed.len();
            println!(
                "[resmoke] suite {name}: {} workload runs in {secs:.0}s, seed {seed}",
                reports.len()
            );
            if failed.is_empty() {
                println!("{passed} passed, 0 failed");
                ExitCode::SUCCESS
            } else {
                let mut replay =
                    format!("cargo run -p tests --bin resmoke -- --suite {name} --seed {seed}");
                if let Some(r) = failed.first()
                    && r.name != "hooks"
                {
                    // The failing run's own seed, alone (its round of a longer run).
                    replay = format!(
                        "cargo run -p tests --bin resmoke -- --suite {name} --seed {} --duration 0 --workload {}",
                        r.seed, r.name
                    );
                }
                println!("[resmoke] FAILED (seed {seed}); replay with:\n    {replay}");
                println!("{passed} passed, {} failed", failed.len());
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            println!("[resmoke] suite {name} could not run: {e:#}");
            ExitCode::FAILURE
        }
    }
}
