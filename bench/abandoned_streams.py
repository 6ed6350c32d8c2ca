#!/usr/bin/env python3
"""What change streams nobody reads hold on the router, with and without a limit.

    python3 bench/abandoned_streams.py [STREAMS [DOCS [LIMIT_MB]]]

Starts the embedded cluster (2 shards) from $TRIBUTARY_BIN (default target/release/tributary)
twice: once with `changeStreamHeldReplyBytesLimit` at LIMIT_MB (default 64) and once with no
effective limit (what the router did before streams were parked). Each time it opens STREAMS
(default 400) change streams with a start time of their own (a merge each), reads none of
them, inserts DOCS (default 20,000) documents of about 1 KB, and prints the router's
`heldReplyBytes`, parked streams and RSS every 5 s for 30 s. Then it reads one stream to the
end and checks it got every document once, in order.
"""

import os
import subprocess
import sys
import tempfile
import time

import pymongo

from procs import free_port, wait_listening

BIN = os.environ.get("TRIBUTARY_BIN", "target/release/tributary")


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def run(streams, docs, limit):
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            [BIN, "--port", str(port), "--dbpath", data, "--shards", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_listening(port)
            client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
            admin, db = client.admin, client.bench
            admin.command("setParameter", 1, changeStreamHeldReplyBytesLimit=limit)
            db.create_collection("c")
            at = db.command("ping")["operationTime"]
            ids = []
            for _ in range(streams):
                r = db.command(
                    "aggregate",
                    "c",
                    pipeline=[{"$changeStream": {"startAtOperationTime": at}}],
                    cursor={},
                )
                ids.append(r["cursor"]["id"])
            pad = "x" * 1000
            for start in range(0, docs, 500):
                db.c.insert_many([{"_id": i, "pad": pad} for i in range(start, min(docs, start + 500))])
            label = "no limit" if limit >= 1 << 50 else f"limit {limit >> 20} MiB"
            for t in range(0, 31, 5):
                cs = admin.command("serverStatus")["metrics"]["changeStreams"]
                print(
                    f"{label}, {streams} streams, t={t:2}s: held {cs['heldReplyBytes'] >> 20} MiB, "
                    f"parked {cs.get('parked', 0)}, router RSS {rss_mb(server.pid)} MB",
                    flush=True,
                )
                time.sleep(5)
            got = []
            while len(got) < docs:
                r = db.command("getMore", ids[0], collection="c", batchSize=1000, maxTimeMS=1000)
                got += [e["documentKey"]["_id"] for e in r["cursor"]["nextBatch"]]
            assert got == list(range(docs)), "the stream read after parking lost or repeated events"
            print(f"{label}: the first stream read {len(got)} events, every one once, in order")
        finally:
            server.kill()
            server.wait()


def main():
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    docs = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    limit = (int(sys.argv[3]) if len(sys.argv) > 3 else 64) << 20
    run(streams, docs, limit)
    run(streams, docs, 1 << 60)


if __name__ == "__main__":
    main()
