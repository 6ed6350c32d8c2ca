"""A sort and a group of three times their memory limit, with allowDiskUse: the server's RSS.

Start Tributary (`tributary --port 29334 --dbpath DIR`, the embedded default), then
`python3 scripts/external_sort_rss.py <server pid> [mongodb://127.0.0.1:29334]`.
Loads 300 MiB (150,000 documents of 2 KiB) unless the collection already holds them, then
sorts it whole and groups it with `$push` of every document (both past the 100 MiB limit),
reading each result to the end. Prints the server's RSS and peak RSS (VmHWM, reset before each query) after the
load and around each query, the spilled runs from `serverStatus`, and the times (BENCHMARKS.md,
issue 25).
"""

import sys
import time

from pymongo import MongoClient

from proc_memory import memory_text, reset_peak, spill_text

pid = int(sys.argv[1])
uri = sys.argv[2] if len(sys.argv) > 2 else "mongodb://127.0.0.1:29334"
N = 150_000
client = MongoClient(uri)
coll = client.spill.big


def memory():
    return memory_text(pid)


def spills():
    return spill_text(client)


if coll.estimated_document_count() != N:
    coll.drop()
    pad = "p" * 2000
    for start in range(0, N, 5000):
        coll.insert_many(
            {"_id": i, "k": (i * 7919) % N, "g": i % 100, "pad": pad}
            for i in range(start, start + 5000)
        )
print(f"loaded {N} documents of 2 KiB: {memory()}")


for name, pipeline in [
    ("sort", [{"$sort": {"k": 1}}]),
    ("group", [{"$group": {"_id": "$g", "all": {"$push": "$pad"}}}, {"$project": {"n": {"$size": "$all"}}}]),
]:
    reset_peak(pid)
    before = memory()
    started = time.time()
    n = 0
    last = -1
    for doc in coll.aggregate(pipeline, allowDiskUse=True, batchSize=1000):
        n += 1
        if name == "sort":
            assert doc["k"] > last, "out of order"
            last = doc["k"]
    print(f"{name}: before it {before}; {n} results in {time.time() - started:.1f} s; after it {memory()}; {spills()}")
