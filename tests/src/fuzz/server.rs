//! The I/O shell's server side: the `tributary` child process under test (its output captured
//! to a file and scanned for panics, its RSS sampled every 100 ms) and blocking connections to
//! it that send frames and read replies with a deadline.
//!
//! Invariants: the child lives in its own temporary directory and is killed when the
//! [`Server`] is dropped; the RSS sampler keeps the largest value seen since the server started,
//! so a spike between two iterations is not missed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

/// Lines in the server's output that mean something went wrong inside it.
const ALARMS: &[&str] = &[
    "panicked",
    "has overflowed its stack",
    "fatal runtime error",
    "memory allocation of",
    "SIGSEGV",
];

/// Backtrace frames from these crates locate a panic in Tributary's code.
const OUR_CRATES: &[&str] = &[
    " router::",
    " shard::",
    " pipeline::",
    " wire::",
    " resume::",
];

/// A running `tributary` (embedded router and shards) in a temporary directory.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub log_path: PathBuf,
    log_offset: u64,
    log_carry: String,
    max_rss_kb: Arc<AtomicU64>,
    stop_sampler: Arc<AtomicBool>,
    sampler: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Server {
    /// Starts `bin --port P --dbpath D --shards N` and waits until it accepts connections.
    pub fn start(bin: &Path, shards: usize) -> Result<Server> {
        let dir = tempfile::tempdir()?;
        let port = crate::free_port()?;
        let log_path = dir.path().join("tributary.log");
        let log = File::create(&log_path)?;
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--dbpath",
                &dir.path().join("data").display().to_string(),
                "--shards",
                &shards.to_string(),
            ])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let max_rss_kb = Arc::new(AtomicU64::new(0));
        let stop_sampler = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (max, stop, pid) = (max_rss_kb.clone(), stop_sampler.clone(), child.id());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(kb) = rss_kb(pid) {
                        max.fetch_max(kb, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log_path,
            log_offset: 0,
            log_carry: String::new(),
            max_rss_kb,
            stop_sampler,
            sampler: Some(sampler),
            _dir: dir,
        };
        let start = Instant::now();
        while TcpStream::connect(server.addr).is_err() {
            if let Some(status) = server.exited() {
                bail!(
                    "tributary exited at startup ({status}):\n{}",
                    server.log_tail(4000)
                );
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("tributary does not listen on {} after 60 s", server.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The largest RSS seen so far, in MB.
    pub fn max_rss_mb(&self) -> u64 {
        let now = rss_kb(self.child.id()).unwrap_or(0);
        self.max_rss_kb.fetch_max(now, Ordering::Relaxed).max(now) / 1024
    }

    /// Lines written since the last call that contain an alarm word (with the line after each,
    /// which names the panic's message in older formats).
    pub fn new_alarms(&mut self) -> Vec<String> {
        let Ok(mut f) = File::open(&self.log_path) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.log_offset)).is_err() {
            return Vec::new();
        }
        let mut buf = Vec::new();
        // At most 64 MB per scan; the rest waits for the next one.
        if f.take(64 << 20).read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        self.log_offset += buf.len() as u64;
        let text = std::mem::take(&mut self.log_carry) + &String::from_utf8_lossy(&buf);
        let (complete, rest) = match text.rfind('\n') {
            Some(i) => text.split_at(i + 1),
            None => ("", text.as_str()),
        };
        self.log_carry = rest.to_string();
        let lines: Vec<&str> = complete.lines().collect();
        let mut out = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            if ALARMS.iter().any(|a| line.contains(a)) {
                let mut s: String = line.chars().take(600).collect();
                if let Some(next) = lines.get(i + 1) {
                    s.push_str(" | ");
                    s.extend(next.chars().take(300));
                }
                // The first backtrace frame in Tributary's own crates, and where it is.
                let ours = lines.iter().skip(i + 1).take(200).position(|l| {
                    OUR_CRATES.iter().any(|c| l.contains(c)) && !l.trim_start().starts_with("at ")
                });
                if let Some(k) = ours {
                    let frame = lines[i + 1 + k].trim();
                    s.push_str(" | in ");
                    s.extend(frame.chars().take(200));
                    if let Some(at) = lines
                        .get(i + 2 + k)
                        .filter(|l| l.trim_start().starts_with("at "))
                    {
                        s.push(' ');
                        s.extend(at.trim().chars().take(200));
                    }
                }
                out.push(s);
            }
        }
        out
    }

    /// The last `n` bytes of the server's output.
    pub fn log_tail(&self, n: u64) -> String {
        let Ok(mut f) = File::open(&self.log_path) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(n)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stop_sampler.store(true, Ordering::Relaxed);
        if let Some(h) = self.sampler.take() {
            let _ = h.join();
        }
    }
}

/// `VmRSS` of `pid`, in kB.
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What came back for a request.
#[derive(Debug)]
pub enum Received {
    /// One whole reply frame.
    Frame(Vec<u8>),
    /// The server closed the connection (or reset it).
    Closed(String),
    /// Nothing (complete) within the deadline.
    Timeout,
}

/// A blocking connection to the server.
pub struct Conn {
    stream: TcpStream,
}

/// Replies larger than this are refused by the harness (the limit plus slack for a header).
const MAX_REPLY: usize = 64 << 20;

impl Conn {
    pub fn connect(addr: SocketAddr) -> Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn { stream })
    }

    /// Writes `bytes`, as separate writes at `splits`; `Err` when the server is gone.
    pub fn send(&mut self, bytes: &[u8], splits: &[usize]) -> std::io::Result<()> {
        let mut from = 0;
        for &at in splits.iter().chain(std::iter::once(&bytes.len())) {
            let at = at.clamp(from, bytes.len());
            self.stream.write_all(&bytes[from..at])?;
            self.stream.flush()?;
            from = at;
        }
        Ok(())
    }

    /// No more requests on this connection (the server sees end of input).
    pub fn finish_writing(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Reads one reply frame within `deadline`.
    pub fn receive(&mut self, deadline: Duration) -> Received {
        let until = Instant::now() + deadline;
        let mut header = [0u8; 4];
        if let Err(r) = self.read_exact_until(&mut header, until) {
            return r;
        }
        let len = i32::from_le_bytes(header);
        let Ok(len) = usize::try_from(len) else {
            return Received::Closed(format!("reply with messageLength {len}"));
        };
        if !(16..=MAX_REPLY).contains(&len) {
            return Received::Closed(format!("reply with messageLength {len}"));
        }
        let mut frame = vec![0u8; len];
        frame[..4].copy_from_slice(&header);
        if let Err(r) = self.read_exact_until(&mut frame[4..], until) {
            return r;
        }
        Received::Frame(frame)
    }

    fn read_exact_until(&mut self, buf: &mut [u8], until: Instant) -> Result<(), Received> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Received::Timeout);
            }
            let _ = self.stream.set_read_timeout(Some(left));
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(Received::Closed(format!(
                        "end of stream after {filled} of {} bytes",
                        buf.len()
                    )));
                }
                Ok(n) => filled += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Received::Timeout);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Received::Closed(e.to_string())),
            }
        }
        Ok(())
    }
}
