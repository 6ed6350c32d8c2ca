#!/usr/bin/env python3
"""One large insert, for measuring what a command costs the server while it is parsed and
written (run the server under a heap profiler; see BENCHMARKS.md, "One insert's memory").

    python3 scripts/insert_heap.py mongodb://127.0.0.1:PORT array   # one 1.4M-element array
    python3 scripts/insert_heap.py mongodb://127.0.0.1:PORT bulk    # 100,000 small documents
"""
import sys
import time

import bson
import pymongo


def main():
    uri, mode = sys.argv[1], sys.argv[2]
    c = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30000).heap.c
    if mode == "array":
        docs = [{"_id": i, "k": i} for i in range(9)]
        docs += [{"_id": 100, "arr": [None] * 1_400_000},
                 {"_id": 101, "arr": [[] for _ in range(200_000)]}]
    else:
        docs = [{"_id": i, "k": i, "a": list(range(20)), "s": "x" * 40}
                for i in range(100_000)]
    c.insert_one({"_id": -1})
    size = len(bson.encode({"documents": docs}))
    started = time.time()
    c.insert_many(docs)
    print(f"{mode}: {len(docs)} documents, {size / 1e6:.1f} MB of BSON, "
          f"inserted in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
