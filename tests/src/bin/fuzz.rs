//! `fuzz`: the wire-level fuzzer (stable Rust, no cargo-fuzz). Starts a `tributary` (embedded
//! router with two shards) and sends it seeded, structured commands for every name
//! `listCommands` gives, with mutated arguments, and raw mutated frames.
//!
//! ```text
//! cargo build --bin tributary --bin fuzz
//! ./target/debug/fuzz --seed 1 --seconds 120 --max-rss-mb 2048
//!     [--bin PATH] [--keep-going] [--shards N] [--reply-timeout-secs S] [--verbose]
//! ./target/debug/fuzz --seed 1 --only-iteration 4711 [--replay-from 4700]    # replay
//! ```
//!
//! The server is `--bin`, else `$TRIBUTARY_BIN`, else the `tributary` beside this binary.
//! Exits 0 when the run passed, 1 on any failure (each printed with the command that replays
//! it), 2 on bad arguments or when the server cannot start.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tests::fuzz::run::{self, Options};

fn usage() -> &'static str {
    "usage: fuzz [--seed N] [--seconds N] [--max-rss-mb N] [--bin PATH] [--keep-going] \
     [--only-iteration K [--replay-from J]] [--shards N] [--reply-timeout-secs S] [--verbose]"
}

fn parse(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        seed: rand::random(),
        seconds: 60,
        max_rss_mb: 2048,
        bin: PathBuf::new(),
        keep_going: false,
        only_iteration: None,
        replay_from: None,
        shards: 2,
        reply_timeout: Duration::from_secs(30),
        verbose: false,
    };
    let mut bin = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--seed" => opts.seed = value()?.parse().context("--seed")?,
            "--seconds" => opts.seconds = value()?.parse().context("--seconds")?,
            "--max-rss-mb" => opts.max_rss_mb = value()?.parse().context("--max-rss-mb")?,
            "--bin" => bin = Some(PathBuf::from(value()?)),
            "--keep-going" => opts.keep_going = true,
            "--only-iteration" => {
                opts.only_iteration = Some(value()?.parse().context("--only-iteration")?);
            }
            "--replay-from" => opts.replay_from = Some(value()?.parse().context("--replay-from")?),
            "--shards" => opts.shards = value()?.parse().context("--shards")?,
            "--reply-timeout-secs" => {
                opts.reply_timeout =
                    Duration::from_secs(value()?.parse().context("--reply-timeout-secs")?);
            }
            "--verbose" => opts.verbose = true,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{}", usage()),
        }
    }
    opts.bin = match bin.or_else(|| std::env::var_os("TRIBUTARY_BIN").map(PathBuf::from)) {
        Some(b) => b,
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .context("this binary has no directory")?
                .join("tributary")
        }
    };
    if !opts.bin.exists() {
        bail!(
            "no tributary binary at {} (build it with `cargo build --bin tributary`, or pass --bin)",
            opts.bin.display()
        );
    }
    Ok(opts)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    match run::run(&opts) {
        Ok(failures) if failures.is_empty() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fuzz: {e:#}");
            ExitCode::from(2)
        }
    }
}
