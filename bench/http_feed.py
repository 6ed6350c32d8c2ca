"""The HTTP change feed against a driver, the SSE latency, and what recording commit metadata
costs a write. Server on core 0, this client on core 1.

    cargo build --release --bin tributary
    python3 bench/http_feed.py --bin target/release/tributary [--events 100000] [--rounds 5]

Tests (each `--rounds` times, medians and the per-round ratios reported):
  drain     N events written first (inserts of ~100-byte documents in batches of 1,000), then
            drained from the same start point by pymongo's `watch()` (batches as it asks) and
            by `GET /v1/changes` pages of 10,000 parsed with `json.loads`: events/s each, and
            HTTP ÷ driver from the same round
  sse       a writer at ~500 inserts/s for 5 s, one `Accept: text/event-stream` reader: time
            from before the insert to the event's arrival, p50 / p99 / p99.9
  metadata  server CPU per inserted document (batches of 100, the writer connected with an
            appName and each insert with a comment, or none with --no-comment, so every entry
            records commitMetadata), with `recordCommitMetadata` on and off in alternating
            rounds: the cost ratio
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from procs import cpu_seconds, free_port, percentile, wait_listening  # noqa: E402

from pymongo import MongoClient  # noqa: E402

PAYLOAD = "x" * 100


def page(http_port, **q):
    qs = "&".join(f"{k}={v}" for k, v in q.items())
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/changes?{qs}", timeout=120) as r:
        return json.loads(r.read())


def drain(client, http_port, n, rounds, pid):
    coll = client.bench.drain
    ratios, driver_rates, http_rates = [], [], []
    for r in range(rounds):
        coll.drop()
        start = client.bench.command("changeStreamBounds", "drain")["current"]
        for i in range(0, n, 1000):
            coll.insert_many([{"_id": j, "p": PAYLOAD} for j in range(i, min(n, i + 1000))])
        # The driver: watch() from the same start, as pymongo batches it.
        cpu, t = cpu_seconds(pid), time.perf_counter()
        got = 0
        with coll.watch(resume_after=start, batch_size=10000) as stream:
            for _ in stream:
                got += 1
                if got == n:
                    break
        driver = n / (time.perf_counter() - t)
        driver_cpu = (cpu_seconds(pid) - cpu) / n * 1e6
        # HTTP: pages of 10,000 from the same start.
        cpu, t = cpu_seconds(pid), time.perf_counter()
        cursor, got, parse = start["_data"], 0, 0.0
        while got < n:
            qs = f"ns=bench.drain&limit=10000&from={cursor}"
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/changes?{qs}",
                                        timeout=120) as reply:
                body = reply.read()
            parsing = time.perf_counter()
            p = json.loads(body)
            parse += time.perf_counter() - parsing
            got += len(p["changes"])
            cursor = p["next"]
        over_http = n / (time.perf_counter() - t)
        http_cpu = (cpu_seconds(pid) - cpu) / n * 1e6
        driver_rates.append(driver)
        http_rates.append(over_http)
        ratios.append(over_http / driver)
        print(f"  drain round {r}: driver {driver:,.0f}/s ({driver_cpu:.1f} µs server CPU/event), "
              f"http {over_http:,.0f}/s ({http_cpu:.1f} µs server CPU/event, "
              f"{parse / n * 1e6:.1f} µs json.loads/event), ratio {over_http / driver:.2f}",
              flush=True)
    print(f"drain: driver {statistics.median(driver_rates):,.0f} events/s, http "
          f"{statistics.median(http_rates):,.0f} events/s, http/driver median "
          f"{statistics.median(ratios):.2f} (rounds {', '.join(f'{x:.2f}' for x in ratios)})")


def sse(client, http_port, seconds=5, rate=500):
    coll = client.bench.sse
    head = page(http_port, ns="bench.sse", **{"from": "head"})["next"]
    sent = {}
    latencies = []
    done = threading.Event()

    def reader():
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        conn.request("GET", f"/v1/changes?ns=bench.sse&from={head}&heartbeatMs=1000",
                     headers={"Accept": "text/event-stream"})
        r = conn.getresponse()
        while not done.is_set():
            line = r.fp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and b'"operationType"' in line:
                now = time.perf_counter()
                event = json.loads(line[6:])
                key = event["documentKey"]["_id"]
                if key in sent:
                    latencies.append(now - sent[key])
        conn.close()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    time.sleep(0.5)
    total = int(seconds * rate)
    began = time.perf_counter()
    for i in range(total):
        due = began + i / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent[i] = time.perf_counter()
        coll.insert_one({"_id": i, "p": PAYLOAD})
    time.sleep(1)
    done.set()
    ms = sorted(x * 1000 for x in latencies)
    print(f"sse: {len(ms)} of {total} events, commit->event p50 {percentile(ms, 50):.2f} ms, "
          f"p99 {percentile(ms, 99):.2f} ms, p99.9 {percentile(ms, 99.9):.2f} ms")


def metadata_cost(uri, pid, rounds, n, with_comment):
    writer = MongoClient(uri, appName="bench-writer")
    admin = MongoClient(uri).admin
    coll = writer.bench.meta
    costs = {True: [], False: []}
    for r in range(rounds * 2):
        on = r % 2 == 0
        admin.command("setParameter", 1, recordCommitMetadata=on)
        coll.drop()
        before = cpu_seconds(pid)
        for i in range(0, n, 100):
            docs = [{"_id": j, "p": PAYLOAD} for j in range(i, i + 100)]
            if with_comment:
                coll.insert_many(docs, comment={"job": "nightly-import", "batch": i})
            else:
                coll.insert_many(docs)
        per_doc = (cpu_seconds(pid) - before) / n * 1e6
        costs[on].append(per_doc)
        print(f"  metadata round {r // 2} {'on ' if on else 'off'}: {per_doc:.2f} µs CPU/doc",
              flush=True)
    admin.command("setParameter", 1, recordCommitMetadata=True)
    on, off = statistics.median(costs[True]), statistics.median(costs[False])
    pairs = [a / b for a, b in zip(costs[True], costs[False])]
    print(f"metadata: server CPU per document recorded {on:.2f} µs, not recorded {off:.2f} µs, "
          f"cost {100 * (on / off - 1):+.1f}% (pairs {', '.join(f'{x:.3f}' for x in pairs)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/tributary")
    ap.add_argument("--events", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tests", default="drain,sse,metadata")
    ap.add_argument("--meta-docs", type=int, default=200000,
                    help="documents inserted per metadata round")
    ap.add_argument("--no-comment", action="store_true",
                    help="metadata: inserts without a comment (the appName alone is recorded)")
    args = ap.parse_args()
    os.sched_setaffinity(0, {1})
    work = tempfile.mkdtemp(prefix="tributary-http-bench-")
    port, http_port = free_port(), free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "0", args.bin, "--port", str(port), "--httpPort", str(http_port),
         "--dbpath", os.path.join(work, "data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        wait_listening(http_port)
        uri = f"mongodb://127.0.0.1:{port}/"
        client = MongoClient(uri)
        tests = args.tests.split(",")
        if "drain" in tests:
            drain(client, http_port, args.events, args.rounds, server.pid)
        if "sse" in tests:
            sse(client, http_port)
        if "metadata" in tests:
            metadata_cost(uri, server.pid, args.rounds, args.meta_docs, not args.no_comment)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
