//! What a run measured, as one serializable summary, and how it is shown. Pure: the workload
//! hands in counts, histograms and samples; nothing here touches the network or the clock.
//!
//! Invariants: rates are counts over the phase's own measured duration; latency percentiles
//! come from the HDR histogram of every event that carried a sequence number (microseconds);
//! server figures are `None` when no server process could be read, never estimated.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::procstat::Sample;

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Latency {
            samples: h.len(),
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        })
    }
}

/// One second of a run: what was acknowledged and delivered so far.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Tick {
    pub t_secs: f64,
    pub acked: u64,
    /// Events the slowest watcher has received.
    pub slowest_watcher: u64,
    /// `acked - slowest_watcher` (events not yet delivered to every watcher).
    pub lag: u64,
    pub server_rss_mb: Option<f64>,
}

/// The server's CPU and memory over a phase.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Server {
    pub cpu_secs: f64,
    /// Server CPU per acknowledged write, in microseconds.
    pub cpu_us_per_write: Option<f64>,
    /// Server CPU per delivered event (all watchers), in microseconds.
    pub cpu_us_per_event: Option<f64>,
    pub rss_start_mb: f64,
    pub rss_end_mb: f64,
    pub rss_max_mb: f64,
}

impl Server {
    pub fn between(start: Sample, end: Sample, rss_max: u64, writes: u64, events: u64) -> Server {
        let cpu = end.cpu.saturating_sub(start.cpu);
        let per = |n: u64| (n > 0).then(|| cpu.as_secs_f64() * 1e6 / n as f64);
        Server {
            cpu_secs: cpu.as_secs_f64(),
            cpu_us_per_write: per(writes),
            cpu_us_per_event: per(events),
            rss_start_mb: mb(start.rss),
            rss_end_mb: mb(end.rss),
            rss_max_mb: mb(rss_max.max(end.rss)),
        }
    }
}

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The whole result, as written to `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The command line that produced it.
    pub command: String,
    pub seconds: f64,
    pub writers: usize,
    pub watchers: usize,
    pub acked_writes: u64,
    pub writes_per_sec: f64,
    /// Events received, all watchers together.
    pub events: u64,
    pub events_per_sec: f64,
    /// Events the slowest watcher received ÷ acknowledged writes in its scope.
    pub delivered_ratio: Option<f64>,
    /// Acknowledgement → event at the driver (0 when the event beat the acknowledgement).
    pub ack_to_event: Option<Latency>,
    /// Send → event at the driver (the write's durable commit included).
    pub send_to_event: Option<Latency>,
    /// Drain mode: time from opening the watchers (before their `aggregate`) to the first event.
    pub time_to_first_event_ms: Option<f64>,
    /// `--resume`: a stream resumed after the first event written, from the `watch` call to
    /// its first event.
    pub resume_to_first_event_ms: Option<f64>,
    pub write_errors: u64,
    pub watcher_errors: Vec<String>,
    pub server: Option<Server>,
    pub ticks: Vec<Tick>,
}

impl Summary {
    /// The human-readable lines printed at the end of a run.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{} writers, {} watchers, {:.1}s: {} acknowledged writes ({:.0}/s), {} events ({:.0}/s){}",
            self.writers,
            self.watchers,
            self.seconds,
            self.acked_writes,
            self.writes_per_sec,
            self.events,
            self.events_per_sec,
            self.delivered_ratio
                .map(|r| format!(", slowest watcher got {:.4} of its writes", r))
                .unwrap_or_default()
        )];
        for (name, l) in [
            ("ack→event", &self.ack_to_event),
            ("send→event", &self.send_to_event),
        ] {
            if let Some(l) = l {
                out.push(format!(
                    "{name} latency (n={}): p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
                    l.samples, l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms
                ));
            }
        }
        if let Some(t) = self.time_to_first_event_ms {
            out.push(format!("time to first event: {t:.2} ms"));
        }
        if let Some(t) = self.resume_to_first_event_ms {
            out.push(format!(
                "resume after the first write's token → first event: {t:.2} ms"
            ));
        }
        if let Some(max) = self.ticks.iter().map(|t| t.lag).max() {
            let end = self.ticks.last().map(|t| t.lag).unwrap_or(0);
            out.push(format!("watcher lag: max {max} events, at the end {end}"));
        }
        if let Some(s) = &self.server {
            let per = |v: Option<f64>| v.map(|v| format!("{v:.1} µs")).unwrap_or("-".into());
            out.push(format!(
                "server: {:.2} CPU-s, {} per write, {} per event; RSS {:.0} → {:.0} MB (max {:.0})",
                s.cpu_secs,
                per(s.cpu_us_per_write),
                per(s.cpu_us_per_event),
                s.rss_start_mb,
                s.rss_end_mb,
                s.rss_max_mb
            ));
        }
        if self.write_errors > 0 || !self.watcher_errors.is_empty() {
            out.push(format!(
                "errors: {} writes failed; watchers: {:?}",
                self.write_errors, self.watcher_errors
            ));
        }
        out
    }
}

/// The columns of [`Summary::csv_row`].
pub const CSV_HEADER: &str = "command,seconds,writers,watchers,acked_writes,writes_per_sec,\
events,events_per_sec,delivered_ratio,ack_to_event_p50_ms,ack_to_event_p99_ms,\
ack_to_event_p999_ms,ack_to_event_max_ms,send_to_event_p50_ms,send_to_event_p99_ms,\
send_to_event_p999_ms,send_to_event_max_ms,time_to_first_event_ms,resume_to_first_event_ms,\
write_errors,watcher_errors,server_cpu_secs,server_cpu_us_per_write,server_cpu_us_per_event,\
server_rss_start_mb,server_rss_end_mb,server_rss_max_mb";

impl Summary {
    /// The summary as one CSV row under [`CSV_HEADER`] (RFC 4180: a field with a comma, quote
    /// or line break is quoted; a figure not measured is empty).
    pub fn csv_row(&self) -> String {
        let num = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        let latency = |l: &Option<Latency>| -> [String; 4] {
            [
                num(l.as_ref().map(|l| l.p50_ms)),
                num(l.as_ref().map(|l| l.p99_ms)),
                num(l.as_ref().map(|l| l.p999_ms)),
                num(l.as_ref().map(|l| l.max_ms)),
            ]
        };
        let server = self.server.as_ref();
        let mut fields = vec![
            csv_field(&self.command),
            self.seconds.to_string(),
            self.writers.to_string(),
            self.watchers.to_string(),
            self.acked_writes.to_string(),
            self.writes_per_sec.to_string(),
            self.events.to_string(),
            self.events_per_sec.to_string(),
            num(self.delivered_ratio),
        ];
        fields.extend(latency(&self.ack_to_event));
        fields.extend(latency(&self.send_to_event));
        fields.extend([
            num(self.time_to_first_event_ms),
            num(self.resume_to_first_event_ms),
            self.write_errors.to_string(),
            csv_field(&self.watcher_errors.join("; ")),
            num(server.map(|s| s.cpu_secs)),
            num(server.and_then(|s| s.cpu_us_per_write)),
            num(server.and_then(|s| s.cpu_us_per_event)),
            num(server.map(|s| s.rss_start_mb)),
            num(server.map(|s| s.rss_end_mb)),
            num(server.map(|s| s.rss_max_mb)),
        ]);
        fields.join(",")
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A progress bar for a run `done` (0 to 1) of the way through after `elapsed`, with the time
/// left at the pace so far: `[#######.............]  35%  ETA 13s`.
pub fn progress(done: f64, elapsed: Duration) -> String {
    const WIDTH: usize = 20;
    let done = if done.is_finite() {
        done.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let filled = (done * WIDTH as f64).round() as usize;
    let eta = if done > 0.0 {
        let left = elapsed.as_secs_f64() * (1.0 - done) / done;
        format!("ETA {}", short_duration(left))
    } else {
        "ETA -".to_string()
    };
    format!(
        "[{}{}] {:>3.0}%  {eta}",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        done * 100.0
    )
}

fn short_duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

/// Per-second rate between two counts.
pub fn rate(n: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_percentiles_are_in_milliseconds() {
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for us in 1..=1000 {
            h.record(us).expect("record");
        }
        let l = Latency::from_histogram(&h).expect("samples");
        assert_eq!(l.samples, 1000);
        assert!((l.p50_ms - 0.5).abs() < 0.01, "{l:?}");
        assert!((l.max_ms - 1.0).abs() < 0.01, "{l:?}");
        assert!(Latency::from_histogram(&Histogram::<u64>::new(3).expect("h")).is_none());
    }

    #[test]
    fn the_progress_bar_fills_and_counts_down() {
        assert_eq!(
            progress(0.0, Duration::from_secs(3)),
            "[....................]   0%  ETA -"
        );
        assert_eq!(
            progress(0.25, Duration::from_secs(10)),
            "[#####...............]  25%  ETA 30s"
        );
        assert_eq!(
            progress(0.5, Duration::from_secs(100)),
            "[##########..........]  50%  ETA 1m40s"
        );
        assert_eq!(
            progress(1.5, Duration::from_secs(1)),
            "[####################] 100%  ETA 0s"
        );
        assert!(progress(f64::NAN, Duration::ZERO).ends_with("ETA -"));
    }

    #[test]
    fn a_csv_row_has_a_field_per_column_and_quotes_what_needs_it() {
        let summary = Summary {
            command: "tributary-bench --match {\"a\": 1, \"b\": 2}".into(),
            seconds: 2.0,
            writers: 1,
            watchers: 1,
            acked_writes: 10,
            writes_per_sec: 5.0,
            events: 10,
            events_per_sec: 5.0,
            delivered_ratio: Some(1.0),
            ack_to_event: None,
            send_to_event: None,
            time_to_first_event_ms: None,
            resume_to_first_event_ms: None,
            write_errors: 0,
            watcher_errors: Vec::new(),
            server: None,
            ticks: Vec::new(),
        };
        let row = summary.csv_row();
        assert!(
            row.starts_with(
                "\"tributary-bench --match {\"\"a\"\": 1, \"\"b\"\": 2}\",2,1,1,10,5,10,5,1,"
            ),
            "{row}"
        );
        // Unquoted, the row has one comma fewer than the header's columns past the command.
        let after_command = row.rsplit_once("\",").map(|(_, rest)| rest).unwrap_or("");
        assert_eq!(
            after_command.split(',').count(),
            CSV_HEADER.split(',').count() - 1,
            "{row}"
        );
    }

    #[test]
    fn server_cost_is_cpu_over_the_phase_per_write() {
        let start = Sample {
            cpu: Duration::from_millis(500),
            rss: 100 << 20,
        };
        let end = Sample {
            cpu: Duration::from_millis(1500),
            rss: 120 << 20,
        };
        let s = Server::between(start, end, 130 << 20, 10_000, 0);
        assert_eq!(s.cpu_us_per_write, Some(100.0));
        assert_eq!(s.cpu_us_per_event, None);
        assert_eq!(
            (s.rss_start_mb, s.rss_end_mb, s.rss_max_mb),
            (100.0, 120.0, 130.0)
        );
    }
}
