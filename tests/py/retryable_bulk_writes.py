"""The retryable-writes spec tests of collection-level bulkWrite, run through pymongo.

Usage: python3 tests/py/retryable_bulk_writes.py mongodb://127.0.0.1:PORT/ [SPEC_DIR]

The Rust runner carries out collection-level `bulkWrite` itself (the mongodb 3.9 crate has
none) and cannot make its batches retryable writes, so it lists these tests as known
failures. pymongo's `bulk_write` is a real driver's: it numbers each batch (`txnNumber`) and
retries it once after a retryable error. This script reads the spec files unchanged
(`retryable-writes/bulkWrite*.json` under SPEC_DIR, default `../shared/spec-tests`), runs each
test that applies to the server's topology (sharded or replica set) and checks what the files
expect: results, errors and their labels, the collection afterwards, and the commands sent
(command names and the fields the files name, with `$$exists`). It knows only what these
files use and fails on anything else. Tests that cannot pass yet are listed in `KNOWN` with the
reason. The last line counts them; the exit status is non-zero if a test failed (a listed one
that passes counts as failed).
"""

import glob
import json
import os
import sys

from pymongo import (
    DeleteMany,
    DeleteOne,
    InsertOne,
    MongoClient,
    ReplaceOne,
    UpdateMany,
    UpdateOne,
)
from pymongo.errors import BulkWriteError, PyMongoError
from pymongo.monitoring import CommandListener

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests that cannot pass yet, with the reason; one that passes fails the script (the list stays
# true). In these three, `onPrimaryTransactionalWrite` fails a statement before it commits
# and closes the connection, on the first attempt and on the retry; pymongo then raises the
# retry's network error (AutoReconnect), where the spec expects an error that carries the
# partial result. The fail point closes the connection as MongoDB's does (its
# `closeConnection` defaults to true in transaction_participant.cpp); reporting a partial
# result with a network error is a driver feature pymongo lacks (PYTHON-4597; its own runner
# skips these three). The Rust spec runner's bulkWrite carries one and passes them.
KNOWN = {
    ("replicaset", "First insertOne is never committed"),
    ("replicaset", "Second updateOne is never committed"),
    ("replicaset", "Third updateOne is never committed"),
}
DEFAULT_SPECS = os.path.join(HERE, "..", "..", "..", "shared", "spec-tests")


class Started(CommandListener):
    def __init__(self):
        self.events = []

    def started(self, event):
        if event.command_name not in ("hello", "isMaster", "ping", "endSessions"):
            self.events.append((event.command_name, event.command))

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


def topology_of(client):
    hello = client.admin.command("hello")
    return "sharded" if hello.get("msg") == "isdbgrid" else "replicaset"


def applies(requirements, topology):
    if not requirements:
        return True
    return any(topology in r.get("topologies", [topology]) for r in requirements)


def models(requests):
    out = []
    for r in requests:
        (kind, spec), = r.items()
        extra = {k: v for k, v in spec.items() if k in ("upsert", "collation", "hint", "arrayFilters")}
        if kind == "insertOne":
            out.append(InsertOne(spec["document"]))
        elif kind == "updateOne":
            out.append(UpdateOne(spec["filter"], spec["update"], **extra))
        elif kind == "updateMany":
            out.append(UpdateMany(spec["filter"], spec["update"], **extra))
        elif kind == "replaceOne":
            out.append(ReplaceOne(spec["filter"], spec["replacement"], **extra))
        elif kind == "deleteOne":
            out.append(DeleteOne(spec["filter"], **extra))
        elif kind == "deleteMany":
            out.append(DeleteMany(spec["filter"], **extra))
        else:
            raise AssertionError("request %s is not supported by this script" % kind)
    return out


def matches(expected, actual, path="result"):
    """The unified format's matching, as far as these files use it."""
    if isinstance(expected, dict) and len(expected) == 1:
        (op, arg), = expected.items()
        if op == "$$unsetOrMatches":
            if actual is None:
                return
            return matches(arg, actual, path)
        if op == "$$exists":
            assert (actual is not None) == arg, "%s: $$exists %s, found %r" % (path, arg, actual)
            return
        assert not op.startswith("$$"), "%s: operator %s is not supported" % (path, op)
    if isinstance(expected, dict):
        assert isinstance(actual, dict), "%s: expected a document, found %r" % (path, actual)
        for k, v in expected.items():
            matches(v, actual.get(k), "%s.%s" % (path, k))
        return
    assert expected == actual, "%s: expected %r, found %r" % (path, expected, actual)


def result_doc(r):
    """A pymongo bulk result (or a BulkWriteError's details) as the spec files name it."""
    if isinstance(r, dict):
        upserted = {str(u["index"]): u["_id"] for u in r.get("upserted", [])}
        return {
            "insertedCount": r.get("nInserted", 0),
            "matchedCount": r.get("nMatched", 0),
            "modifiedCount": r.get("nModified", 0),
            "deletedCount": r.get("nRemoved", 0),
            "upsertedCount": r.get("nUpserted", 0),
            "upsertedIds": upserted,
        }
    return {
        "insertedCount": r.inserted_count,
        "matchedCount": r.matched_count,
        "modifiedCount": r.modified_count,
        "deletedCount": r.deleted_count,
        "upsertedCount": r.upserted_count,
        "upsertedIds": {str(k): v for k, v in r.upserted_ids.items()},
    }


def labels_of(e):
    if isinstance(e, BulkWriteError):
        labels = set(e.details.get("errorLabels", []))
        wce = e.details.get("writeConcernErrors", [])
        for w in wce:
            labels.update(w.get("errorLabels", []))
        return labels | set(getattr(e, "_error_labels", set()))
    return set(getattr(e, "_error_labels", set()))


def run_test(uri, file_doc, test):
    listener = Started()
    client = MongoClient(uri, event_listeners=[listener], serverSelectionTimeoutMS=10_000)
    admin = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    failpoints = []
    try:
        for data in file_doc.get("initialData", []):
            coll = admin[data["databaseName"]][data["collectionName"]]
            coll.drop()
            if data["documents"]:
                coll.insert_many(data["documents"])
            else:
                coll.database.create_collection(coll.name)
        (db_entity,) = [e["database"] for e in file_doc["createEntities"] if "database" in e]
        (coll_entity,) = [e["collection"] for e in file_doc["createEntities"] if "collection" in e]
        coll = client[db_entity["databaseName"]][coll_entity["collectionName"]]
        listener.events.clear()
        for op in test["operations"]:
            args = op.get("arguments", {})
            if op["name"] == "failPoint":
                admin.admin.command(args["failPoint"])
                failpoints.append(args["failPoint"]["configureFailPoint"])
                continue
            assert op["name"] == "bulkWrite", "operation %s is not supported" % op["name"]
            unknown = set(args) - {"requests", "ordered"}
            assert not unknown, "bulkWrite arguments %s are not supported" % unknown
            try:
                result = coll.bulk_write(models(args["requests"]), ordered=args.get("ordered", True))
                error = None
            except PyMongoError as e:
                result, error = None, e
            if "expectError" in op:
                expect = op["expectError"]
                assert error is not None, "expected an error, got %r" % result_doc(result)
                for k, v in expect.items():
                    if k == "isError":
                        continue
                    elif k == "errorLabelsContain":
                        assert set(v) <= labels_of(error), "labels %s, want %s" % (labels_of(error), v)
                    elif k == "errorLabelsOmit":
                        assert not (set(v) & labels_of(error)), "labels %s" % labels_of(error)
                    elif k == "expectResult":
                        assert isinstance(error, BulkWriteError), error
                        matches(v, result_doc(error.details))
                    else:
                        raise AssertionError("expectError.%s is not supported" % k)
            else:
                assert error is None, "unexpected error: %r" % error
                if "expectResult" in op:
                    matches(op["expectResult"], result_doc(result))
        for data in test.get("outcome", []):
            have = list(admin[data["databaseName"]][data["collectionName"]].find().sort("_id", 1))
            assert have == data["documents"], "outcome: expected %r, found %r" % (data["documents"], have)
        for expected in test.get("expectEvents", []):
            want = expected["events"]
            have = listener.events
            assert len(have) == len(want), "events: expected %d, found %s" % (
                len(want),
                [n for n, _ in have],
            )
            for w, (name, command) in zip(want, have):
                spec = w["commandStartedEvent"]
                if "commandName" in spec:
                    assert spec["commandName"] == name, (spec["commandName"], name)
                if "command" in spec:
                    matches(spec["command"], command, name)
    finally:
        for fp in failpoints:
            admin.admin.command({"configureFailPoint": fp, "mode": "off"})
        client.close()
        admin.close()


def main(uri, spec_dir):
    topology = topology_of(MongoClient(uri, serverSelectionTimeoutMS=10_000))
    passed = failed = skipped = known_failed = 0
    for path in sorted(glob.glob(os.path.join(spec_dir, "retryable-writes", "bulkWrite*.json"))):
        file_doc = json.load(open(path))
        name = os.path.relpath(path, spec_dir)
        for test in file_doc["tests"]:
            if not applies(file_doc.get("runOnRequirements"), topology) or not applies(
                test.get("runOnRequirements"), topology
            ):
                skipped += 1
                continue
            known = (topology, test["description"]) in KNOWN
            try:
                run_test(uri, file_doc, test)
            except Exception as e:  # noqa: BLE001 - each test is reported on its own
                if known:
                    known_failed += 1
                    print("known %s: %s: %s" % (name, test["description"], e))
                else:
                    failed += 1
                    print("FAIL  %s: %s: %s" % (name, test["description"], e))
                continue
            if known:
                failed += 1
                print("FAIL  %s: %s: passes, but is listed as a known failure" % (name, test["description"]))
            else:
                passed += 1
                print("ok    %s: %s" % (name, test["description"]))
    print(
        "%d passed, %d failed, %d known failures, %d skipped: retryable bulk writes (%s)"
        % (passed, failed, known_failed, skipped, topology)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    uri = sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/"
    specs = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_SPECS
    sys.exit(main(uri, specs))
