#!/usr/bin/env python3
"""Where a replicated shard's CPU goes, process by process: what separate hosts would give.

Starts, one after the other, (a) one `tributary shard` and (b) a 3-member set of `tributary
shard --replSet` processes, each behind its own `tributary router`, and drives each with
`tributary-bench --uri` (16 writers, 1 watcher, SECONDS s). Prints the acknowledged writes/s
and each process's CPU per acknowledged write (user + system, from /proc), the set's members
by role. On this machine the processes share two cores; on hosts of their own each member
would have the cores to itself, so the leader's CPU per write against the single copy's
bounds the ratio a CPU-bound set could reach there.

    python3 bench/member_cpu.py [SECONDS] [ROUNDS]

Binaries from $TRIBUTARY_BIN and $TRIBUTARY_BENCH (default target/release/...).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import pymongo

from procs import free_port, wait_listening

BIN = os.environ.get("TRIBUTARY_BIN", "target/release/tributary")
BENCH = os.environ.get("TRIBUTARY_BENCH", "target/release/tributary-bench")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(args, port):
    proc = subprocess.Popen([BIN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port)
    return proc


def run(data, members, seconds):
    """One topology: `members` shard processes (a set when above 1) and a router; returns the
    writes/s and {process name: CPU µs per write}."""
    ports = [free_port() for _ in range(members)]
    hosts = [f"127.0.0.1:{p}" for p in ports]
    procs = {}
    try:
        for i, port in enumerate(ports):
            args = ["shard", "--port", str(port), "--dbpath", f"{data}/m{i}"]
            if members > 1:
                args += ["--replSet", "rs0", "--peers", ",".join(hosts)]
            procs[f"member {i}"] = start(args, port)
        shard = f"rs0/{','.join(hosts)}" if members > 1 else hosts[0]
        router_port = free_port()
        procs["router"] = start(["router", "--port", str(router_port), "--shard", shard],
                                router_port)
        roles = {}
        if members > 1:
            while not roles:
                for i, h in enumerate(hosts):
                    hello = pymongo.MongoClient(h, directConnection=True).admin.command("hello")
                    if hello.get("isWritablePrimary"):
                        roles = {f"member {j}": ("primary" if j == i else "secondary")
                                 for j in range(members)}
                time.sleep(0.1)
        before = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        out = f"{data}/bench.json"
        subprocess.run([BENCH, "--uri", f"mongodb://127.0.0.1:{router_port}/",
                        "--writers", "16", "--watchers", "1", "--seconds", str(seconds),
                        "--json", out], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        after = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        with open(out) as f:
            summary = json.load(f)
        writes = summary["acked_writes"]
        cpu = {f"{name} ({roles.get(name, 'only copy')})" if name != "router" else name:
               (after[name] - before[name]) / writes * 1e6 for name in procs}
        return summary["writes_per_sec"], cpu
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def main():
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for r in range(rounds):
        for members in (1, 3):
            with tempfile.TemporaryDirectory(prefix="member-cpu-") as data:
                rate, cpu = run(data, members, seconds)
            parts = ", ".join(f"{name} {us:.0f}" for name, us in sorted(cpu.items()))
            print(f"round {r + 1}, {members} member(s): {rate:,.0f} writes/s; "
                  f"CPU µs per write: {parts}", flush=True)


if __name__ == "__main__":
    main()
