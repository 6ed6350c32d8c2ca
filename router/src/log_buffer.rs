//! The process's recent log lines, for `getLog`: a `tracing` layer that keeps the last
//! [`KEPT`] events as mongod's structured log lines (`{"t", "s", "c", "msg", "attr"}`, one JSON
//! document each).
//!
//! Invariants: bounded (the oldest line goes when a new one comes past [`KEPT`]); the count of
//! lines ever written only grows; recording never blocks on anything but its own short lock.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// How many lines `getLog` can show.
pub const KEPT: usize = 1024;

struct Buffer {
    lines: Mutex<VecDeque<String>>,
    written: AtomicU64,
}

fn buffer() -> &'static Buffer {
    static BUFFER: OnceLock<Buffer> = OnceLock::new();
    BUFFER.get_or_init(|| Buffer {
        lines: Mutex::new(VecDeque::with_capacity(KEPT)),
        written: AtomicU64::new(0),
    })
}

/// The kept lines, oldest first, and how many were ever written.
pub fn lines() -> (Vec<String>, u64) {
    let b = buffer();
    let lines = b
        .lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    (lines, b.written.load(Ordering::Relaxed))
}

/// The layer that records events into the buffer.
pub struct LogBuffer;

#[derive(Default)]
struct Fields {
    message: String,
    attr: serde_json::Map<String, serde_json::Value>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.attr.insert(field.name().to_string(), value.into());
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.attr.insert(field.name().to_string(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.attr.insert(field.name().to_string(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.attr.insert(field.name().to_string(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.attr.insert(field.name().to_string(), text.into());
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for LogBuffer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let severity = match *meta.level() {
            tracing::Level::ERROR => "E",
            tracing::Level::WARN => "W",
            tracing::Level::INFO => "I",
            _ => "D1",
        };
        let line = serde_json::json!({
            "t": {"$date": bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default()},
            "s": severity,
            "c": meta.target(),
            "msg": fields.message,
            "attr": fields.attr,
        })
        .to_string();
        let b = buffer();
        let mut lines = b.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == KEPT {
            lines.pop_front();
        }
        lines.push_back(line);
        b.written.fetch_add(1, Ordering::Relaxed);
    }
}
