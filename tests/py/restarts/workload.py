"""The shard-restart workload through pymongo (see tests/src/restarts.rs, which runs it while it
kills and restarts the cluster's shards, and checks the report).

Usage: python3 tests/py/restarts/workload.py mongodb://127.0.0.1:PORT/ SECONDS WRITERS

Writers insert {_id: "w<w>-<i>", w, i} into `hashed` (sharded) or `plain`, and update every
third document; a reader counts and finds; a database watcher and an updateLookup watcher on
`hashed` read with pymongo's own automatic resume. After SECONDS the writers stop, {_id: "end"}
goes into both collections, and the watchers read up to it. Prints one JSON report on stdout:
{"acked": [...], "db_events": [...], "lookup_events": [...], "reads": N, "errors": [...]}.
Every exception any thread saw is in "errors": none may reach an application.
"""

import json
import sys
import threading
import time

from pymongo import MongoClient

DB = "restarts"
END = "end"


def main():
    uri, seconds, writers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    client = MongoClient(uri)
    db = client[DB]
    report = {"acked": [], "db_events": [], "lookup_events": [], "reads": 0, "errors": []}
    lock = threading.Lock()
    stop = threading.Event()

    def error(where, e):
        with lock:
            report["errors"].append("%s: %r" % (where, e))

    # The watchers open before the first write.
    db_stream = db.watch()
    lookup_stream = db.hashed.watch(full_document="updateLookup")

    def watch(stream, key, ends):
        seen_ends = 0
        try:
            while seen_ends < ends:
                ev = stream.next()
                doc_id = ev["documentKey"]["_id"]
                if doc_id == END:
                    seen_ends += 1
                    continue
                report[key].append({
                    "op": ev["operationType"],
                    "coll": ev["ns"]["coll"],
                    "id": doc_id,
                    "token": ev["_id"]["_data"],
                    "full_document": isinstance(ev.get("fullDocument"), dict),
                })
        except Exception as e:  # noqa: BLE001 - every error is reported
            error("watcher " + key, e)

    def write(w):
        i = 0
        while not stop.is_set():
            coll = "hashed" if i % 2 == 0 else "plain"
            doc_id = "w%d-%d" % (w, i)
            try:
                db[coll].insert_one({"_id": doc_id, "w": w, "i": i})
                with lock:
                    report["acked"].append({"writer": w, "op": "insert", "coll": coll, "id": doc_id})
            except Exception as e:  # noqa: BLE001
                error("writer %d insert %s" % (w, doc_id), e)
            if i % 3 == 0:
                try:
                    r = db[coll].update_one({"_id": doc_id}, {"$set": {"u": True}})
                    if r.modified_count == 1:
                        with lock:
                            report["acked"].append(
                                {"writer": w, "op": "update", "coll": coll, "id": doc_id})
                except Exception as e:  # noqa: BLE001
                    error("writer %d update %s" % (w, doc_id), e)
            i += 1

    def read():
        while not stop.is_set():
            for coll in ("hashed", "plain"):
                try:
                    db[coll].count_documents({})
                    db[coll].find_one({"_id": "w0-0"})
                    with lock:
                        report["reads"] += 2
                except Exception as e:  # noqa: BLE001
                    error("reader " + coll, e)
            time.sleep(0.02)

    watchers = [
        threading.Thread(target=watch, args=(db_stream, "db_events", 2), daemon=True),
        threading.Thread(target=watch, args=(lookup_stream, "lookup_events", 1), daemon=True),
    ]
    workers = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    workers.append(threading.Thread(target=read))
    for t in watchers + workers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join()
    for coll in ("plain", "hashed"):
        db[coll].insert_one({"_id": END})
    for t in watchers:
        t.join(timeout=120)
        if t.is_alive():
            error("watcher", "did not reach the end marker within 120 s")
    json.dump(report, sys.stdout)
    sys.stdout.flush()
    # A watcher stuck in next() must not keep the process alive.
    sys.exit(0)


if __name__ == "__main__":
    main()
