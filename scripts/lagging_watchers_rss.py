"""A thousand change-stream watchers that ask for a batch and then read nothing: the server's RSS.

Start Tributary (`tributary --port 29335 --dbpath DIR`, the embedded default), then
`python3 scripts/lagging_watchers_rss.py <server pid> [port] [watchers] [MiB of events]`.

Every watcher is a raw connection with a 4 KiB receive buffer. Each opens a change stream on
`lag.c` (they all share the router's hub), then the script inserts the events (8 KiB documents,
6 MiB by default), then every watcher sends one `getMore` and never reads its reply: the
server holds each reply until the frame timeout closes the connection. Prints the server's RSS
before the getMores and its peak (VmHWM, reset first) in the 10 s after them (BENCHMARKS.md,
issue 25: a reply written from the shared event bytes costs a lagging watcher next to nothing;
a reply that copies them costs it the batch).
"""

import socket
import struct
import sys
import time

import bson
from pymongo import MongoClient

from proc_memory import reset_peak, rss_and_peak_mib

pid = int(sys.argv[1])
port = int(sys.argv[2]) if len(sys.argv) > 2 else 29335
watchers = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
mib = int(sys.argv[4]) if len(sys.argv) > 4 else 6
DOC = 8 * 1024


def memory():
    return rss_and_peak_mib(pid)


def op_msg(request_id, body):
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def read_reply(sock):
    header = b""
    while len(header) < 16:
        header += sock.recv(16 - len(header))
    (length,) = struct.unpack("<i", header[:4])
    rest = b""
    while len(rest) < length - 16:
        rest += sock.recv(length - 16 - len(rest))
    return bson.decode(rest[5:])


client = MongoClient(f"mongodb://127.0.0.1:{port}")
client.lag.c.drop()
client.lag.create_collection("c")

socks = []
for i in range(watchers):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(op_msg(i + 1, {"aggregate": "c", "pipeline": [{"$changeStream": {}}],
                             "cursor": {}, "$db": "lag"}))
    reply = read_reply(s)
    assert reply["ok"] == 1.0, reply
    socks.append((s, reply["cursor"]["id"]))
print(f"{watchers} streams open")

filler = "x" * DOC
client.lag.c.insert_many([{"_id": i, "filler": filler} for i in range(mib * 1024 * 1024 // DOC)])
time.sleep(1)

reset_peak(pid)
before, _ = memory()
for i, (s, cursor) in enumerate(socks):
    s.sendall(op_msg(100_000 + i, {"getMore": cursor, "collection": "c", "$db": "lag"}))
peak = before
for _ in range(20):
    time.sleep(0.5)
    rss, hwm = memory()
    peak = max(peak, hwm)
print(f"RSS before the getMores {before} MiB; peak after {peak} MiB (+{peak - before} MiB "
      f"for {watchers} watchers and {mib} MiB of events)")
for s, _ in socks:
    s.close()
