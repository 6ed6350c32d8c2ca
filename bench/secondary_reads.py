#!/usr/bin/env python3
"""Change streams and reads on a secondary, next to the primary's, with pymongo.

Starts three `tributary shard --replSet` members (the binary from $TRIBUTARY_BIN, default
target/release/tributary). A writer inserts N documents at RATE per second on the primary;
one watcher follows the collection on the primary and one on a secondary (a direct
connection with `readPreference=secondary`). Prints, for each, the time from the insert's
acknowledgement to its event (p50, p99, max); then, with nothing written, how far behind the
wall clock each stream's post-batch resume token stays (its seconds, sampled every 100 ms
for 10 s); then find() on the secondary right after a write in a causally consistent session
(it waits for the write: afterClusterTime) and without one.

    python3 bench/secondary_reads.py [N] [RATE]
"""

import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pymongo

from procs import free_port, percentile, wait_listening

BIN = os.environ.get("TRIBUTARY_BIN", "target/release/tributary")


def token_secs(token):
    """The seconds of a KeyString resume token's cluster time (type byte 130, then the time)."""
    data = bytes.fromhex(token["_data"])
    return struct.unpack(">I", data[1:5])[0]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
    data = tempfile.mkdtemp(prefix="secondary-")
    ports = [free_port() for _ in range(3)]
    hosts = [f"127.0.0.1:{p}" for p in ports]
    peers = ",".join(hosts)
    procs = [subprocess.Popen(
        [BIN, "shard", "--port", str(ports[i]), "--dbpath", f"{data}/m{i}",
         "--replSet", "rs0", "--peers", peers],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(3)]
    try:
        for p in ports:
            wait_listening(p)
        directs = [pymongo.MongoClient(h, directConnection=True) for h in hosts]
        while True:
            primaries = [i for i, c in enumerate(directs)
                         if c.admin.command("hello").get("isWritablePrimary")]
            secondaries = [i for i, c in enumerate(directs)
                           if c.admin.command("hello").get("secondary")]
            if primaries and secondaries:
                break
            time.sleep(0.1)
        p, s = primaries[0], secondaries[0]
        primary = directs[p].bench.c
        secondary_client = pymongo.MongoClient(
            hosts[s], directConnection=True, readPreference="secondary")
        secondary = secondary_client.bench.c
        primary.insert_one({"_id": "warm-up"})

        seen = {"primary": {}, "secondary": {}}
        pbrts = {"primary": [], "secondary": []}
        stop = threading.Event()

        def watch(name, coll):
            with coll.watch(max_await_time_ms=100) as stream:
                while not stop.is_set():
                    change = stream.try_next()
                    now = time.monotonic()
                    if change is not None:
                        seen[name][change["documentKey"]["_id"]] = now
                    elif stream.resume_token is not None:
                        pbrts[name].append((time.time(), token_secs(stream.resume_token)))

        watchers = [threading.Thread(target=watch, args=("primary", primary)),
                    threading.Thread(target=watch, args=("secondary", secondary))]
        for w in watchers:
            w.start()
        time.sleep(1)
        acked = {}
        for i in range(n):
            primary.insert_one({"_id": i})
            acked[i] = time.monotonic()
            time.sleep(max(0.0, 1.0 / rate))
        deadline = time.time() + 30
        while time.time() < deadline and any(len(seen[k]) < n for k in seen):
            time.sleep(0.01)
        for name in ("primary", "secondary"):
            lat = [(seen[name][i] - acked[i]) * 1000 for i in range(n) if i in seen[name]]
            print(f"{name}: {len(lat)}/{n} events; ack -> event p50 {percentile(lat, 50):.2f} ms, "
                  f"p99 {percentile(lat, 99):.2f} ms, max {max(lat):.2f} ms")
        for k in pbrts:
            pbrts[k].clear()
        time.sleep(10)
        stop.set()
        for w in watchers:
            w.join()
        for name in ("primary", "secondary"):
            lags = [wall - secs for wall, secs in pbrts[name]]
            if lags:
                print(f"{name} idle: {len(lags)} post-batch resume tokens, wall clock minus "
                      f"token seconds p50 {percentile(lags, 50):.2f} s, max {max(lags):.2f} s")

        misses = 0
        waits = []
        with secondary_client.start_session(causal_consistency=True) as session:
            writer = pymongo.MongoClient(hosts[p], directConnection=True)
            for i in range(100):
                doc_id = f"causal-{i}"
                writer.bench.c.insert_one({"_id": doc_id})
                session.advance_cluster_time(writer.admin.command("ping")["$clusterTime"])
                session.advance_operation_time(writer.admin.command("ping")["operationTime"])
                began = time.monotonic()
                found = secondary.find_one({"_id": doc_id}, session=session)
                waits.append((time.monotonic() - began) * 1000)
                misses += found is None
        plain_misses = 0
        for i in range(100):
            doc_id = f"plain-{i}"
            primary.insert_one({"_id": doc_id})
            plain_misses += secondary.find_one({"_id": doc_id}) is None
        print(f"find on the secondary after a write: causally consistent {misses}/100 missed, "
              f"wait p50 {percentile(waits, 50):.2f} ms, p99 {percentile(waits, 99):.2f} ms; "
              f"without a session {plain_misses}/100 missed")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
