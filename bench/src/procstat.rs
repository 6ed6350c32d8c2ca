//! A server process's CPU time and resident memory, from `/proc/<pid>/stat` and
//! `/proc/<pid>/status`. Parsing is pure; [`sample`] is the only read.
//!
//! Invariant: CPU time is user + system time of the whole process (all threads), in
//! microseconds; a process that cannot be read gives `None`, never a made-up figure.

use std::time::Duration;

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// User + system CPU time so far.
    pub cpu: Duration,
    /// Resident set size, in bytes.
    pub rss: u64,
}

/// User + system time in clock ticks from the text of `/proc/<pid>/stat`. The command name
/// (field 2) is in parentheses and may contain spaces, so fields are counted after its `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12 here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` in bytes from the text of `/proc/<pid>/status`.
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux when it cannot be asked).
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// Reads process `pid` now.
pub fn sample(pid: u32, ticks_per_second: u64) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ticks = parse_stat_ticks(&stat)?;
    Some(Sample {
        cpu: Duration::from_micros(ticks * 1_000_000 / ticks_per_second.max(1)),
        rss: parse_status_rss(&status)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (tributary (x) y) S 1 4242 4242 0 -1 4194560 2500 0 0 0 731 269 0 0 20 0 9 0 1234 1000000 300 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(731 + 269));
        assert_eq!(parse_stat_ticks("garbage"), None);
        assert_eq!(parse_stat_ticks("1 (a) S 1 2"), None);
    }

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\ttributary\nVmPeak:\t  900 kB\nVmRSS:\t   118000 kB\nThreads:\t9\n";
        assert_eq!(parse_status_rss(status), Some(118_000 * 1024));
        assert_eq!(parse_status_rss("Name: x\n"), None);
    }
}
