"""Unacknowledged (w: 0) writes with hints, through pymongo.

Usage: python3 tests/py/unacknowledged_writes.py mongodb://127.0.0.1:PORT/

The CRUD spec's `*-hint-unacknowledged` tests cannot run in the Rust runner (the mongodb 3.9
crate refuses every w: 0 write client-side), so these checks send the same writes through
pymongo, which sends `insert`/`update`/`delete` with OP_MSG's moreToCome flag (no reply) and
`findAndModify` with `writeConcern: {w: 0}`. Each check then waits, through an acknowledged
client, for the write's effect: the same data the spec tests expect in their outcome. The
last line is "N passed, N failed" and the exit status is non-zero if a check failed.
"""

import os
import sys
import time

from pymongo import WriteConcern

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402

WAIT_S = 10
HINTS = ["_id_", [("_id", 1)]]


def fresh(client, name):
    """The collection `name` holding {_id: 1, x: 11}, {_id: 2, x: 22}, and a w: 0 handle."""
    coll = client["unack_tests"][name]
    coll.drop()
    coll.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 22}])
    return coll, coll.with_options(write_concern=WriteConcern(w=0))


def eventually(coll, expected):
    """Waits until the collection holds exactly `expected` (ordered by _id)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        have = list(coll.find().sort("_id", 1))
        if have == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError("expected %r, have %r" % (expected, have))
        time.sleep(0.05)


def check_delete_one_and_many_with_hint(client):
    for hint in HINTS:
        coll, unack = fresh(client, "delete")
        result = unack.delete_one({"_id": {"$gt": 1}}, hint=hint)
        assert not result.acknowledged
        eventually(coll, [{"_id": 1, "x": 11}])
        coll, unack = fresh(client, "delete")
        unack.delete_many({"_id": {"$gt": 0}}, hint=hint)
        eventually(coll, [])


def check_update_one_many_and_replace_one_with_hint(client):
    for hint in HINTS:
        coll, unack = fresh(client, "update")
        result = unack.update_one({"_id": {"$gt": 1}}, {"$inc": {"x": 1}}, hint=hint)
        assert not result.acknowledged
        eventually(coll, [{"_id": 1, "x": 11}, {"_id": 2, "x": 23}])
        unack.update_many({"_id": {"$gt": 0}}, {"$inc": {"x": 1}}, hint=hint)
        eventually(coll, [{"_id": 1, "x": 12}, {"_id": 2, "x": 24}])
        unack.replace_one({"_id": 1}, {"x": 111}, hint=hint)
        eventually(coll, [{"_id": 1, "x": 111}, {"_id": 2, "x": 24}])


def check_find_one_and_modify_with_hint(client):
    for hint in HINTS:
        coll, unack = fresh(client, "fam")
        unack.find_one_and_update({"_id": {"$gt": 1}}, {"$inc": {"x": 1}}, hint=hint)
        eventually(coll, [{"_id": 1, "x": 11}, {"_id": 2, "x": 23}])
        unack.find_one_and_replace({"_id": 1}, {"x": 33}, hint=hint)
        eventually(coll, [{"_id": 1, "x": 33}, {"_id": 2, "x": 23}])
        unack.find_one_and_delete({"_id": {"$gt": 1}}, hint=hint)
        eventually(coll, [{"_id": 1, "x": 33}])


def check_unacknowledged_insert_is_applied_once(client):
    coll, unack = fresh(client, "insert")
    result = unack.insert_one({"_id": 3, "x": 33})
    assert not result.acknowledged
    eventually(coll, [{"_id": 1, "x": 11}, {"_id": 2, "x": 22}, {"_id": 3, "x": 33}])
    # A failing w: 0 write (duplicate key) leaves the data alone and the connection usable.
    unack.insert_one({"_id": 3, "x": 99})
    unack.insert_one({"_id": 4, "x": 44})
    eventually(
        coll,
        [{"_id": 1, "x": 11}, {"_id": 2, "x": 22}, {"_id": 3, "x": 33}, {"_id": 4, "x": 44}],
    )


CHECKS = [
    check_delete_one_and_many_with_hint,
    check_update_one_many_and_replace_one_with_hint,
    check_find_one_and_modify_with_hint,
    check_unacknowledged_insert_is_applied_once,
]


def main(uri):
    status = run_checks(uri, CHECKS, "unacknowledged writes")
    return status


if __name__ == "__main__":
    sys.exit(main(uri_from_argv()))
