"""A Debezium-style connector against a live Tributary server: snapshot, then stream.

Usage: python3 tests/py/snapshot_connector.py mongodb://127.0.0.1:PORT/

What a CDC connector does on start, with the operators Debezium and monstache send:
1. open a change stream on the database and keep its post-batch resume token;
2. copy every collection (listCollections, collStats for the estimate) in `_id`-ranged
   chunks: `{$match: {_id: {$gt: last}}}`, `$sort`, `$limit`, and a `$replaceRoot` that adds
   `$bsonSize`, a `$concat` key and a `$regexMatch` flag, as Debezium's snapshot query does;
   one collection monstache-style with `find().sort().skip().limit()` pages;
3. meanwhile another client inserts, updates, replaces and deletes in every collection;
4. follow the stream from the token and apply each event to the copy.
The copy must then equal the source, document for document. The last line is
"N passed, N failed" and the exit status is non-zero if the check failed.
"""

import os
import random
import sys
import threading
import time
import uuid

import bson
from pymongo import MongoClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402

CHUNK = 97
WAIT_S = 30
URI = "mongodb://127.0.0.1:27017/"


def snapshot_chunks(coll, copy):
    """Debezium's snapshot: `_id`-ranged chunks through aggregate, with its operators."""
    last = None
    while True:
        match = {} if last is None else {"_id": {"$gt": last}}
        batch = list(
            coll.aggregate(
                [
                    {"$match": match},
                    {"$sort": {"_id": 1}},
                    {"$limit": CHUNK},
                    {
                        "$replaceRoot": {
                            "newRoot": {
                                "$mergeObjects": [
                                    "$$ROOT",
                                    {
                                        "_size": {"$bsonSize": "$$ROOT"},
                                        "_key": {"$concat": ["key-", {"$toString": "$_id"}]},
                                        "_odd": {
                                            "$regexMatch": {
                                                "input": {"$toString": "$_id"},
                                                "regex": "[13579]$",
                                            }
                                        },
                                    },
                                ]
                            }
                        }
                    },
                ]
            )
        )
        if not batch:
            return
        for d in batch:
            size, key, odd = d.pop("_size"), d.pop("_key"), d.pop("_odd")
            assert size == len(bson.encode(d)), (size, d)
            assert key == "key-%s" % d["_id"], key
            assert odd == (str(d["_id"])[-1] in "13579"), (odd, d["_id"])
            copy[d["_id"]] = d
        last = batch[-1]["_id"]


def snapshot_pages(coll, copy):
    """monstache's split: `find` pages by `$sort` / `$skip` / `$limit`."""
    skip = 0
    while True:
        page = list(coll.find({}).sort("_id", 1).skip(skip).limit(CHUNK))
        if not page:
            return
        for d in page:
            copy[d["_id"]] = d
        skip += len(page)


def writer(db, names, stop, errors):
    rng = random.Random(7)
    n = 10_000
    try:
        while not stop.is_set():
            coll = db[rng.choice(names)]
            op = rng.random()
            k = rng.randrange(0, 600)
            if op < 0.4:
                n += 1
                coll.insert_one({"_id": n, "v": n, "tag": "new"})
            elif op < 0.7:
                coll.update_one({"_id": k}, {"$inc": {"v": 1}, "$set": {"touched": True}})
            elif op < 0.8:
                coll.update_one({"_id": k}, {"$unset": {"tag": ""}})
            elif op < 0.9:
                coll.replace_one({"_id": k}, {"v": -k, "replaced": True})
            else:
                coll.delete_one({"_id": k})
    except Exception as e:  # noqa: BLE001 - reported by the check
        errors.append(e)


def apply(event, copies):
    kind = event["operationType"]
    coll = event.get("ns", {}).get("coll")
    if coll not in copies:
        return
    copy = copies[coll]
    key = event["documentKey"]["_id"] if "documentKey" in event else None
    if kind in ("insert", "replace"):
        copy[key] = event["fullDocument"]
    elif kind == "update":
        doc = copy.get(key)
        if doc is None:
            return
        desc = event["updateDescription"]
        for f, v in desc.get("updatedFields", {}).items():
            doc[f] = v
        for f in desc.get("removedFields", []):
            doc.pop(f, None)
    elif kind == "delete":
        copy.pop(key, None)


def check_snapshot_then_stream_matches_the_source(client):
    db = client["pysnap_" + uuid.uuid4().hex[:8]]
    names = ["orders", "customers", "events"]
    for name in names:
        db[name].insert_many([{"_id": i, "v": i, "tag": "seed"} for i in range(500)])
    client.admin.command("shardCollection", "%s.events" % db.name, key={"_id": "hashed"})
    db.orders.create_index("v")

    # 1. The stream first: its token marks where the snapshot's view begins.
    stream = db.watch(max_await_time_ms=200)
    token = stream.resume_token
    assert token is not None, "a new stream has a post-batch resume token"
    stream.close()

    # 3. Writes run all through the snapshot.
    other = MongoClient(URI)
    stop, errors = threading.Event(), []
    thread = threading.Thread(target=writer, args=(other[db.name], names, stop, errors))
    thread.start()

    # 2. The snapshot.
    copies = {}
    try:
        for info in db.list_collections():
            name = info["name"]
            stats = db.command("collStats", name)
            assert stats["count"] >= 0 and stats["size"] >= 0, stats
            copies[name] = {}
            if name == "customers":
                snapshot_pages(db[name], copies[name])
            else:
                snapshot_chunks(db[name], copies[name])
            time.sleep(0.2)
    finally:
        time.sleep(0.5)
        stop.set()
        thread.join()
        other.close()
    assert not errors, errors
    assert set(copies) == set(names), sorted(copies)

    # 4. Follow the stream from the token up to a marker written after the last write.
    marker = db.marker.insert_one({"done": True}).inserted_id
    applied = 0
    with db.watch(resume_after=token, max_await_time_ms=200) as s:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert time.monotonic() < deadline, "marker not reached after %d events" % applied
            ev = s.try_next()
            if ev is None:
                continue
            if ev["operationType"] == "insert" and ev["ns"]["coll"] == "marker":
                assert ev["documentKey"]["_id"] == marker
                break
            apply(ev, copies)
            applied += 1
    assert applied > 0, "the writer's changes reached the stream"

    for name in names:
        source = {d["_id"]: d for d in db[name].find({})}
        copy = copies[name]
        missing = sorted(set(source) - set(copy))[:5]
        extra = sorted(set(copy) - set(source))[:5]
        assert not missing and not extra, (name, "missing", missing, "extra", extra)
        for k, d in source.items():
            assert dict(copy[k]) == dict(d), (name, k, copy[k], d)
    print("      %d events applied over the snapshot" % applied)
    client.drop_database(db.name)


CHECKS = [check_snapshot_then_stream_matches_the_source]


def main(uri):
    global URI
    URI = uri
    return run_checks(uri, CHECKS, "snapshot connector")


if __name__ == "__main__":
    sys.exit(main(uri_from_argv()))
