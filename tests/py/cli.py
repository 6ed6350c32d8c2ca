"""The tributary command line against a running server: `--version`, a mistyped flag, and
`tributary status` (tables and `--json`) showing the shards and an open change stream.

Run against a router started with default options (three in-process shards):

    python3 tests/py/cli.py mongodb://127.0.0.1:27017/

The binary is $TRIBUTARY_BIN, else target/debug/tributary. The last line is "N passed, N
failed"; the exit status is non-zero on failure.
"""

import json
import os
import re
import socket
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from checks import run_checks, uri_from_argv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TRIBUTARY_BIN", os.path.join(ROOT, "target", "debug", "tributary"))
URI = uri_from_argv()


def tributary(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30)


def version_names_the_commit_and_profile(_client):
    out = tributary("--version")
    assert out.returncode == 0, out
    assert re.fullmatch(r"tributary \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}|unknown), "
                        r"(debug|release|[a-z-]+) build\)\n", out.stdout), out.stdout


def a_mistyped_flag_names_the_closest(_client):
    out = tributary("--prot", "1")
    assert out.returncode != 0, out
    assert "unexpected argument '--prot'" in out.stderr, out.stderr
    assert "'--port'" in out.stderr, out.stderr
    out = tributary("status", "--josn")
    assert out.returncode != 0 and "'--json'" in out.stderr, out.stderr


def status_shows_the_shards_and_an_open_stream(client):
    ns = f"cli_{uuid.uuid4().hex[:8]}"
    coll = client[ns].c
    coll.insert_one({"_id": 1})
    with coll.watch() as stream:
        stream.try_next()  # the stream is open on the server
        out = tributary("status", "--uri", URI)
        assert out.returncode == 0, out
        lines = out.stdout.splitlines()
        assert lines[0].startswith("router "), out.stdout
        header = next(line for line in lines if line.startswith("SHARD"))
        for column in ["UP", "OLDEST ENTRY", "NEWEST ENTRY", "HIGH-WATER MARK"]:
            assert column in header, header
        shards = [line.split()[:2] for line in lines if re.match(r"shard\d", line)]
        assert shards and all(up == "yes" for _, up in shards), out.stdout
        assert any(f"{ns}.c" in line for line in lines), out.stdout

        out = tributary("status", "--uri", URI, "--json")
        assert out.returncode == 0, out
        status = json.loads(out.stdout)
        assert sorted(status) == ["router", "shards", "streams", "subscriptions"], status
        assert all(s["up"] and s["highWaterMark"] for s in status["shards"]), status
        assert status["streams"]["open"] >= 1, status
        assert f"{ns}.c" in [c["ns"] for c in status["streams"]["list"]], status
    client.drop_database(ns)


def status_of_a_closed_port_fails_at_once(_client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tributary("status", "--uri", f"mongodb://127.0.0.1:{port}")
    assert out.returncode == 1, out
    assert out.stderr.startswith("error: connecting to 127.0.0.1:"), out.stderr
    out = tributary("status", "--uri", "mongodb://ana:pw@127.0.0.1:1")
    assert out.returncode == 1 and "--keyFile" in out.stderr, out.stderr


if __name__ == "__main__":
    sys.exit(run_checks(URI, [version_names_the_commit_and_profile,
                              a_mistyped_flag_names_the_closest,
                              status_shows_the_shards_and_an_open_stream,
                              status_of_a_closed_port_fails_at_once],
                        "the tributary command line"))
