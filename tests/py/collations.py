"""Collations through pymongo, as an application uses them.

Usage: python3 tests/py/collations.py mongodb://127.0.0.1:PORT/

pymongo's `Collation` on find, sort, count, distinct, update, delete, aggregate and indexes;
a collection's default collation; a case-insensitive unique index; numeric ordering. The
last line is "N passed, N failed" and the exit status is non-zero if a check failed.
"""

import os
import sys

from pymongo import ASCENDING
from pymongo.collation import Collation, CollationStrength
from pymongo.errors import DuplicateKeyError, OperationFailure

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402

CASELESS = Collation(locale="en", strength=CollationStrength.SECONDARY)


def fresh(client, name, **options):
    db = client["collation_tests"]
    db.drop_collection(name)
    return db.create_collection(name, **options)


def names(cursor):
    return [d["name"] for d in cursor]


def check_queries_and_sorts_follow_the_collation(client):
    coll = fresh(client, "people")
    coll.insert_many(
        [{"_id": i, "name": n} for i, n in enumerate(["bob", "Bob", "BOB", "alice", "Éve", "eve"])]
    )
    assert names(coll.find({"name": "bob"}).sort("_id", ASCENDING)) == ["bob"]
    found = coll.find({"name": "bob"}, collation=CASELESS).sort("_id", ASCENDING)
    assert names(found) == ["bob", "Bob", "BOB"]
    accentless = Collation(locale="fr", strength=CollationStrength.PRIMARY)
    assert coll.count_documents({"name": "EVE"}, collation=accentless) == 2
    binary = names(coll.find({}, {"name": 1}).sort([("name", 1), ("_id", 1)]))
    assert binary[0] == "BOB" and binary[-1] == "Éve", binary
    english = names(
        coll.find({}, {"name": 1}, collation=Collation(locale="en")).sort([("name", 1), ("_id", 1)])
    )
    assert english[0] == "alice" and english[-1] == "Éve", english
    # Strength 2 folds case, not accents: one "bob", and "eve" apart from "Éve".
    distinct = coll.distinct("name", {"name": {"$ne": "alice"}}, collation=CASELESS)
    assert sorted(v.lower() for v in distinct) == ["bob", "eve", "éve"], distinct


def check_writes_follow_the_collation(client):
    coll = fresh(client, "tags")
    coll.insert_many([{"_id": 1, "t": "Red"}, {"_id": 2, "t": "RED"}, {"_id": 3, "t": "blue"}])
    assert coll.update_many({"t": "red"}, {"$set": {"hit": True}}).modified_count == 0
    assert coll.update_many({"t": "red"}, {"$set": {"hit": True}}, collation=CASELESS).modified_count == 2
    assert coll.delete_many({"t": "BLUE"}, collation=CASELESS).deleted_count == 1
    grouped = list(
        coll.aggregate([{"$group": {"_id": "$t", "n": {"$sum": 1}}}], collation=CASELESS)
    )
    assert len(grouped) == 1 and grouped[0]["n"] == 2, grouped


def check_numeric_ordering(client):
    coll = fresh(client, "files")
    coll.insert_many([{"name": n} for n in ["file10", "file9", "file100", "file1"]])
    numeric = Collation(locale="en", numericOrdering=True)
    assert names(coll.find({}, collation=numeric).sort("name", 1)) == [
        "file1",
        "file9",
        "file10",
        "file100",
    ]


def check_default_collation_and_caseless_unique_index(client):
    coll = fresh(client, "users", collation=CASELESS)
    options = coll.options()
    assert options["collation"]["locale"] == "en" and options["collation"]["strength"] == 2, options
    coll.create_index("email", unique=True)
    index = coll.index_information()["email_1"]
    assert index["collation"]["strength"] == 2, index
    coll.insert_one({"email": "Ada@Example.com"})
    try:
        coll.insert_one({"email": "ada@example.COM"})
    except DuplicateKeyError:
        pass
    else:
        raise AssertionError("a case variant of a unique key was accepted")
    assert coll.find_one({"email": "ADA@EXAMPLE.COM"}) is not None
    simple = Collation(locale="simple")
    assert coll.find_one({"email": "ADA@EXAMPLE.COM"}, collation=simple) is None


def check_bad_collations_are_refused(client):
    coll = fresh(client, "bad")
    for bad, code in [({"locale": "xx"}, 2), ({"locale": "en", "strength": 7}, 51024)]:
        try:
            coll.database.command({"find": "bad", "filter": {}, "collation": bad})
        except OperationFailure as e:
            assert e.code == code, (bad, e.code)
        else:
            raise AssertionError("collation %r was accepted" % bad)


CHECKS = [
    check_queries_and_sorts_follow_the_collation,
    check_writes_follow_the_collation,
    check_numeric_ordering,
    check_default_collation_and_caseless_unique_index,
    check_bad_collations_are_refused,
]


def main(uri):
    return run_checks(uri, CHECKS, "collations")


if __name__ == "__main__":
    sys.exit(main(uri_from_argv()))
