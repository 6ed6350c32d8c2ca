"""Server memory before, during and after many change streams (issue 9, point 3).

    python3 bench/memory.py target/release/tributary [DOCS [STREAMS]]

Starts the embedded cluster on a free port with a temporary data directory, opens STREAMS
(default 300) pymongo change streams on one collection, writes DOCS (default 20,000) documents
of 200 bytes in batches of 500, reads every event on every stream, closes the streams and
prints the server's RSS (VmRSS) at each step (5 s and 15 s after the close: jemalloc returns
freed memory within its 10 s decay). Run it with STREAMS = 0 for the same writes
without streams.
"""

import socket
import subprocess
import sys
import tempfile
import time

import pymongo


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    binary = sys.argv[1]
    docs = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    nstreams = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    port = free_port()
    data = tempfile.mkdtemp()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--dbpath", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def rss_mb():
        with open(f"/proc/{server.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024
        return -1

    try:
        client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}", maxPoolSize=nstreams + 50)
        client.admin.command("ping")
        time.sleep(1)
        print("idle", rss_mb(), "MB")
        coll = client.bench.memory
        coll.insert_one({"warm": 1})
        streams = [coll.watch(max_await_time_ms=200) for _ in range(nstreams)]
        for _ in range(docs // 500):
            coll.insert_many([{"pad": "x" * 200} for _ in range(500)])
        print(f"{docs} written, {nstreams} streams open", rss_mb(), "MB")
        for s in streams:
            seen = 0
            while seen < docs:
                if s.try_next() is not None:
                    seen += 1
        print("every event read", rss_mb(), "MB")
        for s in streams:
            s.close()
        time.sleep(5)
        print("streams closed, 5 s later", rss_mb(), "MB")
        time.sleep(10)
        print("streams closed, 15 s later", rss_mb(), "MB")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
