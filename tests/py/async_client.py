"""pymongo's asyncio client (AsyncMongoClient) against a live Tributary server.

Usage: python3 tests/py/async_client.py mongodb://127.0.0.1:PORT/

Writes and reads back; watches a collection and sees insert, update and delete; resumes the same
change stream on its own after a second client finds its server-side cursor with
`currentOp {idleCursors: true}` and kills it (no event lost, none repeated); commits a
two-document transaction (both visible, both events with the session's lsid and one txnNumber)
and aborts another (nothing left, no event); reads an update's pre-image from a collection with
changeStreamPreAndPostImages. Each check runs on its own, on its own database, within
CHECK_S seconds; the last line is "N passed, N failed" and the exit status is non-zero if any
check failed.
"""

import asyncio
import os
import sys
import time
import traceback
import uuid

from pymongo import AsyncMongoClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import Tally  # noqa: E402

WAIT_S = 15
# A check that hangs (a reply that never comes) fails instead of stalling the suite.
CHECK_S = 60


async def next_event(stream):
    """The next event, waiting at most WAIT_S seconds."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ev = await stream.try_next()
        if ev is not None:
            return ev
    raise AssertionError("no change event within %ss" % WAIT_S)


def fresh_db(client):
    return client["pyasync_" + uuid.uuid4().hex[:8]]


async def idle_cursor_ids(client, ns):
    """The ids of the idle cursors on `ns` ("db.coll") that currentOp reports."""
    reply = await client.admin.command({"currentOp": 1, "idleCursors": True})
    return [
        op["cursor"]["cursorId"]
        for op in reply["inprog"]
        if op.get("type") == "idleCursor" and op.get("ns") == ns
    ]


async def check_writes_are_read_back(client, uri):
    db = fresh_db(client)
    coll = db.fruit
    await coll.insert_one({"_id": "apple", "qty": 1})
    await coll.insert_many([{"_id": "pear", "qty": 2}, {"_id": "plum", "qty": 3}])
    res = await coll.update_one({"_id": "apple"}, {"$inc": {"qty": 10}})
    assert (res.matched_count, res.modified_count) == (1, 1), res.raw_result
    res = await coll.delete_one({"_id": "pear"})
    assert res.deleted_count == 1, res.raw_result
    docs = await coll.find().sort("_id", 1).to_list()
    assert docs == [{"_id": "apple", "qty": 11}, {"_id": "plum", "qty": 3}], docs
    assert await coll.count_documents({}) == 2
    await client.drop_database(db.name)


async def check_watch_sees_insert_update_delete(client, uri):
    db = fresh_db(client)
    coll = db.c
    await coll.insert_one({"_id": 0})
    async with await coll.watch(max_await_time_ms=200) as stream:
        await coll.insert_one({"_id": 1, "a": 1})
        await coll.update_one({"_id": 1}, {"$set": {"a": 2}})
        await coll.delete_one({"_id": 1})
        ins = await next_event(stream)
        assert ins["operationType"] == "insert", ins
        assert ins["documentKey"] == {"_id": 1}, ins
        assert ins["fullDocument"] == {"_id": 1, "a": 1}, ins
        assert ins["ns"] == {"db": db.name, "coll": "c"}, ins
        upd = await next_event(stream)
        assert upd["operationType"] == "update", upd
        assert upd["documentKey"] == {"_id": 1}, upd
        assert upd["updateDescription"]["updatedFields"] == {"a": 2}, upd
        dele = await next_event(stream)
        assert dele["operationType"] == "delete", dele
        assert dele["documentKey"] == {"_id": 1}, dele
    await client.drop_database(db.name)


async def check_stream_resumes_after_another_client_kills_its_cursor(client, uri):
    db = fresh_db(client)
    coll = db.c
    ns = "%s.c" % db.name
    await coll.insert_one({"_id": 0})
    async with AsyncMongoClient(uri, serverSelectionTimeoutMS=10_000) as other:
        async with await coll.watch(max_await_time_ms=200) as stream:
            await coll.insert_one({"_id": 1})
            assert (await next_event(stream))["documentKey"] == {"_id": 1}
            # Written before the kill and not yet read: the resumed stream must still see it.
            await coll.insert_one({"_id": 2})
            ids = await idle_cursor_ids(other, ns)
            assert len(ids) == 1, "idle cursors on %s: %r" % (ns, ids)
            killed = ids[0]
            reply = await other[db.name].command({"killCursors": "c", "cursors": [killed]})
            assert reply["cursorsKilled"] == [killed], reply
            await coll.insert_one({"_id": 3})
            # The next getMore fails with CursorNotFound: the driver resumes transparently.
            got = [(await next_event(stream))["documentKey"]["_id"] for _ in range(2)]
            assert got == [2, 3], got
            # No duplicate: the event after 3 is the marker written now.
            await coll.insert_one({"_id": "marker"})
            ev = await next_event(stream)
            assert ev["documentKey"] == {"_id": "marker"}, ev
            ids = await idle_cursor_ids(other, ns)
            assert len(ids) == 1 and ids[0] != killed, "after the resume: %r" % ids
    await client.drop_database(db.name)


async def check_committed_transaction_shows_both_inserts_with_one_lsid_and_txn_number(
    client, uri
):
    db = fresh_db(client)
    coll = db.orders
    await coll.insert_one({"_id": 0})
    async with await coll.watch(max_await_time_ms=200) as stream:

        async def insert_two(session):
            await coll.insert_one({"_id": "o1", "qty": 1}, session=session)
            await coll.insert_one({"_id": "o2", "qty": 2}, session=session)

        async with client.start_session() as session:
            await session.with_transaction(insert_two)
            lsid = session.session_id
        docs = await coll.find({"_id": {"$in": ["o1", "o2"]}}).sort("_id", 1).to_list()
        assert docs == [{"_id": "o1", "qty": 1}, {"_id": "o2", "qty": 2}], docs
        await coll.insert_one({"_id": "after"})
        events = [await next_event(stream) for _ in range(3)]
        kinds = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
        assert kinds == [("insert", "o1"), ("insert", "o2"), ("insert", "after")], kinds
        first, second = events[:2]
        assert first["lsid"]["id"] == lsid["id"], (first.get("lsid"), lsid)
        assert second["lsid"] == first["lsid"], (first.get("lsid"), second.get("lsid"))
        assert "txnNumber" in first, first
        assert second["txnNumber"] == first["txnNumber"], (first, second)
        assert first["clusterTime"] == second["clusterTime"], "not one commit time"
    await client.drop_database(db.name)


async def check_aborted_transaction_leaves_nothing(client, uri):
    db = fresh_db(client)
    coll = db.c
    await coll.insert_one({"_id": 0})
    async with await coll.watch(max_await_time_ms=200) as stream:
        async with client.start_session() as session:
            await session.start_transaction()
            await coll.insert_one({"_id": "never1"}, session=session)
            await coll.insert_one({"_id": "never2"}, session=session)
            assert await coll.count_documents({}, session=session) == 3
            await session.abort_transaction()
        await coll.insert_one({"_id": "marker"})
        ev = await next_event(stream)
        assert ev["documentKey"] == {"_id": "marker"}, "an aborted transaction showed: %r" % ev
        ids = await coll.distinct("_id")
        assert sorted(map(str, ids)) == ["0", "marker"], ids
    await client.drop_database(db.name)


async def check_update_event_carries_its_pre_image(client, uri):
    db = fresh_db(client)
    coll = await db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    before = {"_id": 1, "name": "widget", "qty": 5}
    await coll.insert_one(before)
    async with await coll.watch(
        full_document_before_change="required", max_await_time_ms=200
    ) as stream:
        await coll.update_one({"_id": 1}, {"$set": {"qty": 6}, "$unset": {"name": ""}})
        ev = await next_event(stream)
        assert ev["operationType"] == "update", ev
        assert ev["fullDocumentBeforeChange"] == before, ev
    await client.drop_database(db.name)


CHECKS = [
    check_writes_are_read_back,
    check_watch_sees_insert_update_delete,
    check_stream_resumes_after_another_client_kills_its_cursor,
    check_committed_transaction_shows_both_inserts_with_one_lsid_and_txn_number,
    check_aborted_transaction_leaves_nothing,
    check_update_event_carries_its_pre_image,
]


async def main(uri):
    tally = Tally()
    async with AsyncMongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        await client.admin.command("ping")
        for check in CHECKS:
            try:
                await asyncio.wait_for(check(client, uri), CHECK_S)
                tally.ok(check.__name__)
            except Exception:  # noqa: BLE001 - each check is reported on its own
                tally.fail(check.__name__)
    return tally.summary("pymongo AsyncMongoClient")


if __name__ == "__main__":
    uri = sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/"
    try:
        sys.exit(asyncio.run(main(uri)))
    except Exception:  # noqa: BLE001 - no server, or the client would not start
        traceback.print_exc()
        print("0 passed, 1 failed: pymongo AsyncMongoClient")
        sys.exit(1)
