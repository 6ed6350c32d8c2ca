"""What the pymongo check scripts share: run each check on its own against one server.

Each check is a function taking a MongoClient. A failing check prints its traceback and the
rest still run; the last line is "N passed, N failed: <label>", and the exit status is non-zero
if any check failed. (This folder is not run by scripts/test.sh, which runs tests/py/*.py.)
"""

import sys
import traceback

from pymongo import MongoClient

DEFAULT_URI = "mongodb://127.0.0.1:27017/"


def run_checks(uri, checks, label):
    """Runs `checks` against `uri`; returns the exit status."""
    client = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    client.admin.command("ping")
    passed = failed = 0
    for check in checks:
        try:
            check(client)
            passed += 1
            print("ok    %s" % check.__name__)
        except Exception:  # noqa: BLE001 - each check is reported on its own
            failed += 1
            print("FAIL  %s" % check.__name__)
            traceback.print_exc()
    client.close()
    print("%d passed, %d failed: %s" % (passed, failed, label))
    return 1 if failed else 0


def uri_from_argv():
    return sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URI
