"""Router-side joins and writes over three times the memory limit: the server's RSS.

Start Tributary (`tributary --port 29336 --dbpath DIR`, the embedded default), then
`python3 scripts/router_join_rss.py <server pid> [mongodb://127.0.0.1:29336] [query]`, where
`query` (`lookup`, `find`, `count`, `out`, `window`, `facet`) runs that one alone (restart the server between
them: memory freed by one query stays in the process's RSS and hides the next one's).
Loads 300 MiB (150,000 documents of 2 KiB) and a 100-document `groups` collection unless they
are there, then runs, reading each result to the end:
* a `$lookup` of every document's group with `allowDiskUse` (the router joins it a chunk at a
  time and spools what waits),
* a find sorted on an unindexed field with `allowDiskUse` (the shard's external sort),
* `count` and `distinct` over the whole collection,
* an `$out` copy of the collection without `allowDiskUse` (written a batch at a time),
* a `$setWindowFields` over the whole collection as one partition with `allowDiskUse` (its
  documents wait on disk while the functions compute),
* a `$facet` over the whole collection whose sub-pipeline joins `groups`, with `allowDiskUse`
  (its input waits on disk while each sub-pipeline reads all of it in turn).
Prints the server's RSS and peak RSS (VmHWM, reset before each) around each, the spill counters
and the times (BENCHMARKS.md, issue 25).
"""

import sys
import time

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from proc_memory import memory_text, reset_peak, spill_text

pid = int(sys.argv[1])
uri = sys.argv[2] if len(sys.argv) > 2 else "mongodb://127.0.0.1:29336"
N = 150_000
client = MongoClient(uri)
db = client.joins
coll = db.big


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
    db.groups.drop()
    db.groups.insert_many({"_id": g, "name": f"g{g}"} for g in range(100))
print(f"loaded {N} documents of 2 KiB: {memory()}", flush=True)


def measure(name, run):
    reset_peak(pid)
    before = f"{memory()} ({spills()})"
    started = time.time()
    try:
        n = run()
    except OperationFailure as e:
        n = f"error {e.code} ({e.details.get('codeName')})"
    print(f"{name}: before it {before}; {n} in {time.time() - started:.1f} s; after it {memory()}; {spills()}", flush=True)


def lookup():
    n = 0
    pipeline = [{"$lookup": {"from": "groups", "localField": "g", "foreignField": "_id", "as": "j"}}]
    for doc in coll.aggregate(pipeline, allowDiskUse=True, batchSize=1000):
        assert doc["j"][0]["_id"] == doc["g"]
        n += 1
    return n


def sorted_find():
    n, last = 0, -1
    for doc in coll.find({}, {"pad": 0}, sort=[("k", 1)], allow_disk_use=True, batch_size=1000):
        assert doc["k"] > last, "out of order"
        last = doc["k"]
        n += 1
    return n


def count_and_distinct():
    return (coll.count_documents({}), len(coll.distinct("g")))


def out():
    coll.aggregate([{"$out": "copy"}])
    return db.copy.estimated_document_count()


def window():
    n, run = 0, 0
    pipeline = [
        {"$setWindowFields": {"sortBy": {"k": 1}, "output": {
            "n": {"$documentNumber": {}},
            "run": {"$sum": "$g", "window": {"documents": ["unbounded", "current"]}},
        }}},
        {"$project": {"pad": 0}},
    ]
    for doc in coll.aggregate(pipeline, allowDiskUse=True, batchSize=1000):
        n += 1
        run += doc["g"]
        assert doc["n"] == n and doc["k"] == n - 1 and doc["run"] == run, doc
    return n


def facet():
    pipeline = [{"$facet": {
        "joined": [
            {"$lookup": {"from": "groups", "localField": "g", "foreignField": "_id", "as": "j"}},
            {"$match": {"j._id": 3}},
            {"$count": "n"},
        ],
        "count": [{"$count": "n"}],
    }}]
    [result] = list(coll.aggregate(pipeline, allowDiskUse=True))
    assert result == {"joined": [{"n": N // 100}], "count": [{"n": N}]}, result
    return result


only = sys.argv[3] if len(sys.argv) > 3 else None
for key, name, run in [
    ("lookup", "$lookup", lookup),
    ("find", "sorted find", sorted_find),
    ("count", "count, distinct", count_and_distinct),
    ("out", "$out", out),
    ("window", "$setWindowFields", window),
    ("facet", "$facet joining", facet),
]:
    if only in (None, key):
        measure(name, run)
