//! The I/O shell's loop: start the server, seed data, ask for the command list, then carry out
//! one generated case per iteration and check the server after each.
//!
//! A run fails on: the server process ending (crash, abort, stack overflow), a panic (or stack
//! overflow, failed allocation) in its output, an error reply without a numeric `code` and a
//! string `errmsg` (also in `writeErrors` / `writeConcernError`), an undecodable reply or one
//! addressed to another request, a structured command with no reply within the deadline (a
//! hang), and the server's RSS above the bound. A structured command's connection being closed
//! is recorded and listed at the end, but fails the run only if the server died; for raw cases
//! a close is expected.
//!
//! Under `--keep-going` the server is restarted after a crash, an RSS failure or a hang (a
//! stuck server would fail every later command), and the run goes on.
//!
//! Invariant: every failure is printed with its iteration, the request (truncated) and the
//! command line that regenerates exactly that request (`--seed S --only-iteration K`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bson::{Bson, Document, RawBsonRef, RawDocument, doc};

use super::frame::{self, Verdict};
use super::generate::{Case, Generator, Request, seed_documents};
use super::raw::RawCase;
use super::server::{Conn, Received, Server};
use super::value::EncodeContext;

/// What the command line chose.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub seconds: u64,
    pub max_rss_mb: u64,
    pub bin: PathBuf,
    pub keep_going: bool,
    /// Replay: send only this iteration (after `replay_from`..it, when set).
    pub only_iteration: Option<u64>,
    pub replay_from: Option<u64>,
    pub shards: usize,
    pub reply_timeout: Duration,
    pub verbose: bool,
}

/// One failure, with what is needed to reproduce it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: &'static str,
    pub iteration: u64,
    pub command: String,
    pub detail: String,
    pub request: String,
}

/// A structured command whose connection was closed.
#[derive(Debug, Clone)]
struct Close {
    iteration: u64,
    command: String,
    why: String,
    request: String,
}

#[derive(Debug, Default)]
struct Stats {
    iterations: u64,
    structured: u64,
    raw: u64,
    ok: u64,
    errors: BTreeMap<(i64, String), u64>,
    closes: Vec<Close>,
    skipped_too_large: u64,
    raw_replies: u64,
    raw_closes: u64,
    raw_timeouts: u64,
    restarts: u64,
    max_rss_mb: u64,
    /// Iterations during which the server's RSS rose by [`RSS_JUMP_MB`] or more: (iteration,
    /// command, MB before, MB after).
    rss_jumps: Vec<(u64, String, u64, u64)>,
    /// Replies with code 1 (InternalError), which no request should cause: (iteration,
    /// command, errmsg), the first [`LISTED`] of them.
    internal_errors: Vec<(u64, String, String)>,
}

/// How many of each listed kind (closes, internal errors) a report shows.
const LISTED: usize = 30;

/// An RSS rise within one iteration worth listing in the report.
const RSS_JUMP_MB: u64 = 256;

/// How much of a request a report shows.
const REQUEST_BUDGET: usize = 3000;

struct Runner<'a> {
    opts: &'a Options,
    server: Server,
    conn: Option<Conn>,
    next_id: i32,
    /// The current server's RSS bound failure is reported (once per server).
    rss_reported: bool,
    /// The current server left a command unanswered: it is restarted (under `--keep-going`),
    /// since every later command would wait behind the stuck one and fail too.
    hung: bool,
    stats: Stats,
    failures: Vec<Failure>,
}

/// Runs the fuzzer; `Ok(failures)` (empty when the run passed).
pub fn run(opts: &Options) -> Result<Vec<Failure>> {
    println!(
        "fuzz: seed {} for {} s, RSS bound {} MB, server {}",
        opts.seed,
        opts.seconds,
        opts.max_rss_mb,
        opts.bin.display()
    );
    let server = Server::start(&opts.bin, opts.shards)?;
    let mut r = Runner {
        opts,
        server,
        conn: None,
        next_id: 1,
        rss_reported: false,
        hung: false,
        stats: Stats::default(),
        failures: Vec::new(),
    };
    r.seed_data()?;
    let names = r.list_commands()?;
    let generator = Generator::new(opts.seed, &names);
    println!(
        "fuzz: {} commands from listCommands ({} after exclusions)",
        names.len(),
        generator.commands().len()
    );
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let iterations: Box<dyn Iterator<Item = u64>> = match opts.only_iteration {
        Some(k) => Box::new(opts.replay_from.unwrap_or(k).min(k)..=k),
        None => Box::new(0..),
    };
    let mut last = None;
    for i in iterations {
        if opts.only_iteration.is_none() && started.elapsed() >= Duration::from_secs(opts.seconds) {
            break;
        }
        let case = generator.case(i);
        r.stats.iterations += 1;
        let (name, rendered) = match &case {
            Case::Command(req) => (req.name.clone(), req.render(REQUEST_BUDGET)),
            Case::Raw(rc) => (
                format!("raw/{}", rc.base.name),
                format!(
                    "{} ({} bytes) from {}",
                    rc.mutation,
                    rc.bytes.len(),
                    rc.base.render(REQUEST_BUDGET / 2)
                ),
            ),
        };
        let verbose = opts.verbose || opts.only_iteration.is_some();
        if verbose {
            println!("[{i}] {name}: {}", cut(&rendered, 400));
        }
        let t = Instant::now();
        let rss_before = r.server.max_rss_mb();
        match case {
            Case::Command(req) => r.structured(i, &req, &rendered),
            Case::Raw(rc) => r.raw(i, &rc, &rendered),
        }
        if verbose {
            println!("    ({} ms)", t.elapsed().as_millis());
        }
        last = Some(i);
        let rss_after = r.server.max_rss_mb();
        if rss_after >= rss_before + RSS_JUMP_MB {
            r.stats
                .rss_jumps
                .push((i, name.clone(), rss_before, rss_after));
        }
        if !r.check_server(i, &name, &rendered)? {
            break;
        }
        if !r.failures.is_empty() && !opts.keep_going {
            break;
        }
        if opts.only_iteration.is_none() && i > 0 && i % 500 == 0 {
            // Drops and renames eat the seed data; put it back now and then. (A server too
            // busy to answer shows up in the next iteration's checks, not here.)
            if let Err(e) = r.seed_data() {
                println!("fuzz: re-seeding after iteration {i} failed: {e:#}");
            }
        }
        if last_progress.elapsed() > Duration::from_secs(15) {
            last_progress = Instant::now();
            println!(
                "fuzz: {:>4} s, iteration {i}, {} ok, {} errors, {} failures, max RSS {} MB",
                started.elapsed().as_secs(),
                r.stats.ok,
                r.stats.errors.values().sum::<u64>(),
                r.failures.len(),
                r.server.max_rss_mb()
            );
        }
    }
    // A last look at the output and the process.
    std::thread::sleep(Duration::from_millis(500));
    r.check_server(last.unwrap_or(0), "(after the last iteration)", "")?;
    r.report();
    Ok(r.failures)
}

impl Runner<'_> {
    fn id(&mut self) -> i32 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    fn conn(&mut self) -> Result<&mut Conn> {
        if self.conn.is_none() {
            self.conn = Some(Conn::connect(self.server.addr)?);
        }
        self.conn.as_mut().context("no connection")
    }

    /// Runs one of the harness's own commands (not fuzzed); `Err` if no reply came.
    fn admin(&mut self, body: Document) -> Result<Document> {
        let id = self.id();
        let bytes = frame::plain_frame(&body, id).map_err(anyhow::Error::msg)?;
        let timeout = self.opts.reply_timeout;
        let conn = self.conn()?;
        conn.send(&bytes, &[])?;
        match conn.receive(timeout) {
            Received::Frame(f) => {
                let raw = frame::reply_body(&f).map_err(anyhow::Error::msg)?;
                Ok(Document::try_from(&raw)?)
            }
            other => {
                self.conn = None;
                bail!("no reply to {body}: {other:?}")
            }
        }
    }

    fn list_commands(&mut self) -> Result<Vec<String>> {
        let reply = self.admin(doc! {"listCommands": 1, "$db": "admin"})?;
        let commands = reply
            .get_document("commands")
            .with_context(|| format!("listCommands replied {reply}"))?;
        Ok(commands.keys().cloned().collect())
    }

    /// The data commands chew on: `fuzz.c` (indexed), `fuzz.s` (sharded), `fuzz.capped`,
    /// `fuzz.v` (a view), `fuzz2.c`. Errors (say, the collection exists) are ignored.
    fn seed_data(&mut self) -> Result<()> {
        let docs: Vec<Bson> = seed_documents(50).into_iter().map(Bson::Document).collect();
        let commands = [
            doc! {"enableSharding": "fuzz", "$db": "admin"},
            doc! {"shardCollection": "fuzz.s", "key": {"k": "hashed"}, "$db": "admin"},
            doc! {"create": "capped", "capped": true, "size": 100_000, "max": 100, "$db": "fuzz"},
            doc! {"create": "v", "viewOn": "c", "pipeline": [{"$match": {"k": {"$gt": 2}}}], "$db": "fuzz"},
            doc! {"createIndexes": "c", "indexes": [
                {"key": {"k": 1}, "name": "k_1"},
                {"key": {"a.b": 1}, "name": "a.b_1"},
                {"key": {"s": "text"}, "name": "s_text"},
                {"key": {"loc": "2dsphere"}, "name": "loc_2dsphere"},
            ], "$db": "fuzz"},
        ];
        for c in commands {
            self.admin(c)?;
        }
        for (db, coll) in [
            ("fuzz", "c"),
            ("fuzz", "s"),
            ("fuzz", "capped"),
            ("fuzz2", "c"),
        ] {
            // `ordered: false`: documents already there are duplicates, the rest go in.
            self.admin(
                doc! {"insert": coll, "documents": docs.clone(), "ordered": false, "$db": db},
            )?;
        }
        Ok(())
    }

    fn fail(&mut self, kind: &'static str, i: u64, command: &str, detail: String, request: &str) {
        println!("\nFAILURE [{kind}] at iteration {i} ({command}): {detail}");
        if !request.is_empty() {
            println!("  request: {}", cut(request, REQUEST_BUDGET + 500));
        }
        println!(
            "  replay: fuzz --seed {} --only-iteration {i}  (add --replay-from <earlier> if it needs the state before)",
            self.opts.seed
        );
        self.failures.push(Failure {
            kind,
            iteration: i,
            command: command.to_string(),
            detail,
            request: cut(request, REQUEST_BUDGET),
        });
    }

    fn structured(&mut self, i: u64, req: &Request, rendered: &str) {
        self.stats.structured += 1;
        let mut cx = EncodeContext::default();
        if let Some(prelude) = &req.prelude {
            let id = self.id();
            let body = frame::document(prelude, cx);
            let msg = wire::message::Message::msg(id, body);
            let Ok(bytes) = wire::frame::encode_to_vec(&msg) else {
                return;
            };
            match self.exchange(&bytes, id) {
                Ok(Ok(body)) => {
                    self.judge(i, &format!("{} (prelude)", req.name), &body, rendered);
                    cx.cursor_id = frame::cursor_id(&body).unwrap_or(0);
                }
                Ok(Err(problem)) => {
                    self.fail(
                        "bad reply",
                        i,
                        &req.name,
                        format!("prelude: {problem}"),
                        rendered,
                    );
                    return;
                }
                Err(r) => {
                    self.not_answered(i, &req.name, r, rendered);
                    return;
                }
            }
        }
        let id = self.id();
        let bytes = match frame::command_frame(req, id, cx) {
            Ok(b) => b,
            Err(_) => {
                self.stats.skipped_too_large += 1;
                return;
            }
        };
        match self.exchange(&bytes, id) {
            Ok(Ok(body)) => self.judge(i, &req.name, &body, rendered),
            Ok(Err(problem)) => self.fail("bad reply", i, &req.name, problem, rendered),
            Err(r) => self.not_answered(i, &req.name, r, rendered),
        }
    }

    /// Sends a frame on the main connection and reads its reply: `Ok(Ok(body))`,
    /// `Ok(Err(problem))` for a reply that is not one, `Err` for a close or a timeout.
    #[allow(clippy::type_complexity)]
    fn exchange(
        &mut self,
        bytes: &[u8],
        id: i32,
    ) -> std::result::Result<std::result::Result<bson::RawDocumentBuf, String>, Received> {
        let timeout = self.opts.reply_timeout;
        let conn = match self.conn() {
            Ok(c) => c,
            Err(e) => return Err(Received::Closed(format!("cannot connect: {e}"))),
        };
        if let Err(e) = conn.send(bytes, &[]) {
            // The server may have answered before closing (a frame it refused to read whole).
            return Err(match conn.receive(Duration::from_secs(2)) {
                Received::Frame(_) => Received::Closed(format!("write failed: {e}")),
                other => other,
            });
        }
        match conn.receive(timeout) {
            Received::Frame(f) => {
                let response_to = i32::from_le_bytes([f[8], f[9], f[10], f[11]]);
                if response_to != id {
                    return Ok(Err(format!(
                        "reply's responseTo is {response_to}, the request's id {id}"
                    )));
                }
                Ok(frame::reply_body(&f))
            }
            other => Err(other),
        }
    }

    fn judge(&mut self, i: u64, command: &str, body: &RawDocument, rendered: &str) {
        match frame::check_reply(body) {
            Verdict::Ok => self.stats.ok += 1,
            Verdict::Error { code, code_name } => {
                if self.opts.verbose || self.opts.only_iteration.is_some() {
                    println!(
                        "    error {code} {code_name}: {}",
                        cut(body.get_str("errmsg").unwrap_or(""), 300)
                    );
                }
                if code == 1 && self.stats.internal_errors.len() < LISTED {
                    let errmsg = body.get_str("errmsg").unwrap_or("");
                    self.stats
                        .internal_errors
                        .push((i, command.to_string(), cut(errmsg, 300)));
                }
                *self.stats.errors.entry((code, code_name)).or_default() += 1;
            }
            Verdict::Malformed(why) => {
                let detail = format!("{why}; reply {}", summary(body));
                self.fail("bad error reply", i, command, detail, rendered);
            }
        }
    }

    fn not_answered(&mut self, i: u64, command: &str, r: Received, rendered: &str) {
        self.conn = None;
        match r {
            Received::Timeout => {
                let secs = self.opts.reply_timeout.as_secs();
                self.hung = true;
                self.fail(
                    "hang",
                    i,
                    command,
                    format!("no reply within {secs} s"),
                    rendered,
                );
            }
            Received::Closed(why) => {
                if self.opts.verbose || self.opts.only_iteration.is_some() {
                    println!("    connection closed: {why}");
                }
                self.stats.closes.push(Close {
                    iteration: i,
                    command: command.to_string(),
                    why,
                    request: cut(rendered, 300),
                });
            }
            Received::Frame(_) => {}
        }
    }

    fn raw(&mut self, i: u64, rc: &RawCase, rendered: &str) {
        self.stats.raw += 1;
        let Ok(mut conn) = Conn::connect(self.server.addr) else {
            // The server is gone or refuses connections: `check_server` says which.
            return;
        };
        let _ = conn.send(&rc.bytes, &rc.splits);
        conn.finish_writing();
        for _ in 0..4 {
            match conn.receive(Duration::from_secs(5)) {
                Received::Frame(f) => {
                    self.stats.raw_replies += 1;
                    match frame::reply_body(&f) {
                        Ok(body) => {
                            if let Verdict::Malformed(why) = frame::check_reply(&body) {
                                let detail = format!("{why}; reply {}", summary(&body));
                                self.fail("bad error reply", i, "raw", detail, rendered);
                            }
                        }
                        Err(problem) => self.fail("bad reply", i, "raw", problem, rendered),
                    }
                }
                Received::Closed(_) => {
                    self.stats.raw_closes += 1;
                    return;
                }
                Received::Timeout => {
                    self.stats.raw_timeouts += 1;
                    return;
                }
            }
        }
    }

    /// Checks the process, its output and its RSS; restarts it after a failure when
    /// `--keep-going`. `Ok(false)`: stop the run.
    fn check_server(&mut self, i: u64, command: &str, rendered: &str) -> Result<bool> {
        let mut restart = false;
        for alarm in self.server.new_alarms() {
            self.fail("panic", i, command, alarm, rendered);
        }
        if let Some(status) = self.server.exited() {
            // Give the output a moment to land, then read what is left of it.
            std::thread::sleep(Duration::from_millis(200));
            for alarm in self.server.new_alarms() {
                self.fail("panic", i, command, alarm, rendered);
            }
            let tail = self.server.log_tail(1500);
            self.fail(
                "crash",
                i,
                command,
                format!("server exited ({status}); output ends:\n{tail}"),
                rendered,
            );
            restart = true;
        }
        let rss = self.server.max_rss_mb();
        self.stats.max_rss_mb = self.stats.max_rss_mb.max(rss);
        if rss > self.opts.max_rss_mb && !self.rss_reported {
            self.rss_reported = true;
            self.fail(
                "rss",
                i,
                command,
                format!(
                    "server RSS reached {rss} MB (bound {} MB)",
                    self.opts.max_rss_mb
                ),
                rendered,
            );
            restart = true;
        }
        if self.hung {
            restart = true;
        }
        if restart {
            if !self.opts.keep_going {
                return Ok(false);
            }
            self.conn = None;
            self.stats.restarts += 1;
            self.server = Server::start(&self.opts.bin, self.opts.shards)?;
            self.rss_reported = false;
            self.hung = false;
            self.seed_data()?;
        }
        Ok(true)
    }

    fn report(&self) {
        let s = &self.stats;
        println!("\nfuzz: seed {}", self.opts.seed);
        println!(
            "  iterations {} (structured {}, raw {}), skipped as too large {}",
            s.iterations, s.structured, s.raw, s.skipped_too_large
        );
        println!(
            "  structured replies: ok {}, errors {}",
            s.ok,
            s.errors.values().sum::<u64>()
        );
        let mut by_count: Vec<_> = s.errors.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        let line: Vec<String> = by_count
            .iter()
            .map(|((code, name), n)| format!("{code} {name}: {n}"))
            .collect();
        println!("  error codes: {}", line.join(", "));
        println!(
            "  raw: replies {}, connection closes {}, no reply in 5 s {}",
            s.raw_replies, s.raw_closes, s.raw_timeouts
        );
        println!(
            "  structured connection closes: {}; server restarts: {}; max RSS {} MB",
            s.closes.len(),
            s.restarts,
            s.max_rss_mb
        );
        for (i, command, before, after) in s.rss_jumps.iter().take(20) {
            println!("    RSS {before} → {after} MB during iteration {i} ({command})");
        }
        for (i, command, errmsg) in &s.internal_errors {
            println!("    InternalError at iteration {i} ({command}): {errmsg}");
        }
        for c in s.closes.iter().take(LISTED) {
            println!(
                "    close at iteration {} ({}): {} — {}",
                c.iteration, c.command, c.why, c.request
            );
        }
        if self.failures.is_empty() {
            println!("fuzz: passed");
            return;
        }
        // Distinct failures: by kind, command and the first line of the detail.
        let mut distinct: BTreeMap<(String, String, String), (u64, usize)> = BTreeMap::new();
        for f in &self.failures {
            let first_line = f.detail.lines().next().unwrap_or("").to_string();
            let key = (f.kind.to_string(), f.command.clone(), cut(&first_line, 160));
            distinct.entry(key).or_insert((f.iteration, 0)).1 += 1;
        }
        println!("fuzz: FAILED, {} distinct failures:", distinct.len());
        for ((kind, command, detail), (first, n)) in distinct {
            println!(
                "  [{kind}] {command}: {detail} (x{n}; replay: fuzz --seed {} --only-iteration {first})",
                self.opts.seed
            );
        }
    }
}

/// The top-level fields of a reply, values shown only when short.
fn summary(body: &RawDocument) -> String {
    let mut parts = Vec::new();
    for e in body.iter().take(20) {
        let Ok((k, v)) = e else {
            parts.push("<invalid element>".to_string());
            break;
        };
        let shown = match v {
            RawBsonRef::Document(_) => "{…}".to_string(),
            RawBsonRef::Array(_) => "[…]".to_string(),
            RawBsonRef::String(s) => format!("{:?}", cut(s, 200)),
            other => format!("{other:?}"),
        };
        parts.push(format!("{k}: {shown}"));
    }
    format!("{{{}}}", parts.join(", "))
}

fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
