"""Large reply batches of small documents: what the router holds to answer them.

Start Tributary (`tributary --port 29337 --dbpath DIR`, the embedded default), then
`python3 scripts/reply_batch_rss.py <server pid> [mongodb://127.0.0.1:29337] [clients]`.
Loads 400,000 documents of ~60 BSON bytes (24 MB) into a collection sharded on `_id`
(hashed, so the router merges the shards' cursors) unless they are there, then has `clients`
(default 20) connections each open a find with `batchSize` 1,000,000 and read its first
batch, then its getMores, all at once: each reply is up to 16 MiB of these documents. Prints
the server's RSS and peak RSS (VmHWM, reset before) around it (BENCHMARKS.md, issue 25).
"""

import sys
import threading
import time

from pymongo import MongoClient

from proc_memory import memory_text, reset_peak

pid = int(sys.argv[1])
uri = sys.argv[2] if len(sys.argv) > 2 else "mongodb://127.0.0.1:29337"
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 20
N = 400_000
client = MongoClient(uri)
coll = client.replies.tiny

if coll.estimated_document_count() != N:
    coll.drop()
    client.admin.command("enableSharding", "replies")
    client.admin.command("shardCollection", "replies.tiny", key={"_id": "hashed"})
    for start in range(0, N, 20_000):
        coll.insert_many({"_id": i, "a": i % 7, "b": "xy", "c": 1.5} for i in range(start, start + 20_000))
print(f"loaded {N} documents: {memory_text(pid)}", flush=True)

barrier = threading.Barrier(clients)
counts = []


def read_all():
    c = MongoClient(uri)
    barrier.wait()
    n = sum(1 for _ in c.replies.tiny.find({}, batch_size=1_000_000))
    counts.append(n)


reset_peak(pid)
before = memory_text(pid)
started = time.time()
threads = [threading.Thread(target=read_all) for _ in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert counts == [N] * clients, counts
print(
    f"{clients} clients each read {N} documents in batches of up to 16 MiB: before {before}; "
    f"{time.time() - started:.1f} s; after {memory_text(pid)}",
    flush=True,
)
