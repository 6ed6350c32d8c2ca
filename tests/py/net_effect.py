"""Change streams with transactionNetEffect through pymongo: a transaction's events folded per
document into its net change, each folded event with a token that resumes exactly.

Run against a router started with default options:

    python3 tests/py/net_effect.py mongodb://127.0.0.1:27017/

The last line is "N passed, N failed"; the exit status is non-zero on failure.
"""

import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402


def watch(db, coll, spec, want):
    """Opens a change stream with options pymongo does not know; reads `want` events."""
    reply = db.command("aggregate", coll, pipeline=[{"$changeStream": spec}], cursor={})
    events, cid = list(reply["cursor"]["firstBatch"]), reply["cursor"]["id"]
    for _ in range(40):
        if len(events) >= want:
            break
        more = db.command("getMore", cid, collection=coll, maxTimeMS=250)
        events.extend(more["cursor"]["nextBatch"])
    db.command("killCursors", coll, cursors=[cid])
    return events


def folded_transaction(client):
    db = client[f"net_{uuid.uuid4().hex[:8]}"]
    coll = db.c
    coll.insert_many([{"_id": 1, "a": 1, "b": 1}, {"_id": 2, "a": 1}, {"_id": 3, "a": 1}])
    start = db.command("changeStreamBounds", "c")["current"]
    with client.start_session() as s:
        with s.start_transaction():
            coll.update_one({"_id": 1}, {"$set": {"a": 2}}, session=s)
            coll.update_one({"_id": 1}, {"$set": {"a": 3, "c": 1}}, session=s)
            coll.insert_one({"_id": 4, "x": 1}, session=s)
            coll.delete_one({"_id": 4}, session=s)
            coll.update_one({"_id": 2}, {"$set": {"a": 5}}, session=s)
            coll.update_one({"_id": 2}, {"$set": {"a": 1}}, session=s)
            coll.insert_one({"_id": 5, "y": 1}, session=s)
            coll.update_one({"_id": 5}, {"$inc": {"y": 1}}, session=s)
            coll.delete_one({"_id": 3}, session=s)
    coll.insert_one({"_id": "after"})

    raw = watch(db, "c", {"resumeAfter": start}, 10)
    assert len(raw) == 10, f"without the option every event: {[e['operationType'] for e in raw]}"

    net = watch(db, "c", {"resumeAfter": start, "transactionNetEffect": True}, 4)
    got = [(e["operationType"], e["documentKey"]["_id"]) for e in net]
    assert got == [("update", 1), ("insert", 5), ("delete", 3), ("insert", "after")], got
    update = net[0]["updateDescription"]
    assert update["updatedFields"] == {"a": 3, "c": 1} and update["removedFields"] == [], update
    assert net[1]["fullDocument"] == {"_id": 5, "y": 2}, net[1]
    assert len({e["clusterTime"] for e in net[:3]}) == 1, "one transaction, one cluster time"

    # Each folded event's token resumes exactly after it.
    for i, event in enumerate(net[:3]):
        rest = watch(db, "c", {"resumeAfter": event["_id"], "transactionNetEffect": True},
                     len(net) - i - 1)
        assert [e["_id"] for e in rest] == [e["_id"] for e in net[i + 1:]], (i, rest)


def the_option_is_checked(client):
    db = client[f"net_{uuid.uuid4().hex[:8]}"]
    try:
        db.command("aggregate", "c", pipeline=[{"$changeStream": {
            "transactionNetEffect": True, "showRawUpdateDescription": True}}], cursor={})
        raise AssertionError("transactionNetEffect with showRawUpdateDescription was taken")
    except Exception as e:  # noqa: BLE001 - the code is what is checked
        assert getattr(e, "code", None) == 2, e
    try:
        db.command("aggregate", "c", pipeline=[{"$changeStream": {
            "transactionNetEffect": 1}}], cursor={})
        raise AssertionError("a non-boolean transactionNetEffect was taken")
    except Exception as e:  # noqa: BLE001
        assert getattr(e, "code", None) == 14, e


if __name__ == "__main__":
    sys.exit(run_checks(uri_from_argv(), [folded_transaction, the_option_is_checked],
                        "transactionNetEffect"))
