"""The HTTP change feed (`--httpPort`) with plain HTTP clients: urllib, and curl for the events.

Usage: python3 tests/py/http_feed.py [ignored URI]
Starts its own servers (TRIBUTARY_BIN, else target/debug/tributary) on free ports: one with a
1 MB oplog per shard (so history can be lost on purpose), and one with --auth and preferTLS
(certificates made by the openssl command). Every check names the behaviour it asserts; the
last line is "N passed, N failed" and the exit status is non-zero on failure.
"""

import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

from bson import json_util
from bson.json_util import JSONOptions
from pymongo import MongoClient
from pymongo.errors import OperationFailure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from auth_tls import certificates, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("TRIBUTARY_BIN", os.path.join(ROOT, "target", "debug", "tributary"))
LOADS = JSONOptions(tz_aware=False)


class Server:
    def __init__(self, work, name, *args):
        self.port, self.http = free_port(), free_port()
        self.log = open(os.path.join(work, f"{name}.log"), "w")
        self.proc = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--httpPort", str(self.http), "--shards", "2",
             "--dbpath", os.path.join(work, name), *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        for port in (self.port, self.http):
            for _ in range(300):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"the server exited: see {self.log.name}")
                    time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def get(port, path, headers=None, context=None, timeout=30):
    """GET over HTTP(S): (status, parsed JSON body, headers)."""
    scheme = "https" if context else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def changes(port, **params):
    q = urllib.parse.urlencode(params)
    status, body, _ = get(port, f"/v1/changes?{q}")
    assert status == 200, (status, body)
    return body


def as_bson(change):
    """An Extended JSON change back as the values a driver decodes."""
    return json_util.loads(json.dumps(change), json_options=LOADS)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def feed_checks(server, client):
    db = client.feed
    coll = db.c
    port = server.http

    def pages_resume_and_equal_watch():
        # What watch() returns from the same start, through the driver.
        bounds = db.command("changeStreamBounds", "c")
        coll.insert_many([{"_id": i, "n": i} for i in range(5)])
        coll.update_one({"_id": 0}, {"$set": {"n": 100}})
        coll.delete_one({"_id": 1})
        with coll.watch(resume_after=bounds["current"]) as stream:
            watched = [stream.next() for _ in range(7)]
        cursor = urllib.parse.quote(bounds["current"]["_data"])
        q = f"/v1/changes?ns=feed.c&limit=3&from={cursor}"
        status, first, headers = get(port, q)
        check(status == 200, (status, first))
        check(headers["Content-Type"] == "application/json", headers["Content-Type"])
        check(len(first["changes"]) == 3 and first["caught_up"] is False, first)
        second = changes(port, ns="feed.c", limit=100, **{"from": first["next"]})
        check(len(second["changes"]) == 4 and second["caught_up"] is True, second)
        got = [as_bson(c) for c in first["changes"] + second["changes"]]
        check(got == watched, f"the feed's events are watch()'s:\n{got}\n{watched}")
        third = changes(port, ns="feed.c", **{"from": second["next"]})
        check(third["changes"] == [] and third["caught_up"], third)

    def head_then_new_changes():
        head = changes(port, ns="feed.c", **{"from": "head"})
        check(head["changes"] == [] and head["caught_up"], head)
        coll.insert_one({"_id": "new"})
        after = changes(port, ns="feed.c", waitMs=5000, **{"from": head["next"]})
        check([c["documentKey"]["_id"] for c in after["changes"]] == ["new"], after)

    def wait_for_the_first_change():
        head = changes(port, ns="feed.c", **{"from": "head"})
        threading.Timer(0.5, lambda: coll.insert_one({"_id": "late"})).start()
        started = time.monotonic()
        page = changes(port, ns="feed.c", waitMs=10000, **{"from": head["next"]})
        took = time.monotonic() - started
        check([c["documentKey"]["_id"] for c in page["changes"]] == ["late"], page)
        check(0.3 < took < 9, f"the page waited for the change, not the whole wait: {took}")

    def oldest_starts_at_the_oldest_change():
        page = changes(port, ns="feed.c", limit=1, **{"from": "oldest"})
        check(page["changes"][0]["documentKey"] == {"_id": 0}, page)
        check(page["changes"][0]["operationType"] == "insert", page)

    def relaxed_and_canonical():
        head = changes(port, ns="feed.c", **{"from": "head"})
        coll.insert_one({"_id": "typed", "i": 7, "l": 2**40, "d": 1.5})
        relaxed = changes(port, ns="feed.c", waitMs=5000, **{"from": head["next"]})["changes"][0]
        check(relaxed["fullDocument"] == {"_id": "typed", "i": 7, "l": 2**40, "d": 1.5}, relaxed)
        check("$timestamp" in relaxed["clusterTime"], relaxed["clusterTime"])
        canonical = changes(port, ns="feed.c", json="canonical", **{"from": head["next"]})
        doc = canonical["changes"][0]["fullDocument"]
        check(doc["i"] == {"$numberInt": "7"} and doc["l"] == {"$numberLong": str(2**40)}, doc)
        check(doc["d"] == {"$numberDouble": "1.5"}, doc)

    def watch_options_and_match():
        db.create_collection("pre", changeStreamPreAndPostImages={"enabled": True})
        head = changes(port, ns="feed.pre", **{"from": "head"})
        db.pre.insert_one({"_id": 1, "v": "a"})
        db.pre.update_one({"_id": 1}, {"$set": {"v": "b"}})
        db.pre.delete_one({"_id": 1})
        page = changes(port, ns="feed.pre", waitMs=5000, limit=3, fullDocument="updateLookup",
                       fullDocumentBeforeChange="required", **{"from": head["next"]})
        kinds = [c["operationType"] for c in page["changes"]]
        check(kinds == ["insert", "update", "delete"], kinds)
        update = page["changes"][1]
        check(update["fullDocumentBeforeChange"] == {"_id": 1, "v": "a"}, update)
        check("fullDocument" in update, update)
        deletes = changes(port, ns="feed.pre", match=json.dumps({"operationType": "delete"}),
                          **{"from": head["next"]})
        check([c["operationType"] for c in deletes["changes"]] == ["delete"], deletes)

    def database_and_cluster_scopes():
        head_db = changes(port, ns="feed", **{"from": "head"})
        head_all = changes(port, **{"from": "head"})
        client.feed.other.insert_one({"_id": "o"})
        client.elsewhere.c.insert_one({"_id": "e"})
        in_db = changes(port, ns="feed", waitMs=5000, **{"from": head_db["next"]})
        check([c["ns"] for c in in_db["changes"]] == [{"db": "feed", "coll": "other"}], in_db)
        everything = changes(port, waitMs=5000, limit=10, **{"from": head_all["next"]})
        nss = [c["ns"]["db"] for c in everything["changes"] if c["operationType"] == "insert"]
        check(nss[-2:] == ["feed", "elsewhere"], everything)

    def bad_requests_are_400_with_the_error():
        for query, code in [
            ("ns=feed.c&from=nothex", 260),
            ("ns=feed.c&limit=0", 2),
            ("ns=feed.c&limit=100000", 2),
            ("ns=feed.c&json=yaml", 2),
            ("ns=feed.c&match=%7Bnot", 9),
            ("ns=feed.c&fullDocument=sometimes", None),
            ("ns=feed.c&nonsense=1", 2),
            ("ns=feed.c&limit=1&limit=2", 2),
        ]:
            status, body, _ = get(port, f"/v1/changes?{query}")
            check(status == 400, (query, status, body))
            check(body["ok"] == 0 and isinstance(body["code"], int) and body["codeName"], body)
            check(code is None or body["code"] == code, (query, body))
        status, body, _ = get(port, "/v1/nothing")
        check(status == 404 and body["ok"] == 0, (status, body))

    def bounds_over_http_and_the_earliest_marker():
        status, bounds, _ = get(port, "/v1/bounds?ns=feed.c")
        check(status == 200 and bounds["earliest"] and bounds["current"], bounds)
        check("$timestamp" in bounds["earliestTime"] and "$timestamp" in bounds["currentTime"],
              bounds)
        after = changes(port, ns="feed.c", **{"from": bounds["current"]})
        check(after["changes"] == [] and after["caught_up"], after)
        oldest = changes(port, ns="feed.c", limit=1, **{"from": bounds["earliest"]})
        check(oldest["changes"][0]["documentKey"] == {"_id": 0}, oldest)
        # Through a driver: the marker as resumeAfter starts at the oldest change kept.
        marker = db.command("changeStreamBounds", "c")["earliest"]
        with coll.watch(resume_after=marker) as stream:
            first = stream.next()
        check(first["documentKey"] == {"_id": 0}, first)
        cluster = client.admin.command("changeStreamBounds", 1, allChangesForCluster=True)
        check("earliest" in cluster and "current" in cluster, cluster)

    def events_stream_and_resume_with_last_event_id():
        head = changes(port, ns="feed.sse", **{"from": "head"})
        client.feed.sse.insert_many([{"_id": i} for i in range(3)])

        def read_events(last_event_id, want):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            conn.request("GET", f"/v1/changes?ns=feed.sse&heartbeatMs=200&from={head['next']}",
                         headers=headers)
            r = conn.getresponse()
            check(r.status == 200, r.status)
            check(r.getheader("Content-Type") == "text/event-stream", r.getheader("Content-Type"))
            events, heartbeats, current = [], 0, {}
            while len(events) < want or heartbeats == 0:
                line = r.fp.readline().decode()
                check(line != "", "the stream ended early")
                line = line.rstrip("\n")
                if line == "":
                    if current.get("event", "message") == "message" and "data" in current:
                        events.append((current.get("id"), json.loads(current["data"])))
                    elif current.get("event") == "heartbeat":
                        heartbeats += 1
                        check(current.get("id"), f"a heartbeat carries the position: {current}")
                    current = {}
                elif not line.startswith(":"):
                    field, _, value = line.partition(":")
                    current[field] = value.lstrip(" ")
            conn.close()
            return events

        events = read_events(None, 3)
        check([e["documentKey"]["_id"] for _, e in events] == [0, 1, 2], events)
        check(all(i == e["_id"]["_data"] for i, e in events), "each id is the event's token")
        # A reconnect with Last-Event-ID goes on after that event.
        client.feed.sse.insert_one({"_id": 3})
        again = read_events(events[1][0], 2)
        check([e["documentKey"]["_id"] for _, e in again] == [2, 3], again)

    def curl_reads_the_event_stream():
        head = changes(port, ns="feed.curl", **{"from": "head"})
        client.feed.curl.insert_one({"_id": "c"})
        out = subprocess.run(
            ["curl", "-sN", "--max-time", "3", "-H", "Accept: text/event-stream",
             f"http://127.0.0.1:{port}/v1/changes?ns=feed.curl&from={head['next']}"],
            capture_output=True, text=True)
        data = [json.loads(l[len("data: "):]) for l in out.stdout.splitlines()
                if l.startswith("data: ") and '"operationType"' in l]
        check([d["documentKey"]["_id"] for d in data] == ["c"], out.stdout)

    def lost_history_is_410():
        old = changes(port, ns="feed.big", **{"from": "head"})["next"]
        client.feed.big.insert_one({"_id": -1})
        first = changes(port, ns="feed.big", waitMs=5000, **{"from": old})
        cursor = first["changes"][0]["_id"]["_data"]
        big = "x" * 20000
        for i in range(0, 300, 50):
            client.feed.big.insert_many([{"_id": j, "pad": big} for j in range(i, i + 50)])
        status, body, _ = get(port, f"/v1/changes?ns=feed.big&from={cursor}")
        check(status == 410, (status, body))
        check(body["code"] == 286 and body["codeName"] == "ChangeStreamHistoryLost", body)
        # The earliest marker still starts at what is kept.
        status, bounds, _ = get(port, "/v1/bounds?ns=feed.big")
        page = changes(port, ns="feed.big", limit=1, **{"from": bounds["earliest"]})
        check(len(page["changes"]) == 1, page)
        # metrics are served on the same port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            check(b"tributary_commands_total" in r.read(), "metrics")

    def apply(state, event):
        """Applies one change event to a dict of documents by _id."""
        kind, key = event["operationType"], event.get("documentKey", {}).get("_id")
        if kind in ("insert", "replace"):
            state[key] = event["fullDocument"]
        elif kind == "update":
            doc = dict(state[key])
            doc.update(event["updateDescription"]["updatedFields"])
            for field in event["updateDescription"]["removedFields"]:
                doc.pop(field, None)
            state[key] = doc
        elif kind == "delete":
            del state[key]

    def writers(coll, seconds, first_new):
        """Inserts, updates, replaces and deletes for `seconds` in a thread; returns it."""
        def run():
            import random
            rng = random.Random(7)
            until = time.monotonic() + seconds
            n = first_new
            while time.monotonic() < until:
                key = rng.randrange(1000)
                op = rng.random()
                if op < 0.4:
                    coll.insert_one({"_id": n, "v": 0})
                    n += 1
                elif op < 0.7:
                    coll.update_one({"_id": key}, {"$inc": {"v": 1}, "$set": {"w": rng.random()}})
                elif op < 0.8:
                    coll.update_one({"_id": key}, {"$unset": {"w": ""}})
                elif op < 0.9:
                    coll.replace_one({"_id": key}, {"v": -1, "r": True})
                else:
                    coll.delete_one({"_id": key})
        t = threading.Thread(target=run)
        t.start()
        return t

    def follow(state, cursor):
        """Applies the feed from `cursor` until it has caught up."""
        while True:
            page = changes(port, ns=coll_boot.full_name, limit=1000, **{"from": cursor})
            for change in page["changes"]:
                apply(state, as_bson(change))
            cursor = page["next"]
            if page["caught_up"]:
                return cursor

    coll_boot = db.boot

    def snapshot_then_follow_is_exact():
        client.admin.command("shardCollection", "feed.boot", key={"_id": "hashed"})
        coll_boot.insert_many([{"_id": i, "v": 0} for i in range(1000)])
        writing = writers(coll_boot, 3, 1000)
        time.sleep(0.5)
        with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/v1/snapshot?ns=feed.boot", timeout=60) as r:
            check(r.headers["Content-Type"] == "application/x-ndjson", r.headers["Content-Type"])
            lines = [json.loads(l) for l in r.read().splitlines()]
        end = lines[-1]
        check("next" in end and end["count"] == len(lines) - 1, end)
        state = {}
        for line in lines[:-1]:
            doc = as_bson(line)
            check(doc["_id"] not in state, f"a document twice: {doc}")
            state[doc["_id"]] = doc
        writing.join()
        follow(state, end["next"])
        actual = {d["_id"]: d for d in coll_boot.find()}
        check(state == actual, f"snapshot + feed != collection: {len(state)} vs {len(actual)}, "
              f"differing {[k for k in set(state) | set(actual) if state.get(k) != actual.get(k)][:5]}")

    def snapshot_cursor_through_a_driver():
        writing = writers(coll_boot, 2, 1_000_000)
        time.sleep(0.3)
        point = db.command("snapshotCursor", "boot")
        docs = db.command("find", "boot", filter={}, batchSize=100000,
                          readConcern={"level": "snapshot", "atClusterTime": point["atClusterTime"]})
        state = {d["_id"]: d for d in docs["cursor"]["firstBatch"]}
        check(docs["cursor"]["id"] == 0, "one batch")
        writing.join()
        latest = db.command("changeStreamBounds", "boot")["current"]
        with coll_boot.watch(resume_after=point["cursor"], max_await_time_ms=500) as stream:
            while True:
                event = stream.try_next()
                if event is None:
                    if stream.resume_token["_data"] >= latest["_data"]:
                        break
                    continue
                apply(state, event)
        actual = {d["_id"]: d for d in coll_boot.find()}
        check(state == actual, "snapshotCursor + watch() != collection")

    def snapshot_refusals():
        status, body, _ = get(port, "/v1/snapshot?ns=feed")
        check(status == 400 and body["ok"] == 0, (status, body))
        status, body, _ = get(port, "/v1/snapshot?ns=feed.boot&limit=1")
        check(status == 400, (status, body))

    return [
        snapshot_then_follow_is_exact,
        snapshot_cursor_through_a_driver,
        snapshot_refusals,
        pages_resume_and_equal_watch,
        head_then_new_changes,
        wait_for_the_first_change,
        oldest_starts_at_the_oldest_change,
        relaxed_and_canonical,
        watch_options_and_match,
        database_and_cluster_scopes,
        bad_requests_are_400_with_the_error,
        bounds_over_http_and_the_earliest_marker,
        events_stream_and_resume_with_last_event_id,
        curl_reads_the_event_stream,
        lost_history_is_410,
    ]


def auth_checks(server, ca):
    port = server.http
    tls = ssl.create_default_context(cafile=ca)

    def client(**kw):
        return MongoClient(f"mongodb://127.0.0.1:{server.port}/", tls=True, tlsCAFile=ca,
                           serverSelectionTimeoutMS=5000, directConnection=True, **kw)

    def basic(user, password):
        raw = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {raw}"}

    def setup():
        client().admin.command("createUser", "boss", pwd="s3cret", roles=["root"])
        boss = client(username="boss", password="s3cret")
        boss.app.command("createUser", "reader", pwd="pw", roles=["read"])
        boss.admin.command("createUser", "temp", pwd="pw", roles=["readAnyDatabase"])
        boss.app.c.insert_one({"_id": 1})

    def refusals():
        status, body, headers = get(port, "/v1/changes?ns=app.c")
        check(status == 401 and body["code"] == 18, (status, body))
        check("Basic" in headers["WWW-Authenticate"], headers)
        status, body, _ = get(port, "/v1/changes?ns=app.c", headers=basic("boss", "s3cret"))
        check(status == 401, f"Basic over plain HTTP is refused: {status} {body}")
        status, body, _ = get(port, "/v1/changes?ns=app.c", basic("boss", "wrong"), tls)
        check(status == 401 and body["code"] == 18, (status, body))
        # /metrics needs no login, as before.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            check(r.status == 200, r.status)

    def basic_over_tls_with_the_users_rights():
        q = "/v1/changes?ns=app.c&from=oldest&authSource=app"
        status, body, _ = get(port, q, basic("reader", "pw"), tls)
        check(status == 200 and body["changes"][0]["documentKey"] == {"_id": 1}, (status, body))
        status, body, _ = get(port, "/v1/changes?ns=other.c&authSource=app",
                              basic("reader", "pw"), tls)
        check(status == 403 and body["code"] == 13, (status, body))
        status, body, _ = get(port, "/v1/changes?authSource=app", basic("reader", "pw"), tls)
        check(status == 403, f"the cluster's stream needs more than read on one db: {status}")
        status, body, _ = get(port, "/v1/status?authSource=app", basic("reader", "pw"), tls)
        check(status == 403, f"the status needs serverStatus's rights: {status}")
        status, body, _ = get(port, "/v1/status", basic("boss", "s3cret"), tls)
        check(status == 200 and len(body["shards"]) == 2, (status, body))

    def bearer_tokens():
        reader = client(username="reader", password="pw", authSource="app")
        made = reader.app.command("createHttpToken", expiresAfterSecs=600)
        check(made["user"] == "reader" and made["db"] == "app", made)
        bearer = {"Authorization": f"Bearer {made['token']}"}
        status, body, _ = get(port, "/v1/changes?ns=app.c&from=oldest", bearer)
        check(status == 200 and len(body["changes"]) == 1, (status, body))
        status, body, _ = get(port, "/v1/bounds?ns=other.c", bearer)
        check(status == 403, (status, body))
        forged = made["token"][:-2] + ("AA" if not made["token"].endswith("AA") else "BB")
        status, body, _ = get(port, "/v1/changes?ns=app.c",
                              {"Authorization": f"Bearer {forged}"})
        check(status == 401, (status, body))
        # A dropped user's token stops working.
        temp = client(username="temp", password="pw")
        token = temp.admin.command("createHttpToken")["token"]
        status, _, _ = get(port, "/v1/changes?ns=app.c", {"Authorization": f"Bearer {token}"})
        check(status == 200, status)
        client(username="boss", password="s3cret").admin.command("dropUser", "temp")
        status, body, _ = get(port, "/v1/changes?ns=app.c", {"Authorization": f"Bearer {token}"})
        check(status == 401, (status, body))

    def watch_raw(db, coll, spec, pipeline=()):
        """Opens a change stream with options a driver does not know; returns (db, cursor)."""
        reply = db.command("aggregate", coll, pipeline=[{"$changeStream": spec}, *pipeline],
                           cursor={})
        return reply["cursor"]

    def read_events(db, coll, cursor, want):
        events, cid = list(cursor["firstBatch"]), cursor["id"]
        deadline = time.monotonic() + 20
        while len(events) < want and time.monotonic() < deadline:
            more = db.command("getMore", cid, collection=coll, maxTimeMS=500)
            events.extend(more["cursor"]["nextBatch"])
        return events

    def commit_metadata_from_two_users_and_a_transaction():
        boss = client(username="boss", password="s3cret")
        boss.app.command("createUser", "ana", pwd="pw", roles=["readWrite"])
        boss.app.command("createUser", "ben", pwd="pw", roles=["readWrite"])
        ana = client(username="ana", password="pw", authSource="app", appName="billing")
        ben = client(username="ben", password="pw", authSource="app", appName="audit-tool")
        start = boss.app.command("changeStreamBounds", "who")["current"]
        ana.app.who.insert_one({"_id": 1}, comment="first order")
        ben.app.who.update_one({"_id": 1}, {"$set": {"paid": True}}, comment={"ticket": 42})
        with ana.start_session() as s:
            s.start_transaction()
            ana.app.who.insert_one({"_id": 2}, session=s)
            ana.app.who.delete_one({"_id": 1}, session=s)
            ana.admin.command({"commitTransaction": 1, "comment": "close ticket"}, session=s)
        cursor = watch_raw(boss.app, "who", {"showCommitMetadata": True, "resumeAfter": start})
        events = read_events(boss.app, "who", cursor, 4)
        meta = [e["commitMetadata"] for e in events]
        check([m["user"] for m in meta] == ["ana", "ben", "ana", "ana"], meta)
        check(all(m["authenticatedDb"] == "app" for m in meta), meta)
        check([m["appName"] for m in meta] == ["billing", "audit-tool", "billing", "billing"],
              meta)
        check(meta[0]["comment"] == "first order" and meta[1]["comment"] == {"ticket": 42}, meta)
        check(meta[2]["comment"] == "close ticket" == meta[3]["comment"],
              f"a transaction's events carry its commit's comment: {meta}")
        check(meta[0]["txnMetadata"] is None, meta)
        txn = meta[2]["txnMetadata"]
        check(txn is not None and txn == meta[3]["txnMetadata"] and "txnNumber" in txn, meta)
        check(all(m["wallTime"] == e["wallTime"] for m, e in zip(meta, events)), events)
        # Selecting by user.
        cursor = watch_raw(boss.app, "who", {"showCommitMetadata": True, "resumeAfter": start},
                           [{"$match": {"commitMetadata.user": "ben"}}])
        by_ben = read_events(boss.app, "who", cursor, 1)
        check([e["operationType"] for e in by_ben] == ["update"], by_ben)
        # Without the option, no commitMetadata.
        cursor = watch_raw(boss.app, "who", {"resumeAfter": start})
        plain = read_events(boss.app, "who", cursor, 1)
        check("commitMetadata" not in plain[0], plain[0])
        # Over HTTP too.
        token = ana.app.command("createHttpToken")["token"]
        cursor = urllib.parse.quote(start["_data"])
        status, body, _ = get(port, f"/v1/changes?ns=app.who&showCommitMetadata=true&limit=4"
                              f"&from={cursor}", {"Authorization": f"Bearer {token}"})
        check(status == 200, (status, body))
        check([c["commitMetadata"]["user"] for c in body["changes"]] == ["ana", "ben", "ana", "ana"],
              body)

    def a_batchs_events_all_carry_its_metadata_from_any_resume_point():
        # A command's entries share one recorded document in runs; every event still has it,
        # whether the stream reads the run from its start or resumes inside it.
        boss = client(username="boss", password="s3cret")
        ana = client(username="ana", password="pw", authSource="app", appName="bulk")
        start = boss.app.command("changeStreamBounds", "bulk")["current"]
        ana.app.bulk.insert_many([{"_id": i} for i in range(100)], comment={"job": "import"})
        cursor = watch_raw(boss.app, "bulk", {"showCommitMetadata": True, "resumeAfter": start})
        events = read_events(boss.app, "bulk", cursor, 100)
        check(len(events) == 100, len(events))
        meta = [(e["commitMetadata"]["appName"], e["commitMetadata"]["comment"]) for e in events]
        check(meta == [("bulk", {"job": "import"})] * 100, meta)
        for resume_at in (40, 70, 98):
            cursor = watch_raw(boss.app, "bulk", {"showCommitMetadata": True,
                                                  "resumeAfter": events[resume_at]["_id"]})
            rest = read_events(boss.app, "bulk", cursor, 99 - resume_at)
            check([e["documentKey"]["_id"] for e in rest] == list(range(resume_at + 1, 100)),
                  rest)
            check(all(e["commitMetadata"]["user"] == "ana" and
                      e["commitMetadata"]["comment"] == {"job": "import"} for e in rest),
                  f"resumed after event {resume_at}: {rest[:2]}")

    def the_extension_can_be_turned_off():
        boss = client(username="boss", password="s3cret")
        boss.admin.command("setParameter", 1, changeStreamExtensions=False)
        try:
            try:
                boss.app.command("aggregate", "who",
                                 pipeline=[{"$changeStream": {"showCommitMetadata": True}}],
                                 cursor={})
                raise AssertionError("an unknown $changeStream field was taken")
            except OperationFailure as e:
                check(e.code == 40415, e.details)
        finally:
            boss.admin.command("setParameter", 1, changeStreamExtensions=True)

    return [setup, refusals, basic_over_tls_with_the_users_rights, bearer_tokens,
            commit_metadata_from_two_users_and_a_transaction,
            a_batchs_events_all_carry_its_metadata_from_any_resume_point,
            the_extension_can_be_turned_off]


def run(checks):
    passed = failed = 0
    for c in checks:
        try:
            c()
            print(f"ok    {c.__name__}")
            passed += 1
        except Exception:  # noqa: BLE001 - each check is reported on its own
            print(f"FAIL  {c.__name__}")
            traceback.print_exc()
            failed += 1
    return passed, failed


def main():
    work = tempfile.mkdtemp(prefix="tributary-http-feed-")
    passed = failed = 0
    server = Server(work, "feed", "--oplogSizeMB", "1")
    try:
        client = MongoClient(f"mongodb://127.0.0.1:{server.port}/", serverSelectionTimeoutMS=10000)
        p, f = run(feed_checks(server, client))
        passed, failed = passed + p, failed + f
    finally:
        server.stop()
    ca, pem = certificates(work)
    secure = Server(work, "auth", "--auth", "--tlsMode", "preferTLS",
                    "--tlsCertificateKeyFile", pem)
    try:
        p, f = run(auth_checks(secure, ca))
        passed, failed = passed + p, failed + f
    finally:
        secure.stop()
    print(f"{passed} passed, {failed} failed")
    if failed:
        print(f"server logs in {work}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
