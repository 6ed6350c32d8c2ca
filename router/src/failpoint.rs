//! Test fail points (`configureFailPoint`), as in MongoDB with `--enableTestCommands`:
//! `failCommand` (fail or close the connection on the named commands, before they run, or
//! run them and answer a `writeConcernError`) and
//! `failGetMoreAfterCursorCheckout` (fail a getMore once its cursor has been found),
//! `onPrimaryTransactionalWrite` (a retryable write fails before it commits, or commits and
//! loses its reply: the connection closes) and `maxTimeAlwaysTimeOut` (every command with a
//! `maxTimeMS` fails with `MaxTimeMSExpired`).
//!
//! This module is the pure state machine: it parses `configureFailPoint`, counts activations
//! and decides what a command should do; the command layer acts on the decision.
//!
//! Invariants: a fail point in mode `{times: n}` triggers at most `n` times, then turns itself
//! off; `{skip: n}` lets the first `n` matching commands through, then stays on; `off` never
//! triggers; a `failCommand` error carries exactly the configured `errorLabels` when they are
//! given (the caller adds the server's own labels only when they are not); fail points never
//! touch `configureFailPoint` itself or the handshake unless the handshake is named.

use std::sync::Mutex;
use std::time::Duration;

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

/// The fail points this server knows.
pub const FAIL_COMMAND: &str = "failCommand";
pub const FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT: &str = "failGetMoreAfterCursorCheckout";
pub const ON_PRIMARY_TRANSACTIONAL_WRITE: &str = "onPrimaryTransactionalWrite";
pub const MAX_TIME_ALWAYS_TIME_OUT: &str = "maxTimeAlwaysTimeOut";

/// When a fail point triggers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Off,
    AlwaysOn,
    /// Triggers this many more times, then turns off.
    Times(u64),
    /// Lets this many matching evaluations through, then triggers every time.
    Skip(u64),
}

impl Mode {
    fn parse(v: Option<&Bson>) -> Result<Mode> {
        let bad =
            || MongoError::bad_value("'mode' must be 'alwaysOn', 'off', {times: n} or {skip: n}");
        match v {
            Some(Bson::String(s)) if s == "off" => Ok(Mode::Off),
            Some(Bson::String(s)) if s == "alwaysOn" => Ok(Mode::AlwaysOn),
            Some(Bson::Document(d)) if d.len() == 1 => {
                let (key, value) = d.iter().next().ok_or_else(bad)?;
                let n = match value {
                    Bson::Int32(n) => i64::from(*n),
                    Bson::Int64(n) => *n,
                    Bson::Double(n) if n.fract() == 0.0 => *n as i64,
                    _ => return Err(bad()),
                };
                if n < 0 {
                    return Err(MongoError::bad_value(format!(
                        "'{key}' must be a non-negative number"
                    )));
                }
                match key.as_str() {
                    "times" if n == 0 => Ok(Mode::Off),
                    "times" => Ok(Mode::Times(n as u64)),
                    "skip" => Ok(Mode::Skip(n as u64)),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// One evaluation of a matching command: whether it triggers, advancing the counters.
    fn evaluate(&mut self) -> bool {
        match self {
            Mode::Off => false,
            Mode::AlwaysOn => true,
            Mode::Times(n) => {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    *self = Mode::Off;
                }
                true
            }
            Mode::Skip(0) => true,
            Mode::Skip(n) => {
                *n -= 1;
                false
            }
        }
    }
}

/// What `failCommand` tells a command to do.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Triggered {
    /// Wait this long first (`blockConnection` with `blockTimeMS`).
    pub block: Option<Duration>,
    /// Then do this instead of running the command; `None`: run it.
    pub action: Option<Action>,
    /// Run it, then answer with this `writeConcernError` (and these labels) in the reply.
    pub write_concern_error: Option<(Document, Vec<String>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Answer with this error. `explicit_labels`: its labels were configured (`errorLabels`),
    /// so the server must not add its own.
    Fail {
        error: MongoError,
        explicit_labels: bool,
    },
    /// Close the connection without answering.
    CloseConnection,
}

/// What `onPrimaryTransactionalWrite` does to a retryable write, at the statement it entered.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionalWrite {
    /// The statement (its index in the command's batch) the fail point entered at: the ones
    /// before it run, it commits unless it fails, the rest do not run.
    pub statement: usize,
    /// Fail with this before the write commits (`failBeforeCommitExceptionCode`); `None`: the
    /// write commits.
    pub fail_before_commit: Option<MongoError>,
    /// Then close the connection without answering (`closeConnection`, on by default).
    pub close_connection: bool,
}

#[derive(Debug, Clone, Default)]
struct Configured {
    mode: Mode,
    data: Document,
    /// How many times the fail point triggered since it was configured.
    entered: i64,
}

/// The fail points of one router.
#[derive(Debug, Default)]
pub struct FailPoints {
    fail_command: Mutex<Configured>,
    fail_get_more: Mutex<Configured>,
    on_primary_transactional_write: Mutex<Configured>,
    /// How many leading statements of a retryable write (`lsid` bytes, `txnNumber`) committed
    /// in an attempt `onPrimaryTransactionalWrite` cut short: a retry answers those from
    /// history, so they do not enter the fail point again.
    committed: Mutex<std::collections::HashMap<(Vec<u8>, i64), usize>>,
    max_time_always_time_out: Mutex<Configured>,
}

impl FailPoints {
    /// `configureFailPoint`: replaces the named fail point's mode and data; replies with the
    /// number of times it had triggered (`count`), like MongoDB.
    pub fn configure(&self, cmd: &Document) -> Result<Document> {
        let name = match cmd.get("configureFailPoint") {
            Some(Bson::String(s)) => s.as_str(),
            _ => {
                return Err(MongoError::type_mismatch(
                    "'configureFailPoint' must be the name of a fail point",
                ));
            }
        };
        let slot = self
            .slot(name)
            .ok_or_else(|| MongoError::bad_value(format!("Failpoint {name} not found")))?;
        let mode = Mode::parse(cmd.get("mode"))?;
        let data = match cmd.get("data") {
            None => Document::new(),
            Some(Bson::Document(d)) => d.clone(),
            Some(_) => return Err(MongoError::type_mismatch("'data' must be a document")),
        };
        if name == FAIL_COMMAND && mode != Mode::Off {
            validate_fail_command(&data)?;
        }
        if name == FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT && mode != Mode::Off {
            error_code(&data)?;
        }
        if name == ON_PRIMARY_TRANSACTIONAL_WRITE && mode != Mode::Off {
            before_commit_code(&data)?;
        }
        if name == ON_PRIMARY_TRANSACTIONAL_WRITE {
            self.forget_committed();
        }
        let mut state = lock(slot);
        let count = state.entered;
        *state = Configured {
            mode,
            data,
            entered: 0,
        };
        Ok(doc! {"count": count, "ok": 1.0})
    }

    /// Turns every fail point off.
    pub fn clear(&self) {
        *lock(&self.fail_command) = Configured::default();
        *lock(&self.fail_get_more) = Configured::default();
        *lock(&self.on_primary_transactional_write) = Configured::default();
        self.forget_committed();
        *lock(&self.max_time_always_time_out) = Configured::default();
    }

    /// `onPrimaryTransactionalWrite`, checked before a retryable write (`cmd`) runs. As in
    /// MongoDB it is entered once per statement the write executes (so a `{times: n}` mode
    /// counts statements), skipping the statements an earlier attempt it cut short committed.
    pub fn check_transactional_write(&self, cmd: &Document) -> Option<TransactionalWrite> {
        let name = cmd.keys().next().map(String::as_str).unwrap_or("");
        let write = matches!(
            name,
            "insert" | "update" | "delete" | "findAndModify" | "findandmodify"
        );
        let statements = statement_count(cmd);
        if !write || !cmd.contains_key("txnNumber") || cmd.contains_key("autocommit") {
            return None;
        }
        let key = (
            cmd.get_document("lsid")
                .ok()
                .map(|l| l.to_string().into_bytes())
                .unwrap_or_default(),
            cmd.get_i64("txnNumber").unwrap_or(0),
        );
        let mut state = lock(&self.on_primary_transactional_write);
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = committed.get(&key).copied().unwrap_or(0);
        for statement in start..statements {
            if state.mode == Mode::Off || !state.mode.evaluate() {
                continue;
            }
            state.entered += 1;
            let data = &state.data;
            let fail_before_commit = before_commit_code(data)
                .ok()
                .flatten()
                .map(|code| MongoError::with_code(code, "Failing write for test before commit"));
            let done = if fail_before_commit.is_some() {
                statement
            } else {
                statement + 1
            };
            committed.insert(key, done);
            return Some(TransactionalWrite {
                statement,
                fail_before_commit,
                close_connection: data
                    .get("closeConnection")
                    .is_none_or(pipeline::value::truthy),
            });
        }
        None
    }

    fn forget_committed(&self) {
        self.committed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// `maxTimeAlwaysTimeOut`: a command with a `maxTimeMS` fails at once.
    pub fn check_max_time(&self, cmd: &Document) -> Option<MongoError> {
        if !cmd.contains_key("maxTimeMS") {
            return None;
        }
        let mut state = lock(&self.max_time_always_time_out);
        if state.mode == Mode::Off || !state.mode.evaluate() {
            return None;
        }
        state.entered += 1;
        Some(MongoError::new(
            ErrorCode::MAX_TIME_MS_EXPIRED,
            "operation exceeded time limit",
        ))
    }

    /// `failCommand`, checked before the command `name` runs.
    ///
    /// `app_name` is the connection's `client.application.name` from its handshake: a fail point
    /// with `appName` only fails that application's commands.
    pub fn check_command(&self, name: &str, app_name: Option<&str>) -> Option<Triggered> {
        if name == "configureFailPoint" {
            return None;
        }
        let mut state = lock(&self.fail_command);
        if state.mode == Mode::Off || !names_command(&state.data, name) {
            return None;
        }
        if let Ok(wanted) = state.data.get_str("appName")
            && app_name != Some(wanted)
        {
            return None;
        }
        if !state.mode.evaluate() {
            return None;
        }
        state.entered += 1;
        let data = &state.data;
        if data.get_bool("closeConnection").unwrap_or(false) {
            return Some(Triggered {
                block: block_time(data),
                action: Some(Action::CloseConnection),
                write_concern_error: None,
            });
        }
        let block = block_time(data);
        let action = error_code(data).ok().flatten().map(|code| {
            let mut error =
                MongoError::with_code(code, "Failing command via 'failCommand' failpoint");
            let labels = data.get_array("errorLabels").ok();
            for label in labels.into_iter().flatten().filter_map(Bson::as_str) {
                error = error.with_label(label);
            }
            Action::Fail {
                error,
                explicit_labels: labels.is_some(),
            }
        });
        let write_concern_error = data.get_document("writeConcernError").ok().map(|w| {
            let mut w = w.clone();
            if !w.contains_key("codeName")
                && let Some(code) = w.get("code").and_then(Bson::as_i32)
            {
                w.insert("codeName", ErrorCode::named(code).name);
            }
            let labels = data
                .get_array("errorLabels")
                .map(|a| {
                    a.iter()
                        .filter_map(Bson::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            (w, labels)
        });
        Some(Triggered {
            block,
            action,
            write_concern_error,
        })
    }

    /// `failGetMoreAfterCursorCheckout`, checked once a getMore found its cursor.
    pub fn check_get_more(&self) -> Option<MongoError> {
        let mut state = lock(&self.fail_get_more);
        if state.mode == Mode::Off || !state.mode.evaluate() {
            return None;
        }
        state.entered += 1;
        let code = error_code(&state.data)
            .ok()
            .flatten()
            .unwrap_or(ErrorCode::INTERNAL_ERROR.code);
        Some(MongoError::with_code(
            code,
            "Failing getMore via 'failGetMoreAfterCursorCheckout' failpoint",
        ))
    }

    fn slot(&self, name: &str) -> Option<&Mutex<Configured>> {
        match name {
            FAIL_COMMAND => Some(&self.fail_command),
            FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT => Some(&self.fail_get_more),
            ON_PRIMARY_TRANSACTIONAL_WRITE => Some(&self.on_primary_transactional_write),
            MAX_TIME_ALWAYS_TIME_OUT => Some(&self.max_time_always_time_out),
            _ => None,
        }
    }
}

/// Codes on which a retryable write may be retried (the server labels them
/// `RetryableWriteError`).
const RETRYABLE_WRITE_CODES: &[i32] = &[
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// The labels the server itself would put on an injected error when none were configured: a
/// retryable write (a write command with `txnNumber`, outside a transaction) failing with a
/// retryable code gets `RetryableWriteError`. Never `ResumableChangeStreamError`: `failCommand`
/// fails before any cursor is checked out.
pub fn with_server_labels(error: MongoError, name: &str, cmd: &Document) -> MongoError {
    let write = matches!(
        name,
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
    );
    let in_txn = cmd.get_bool("autocommit").is_ok();
    if write
        && !in_txn
        && cmd.contains_key("txnNumber")
        && RETRYABLE_WRITE_CODES.contains(&error.code)
    {
        error.with_label("RetryableWriteError")
    } else {
        error
    }
}

fn lock(m: &Mutex<Configured>) -> std::sync::MutexGuard<'_, Configured> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The statements of a write command (`documents`, `updates` or `deletes`; one for
/// `findAndModify`).
pub fn statement_count(cmd: &Document) -> usize {
    ["documents", "updates", "deletes"]
        .iter()
        .find_map(|f| cmd.get_array(f).ok().map(Vec::len))
        .unwrap_or(1)
}

/// Whether a write command carries a statement list (`documents`, `updates`, `deletes`).
pub fn has_statement_list(cmd: &Document) -> bool {
    ["documents", "updates", "deletes"]
        .iter()
        .any(|f| cmd.get_array(f).is_ok())
}

/// A write command with only its first `n` statements (their implicit `stmtId`s unchanged).
pub fn first_statements(cmd: &Document, n: usize) -> Document {
    let mut out = cmd.clone();
    for field in ["documents", "updates", "deletes"] {
        if let Ok(list) = out.get_array_mut(field) {
            list.truncate(n);
        }
    }
    out
}

/// A write reply with the write error of the statement `index` the fail point failed, after
/// those that ran (an ordered write stops there).
pub fn with_write_error(reply: wire::raw::Body, index: usize, e: &MongoError) -> wire::raw::Body {
    let Ok(mut d) = reply.into_document() else {
        return wire::raw::Body::Document(e.to_document());
    };
    let error = doc! {"index": index as i32, "code": e.code, "errmsg": e.errmsg.clone()};
    match d.get_array_mut("writeErrors") {
        Ok(list) => list.push(Bson::Document(error)),
        Err(_) => {
            d.insert("writeErrors", vec![Bson::Document(error)]);
        }
    }
    wire::raw::Body::Document(d)
}

/// `failBeforeCommitExceptionCode` of `onPrimaryTransactionalWrite`.
fn before_commit_code(data: &Document) -> Result<Option<i32>> {
    match data.get("failBeforeCommitExceptionCode") {
        None => Ok(None),
        Some(v) => match pipeline::value::as_f64(v) {
            Some(n) if n.fract() == 0.0 && n >= f64::from(i32::MIN) && n <= f64::from(i32::MAX) => {
                Ok(Some(n as i32))
            }
            _ => Err(MongoError::type_mismatch(
                "'failBeforeCommitExceptionCode' must be an integer",
            )),
        },
    }
}

fn names_command(data: &Document, name: &str) -> bool {
    data.get_array("failCommands")
        .map(|a| a.iter().any(|c| c.as_str() == Some(name)))
        .unwrap_or(false)
}

fn error_code(data: &Document) -> Result<Option<i32>> {
    match data.get("errorCode") {
        None => Ok(None),
        Some(Bson::Int32(n)) => Ok(Some(*n)),
        Some(Bson::Int64(n)) => i32::try_from(*n)
            .map(Some)
            .map_err(|_| MongoError::bad_value("'errorCode' is out of range")),
        Some(Bson::Double(n)) if n.fract() == 0.0 && n.abs() <= f64::from(i32::MAX) => {
            Ok(Some(*n as i32))
        }
        Some(_) => Err(MongoError::type_mismatch("'errorCode' must be a number")),
    }
}

fn block_time(data: &Document) -> Option<Duration> {
    if !data.get_bool("blockConnection").unwrap_or(false) {
        return None;
    }
    let ms = match data.get("blockTimeMS") {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(n)) => *n as i64,
        _ => 0,
    };
    Some(Duration::from_millis(ms.max(0) as u64))
}

/// `failCommand` options this server implements; anything else is refused rather than silently
/// ignored.
const FAIL_COMMAND_OPTIONS: &[&str] = &[
    "failCommands",
    "errorCode",
    "errorLabels",
    "closeConnection",
    "blockConnection",
    "blockTimeMS",
    "appName",
    "failInternalCommands",
    "writeConcernError",
];

fn validate_fail_command(data: &Document) -> Result<()> {
    if let Some(k) = data
        .keys()
        .find(|k| !FAIL_COMMAND_OPTIONS.contains(&k.as_str()))
    {
        return Err(MongoError::bad_value(format!(
            "failCommand option '{k}' is not supported by this server"
        )));
    }
    if let Some(v) = data.get("appName")
        && !matches!(v, Bson::String(_))
    {
        return Err(MongoError::type_mismatch("'appName' must be a string"));
    }
    match data.get("failCommands") {
        Some(Bson::Array(a)) if a.iter().all(|c| matches!(c, Bson::String(_))) => {}
        _ => {
            return Err(MongoError::bad_value(
                "'failCommands' must be an array of command names",
            ));
        }
    }
    error_code(data)?;
    if let Some(labels) = data.get("errorLabels") {
        match labels {
            Bson::Array(a) if a.iter().all(|l| matches!(l, Bson::String(_))) => {}
            _ => {
                return Err(MongoError::type_mismatch(
                    "'errorLabels' must be an array of strings",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    impl FailPoints {
        fn check_command_any(&self, name: &str) -> Option<Triggered> {
            self.check_command(name, None)
        }
    }

    fn fail_command(mode: Bson, data: Document) -> FailPoints {
        let fp = FailPoints::default();
        fp.configure(&doc! {"configureFailPoint": FAIL_COMMAND, "mode": mode, "data": data})
            .unwrap();
        fp
    }

    fn error_of(t: Option<Triggered>) -> (MongoError, bool) {
        match t.and_then(|t| t.action) {
            Some(Action::Fail {
                error,
                explicit_labels,
            }) => (error, explicit_labels),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn a_write_concern_error_lets_the_command_run_and_names_its_code() {
        let fp = fail_command(
            Bson::Document(doc! {"times": 1}),
            doc! {"failCommands": ["commitTransaction"], "writeConcernError": {"code": 64, "errmsg": "x"}},
        );
        let t = fp.check_command_any("commitTransaction").unwrap();
        assert!(t.action.is_none(), "the command runs");
        let (wce, labels) = t.write_concern_error.unwrap();
        assert_eq!(wce.get_str("codeName").unwrap(), "WriteConcernFailed");
        assert!(labels.is_empty());
    }

    #[test]
    fn times_mode_triggers_exactly_n_times_on_named_commands_only() {
        let fp = fail_command(
            Bson::Document(doc! {"times": 2}),
            doc! {"failCommands": ["getMore"], "errorCode": 6},
        );
        assert!(fp.check_command_any("find").is_none());
        assert!(fp.check_command_any("configureFailPoint").is_none());
        assert_eq!(error_of(fp.check_command_any("getMore")).0.code, 6);
        assert_eq!(error_of(fp.check_command_any("getMore")).0.code, 6);
        assert!(fp.check_command_any("getMore").is_none());
    }

    #[test]
    fn off_and_always_on() {
        let fp = fail_command(
            Bson::String("alwaysOn".into()),
            doc! {"failCommands": ["insert"], "closeConnection": true},
        );
        for _ in 0..5 {
            assert_eq!(
                fp.check_command_any("insert").unwrap().action,
                Some(Action::CloseConnection)
            );
        }
        let reply = fp
            .configure(&doc! {"configureFailPoint": FAIL_COMMAND, "mode": "off"})
            .unwrap();
        assert_eq!(reply.get_i64("count").unwrap(), 5);
        assert!(fp.check_command_any("insert").is_none());
    }

    #[test]
    fn skip_mode_lets_the_first_n_through() {
        let fp = fail_command(
            Bson::Document(doc! {"skip": 1}),
            doc! {"failCommands": ["find"], "errorCode": 2},
        );
        assert!(fp.check_command_any("find").is_none());
        assert!(fp.check_command_any("find").is_some());
        assert!(fp.check_command_any("find").is_some());
    }

    #[test]
    fn configured_labels_are_exact_and_marked_explicit() {
        let fp = fail_command(
            Bson::Document(doc! {"times": 1}),
            doc! {"failCommands": ["getMore"], "errorCode": 50, "errorLabels": ["ResumableChangeStreamError"]},
        );
        let (e, explicit) = error_of(fp.check_command_any("getMore"));
        assert!(explicit);
        assert_eq!(e.labels, vec!["ResumableChangeStreamError".to_string()]);
        let fp = fail_command(
            Bson::Document(doc! {"times": 1}),
            doc! {"failCommands": ["getMore"], "errorCode": 6},
        );
        let (e, explicit) = error_of(fp.check_command_any("getMore"));
        assert!(!explicit);
        assert!(e.labels.is_empty());
        assert_eq!(e.code_name, "HostUnreachable");
    }

    #[test]
    fn get_more_after_checkout_counts_down() {
        let fp = FailPoints::default();
        fp.configure(&doc! {
            "configureFailPoint": FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT,
            "mode": {"times": 1},
            "data": {"errorCode": 10107},
        })
        .unwrap();
        assert!(fp.check_command_any("getMore").is_none());
        assert_eq!(fp.check_get_more().unwrap().code, 10107);
        assert!(fp.check_get_more().is_none());
    }

    #[test]
    fn on_primary_transactional_write_is_entered_per_statement_not_again_on_a_retry() {
        let fp = FailPoints::default();
        fp.configure(&doc! {
            "configureFailPoint": ON_PRIMARY_TRANSACTIONAL_WRITE, "mode": {"times": 2},
        })
        .unwrap();
        let batch = doc! {"update": "c", "updates": [{}, {}, {}], "txnNumber": 5_i64,
        "lsid": {"id": 1}};
        // The first attempt commits statement 0, then loses its reply; the retry answers
        // statement 0 from history and enters at statement 1; the next retry runs through.
        assert_eq!(
            fp.check_transactional_write(&batch).map(|t| t.statement),
            Some(0)
        );
        assert_eq!(
            fp.check_transactional_write(&batch).map(|t| t.statement),
            Some(1)
        );
        assert!(fp.check_transactional_write(&batch).is_none());
        // `skip` counts statements too; another transaction number starts afresh.
        fp.configure(&doc! {
            "configureFailPoint": ON_PRIMARY_TRANSACTIONAL_WRITE, "mode": {"skip": 2},
            "data": {"failBeforeCommitExceptionCode": 1, "closeConnection": false},
        })
        .unwrap();
        let mut other = batch.clone();
        other.insert("txnNumber", 6_i64);
        let cut = fp.check_transactional_write(&other).unwrap();
        assert_eq!(cut.statement, 2);
        assert_eq!(cut.fail_before_commit.map(|e| e.code), Some(1));
    }

    #[test]
    fn on_primary_transactional_write_fails_or_loses_the_reply_of_retryable_writes_only() {
        let fp = FailPoints::default();
        fp.configure(&doc! {
            "configureFailPoint": ON_PRIMARY_TRANSACTIONAL_WRITE,
            "mode": {"times": 2},
            "data": {"failBeforeCommitExceptionCode": 1},
        })
        .unwrap();
        let retryable = doc! {"insert": "c", "documents": [{}], "txnNumber": 1_i64};
        // Not a retryable write: untouched, and not counted.
        assert!(
            fp.check_transactional_write(&doc! {"insert": "c"})
                .is_none()
        );
        let in_txn = doc! {"insert": "c", "txnNumber": 1_i64, "autocommit": false};
        assert!(fp.check_transactional_write(&in_txn).is_none());
        assert!(
            fp.check_transactional_write(&doc! {"find": "c", "txnNumber": 1_i64})
                .is_none()
        );
        let first = fp.check_transactional_write(&retryable).unwrap();
        assert_eq!(first.fail_before_commit.map(|e| e.code), Some(1));
        assert!(first.close_connection, "closeConnection is on by default");
        assert!(fp.check_transactional_write(&retryable).is_some());
        assert!(
            fp.check_transactional_write(&retryable).is_none(),
            "times: 2"
        );
        // Without a code the write commits; the reply is lost unless closeConnection is false.
        fp.configure(&doc! {
            "configureFailPoint": ON_PRIMARY_TRANSACTIONAL_WRITE,
            "mode": "alwaysOn",
            "data": {"closeConnection": false},
        })
        .unwrap();
        let kept = fp.check_transactional_write(&retryable).unwrap();
        assert_eq!(
            kept,
            TransactionalWrite {
                statement: 0,
                fail_before_commit: None,
                close_connection: false
            }
        );
    }

    #[test]
    fn max_time_always_time_out_fails_commands_with_a_max_time() {
        let fp = FailPoints::default();
        fp.configure(&doc! {"configureFailPoint": MAX_TIME_ALWAYS_TIME_OUT, "mode": "alwaysOn"})
            .unwrap();
        assert!(fp.check_max_time(&doc! {"find": "c"}).is_none());
        let e = fp
            .check_max_time(&doc! {"find": "c", "maxTimeMS": 1000})
            .unwrap();
        assert_eq!((e.code, e.code_name.as_str()), (50, "MaxTimeMSExpired"));
        fp.clear();
        assert!(
            fp.check_max_time(&doc! {"find": "c", "maxTimeMS": 1000})
                .is_none()
        );
    }

    #[test]
    fn bad_configurations_are_rejected() {
        let fp = FailPoints::default();
        for cmd in [
            doc! {"configureFailPoint": "noSuchFailPoint", "mode": "alwaysOn"},
            doc! {"configureFailPoint": FAIL_COMMAND, "mode": "sometimes"},
            doc! {"configureFailPoint": FAIL_COMMAND, "mode": {"times": -1}},
            doc! {"configureFailPoint": FAIL_COMMAND, "mode": "alwaysOn", "data": {"errorCode": 1}},
            doc! {"configureFailPoint": 1, "mode": "off"},
            doc! {"configureFailPoint": ON_PRIMARY_TRANSACTIONAL_WRITE, "mode": "alwaysOn",
            "data": {"failBeforeCommitExceptionCode": "one"}},
        ] {
            assert!(fp.configure(&cmd).is_err(), "{cmd}");
        }
        assert!(fp.check_command_any("insert").is_none());
    }

    #[test]
    fn server_labels_only_for_retryable_writes() {
        let e = || MongoError::with_code(91, "x");
        let w = with_server_labels(e(), "insert", &doc! {"insert": "c", "txnNumber": 1_i64});
        assert!(w.has_label("RetryableWriteError"));
        let g = with_server_labels(e(), "getMore", &doc! {"getMore": 1_i64});
        assert!(g.labels.is_empty());
        let no_txn = with_server_labels(e(), "insert", &doc! {"insert": "c"});
        assert!(no_txn.labels.is_empty());
    }

    #[test]
    fn app_name_limits_the_fail_point_to_one_application() {
        let fp = fail_command(
            Bson::String("alwaysOn".into()),
            doc! {"failCommands": ["find"], "errorCode": 2, "appName": "app1"},
        );
        assert!(fp.check_command("find", None).is_none());
        assert!(fp.check_command("find", Some("app2")).is_none());
        assert!(fp.check_command("find", Some("app1")).is_some());
    }

    #[test]
    fn unsupported_options_are_refused() {
        let fp = FailPoints::default();
        let cmd = doc! {"configureFailPoint": FAIL_COMMAND, "mode": "alwaysOn",
        "data": {"failCommands": ["insert"], "errorExtraInfo": {"x": 1}}};
        assert!(fp.configure(&cmd).is_err());
    }

    #[test]
    fn clear_turns_everything_off() {
        let fp = fail_command(
            Bson::String("alwaysOn".into()),
            doc! {"failCommands": ["ping"], "errorCode": 2},
        );
        fp.clear();
        assert!(fp.check_command_any("ping").is_none());
    }
}
