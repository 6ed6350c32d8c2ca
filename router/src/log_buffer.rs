//! The process's recent log lines, for `getLog`: a `tracing` layer that keeps the last
//! [`KEPT`] events as mongod's structured log lines (`{"t", "s", "c", "msg", "attr"}`, one JSON
//! document each).
//!
//! Invariants: bounded in lines (the oldest line goes when a new one comes past [`KEPT`]) and
//! in bytes (a message or attribute is cut at [`MAX_FIELD`] as it is formatted, as mongod's
//! `maxLogSizeKB` cuts attributes: a slow 16 MiB command is never kept whole); the count of
//! lines ever written only grows; recording never blocks on anything but its own short lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// How many lines `getLog` can show.
pub const KEPT: usize = 1024;

/// The most bytes of one message or attribute a line keeps (mongod's `maxLogSizeKB`, 10).
pub const MAX_FIELD: usize = 10 * 1024;

/// `value` formatted and cut at [`MAX_FIELD`]; whether it was cut.
fn capped(value: impl std::fmt::Display) -> (String, bool) {
    wire::capped::format_capped(value, MAX_FIELD)
}

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
    /// The fields cut at [`MAX_FIELD`].
    truncated: Vec<String>,
}

impl Fields {
    fn text(&mut self, field: &Field, (text, cut): (String, bool)) {
        if cut {
            self.truncated.push(field.name().to_string());
        }
        if field.name() == "message" {
            self.message = text;
        } else {
            self.attr.insert(field.name().to_string(), text.into());
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, capped(value));
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
        self.text(field, capped(format_args!("{value:?}")));
    }
}

impl<S: tracing::Subscriber> Layer<S> for LogBuffer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if !fields.truncated.is_empty() {
            let cut = std::mem::take(&mut fields.truncated);
            fields.attr.insert("truncated".into(), cut.into());
        }
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

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn a_field_is_cut_at_its_limit_on_a_character_boundary() {
        let (short, cut) = capped("short");
        assert_eq!((short.as_str(), cut), ("short", false));
        // 'é' is two bytes: the cut must not split one.
        let long = format!("a{}", "é".repeat(MAX_FIELD));
        let (text, cut) = capped(&long);
        assert!(cut);
        assert_eq!(text.len(), MAX_FIELD - 1);
        assert!(long.starts_with(&text));
    }

    #[test]
    fn a_huge_slow_command_is_kept_cut_not_whole() {
        let subscriber = tracing_subscriber::registry().with(LogBuffer);
        let command = format!("{{insert: {}}}", "x".repeat(16 * 1024 * 1024));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(command = %command, ms = 250_u64, "a huge slow command, for the test");
        });
        let (lines, _) = lines();
        let line = lines
            .iter()
            .find(|l| l.contains("a huge slow command, for the test"))
            .expect("the line is kept");
        assert!(line.len() < 2 * MAX_FIELD, "{} bytes kept", line.len());
        let parsed: serde_json::Value = serde_json::from_str(line).expect("JSON");
        assert_eq!(parsed["attr"]["truncated"], serde_json::json!(["command"]));
        assert_eq!(parsed["attr"]["ms"], 250);
    }
}
