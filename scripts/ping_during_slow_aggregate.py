"""How long a fresh client's `ping` waits while a shard runs a long aggregate.

Start a shard (`tributary shard --port 29333 --dbpath DIR`), then
`python3 scripts/ping_during_slow_aggregate.py mongodb://127.0.0.1:29333/?directConnection=true`.
Prints the time of five pings from a new client, the first of which opens a new connection
while a `$expr` aggregate keeps one of the shard's workers busy (BENCHMARKS.md, issue 25).
"""

import sys
import threading
import time

from pymongo import MongoClient

uri = sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:29333/?directConnection=true"
client = MongoClient(uri)
client.ops.slow.drop()
client.ops.slow.insert_many([{"_id": i} for i in range(300)])


def slow():
    never = {"$gt": [{"$size": {"$range": [0, 200000]}}, 10**9]}
    try:
        client.ops.command(
            {"aggregate": "slow", "pipeline": [{"$match": {"$expr": never}}], "cursor": {}}
        )
    except Exception as e:  # the shard may be stopped first
        print("aggregate:", e)


threading.Thread(target=slow, daemon=True).start()
time.sleep(1)
fresh = MongoClient(uri, serverSelectionTimeoutMS=30000)
for _ in range(5):
    start = time.time()
    fresh.admin.command("ping")
    print(f"ping took {time.time() - start:.3f} s")
    time.sleep(0.5)
