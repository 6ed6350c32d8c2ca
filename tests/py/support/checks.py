"""What the pymongo check scripts share: run each check on its own against one server.

Each check is a function taking a MongoClient. A failing check prints its traceback and the
rest still run; the last line is "N passed, N failed: <label>", and the exit status is non-zero
if any check failed. (This folder is not run by scripts/test.sh, which runs tests/py/*.py.)
"""

import sys
import traceback

from pymongo import MongoClient

DEFAULT_URI = "mongodb://127.0.0.1:27017/"


class Tally:
    """Checks as they end: each printed `ok` or `FAIL` (with the exception being handled), and
    the summary line."""

    def __init__(self):
        self.passed = self.failed = 0

    def ok(self, name):
        self.passed += 1
        print("ok    %s" % name)

    def fail(self, name):
        """Call from an `except` block: prints its traceback."""
        self.failed += 1
        print("FAIL  %s" % name)
        traceback.print_exc()

    def summary(self, label):
        """Prints the last line; returns the exit status."""
        print("%d passed, %d failed: %s" % (self.passed, self.failed, label))
        return 1 if self.failed else 0


def run_checks(uri, checks, label):
    """Runs `checks` against `uri`; returns the exit status."""
    client = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    client.admin.command("ping")
    tally = Tally()
    for check in checks:
        try:
            check(client)
            tally.ok(check.__name__)
        except Exception:  # noqa: BLE001 - each check is reported on its own
            tally.fail(check.__name__)
    client.close()
    return tally.summary(label)


def uri_from_argv():
    return sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URI
