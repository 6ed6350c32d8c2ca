"""pymongo change-stream interop against a live Tributary server.

Usage: python3 tests/py/change_streams.py mongodb://127.0.0.1:PORT/

Watches a collection, a database and the whole cluster; sees every event type (insert, update,
replace, delete, drop, rename, dropDatabase, invalidate); resumes after the server-side cursor is
killed; restarts with startAfter from an invalidate after a drop, and resumes such a stream after
its cursor is killed (pymongo's own startAfter resume tests). Each check runs on its own;
the last line is "N passed, N failed" and the exit status is non-zero if any check failed.
"""

import os
import sys
import time
import uuid

from pymongo import MongoClient
from pymongo.errors import OperationFailure

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402

WAIT_S = 15


def next_event(stream):
    """The next event, waiting at most WAIT_S seconds."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ev = stream.try_next()
        if ev is not None:
            return ev
    raise AssertionError("no change event within %ss" % WAIT_S)


def fresh_db(client):
    return client["pycs_" + uuid.uuid4().hex[:8]]


def check_collection_events(client):
    db = fresh_db(client)
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
        coll.insert_one({"_id": 1, "a": 1})
        coll.update_one({"_id": 1}, {"$set": {"a": 2}, "$unset": {"zz": 1}})
        coll.replace_one({"_id": 1}, {"b": 1})
        coll.delete_one({"_id": 1})
        coll.drop()
        ins = next_event(stream)
        assert ins["operationType"] == "insert", ins
        assert ins["fullDocument"] == {"_id": 1, "a": 1}, ins
        assert ins["ns"] == {"db": db.name, "coll": "c"}, ins
        assert ins["documentKey"] == {"_id": 1}, ins
        assert "clusterTime" in ins and "wallTime" in ins, ins
        upd = next_event(stream)
        assert upd["operationType"] == "update", upd
        assert upd["updateDescription"]["updatedFields"] == {"a": 2}, upd
        assert upd["fullDocument"] in ({"_id": 1, "a": 2}, {"_id": 1, "b": 1}, None), upd
        rep = next_event(stream)
        assert rep["operationType"] == "replace", rep
        assert rep["fullDocument"] == {"_id": 1, "b": 1}, rep
        dele = next_event(stream)
        assert dele["operationType"] == "delete" and dele["documentKey"] == {"_id": 1}, dele
        drop = next_event(stream)
        assert drop["operationType"] == "drop", drop
        inv = next_event(stream)
        assert inv["operationType"] == "invalidate", inv
        assert not stream.alive, "the stream stays open after invalidate"
    client.drop_database(db.name)


def check_database_stream(client):
    db = fresh_db(client)
    db.a.insert_one({"_id": 0})
    with db.watch(max_await_time_ms=200) as stream:
        db.a.insert_one({"_id": 1})
        db.b.insert_one({"_id": 2})
        db.a.rename("a2")
        client.drop_database(db.name)
        seen = []
        while True:
            ev = next_event(stream)
            seen.append(ev)
            if ev["operationType"] == "invalidate":
                break
        kinds = [e["operationType"] for e in seen]
        assert kinds[:3] == ["insert", "insert", "rename"], kinds
        assert [e["ns"]["coll"] for e in seen[:2]] == ["a", "b"], seen
        assert seen[2]["to"] == {"db": db.name, "coll": "a2"}, seen[2]
        assert kinds[-2:] == ["dropDatabase", "invalidate"], kinds
        assert set(kinds[3:-2]) <= {"drop"}, kinds


def check_cluster_stream(client):
    db1, db2 = fresh_db(client), fresh_db(client)
    with client.watch(max_await_time_ms=200) as stream:
        db1.x.insert_one({"_id": "one"})
        db2.y.insert_one({"_id": "two"})
        got = []
        while len(got) < 2:
            ev = next_event(stream)
            if ev["ns"]["db"] in (db1.name, db2.name):
                got.append((ev["operationType"], ev["ns"]["db"], ev["documentKey"]["_id"]))
        assert got == [("insert", db1.name, "one"), ("insert", db2.name, "two")], got
    client.drop_database(db1.name)
    client.drop_database(db2.name)


def check_resume_after_killed_cursor(client):
    db = fresh_db(client)
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as stream:
        coll.insert_one({"_id": 1})
        assert next_event(stream)["documentKey"] == {"_id": 1}
        cursor_id = stream._cursor.cursor_id
        assert cursor_id, "the stream has no server cursor"
        reply = db.command("killCursors", "c", cursors=[cursor_id])
        assert cursor_id in reply["cursorsKilled"], reply
        # The next getMore fails with CursorNotFound: pymongo resumes transparently.
        coll.insert_one({"_id": 2})
        coll.insert_one({"_id": 3})
        ids = [next_event(stream)["documentKey"]["_id"] for _ in range(2)]
        assert ids == [2, 3], ids
        assert stream._cursor.cursor_id != cursor_id, "no new cursor after the resume"
    client.drop_database(db.name)


def check_start_after_drop(client):
    db = fresh_db(client)
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as stream:
        coll.drop()
        assert next_event(stream)["operationType"] == "drop"
        inv = next_event(stream)
        assert inv["operationType"] == "invalidate", inv
        token = inv["_id"]
    # resumeAfter an invalidate is refused; startAfter starts after it.
    try:
        coll.watch(resume_after=token).close()
        raise AssertionError("resumeAfter an invalidate token was accepted")
    except OperationFailure as e:
        assert e.code == 260, e.details  # InvalidResumeToken
    coll.insert_one({"_id": "again"})
    with coll.watch(start_after=token, max_await_time_ms=200) as stream:
        ev = next_event(stream)
        assert ev["operationType"] == "insert" and ev["documentKey"] == {"_id": "again"}, ev
    client.drop_database(db.name)


def start_after_resume_process(client, level, with_changes):
    """pymongo's test_start_after_resume_process_with_changes / _without_changes: a stream
    started after an invalidate (the collection or database dropped, and not yet recreated)
    stays open; its cursor killed, the driver resumes it (with startAfter while it has returned
    nothing, resumeAfter once it has) and the next insert arrives."""
    db = fresh_db(client)
    coll = db.w
    coll.insert_one({})
    target = coll if level == "collection" else db
    with target.watch([{"$match": {"operationType": "invalidate"}}]) as stream:
        if level == "collection":
            coll.drop()
        else:
            client.drop_database(db.name)
        token = next_event(stream)["_id"]

    def kill(stream):
        cursor = stream._cursor
        assert cursor.cursor_id, "the stream started after the invalidate was closed"
        db.command("killCursors", cursor._collection.name, cursors=[cursor.cursor_id])

    with target.watch(start_after=token, max_await_time_ms=250) as stream:
        if with_changes:
            coll.insert_one({"_id": 2})
            ev = next_event(stream)
            assert ev["operationType"] == "insert" and ev["fullDocument"] == {"_id": 2}, ev
            assert stream.try_next() is None
        else:
            assert stream.try_next() is None
        kill(stream)
        coll.insert_one({"_id": 3})
        ev = next_event(stream)
        assert ev["operationType"] == "insert" and ev["fullDocument"] == {"_id": 3}, ev
    client.drop_database(db.name)


def check_start_after_resume_collection_with_changes(client):
    start_after_resume_process(client, "collection", True)


def check_start_after_resume_collection_without_changes(client):
    start_after_resume_process(client, "collection", False)


def check_start_after_resume_database_with_changes(client):
    start_after_resume_process(client, "database", True)


def check_start_after_resume_database_without_changes(client):
    start_after_resume_process(client, "database", False)


CHECKS = [
    check_collection_events,
    check_database_stream,
    check_cluster_stream,
    check_resume_after_killed_cursor,
    check_start_after_drop,
    check_start_after_resume_collection_with_changes,
    check_start_after_resume_collection_without_changes,
    check_start_after_resume_database_with_changes,
    check_start_after_resume_database_without_changes,
]


def main(uri):
    return run_checks(uri, CHECKS, "pymongo change streams")


if __name__ == "__main__":
    sys.exit(main(uri_from_argv()))
