#!/usr/bin/env python3
"""Failover times of a replicated shard, through a router, with pymongo.

Starts three `tributary shard --replSet` members and a `tributary router --shard rs0/...`
(the binary from $TRIBUTARY_BIN, default target/release/tributary), then, ROUNDS times:
a writer inserts as fast as acknowledgements come and a watcher reads the collection's
change stream; the primary gets `kill -9`; the round records the time from the kill to the
first acknowledged insert and to the first event of an insert made after the kill; the
killed member is started again and rejoins before the next round. Prints each round and
the p50, p99 and max of both.

    python3 bench/failover.py [ROUNDS]
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pymongo
from pymongo.errors import PyMongoError

from procs import free_port, percentile, wait_listening

BIN = os.environ.get("TRIBUTARY_BIN", "target/release/tributary")


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    data = tempfile.mkdtemp(prefix="failover-")
    ports = [free_port() for _ in range(3)]
    hosts = [f"127.0.0.1:{p}" for p in ports]
    peers = ",".join(hosts)

    def member(i):
        return subprocess.Popen(
            [BIN, "shard", "--port", str(ports[i]), "--dbpath", f"{data}/m{i}",
             "--replSet", "rs0", "--peers", peers],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    procs = [member(i) for i in range(3)]
    for p in ports:
        wait_listening(p)
    router_port = free_port()
    router = subprocess.Popen(
        [BIN, "router", "--port", str(router_port), "--shard", f"rs0/{peers}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(router_port)
    directs = [pymongo.MongoClient(h, directConnection=True, serverSelectionTimeoutMS=500)
               for h in hosts]

    def primary():
        while True:
            for i, c in enumerate(directs):
                try:
                    if c.admin.command("hello").get("isWritablePrimary"):
                        return i
                except PyMongoError:
                    pass
            time.sleep(0.05)

    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{router_port}/", retryWrites=True)
    coll = client.bench.failover
    coll.insert_one({"_id": "warm-up"})
    acks, events = [], []
    try:
        for r in range(rounds):
            old = primary()
            seen = {}
            stop = threading.Event()
            stream = coll.watch()

            def watch():
                while not stop.is_set():
                    change = stream.try_next()
                    if change is not None:
                        seen[change["documentKey"]["_id"]] = time.monotonic()

            watcher = threading.Thread(target=watch)
            watcher.start()
            for i in range(20):
                coll.insert_one({"_id": f"{r}-before-{i}"})
            killed = time.monotonic()
            procs[old].send_signal(signal.SIGKILL)
            procs[old].wait()
            first = None
            i = 0
            while first is None:
                try:
                    coll.insert_one({"_id": f"{r}-after-{i}"})
                    first = (f"{r}-after-{i}", time.monotonic())
                except PyMongoError:
                    i += 1
                    time.sleep(0.01)
            while first[0] not in seen:
                time.sleep(0.001)
            stop.set()
            watcher.join()
            stream.close()
            ack, event = first[1] - killed, seen[first[0]] - killed
            acks.append(ack)
            events.append(event)
            print(f"round {r}: member {old} killed; first ack {ack * 1000:.0f} ms, "
                  f"its event {event * 1000:.0f} ms", flush=True)
            procs[old] = member(old)
            wait_listening(ports[old])
            time.sleep(2)  # the member rejoins and catches up before the next kill
        for name, xs in (("kill -> first acknowledged write", acks),
                         ("kill -> its event at a watcher", events)):
            print(f"{name}: p50 {percentile(xs, 50) * 1000:.0f} ms, "
                  f"p99 {percentile(xs, 99) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms "
                  f"({len(xs)} rounds)")
    finally:
        router.kill()
        for p in procs:
            p.kill()
        subprocess.run(["rm", "-rf", data], check=False)


if __name__ == "__main__":
    main()
