//! Hosts of their own for fault tests: each host is a network namespace with one address on a
//! bridge the test makes, and the test process (the hosts' clients) is on the bridge too. Links
//! are cut with nftables, both ways or one way, and a cut drops packets silently, as a lost link
//! does: no reset, no refusal, so a connection opened before it stalls.
//!
//! Invariants: a network's names are its own (bridge `tbN`, namespaces `tbN-i`, subnet
//! `10.123.N.0/24`, the clients at `.1`), and it removes everything it made when dropped; every
//! rule lives in a host's namespace (`inet cut` table), so healing is flushing them.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

/// One end of a link: a host, or the test process (the clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Host(usize),
    Clients,
}

/// A host: its namespace and its address.
#[derive(Debug, Clone)]
pub struct Host {
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// Hosts on a bridge (see the module header).
pub struct Network {
    id: u8,
    hosts: Vec<Host>,
}

fn run(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {args:?}"))?;
    ensure!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// `nft -f -` in namespace `ns`, with `script` on its standard input.
fn nft(ns: &str, script: &str) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    child
        .stdin
        .take()
        .context("nft's input")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "nft in {ns}: {}: {script}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Network {
    /// Whether this machine lets a test make networks: root, with `ip` and `nft`.
    pub fn available() -> bool {
        let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
        });
        let has = |tool: &str| {
            Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        root && has("ip") && has("nft")
    }

    /// `n` hosts on a new bridge, every link up.
    pub fn create(n: usize) -> Result<Network> {
        ensure!(n < 250, "at most 249 hosts");
        // A free id: the bridge's creation claims it (another test process may hold others).
        let start = (std::process::id() % 250) as u8;
        let id = (0..250u8)
            .map(|k| start.wrapping_add(k) % 250 + 1)
            .find(|id| run(&["ip", "link", "add", &format!("tb{id}"), "type", "bridge"]).is_ok())
            .context("no free bridge name")?;
        let mut net = Network {
            id,
            hosts: Vec::new(),
        };
        let bridge = net.bridge();
        run(&[
            "ip",
            "addr",
            "add",
            &format!("10.123.{id}.1/24"),
            "dev",
            &bridge,
        ])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..n {
            let ns = format!("tb{id}-{i}");
            let ip = Ipv4Addr::new(10, 123, id, u8::try_from(i + 2)?);
            let (outer, inner) = (format!("tb{id}h{i}"), format!("tb{id}n{i}"));
            run(&["ip", "netns", "add", &ns])?;
            net.hosts.push(Host { ns: ns.clone(), ip });
            run(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            run(&["ip", "link", "set", &inner, "netns", &ns])?;
            run(&["ip", "link", "set", &outer, "master", &bridge])?;
            run(&["ip", "link", "set", &outer, "up"])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                &inner,
            ])?;
            run(&["ip", "-n", &ns, "link", "set", &inner, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            nft(
                &ns,
                "table inet cut {\n\
                 chain input { type filter hook input priority 0; policy accept; }\n\
                 chain output { type filter hook output priority 0; policy accept; }\n\
                 }\n",
            )?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("tb{}", self.id)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// The test process's address on the bridge.
    pub fn clients_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 123, self.id, 1)
    }

    fn ip(&self, end: End) -> Ipv4Addr {
        match end {
            End::Host(i) => self.hosts[i].ip,
            End::Clients => self.clients_ip(),
        }
    }

    /// Drops every packet `from` sends to `to`, silently; what `to` sends to `from` still
    /// arrives (a one-way cut).
    pub fn cut_one_way(&self, from: End, to: End) -> Result<()> {
        if let End::Host(i) = from {
            let rule = format!("add rule inet cut output ip daddr {} drop\n", self.ip(to));
            nft(&self.hosts[i].ns, &rule)?;
        }
        if let End::Host(i) = to {
            let rule = format!("add rule inet cut input ip saddr {} drop\n", self.ip(from));
            nft(&self.hosts[i].ns, &rule)?;
        }
        Ok(())
    }

    /// Cuts `a` and `b` apart, both ways.
    pub fn cut(&self, a: End, b: End) -> Result<()> {
        self.cut_one_way(a, b)?;
        self.cut_one_way(b, a)
    }

    /// Cuts every end in `side` from every end not in it (the hosts, and the clients unless
    /// `side` holds them), both ways: a partition.
    pub fn partition(&self, side: &[End]) -> Result<()> {
        let everyone = (0..self.hosts.len()).map(End::Host).chain([End::Clients]);
        for other in everyone.filter(|e| !side.contains(e)) {
            for &end in side {
                self.cut(end, other)?;
            }
        }
        Ok(())
    }

    /// Every link whole again.
    pub fn heal(&self) -> Result<()> {
        for host in &self.hosts {
            nft(
                &host.ns,
                "flush chain inet cut input\nflush chain inet cut output\n",
            )?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = run(&["ip", "netns", "del", &host.ns]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge()]);
    }
}
