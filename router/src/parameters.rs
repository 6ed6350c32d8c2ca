//! Server parameters: `getParameter` and `setParameter` for the parameters the router has.
//!
//! Owns: the table of parameters (name, whether it can change at runtime, how to read and set
//! it) and the process's log verbosity (`logLevel`: 0 logs info and above, 1 debug, 2 and up
//! trace, as mongod's levels map onto `tracing`'s; the binary installs the hook that applies
//! it, over whatever `RUST_LOG` said).
//!
//! Invariants: a parameter that cannot change at runtime is refused by `setParameter`, never
//! silently kept; a value is checked before anything changes; `setParameter` answers with the
//! old value (`was`), as mongod does.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

use crate::cursors::CursorTable;

/// The current `logLevel`.
static LOG_LEVEL: AtomicI32 = AtomicI32::new(0);

/// Applies a `tracing` filter directive (installed by the binary).
type Reload = Box<dyn Fn(&str) -> std::result::Result<(), String> + Send + Sync>;
static RELOAD: OnceLock<Reload> = OnceLock::new();

/// Installs how a new `logLevel` reaches the log filter (once, by the binary).
pub fn install_log_reload(
    reload: impl Fn(&str) -> std::result::Result<(), String> + Send + Sync + 'static,
) {
    let _ = RELOAD.set(Box::new(reload));
}

fn set_log_level(level: i32) -> Result<()> {
    let directive = match level {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    if let Some(reload) = RELOAD.get() {
        reload(directive).map_err(|e| MongoError::internal(format!("log filter: {e}")))?;
    }
    LOG_LEVEL.store(level, Ordering::Relaxed);
    tracing::info!(level, directive, "log level changed");
    Ok(())
}

/// What the parameters stand for: the router's parts they read and set.
pub struct Knobs<'a> {
    pub cursors: &'a CursorTable,
    pub enable_test_commands: bool,
    pub max_clock_drift: Duration,
}

struct Parameter {
    name: &'static str,
    runtime: bool,
    get: fn(&Knobs<'_>) -> Bson,
    /// Checks and applies a new value.
    set: Option<fn(&Knobs<'_>, &Bson) -> Result<()>>,
}

fn int(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 => Some(*f as i64),
        _ => None,
    }
}

/// A memory limit as `getParameter` shows it (set through the shards: `commands::admin`).
fn limit(bytes: usize) -> Bson {
    Bson::Int64(i64::try_from(bytes).unwrap_or(i64::MAX))
}

const PARAMETERS: &[Parameter] = &[
    Parameter {
        name: "authenticationMechanisms",
        runtime: false,
        get: |_| Bson::Array(vec!["SCRAM-SHA-1".into(), "SCRAM-SHA-256".into()]),
        set: None,
    },
    Parameter {
        name: "changeStreamExtensions",
        runtime: true,
        get: |_| Bson::Boolean(pipeline::changestream::spec::extensions_enabled()),
        set: Some(|_, v| match v {
            Bson::Boolean(on) => {
                pipeline::changestream::spec::set_extensions_enabled(*on);
                Ok(())
            }
            _ => Err(MongoError::bad_value(
                "changeStreamExtensions must be a boolean",
            )),
        }),
    },
    Parameter {
        name: "changeStreamHeldReplyBytesLimit",
        runtime: true,
        get: |r| limit(r.cursors.stream_held_bytes()),
        set: Some(|r, v| match int(v) {
            Some(bytes) if bytes > 0 => {
                r.cursors.set_stream_held_bytes(bytes as u64);
                Ok(())
            }
            _ => Err(MongoError::bad_value(
                "changeStreamHeldReplyBytesLimit must be a positive integer",
            )),
        }),
    },
    Parameter {
        name: "cursorTimeoutMillis",
        runtime: true,
        get: |r| Bson::Int64(r.cursors.idle_timeout().as_millis() as i64),
        set: Some(|r, v| match int(v) {
            Some(ms) if ms > 0 => {
                r.cursors.set_idle_timeout(Duration::from_millis(ms as u64));
                Ok(())
            }
            _ => Err(MongoError::bad_value(
                "cursorTimeoutMillis must be a positive integer",
            )),
        }),
    },
    Parameter {
        name: "enableTestCommands",
        runtime: false,
        get: |r| Bson::Boolean(r.enable_test_commands),
        set: None,
    },
    Parameter {
        name: "featureCompatibilityVersion",
        runtime: false,
        get: |_| Bson::Document(doc! {"version": "7.0"}),
        set: None,
    },
    Parameter {
        name: "internalDocumentSourceGroupMaxMemoryBytes",
        runtime: true,
        get: |_| limit(pipeline::agg::spill::group_limit()),
        set: None,
    },
    Parameter {
        name: "internalQueryMaxBlockingSortMemoryUsageBytes",
        runtime: true,
        get: |_| limit(pipeline::agg::spill::sort_limit()),
        set: None,
    },
    Parameter {
        name: "logLevel",
        runtime: true,
        get: |_| Bson::Int32(LOG_LEVEL.load(Ordering::Relaxed)),
        set: Some(|_, v| match int(v) {
            Some(level @ 0..=5) => set_log_level(level as i32),
            _ => Err(MongoError::bad_value(
                "logLevel must be an integer from 0 to 5",
            )),
        }),
    },
    Parameter {
        name: "maxAcceptableLogicalClockDriftSecs",
        runtime: false,
        get: |r| Bson::Int64(r.max_clock_drift.as_secs() as i64),
        set: None,
    },
    Parameter {
        name: "recordCommitMetadata",
        runtime: true,
        get: |_| Bson::Boolean(crate::kernel::transport::record_commit_metadata()),
        set: Some(|_, v| match v {
            Bson::Boolean(on) => {
                crate::kernel::transport::set_record_commit_metadata(*on);
                Ok(())
            }
            _ => Err(MongoError::bad_value(
                "recordCommitMetadata must be a boolean",
            )),
        }),
    },
    Parameter {
        name: "requireApiVersion",
        runtime: false,
        get: |_| Bson::Boolean(false),
        set: None,
    },
];

fn find(name: &str) -> Option<&'static Parameter> {
    PARAMETERS.iter().find(|p| p.name == name)
}

/// Fields of a `getParameter` / `setParameter` command that are not parameters.
fn is_envelope(field: &str) -> bool {
    field.starts_with('$')
        || matches!(
            field,
            "getParameter" | "setParameter" | "comment" | "lsid" | "txnNumber" | "apiVersion"
        )
}

/// `getParameter: 1 | "*" | {showDetails, allParameters}` with the parameters named as fields.
pub fn get(knobs: &Knobs<'_>, cmd: &Document) -> Result<Document> {
    let (all, details) = match cmd.get("getParameter") {
        Some(Bson::String(s)) if s == "*" => (true, false),
        Some(Bson::Document(d)) => (
            d.get_bool("allParameters").unwrap_or(false),
            d.get_bool("showDetails").unwrap_or(false),
        ),
        _ => (false, false),
    };
    let shown = |p: &Parameter| {
        let value = (p.get)(knobs);
        if details {
            Bson::Document(doc! {
                "value": value,
                "settableAtRuntime": p.runtime,
                "settableAtStartup": true,
            })
        } else {
            value
        }
    };
    let mut reply = Document::new();
    if all {
        for p in PARAMETERS {
            reply.insert(p.name, shown(p));
        }
    } else {
        for field in cmd.keys().filter(|f| !is_envelope(f)) {
            // Parameters mongod has that the router does not are left out, as mongos does.
            if let Some(p) = find(field) {
                reply.insert(p.name, shown(p));
            }
        }
        if reply.is_empty() {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "no option found to get",
            ));
        }
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// `setParameter: 1, <name>: <value>`.
pub fn set(knobs: &Knobs<'_>, cmd: &Document) -> Result<Document> {
    let mut fields = cmd.iter().filter(|(f, _)| !is_envelope(f));
    let Some((name, value)) = fields.next() else {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "no option found to set, use help:true to see options",
        ));
    };
    if fields.next().is_some() {
        return Err(MongoError::bad_value(
            "setParameter sets one parameter at a time",
        ));
    }
    let Some(p) = find(name) else {
        return Err(MongoError::bad_value(format!(
            "attempted to set unrecognized parameter [{name}], use help:true to see options"
        )));
    };
    let (true, Some(apply)) = (p.runtime, p.set) else {
        return Err(MongoError::bad_value(format!(
            "not allowed to change [{name}] at runtime"
        )));
    };
    let was = (p.get)(knobs);
    apply(knobs, value)?;
    Ok(doc! {"was": was, "ok": 1.0})
}
