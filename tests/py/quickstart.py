"""The pymongo walk-through of the guide's "Getting started" (docs/src/getting-started.md), run
against a live Tributary router.

Usage: python3 tests/py/quickstart.py mongodb://127.0.0.1:PORT/
Exits non-zero (with the failing assertion) if any step does not behave as documented.
"""

import sys

from pymongo import MongoClient


def main(uri: str) -> None:
    client = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    db = client.quickstart
    db.people.drop()

    # Insert.
    db.people.insert_one({"name": "Ada", "born": 1815})
    db.people.insert_many([{"name": "Grace", "born": 1906}, {"name": "Edsger", "born": 1930}])

    # Find.
    names = [p["name"] for p in db.people.find({"born": {"$gt": 1900}}).sort("born")]
    assert names == ["Grace", "Edsger"], names

    # Update.
    result = db.people.update_one({"name": "Ada"}, {"$set": {"field": "computing"}})
    assert result.modified_count == 1, result.raw_result
    ada = db.people.find_one({"name": "Ada"}, {"_id": 0})
    assert ada == {"name": "Ada", "born": 1815, "field": "computing"}, ada

    # A sharded collection works the same way.
    client.admin.command("shardCollection", "quickstart.events", key={"_id": "hashed"})
    db.events.insert_many([{"_id": i, "kind": "click" if i % 2 else "view"} for i in range(100)])
    assert db.events.count_documents({"kind": "click"}) == 50

    print("1 passed, 0 failed: pymongo quick start")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/")
