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
