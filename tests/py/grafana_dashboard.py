"""The Grafana dashboard (docs/src/operations/grafana-dashboard.json) against a live router's
/metrics: every series a panel queries is one the router exports, with the labels the panel
groups and selects by.

Usage: python3 tests/py/grafana_dashboard.py [ignored URI]
Starts its own server (TRIBUTARY_BIN, else target/debug/tributary) with --metricsPort on free
ports, makes every kind of traffic the panels chart (writes, a change stream with an event, a
failed command, a $lookup), then checks. The last line is "N passed, N failed"; the exit
status is non-zero on failure.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks  # noqa: E402
from pymongo import MongoClient  # noqa: E402
from pymongo.errors import OperationFailure  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("TRIBUTARY_BIN", os.path.join(ROOT, "target", "debug", "tributary"))
DASHBOARD = os.path.join(ROOT, "docs", "src", "operations", "grafana-dashboard.json")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def exported(text):
    """Each exported series name (counters with _total, histograms with _bucket/_sum/_count)
    mapped to the label names its samples carry."""
    series = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if not m or line.startswith("#"):
            continue
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(2) or ""))
        series.setdefault(m.group(1), set()).update(labels)
    return series


def queried(dashboard):
    """(panel title, expr) of every target."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def the_dashboard_is_well_formed(_client, dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    assert all(p["targets"] and p["gridPos"]["w"] > 0 for p in dashboard["panels"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for title, expr in queried(dashboard):
        for var in re.findall(r"\$([a-z_]+)", expr):
            assert var in variables or var.startswith("__"), (title, var)


def every_queried_series_is_exported(_client, dashboard, series):
    for title, expr in queried(dashboard):
        names = re.findall(r"\btributary_[a-z_]+", expr)
        assert names, (title, expr)
        for name in names:
            assert name in series, f"{title}: {name} is not exported ({sorted(series)})"
            # Labels the query groups by or selects on (the scrape's own `instance` aside).
            used = set()
            for group in re.findall(r"by \(([^)]*)\)", expr):
                used.update(label.strip() for label in group.split(","))
            for selector in re.findall(name + r"\{([^}]*)\}", expr):
                used.update(re.findall(r"([a-z_]+)\s*[!=]~?", selector))
            used -= {"instance", "le"}
            missing = used - series[name]
            assert not missing, f"{title}: {name} has no label {missing} ({series[name]})"


def main():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    work = tempfile.mkdtemp(prefix="tributary-grafana-")
    port, metrics_port = free_port(), free_port()
    server = subprocess.Popen(
        [BINARY, "--port", str(port), "--metricsPort", str(metrics_port), "--dbpath", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(metrics_port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        client = MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=10_000)
        db = client.grafana
        with db.c.watch() as stream:
            db.c.insert_one({"_id": 1, "k": 1})
            db.c.update_one({"_id": 1}, {"$set": {"v": 1}})
            db.c.delete_one({"_id": 1})
            assert stream.try_next() is not None or stream.next() is not None
        db.c.insert_one({"_id": 2, "k": 1})
        db.d.insert_one({"_id": 1, "k": 1})
        list(db.c.aggregate([{"$lookup": {"from": "d", "localField": "k",
                                          "foreignField": "k", "as": "j"}}]))
        try:
            db.command("noSuchCommand")
        except OperationFailure:
            pass
        series = exported(scrape(metrics_port))

        def well_formed(c):
            the_dashboard_is_well_formed(c, dashboard)

        def exported_series(c):
            every_queried_series_is_exported(c, dashboard, series)

        well_formed.__name__ = the_dashboard_is_well_formed.__name__
        exported_series.__name__ = every_queried_series_is_exported.__name__
        status = run_checks(f"mongodb://127.0.0.1:{port}/", [well_formed, exported_series],
                            "the Grafana dashboard against /metrics")
        client.close()
        return status
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    sys.exit(main())
