"""Subscriptions side by side with NATS JetStream pull consumers and Redis Streams consumer
groups, one harness, servers on core 0 and this client on core 1.

    cargo build --release --bin tributary
    apt-get install nats-server redis-server && pip install nats-py redis pymongo
    python3 bench/subscriptions.py --bin target/release/tributary [--messages 20000] [--rounds 3]

Tests, each run `--rounds` times with the systems rotated (medians reported):
  one      one consumer drains N queued messages: read up to 100, ack the batch (Tributary and
           JetStream with one cumulative ack through the batch's last message, Redis with
           XACK of every id; --ack-ids: Tributary names every delivery too; --cheap-acks: each
           system's ack without a round trip of its own: Tributary's carried by the next read
           (`ackThrough`), JetStream's published without waiting for its confirmation)
  fanout   10 consumers each drain the same N messages (one thread each)
  latency  a writer at ~1,000 messages/s for 5 s, one long-polling consumer: time from before
           the write to the delivery, p50 / p99 / p99.9
Server CPU is read from /proc/<pid>/stat before and after each test.

Durability as run: Tributary fsyncs each commit, a consumer's position within a second (an ack
with `waitDurable` at once); JetStream (file
storage) as its version defaults (2.9 syncs every 2 minutes); Redis with AOF `everysec`.
"""

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from procs import cpu_seconds, free_port, percentile, wait_listening  # noqa: E402

PAYLOAD = "x" * 100


def start(cmd, port):
    proc = subprocess.Popen(["taskset", "-c", "0", *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_listening(port)
    return proc


class Server:
    """A server process on core 0 with a data directory of its own, stopped and removed on exit."""

    def launch(self, cmd_for):
        self.dir = tempfile.mkdtemp()
        self.port = free_port()
        self.proc = start(cmd_for(self.dir, self.port), self.port)
        self.n = 0

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- Tributary -------------------------------------------------------------------------------

# Tributary's consumers ack a batch by naming every delivery (`deliveryIds`) rather than with
# one cumulative `through` (--ack-ids).
ACK_BY_IDS = False

# Acks without a round trip of their own (--cheap-acks): Tributary's next read carries the
# batch's ack, JetStream's ack is not confirmed.
CHEAP_ACKS = False


class Tributary(Server):
    name = "tributary"

    def __init__(self, binary):
        self.binary = binary

    def __enter__(self):
        from pymongo import MongoClient
        self.launch(lambda d, p: [self.binary, "--port", str(p), "--dbpath", d])
        self.client = MongoClient(f"mongodb://127.0.0.1:{self.port}/")
        self.db = self.client.bench
        return self

    def __exit__(self, *exc):
        self.client.close()
        super().__exit__(*exc)

    def setup(self, consumers):
        self.n += 1
        self.sub = f"s{self.n}"
        self.coll = f"c{self.n}"
        self.db.command("createSubscription", self.sub, collection=self.coll, maxInFlight=10_000)
        for c in consumers:
            self.db.command("readSubscription", self.sub, consumer=c, max=1)

    def publish(self, docs):
        self.db[self.coll].insert_many(docs, ordered=False)

    def drain(self, consumer, n, on_message=None):
        from pymongo import MongoClient
        db = MongoClient(f"mongodb://127.0.0.1:{self.port}/").bench
        got = 0
        carried = {}
        while got < n:
            r = db.command("readSubscription", self.sub, consumer=consumer, max=100, waitMS=1000,
                           **carried)
            carried = {}
            msgs = r["messages"]
            if on_message:
                for m in msgs:
                    on_message(m["event"]["fullDocument"])
            if msgs and CHEAP_ACKS and got + len(msgs) < n:
                carried = {"ackThrough": msgs[-1]["deliveryId"]}
            elif msgs and ACK_BY_IDS:
                db.command("ackSubscription", self.sub, consumer=consumer,
                           deliveryIds=[m["deliveryId"] for m in msgs])
            elif msgs:
                # Cumulative, as JetStream's AckAll below.
                db.command("ackSubscription", self.sub, consumer=consumer,
                           through=msgs[-1]["deliveryId"])
            got += len(msgs)
        db.client.close()


# --- NATS JetStream --------------------------------------------------------------------------

class JetStream(Server):
    name = "jetstream"

    def __enter__(self):
        self.launch(lambda d, p: ["nats-server", "-js", "-sd", d, "-p", str(p)])
        return self

    async def _nc(self):
        import nats
        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        return nc, nc.jetstream()

    def setup(self, consumers):
        from nats.js.api import AckPolicy, ConsumerConfig
        self.n += 1
        self.stream = f"S{self.n}"

        async def go():
            nc, js = await self._nc()
            await js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"])
            for c in consumers:
                await js.add_consumer(self.stream, ConsumerConfig(
                    durable_name=c, ack_policy=AckPolicy.ALL, max_ack_pending=10_000))
            await nc.close()
        asyncio.run(go())

    def publish(self, docs):
        import json

        async def go():
            nc, js = await self._nc()
            acks = [js.publish(f"{self.stream}.c", json.dumps(d).encode()) for d in docs]
            for i in range(0, len(acks), 500):
                await asyncio.gather(*acks[i:i + 500])
            await nc.close()
        asyncio.run(go())

    def drain(self, consumer, n, on_message=None):
        import json

        async def go():
            nc, js = await self._nc()
            sub = await js.pull_subscribe_bind(consumer, self.stream)
            got = 0
            while got < n:
                try:
                    msgs = await sub.fetch(100, timeout=1)
                except asyncio.TimeoutError:
                    continue
                if on_message:
                    for m in msgs:
                        on_message(json.loads(m.data))
                if CHEAP_ACKS:
                    await msgs[-1].ack()  # AckAll: the batch, unconfirmed
                else:
                    await msgs[-1].ack_sync()  # AckAll: the batch
                got += len(msgs)
            await nc.close()
        asyncio.run(go())


# --- Redis Streams ---------------------------------------------------------------------------

class Redis(Server):
    name = "redis"

    def __enter__(self):
        import redis
        self.launch(lambda d, p: ["redis-server", "--port", str(p), "--dir", d, "--appendonly",
                                  "yes", "--appendfsync", "everysec", "--save", ""])
        self.r = redis.Redis(port=self.port)
        return self

    def setup(self, consumers):
        self.n += 1
        self.stream = f"s{self.n}"
        for c in consumers:
            self.r.xgroup_create(self.stream, c, id="0", mkstream=True)

    def publish(self, docs):
        import json
        for i in range(0, len(docs), 500):
            p = self.r.pipeline(transaction=False)
            for d in docs[i:i + 500]:
                p.xadd(self.stream, {"d": json.dumps(d)})
            p.execute()

    def drain(self, consumer, n, on_message=None):
        import json
        import redis
        r = redis.Redis(port=self.port)
        got = 0
        while got < n:
            res = r.xreadgroup(consumer, "c", {self.stream: ">"}, count=100, block=1000)
            if not res:
                continue
            entries = res[0][1]
            if on_message:
                for _, fields in entries:
                    on_message(json.loads(fields[b"d"]))
            r.xack(self.stream, consumer, *[e[0] for e in entries])
            got += len(entries)
        r.close()


# --- the tests -------------------------------------------------------------------------------

def docs(n, start=0):
    return [{"_id": start + i, "p": PAYLOAD} for i in range(n)]


def test_drain(system, n, consumers):
    system.setup(consumers)
    system.publish(docs(n))
    cpu0, t0 = cpu_seconds(system.proc.pid), time.time()
    threads = [threading.Thread(target=system.drain, args=(c, n)) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.time() - t0, cpu_seconds(system.proc.pid) - cpu0
    total = n * len(consumers)
    return {"acked_per_s": total / elapsed, "cpu_us_per_ack": cpu / total * 1e6}


def test_latency(system, seconds=5, rate=1000):
    system.setup(["lat"])
    n = seconds * rate
    latencies = []
    done = threading.Event()

    def on_message(doc):
        latencies.append(time.time() - doc["t"])

    reader = threading.Thread(target=lambda: (system.drain("lat", n, on_message), done.set()))
    reader.start()
    start_t = time.time()
    for i in range(n):
        due = start_t + i / rate
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        system.publish([{"_id": 10_000_000 + i, "t": time.time(), "p": PAYLOAD}])
    reader.join(timeout=60)
    ms = [x * 1000 for x in latencies]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "p999_ms": percentile(ms, 99.9)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/tributary")
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default="tributary,jetstream,redis")
    ap.add_argument("--tests", default="one,fanout,latency")
    ap.add_argument("--ack-ids", action="store_true",
                    help="Tributary acks each delivery by id rather than through the last")
    ap.add_argument("--cheap-acks", action="store_true",
                    help="acks without a round trip of their own (Tributary: carried by the "
                         "next read; JetStream: unconfirmed)")
    ap.add_argument("--fanout-cpu", action="store_true",
                    help="only: server CPU per written document, 100 consumers vs 1")
    args = ap.parse_args()
    global ACK_BY_IDS, CHEAP_ACKS
    ACK_BY_IDS = args.ack_ids
    CHEAP_ACKS = args.cheap_acks
    if args.fanout_cpu:
        os.sched_setaffinity(0, {1})
        for r in range(args.rounds):
            one = fanout_cpu(args.bin, 1)
            hundred = fanout_cpu(args.bin, 100)
            print(f"round {r}: server CPU per written doc: 1 consumer {one:.1f} us, "
                  f"100 consumers {hundred:.1f} us, ratio {hundred / one:.2f}", flush=True)
        return
    os.sched_setaffinity(0, {1})
    makers = {"tributary": lambda: Tributary(args.bin), "jetstream": JetStream, "redis": Redis}
    systems = args.systems.split(",")
    results = {}
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for name in order:
            with makers[name]() as system:
                for test in args.tests.split(","):
                    if test == "one":
                        res = test_drain(system, args.messages, ["c0"])
                    elif test == "fanout":
                        res = test_drain(system, args.messages // 4,
                                         [f"c{i}" for i in range(10)])
                    else:
                        res = test_latency(system)
                    print(f"round {r} {name:9} {test:7} " +
                          " ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
                    for k, v in res.items():
                        results.setdefault((test, name, k), []).append(v)
    print("\nmedians:")
    for (test, name, k), vs in sorted(results.items()):
        print(f"  {test:7} {name:9} {k:15} {statistics.median(vs):12.3f}")



def fanout_cpu(binary, consumers, n=5000):
    """Server CPU per written document while `consumers` consumers of one subscription read and
    ack everything a writer inserts (acks in batches of up to 100)."""
    with Tributary(binary) as t:
        names = [f"c{i}" for i in range(consumers)]
        t.setup(names)
        cpu0 = cpu_seconds(t.proc.pid)
        threads = [threading.Thread(target=t.drain, args=(c, n)) for c in names]
        for th in threads:
            th.start()
        for i in range(0, n, 100):
            t.publish(docs(100, i))
        for th in threads:
            th.join()
        return (cpu_seconds(t.proc.pid) - cpu0) / n * 1e6


if __name__ == "__main__":
    main()
