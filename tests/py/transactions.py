"""pymongo multi-document transactions against a live Tributary server.

Usage: python3 tests/py/transactions.py mongodb://127.0.0.1:PORT/

Runs with_transaction (the convenient API, with its retry of transient errors), watches the
committed transaction arrive as one event per operation with its lsid and txnNumber, checks that
an aborted transaction leaves nothing and produces no event, and that a write conflict between
two transactions is labelled TransientTransactionError. Each check runs on its own; the last line
is "N passed, N failed" and the exit status is non-zero if any check failed.
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
    return client["pytxn_" + uuid.uuid4().hex[:8]]


def check_with_transaction_and_its_events(client):
    db = fresh_db(client)
    coll = db.accounts
    coll.insert_many([{"_id": "alice", "balance": 100}, {"_id": "bob", "balance": 0}])
    with coll.watch(max_await_time_ms=200) as stream:

        def transfer(session):
            coll.update_one({"_id": "alice"}, {"$inc": {"balance": -30}}, session=session)
            coll.update_one({"_id": "bob"}, {"$inc": {"balance": 30}}, session=session)
            coll.insert_one({"_id": "log1", "amount": 30}, session=session)

        with client.start_session() as session:
            session.with_transaction(transfer)
            lsid = session.session_id
        coll.insert_one({"_id": "after"})
        events = [next_event(stream) for _ in range(4)]
        kinds = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
        assert kinds == [
            ("update", "alice"),
            ("update", "bob"),
            ("insert", "log1"),
            ("insert", "after"),
        ], kinds
        txn = events[:3]
        assert len({e["clusterTime"] for e in txn}) == 1, "one commit time: %r" % txn
        for e in txn:
            # The session as the server keys it: the driver's id and its owner's uid (the
            # SHA-256 of the user), as MongoDB's events carry it.
            assert e["lsid"]["id"] == lsid["id"], e
            assert len(e["lsid"]["uid"]) == 32, e
            assert e["txnNumber"] == txn[0]["txnNumber"], e
        assert "txnNumber" not in events[3], events[3]
    balances = {d["_id"]: d.get("balance") for d in coll.find()}
    assert balances["alice"] == 70 and balances["bob"] == 30, balances
    client.drop_database(db.name)


def check_abort_leaves_nothing(client):
    db = fresh_db(client)
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as stream:
        with client.start_session() as session:
            session.start_transaction()
            coll.insert_one({"_id": "never"}, session=session)
            coll.delete_one({"_id": 0}, session=session)
            assert coll.count_documents({}, session=session) == 1
            session.abort_transaction()
        coll.insert_one({"_id": "marker"})
        ev = next_event(stream)
        assert ev["documentKey"] == {"_id": "marker"}, "an aborted transaction showed: %r" % ev
    assert sorted(str(d["_id"]) for d in coll.find()) == ["0", "marker"]
    client.drop_database(db.name)


def check_write_conflict_is_transient(client):
    db = fresh_db(client)
    coll = db.c
    coll.insert_one({"_id": 1, "n": 0})
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
        try:
            coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s2)
            raise AssertionError("the second transaction's write did not conflict")
        except OperationFailure as e:
            assert e.code == 112, e.details
            assert e.has_error_label("TransientTransactionError"), e.details
        s2.abort_transaction()
        s1.commit_transaction()
    assert coll.find_one({"_id": 1})["n"] == 1
    client.drop_database(db.name)


CHECKS = [
    check_with_transaction_and_its_events,
    check_abort_leaves_nothing,
    check_write_conflict_is_transient,
]


def main(uri):
    return run_checks(uri, CHECKS, "pymongo transactions")


if __name__ == "__main__":
    sys.exit(main(uri_from_argv()))
