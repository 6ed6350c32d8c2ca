"""Subscriptions through pymongo: server-tracked consumers with acks, redelivery and dead letters.

Run against a router started with default options:

    python3 tests/py/subscriptions.py mongodb://127.0.0.1:27017/

Each check names the behaviour it asserts; the script exits non-zero on the first failure.
"""

import random
import sys
import time
import uuid

from pymongo import MongoClient
from pymongo.errors import OperationFailure


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main(uri):
    client = MongoClient(uri)
    db = client[f"subs_{uuid.uuid4().hex[:8]}"]
    coll = db.orders

    def read(name, consumer, **kw):
        return db.command("readSubscription", name, consumer=consumer, **kw)

    def ack(name, consumer, ids, **kw):
        return db.command("ackSubscription", name, consumer=consumer, deliveryIds=ids, **kw)

    def nack(name, consumer, ids, **kw):
        return db.command("nackSubscription", name, consumer=consumer, deliveryIds=ids, **kw)

    # --- the README's consumer loop: read, handle, ack ---
    db.command("createSubscription", "audit", collection="orders", ackTimeoutSecs=2, maxDeliveries=3)
    coll.insert_many([{"_id": i, "n": i} for i in range(5)])
    seen = []
    while len(seen) < 5:
        reply = read("audit", "billing", max=100, waitMS=2000)
        for m in reply["messages"]:
            seen.append(m["event"]["documentKey"]["_id"])
        ack("audit", "billing", [m["deliveryId"] for m in reply["messages"]])
    check(seen == list(range(5)), f"one consumer gets every change in commit order: {seen}")
    reply = read("audit", "billing", max=100, waitMS=1000)
    check(reply["messages"] == [] and reply["caughtUp"], f"nothing more, caught up: {reply}")

    # --- the event is exactly what watch() returns ---
    with coll.watch(start_after=None) as stream:
        coll.insert_one({"_id": 100, "x": "same"})
        watched = stream.next()
    got = read("audit", "billing", waitMS=2000)["messages"]
    check(len(got) == 1 and got[0]["event"] == watched, f"event equals watch()'s: {got} vs {watched}")
    check(got[0]["deliveryCount"] == 1, "a first delivery counts 1")
    ack("audit", "billing", [got[0]["deliveryId"]])

    # --- a second consumer is independent and starts at the subscription's start ---
    other = read("audit", "reports", max=100)["messages"]
    check([m["event"]["documentKey"]["_id"] for m in other] == [0, 1, 2, 3, 4, 100],
          f"a new consumer starts at the start point: {other}")

    # --- acking twice, late, or garbage ---
    first = other[0]["deliveryId"]
    r = ack("audit", "reports", [first])
    check(r["acked"] == 1 and r["late"] == 0, f"ack: {r}")
    r = ack("audit", "reports", [first])
    check(r["acked"] == 0 and r["late"] == 1, f"acking twice is a reported no-op: {r}")
    try:
        ack("audit", "reports", ["not-an-id"])
        check(False, "a malformed id is refused")
    except OperationFailure as e:
        check(e.code == 2, f"BadValue for a malformed id: {e}")

    # --- redelivery after the ack timeout, then a dead letter after maxDeliveries ---
    rest = [m["deliveryId"] for m in other[1:]]
    ack("audit", "reports", rest[1:])  # leave one unacked
    counts = []
    for _ in range(2):
        again = read("audit", "reports", waitMS=4000)["messages"]
        check(len(again) == 1, f"the unacked message comes again after the timeout: {again}")
        counts.append(again[0]["deliveryCount"])
    check(counts == [2, 3], f"delivery counts grow by one per redelivery: {counts}")
    # maxDeliveries is 3: when the third delivery times out, the message is set aside.
    r = read("audit", "reports", waitMS=4000)
    check(r["messages"] == [], f"no fourth delivery: {r}")
    time.sleep(0.5)
    letters = list(client.config.subscriptionDeadLetters.find({"subscription": f"{db.name}.audit", "consumer": "reports"}))
    check(len(letters) == 1 and letters[0]["deliveryCount"] == 3, f"one dead letter: {letters}")
    check(letters[0]["event"]["documentKey"]["_id"] == 1, "the dead letter holds its event")

    # --- redrive brings it back, and its ack clears it ---
    r = db.command("alterSubscription", "audit", redrive={"consumer": "reports"})
    check(r["redriven"] == 1, f"redrive: {r}")
    again = read("audit", "reports", waitMS=1000)["messages"]
    check(len(again) == 1 and again[0]["deliveryCount"] == 1, f"redriven message: {again}")
    ack("audit", "reports", [again[0]["deliveryId"]])
    time.sleep(0.5)
    check(client.config.subscriptionDeadLetters.count_documents({"subscription": f"{db.name}.audit", "consumer": "reports"}) == 0,
          "an acked redriven message leaves the dead letters")

    # --- nack with a delay, and nack to the dead letters ---
    coll.insert_one({"_id": 200})
    m = read("audit", "billing", waitMS=2000)["messages"]
    nack("audit", "billing", [m[0]["deliveryId"]], retryInMS=500)
    check(read("audit", "billing")["messages"] == [], "a delayed nack is not redelivered early")
    again = read("audit", "billing", waitMS=2000)["messages"]
    check(len(again) == 1 and again[0]["deliveryCount"] == 2, f"redelivered after retryInMS: {again}")
    r = nack("audit", "billing", [again[0]["deliveryId"]], deadLetter=True)
    check(r["nacked"] == 1, f"nack to dead letter: {r}")

    # --- inProgress extends the deadline ---
    coll.insert_one({"_id": 201})
    m = read("audit", "billing", waitMS=2000)["messages"]
    for _ in range(3):
        time.sleep(1)
        ack("audit", "billing", [m[0]["deliveryId"]], inProgress=True)
    check(read("audit", "billing")["messages"] == [], "an extended message is not redelivered")
    r = ack("audit", "billing", [m[0]["deliveryId"]], waitDurable=True)
    check(r["acked"] == 1 and r["late"] == 0, f"a durable ack: {r}")

    # --- a work queue: two readers of one consumer split the messages ---
    db.command("createSubscription", "jobs", collection="orders")
    coll.insert_many([{"_id": 300 + i} for i in range(10)])
    a = read("jobs", "workers", max=5, waitMS=2000)["messages"]
    b = read("jobs", "workers", max=5, waitMS=2000)["messages"]
    ids_a = {m["event"]["documentKey"]["_id"] for m in a}
    ids_b = {m["event"]["documentKey"]["_id"] for m in b}
    check(len(ids_a) == 5 and len(ids_b) == 5 and not ids_a & ids_b, "readers split the work")

    # --- pause, resume, reset ---
    db.command("alterSubscription", "jobs", pause=True)
    coll.insert_one({"_id": 400})
    check(read("jobs", "workers")["messages"] == [], "a paused subscription delivers nothing")
    db.command("alterSubscription", "jobs", resume=True)
    got = read("jobs", "workers", waitMS=2000)["messages"]
    check([m["event"]["documentKey"]["_id"] for m in got] == [400], f"resumed: {got}")
    db.command("alterSubscription", "jobs", reset={"to": "now", "consumer": "workers"})
    r = ack("jobs", "workers", [got[0]["deliveryId"]])
    check(r["unknown"] == 1, f"an id from before a reset acks nothing: {r}")
    coll.insert_one({"_id": 401})
    got = read("jobs", "workers", waitMS=2000)["messages"]
    check([m["event"]["documentKey"]["_id"] for m in got] == [401], f"after reset to now: {got}")

    # --- listSubscriptions ---
    rows = db.command("listSubscriptions", 1)["cursor"]["firstBatch"]
    by = {(r["subscription"], r["consumer"]): r for r in rows}
    check(("audit", "billing") in by and ("jobs", "workers") in by, f"one row per consumer: {rows}")
    check(by[("audit", "reports")]["deadLettered"] == 0 and by[("audit", "reports")]["acked"] >= 6,
          f"counters: {by[('audit', 'reports')]}")
    rows = db.command("listSubscriptions", 1, filter={"consumer": "billing"})["cursor"]["firstBatch"]
    check(len(rows) == 1, f"filtered: {rows}")
    # Lag in bytes: the oplog a consumer's position holds on every shard.
    db.command("createSubscription", "lag", collection="lagging")
    read("lag", "l", max=1)
    db.lagging.insert_many([{"_id": i, "pad": "x" * 1000} for i in range(20)])

    def lag_row():
        return db.command("listSubscriptions", 1, filter={"subscription": "lag"})["cursor"]["firstBatch"][0]
    behind = lag_row()
    check(behind["lagBytes"] >= 20 * 1000, f"twenty 1 KB inserts unacknowledged: {behind}")
    got = []
    while len(got) < 20:
        batch = read("lag", "l", max=100, waitMS=2000)["messages"]
        check(batch, "the lagging consumer reads its 20 messages")
        got += batch
    # A cumulative ack: every delivery through the last one.
    r = db.command("ackSubscription", "lag", consumer="l", through=got[-1]["deliveryId"])
    check(r["acked"] == 20 and r["unknown"] == 0, f"acked through the last: {r}")
    r = db.command("ackSubscription", "lag", consumer="l", through=got[-1]["deliveryId"])
    check(r["acked"] == 0 and r["late"] == 1, f"acked through again: late {r}")
    try:
        db.command("ackSubscription", "lag", consumer="l", through=got[-1]["deliveryId"],
                   inProgress=True)
        check(False, "through with inProgress is refused")
    except OperationFailure as e:
        check(e.code == 2, f"BadValue: {e}")
    caught_up = lag_row()
    check(caught_up["lagBytes"] < behind["lagBytes"] - 15 * 1000,
          f"acknowledged, the lag shrinks: {behind['lagBytes']} -> {caught_up}")
    db.command("dropSubscription", "lag")

    # The next read carries the ack: one round trip per batch.
    db.command("createSubscription", "carried", collection="carried")
    read("carried", "k", max=1)
    db.carried.insert_many([{"_id": i} for i in range(3)])
    first = read("carried", "k", max=2, waitMS=2000)["messages"]
    check([m["event"]["documentKey"]["_id"] for m in first] == [0, 1], f"two of three: {first}")
    r = read("carried", "k", max=10, waitMS=2000, ackThrough=first[-1]["deliveryId"])
    check(r["acked"] == 2 and r["late"] == 0 and r["unknown"] == 0, f"the read acked two: {r}")
    check([m["event"]["documentKey"]["_id"] for m in r["messages"]] == [2],
          f"and read only the third: {r['messages']}")
    r = read("carried", "k", max=10, ackThrough=first[-1]["deliveryId"])
    check(r["acked"] == 0 and r["late"] == 1 and r["messages"] == [], f"twice: late, nothing new {r}")
    check("acked" not in read("carried", "k", max=10), "no ack asked, none reported")
    try:
        read("carried", "k", ackThrough=5)
        check(False, "a number for ackThrough is refused")
    except OperationFailure as e:
        check(e.code == 14, f"TypeMismatch: {e}")
    db.command("dropSubscription", "carried")

    # --- errors ---
    for cmd, code in [
        ({"readSubscription": "nope", "consumer": "c"}, 9100),
        ({"ackSubscription": "audit", "consumer": "nobody", "deliveryIds": []}, 9101),
        ({"createSubscription": "audit", "collection": "other"}, 9102),
        ({"readSubscription": "audit", "consumer": "c", "waitMS": 25001}, 2),
        ({"createSubscription": "bad", "maxDeliveries": 0}, 2),
    ]:
        try:
            db.command(cmd)
            check(False, f"{cmd} is refused")
        except OperationFailure as e:
            check(e.code == code, f"{cmd}: code {e.code}, wanted {code}: {e}")
    try:
        client.config.subscriptionConsumers.insert_one({"x": 1})
        check(False, "user writes to the state are refused")
    except OperationFailure as e:
        check(e.code == 9105, f"ReservedNamespace: {e}")

    # --- a waiting read ends at killOp, and idle consumers are dropped ---
    import threading
    db.command("createSubscription", "idle", collection="orders", consumerIdleTimeoutSecs=1)
    read("idle", "gone")
    failure = []

    def waiting_read():
        try:
            read("idle", "waiter", waitMS=20000)
        except OperationFailure as e:
            failure.append(e.code)

    t = threading.Thread(target=waiting_read)
    t0 = time.time()
    t.start()
    op = None
    for _ in range(50):
        ops = client.admin.command("currentOp", {"command.readSubscription": "idle"})["inprog"]
        if ops:
            op = ops[0]["opid"]
            break
        time.sleep(0.1)
    check(op is not None, "a waiting read is listed by currentOp")
    client.admin.command("killOp", op=op)
    t.join(timeout=10)
    check(failure == [11601] and time.time() - t0 < 10, f"killOp ends a waiting read: {failure}")
    time.sleep(3)
    rows = db.command("listSubscriptions", 1, filter={"subscription": "idle"})["cursor"]["firstBatch"]
    check(all(r["consumer"] not in ("gone",) for r in rows), f"an idle consumer is dropped: {rows}")

    # --- selectors: a trigger queue, one message per document per transaction ---
    client.admin.command("shardCollection", f"{db.name}.tasks", key={"_id": "hashed"})
    tasks = db.tasks
    tasks.insert_many([{"_id": i, "status": "new", "note": ""} for i in range(8)])
    db.command("createSubscription", "triggers", collection="tasks", selectors=[
        {"operations": ["update"], "changedFields": ["status"]},
        {"operations": ["delete"]},
    ])
    with client.start_session() as s:
        with s.start_transaction():
            for i in range(8):  # over both shards (hashed _id)
                tasks.update_one({"_id": i}, {"$set": {"status": "open"}}, session=s)
                tasks.update_one({"_id": i}, {"$set": {"note": "x"}}, session=s)
                tasks.update_one({"_id": i}, {"$set": {"status": "done"}}, session=s)
    tasks.update_one({"_id": 0}, {"$set": {"note": "not a trigger"}})
    tasks.delete_one({"_id": 1})
    got = []
    for _ in range(20):
        reply = read("triggers", "t", max=100, waitMS=1000)
        got.extend(reply["messages"])
        if len(got) >= 9:
            break
    keys = [m["event"]["documentKey"]["_id"] for m in got]
    check(sorted(keys[:8]) == list(range(8)) and keys[8:] == [1],
          f"one message per document per transaction, then the delete: {keys}")
    for m in got[:8]:
        fields = [list(c["updateDescription"]["updatedFields"]) for c in m["changes"]]
        check(fields == [["status"], ["status"]],
              f"changes lists the document's matching changes in the transaction: {fields}")
        check(m["event"] == m["changes"][0], "event is the first matching change")
        check(m["event"]["updateDescription"]["updatedFields"] == {"status": "open"},
              f"the first change: {m['event']}")
    check(got[8]["changes"] == [got[8]["event"]], "a change outside a transaction is its own message")
    # A consumer that acks part of the transaction's messages and crashes meets the rest again,
    # grouped the same, never split.
    db.command("createSubscription", "triggers2", collection="tasks", start=got[0]["event"]["_id"],
               selectors=[{"changedFields": ["status"]}])
    first = read("triggers2", "c", max=3, waitMS=2000)["messages"]
    check([m["event"]["_id"] for m in first] == [m["event"]["_id"] for m in got[1:4]] and
          all(len(m["changes"]) == 2 for m in first),
          f"a start inside a transaction gives the messages after it whole: {first}")
    ack("triggers2", "c", [m["deliveryId"] for m in first[:2]], waitDurable=True)
    db.command("alterSubscription", "triggers2", reset={"to": first[1]["event"]["_id"], "consumer": "d"})
    rest = read("triggers2", "d", max=100, waitMS=2000)["messages"]
    expected = [m["event"]["_id"] for m in got[3:8]]
    check([m["event"]["_id"] for m in rest[:5]] == expected and
          all(len(m["changes"]) == 2 for m in rest[:5]),
          f"resuming inside a transaction gives its remaining messages whole: {rest}")

    # --- start: "snapshot": the data as of one cluster time, then the changes after it ---
    client.admin.command("shardCollection", f"{db.name}.stock", key={"_id": "hashed"})
    stock = db.stock
    stock.insert_many([{"_id": i, "v": 0} for i in range(500)])
    stop = threading.Event()
    inserted = []

    def writer():
        w = MongoClient(uri)[db.name].stock
        n, rng = 500, random.Random(7)
        while not stop.is_set():
            n += 1
            w.insert_one({"_id": n, "v": 0})
            inserted.append(n)
            w.replace_one({"_id": rng.randrange(n)}, {"v": rng.randrange(1000)})
            w.delete_one({"_id": rng.randrange(500)})  # never one inserted here
        w.database.client.close()

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.5)
    created = db.command("createSubscription", "copy", collection="stock", start="snapshot")
    time.sleep(0.5)
    stop.set()
    t.join()
    copy, from_snapshot, from_inserts = {}, [], []
    while True:
        reply = read("copy", "mirror", max=1000, waitMS=500)
        for m in reply["messages"]:
            e = m["event"]
            key = e["documentKey"]["_id"]
            if e.get("snapshot"):
                from_snapshot.append(key)
                copy[key] = e["fullDocument"]
            elif e["operationType"] in ("insert", "replace"):
                if e["operationType"] == "insert":
                    from_inserts.append(key)
                copy[key] = e["fullDocument"]
            elif e["operationType"] == "delete":
                copy.pop(key, None)
        ack("copy", "mirror", [m["deliveryId"] for m in reply["messages"]])
        if reply["caughtUp"] and not reply["messages"]:
            break
    check(copy == {d["_id"]: d for d in stock.find()},
          "the snapshot, then the changes after it, equal the collection")
    check(not set(from_snapshot) & set(from_inserts),
          "nothing is both in the snapshot and inserted after it (no overlap)")
    missing = [i for i in inserted if i not in from_snapshot and i not in from_inserts]
    check(inserted and not missing,
          f"every insert reaches the consumer, by the snapshot or after it (no gap): {missing[:5]}")
    check(len(from_snapshot) == len(set(from_snapshot)) and from_snapshot,
          f"the snapshot delivers each document once: {len(from_snapshot)}")
    check(created["start"] is not None, "the reply gives the start")
    db.command("alterSubscription", "copy", reset={"to": "snapshot"})
    again = {}
    while True:
        reply = read("copy", "mirror", max=1000, waitMS=500)
        again.update({m["event"]["documentKey"]["_id"]: m["event"]["fullDocument"]
                      for m in reply["messages"] if m["event"].get("snapshot")})
        ack("copy", "mirror", [m["deliveryId"] for m in reply["messages"]])
        if reply["caughtUp"] and not reply["messages"]:
            break
    check(again == {d["_id"]: d for d in stock.find()}, "a reset to a new snapshot copies again")
    try:
        db.command("alterSubscription", "audit", reset={"to": "snapshot", "consumer": "billing"})
        check(False, "one consumer cannot take a snapshot of its own")
    except OperationFailure as e:
        check(e.code == 2, f"BadValue: {e}")

    # --- drop ---
    db.command("dropSubscription", "jobs")
    try:
        read("jobs", "workers")
        check(False, "a dropped subscription is gone")
    except OperationFailure as e:
        check(e.code == 9100, f"dropped: {e}")
    client.drop_database(db.name)
    check(db.command("listSubscriptions", 1)["cursor"]["firstBatch"] == [],
          "dropping a database drops its subscriptions")
    print("subscriptions: ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/")
