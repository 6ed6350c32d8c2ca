"""pymongo against a Tributary started with --auth and --tlsMode requireTLS.

Usage: python3 tests/py/auth_tls.py [ignored URI]
Starts its own server (TRIBUTARY_BIN, else target/debug/tributary) on a free port with
certificates made by the openssl command, then checks over TLS: the first user through the
localhost exception, SCRAM-SHA-256 and SCRAM-SHA-1 logins, a wrong password, a plain client
refused, and a read-only user who may read and watch but not write. The last line is
"N passed, N failed"; the exit status is non-zero on failure.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError, ServerSelectionTimeoutError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def certificates(d):
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt")
    with open(os.path.join(d, "server.pem"), "w") as out:
        for part in ("server.crt", "server.key"):
            with open(os.path.join(d, part)) as f:
                out.write(f.read())
    return os.path.join(d, "ca.pem"), os.path.join(d, "server.pem")


def main():
    binary = os.environ.get("TRIBUTARY_BIN", os.path.join(ROOT, "target", "debug", "tributary"))
    work = tempfile.mkdtemp()
    ca, server_pem = certificates(work)
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--dbpath", os.path.join(work, "data"), "--auth",
         "--tlsMode", "requireTLS", "--tlsCertificateKeyFile", server_pem],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    passed, failed = 0, 0

    def check(name, fn):
        nonlocal passed, failed
        try:
            fn()
            print(f"ok    {name}")
            passed += 1
        except (AssertionError, PyMongoError) as e:
            print(f"FAIL  {name}: {e!r}")
            failed += 1

    def client(**kw):
        return MongoClient(f"mongodb://127.0.0.1:{port}/", tls=True, tlsCAFile=ca,
                           serverSelectionTimeoutMS=5000, directConnection=True, **kw)

    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)

        def first_user():
            anonymous = client()
            try:
                anonymous.app.c.find_one()
                raise AssertionError("an unauthenticated find was allowed")
            except OperationFailure as e:
                assert e.code == 13, e.details
            anonymous.admin.command("createUser", "boss", pwd="s3cret", roles=["root"])

        def logins():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-1"):
                boss = client(username="boss", password="s3cret", authMechanism=mechanism)
                boss.app.c.insert_one({"by": mechanism})
            assert client(username="boss", password="s3cret").app.c.count_documents({}) == 2

        def wrong_password():
            try:
                client(username="boss", password="wrong").app.c.find_one()
                raise AssertionError("a wrong password was accepted")
            except OperationFailure as e:
                assert e.code == 18, e.details

        def plain_refused():
            plain = MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1500,
                                directConnection=True)
            try:
                plain.admin.command("ping")
                raise AssertionError("a plain client got through")
            except ServerSelectionTimeoutError:
                pass

        def reader():
            boss = client(username="boss", password="s3cret")
            boss.app.command("createUser", "reader", pwd="pw", roles=["read"])
            r = client(username="reader", password="pw", authSource="app")
            assert r.app.c.find_one() is not None
            with r.app.c.watch(max_await_time_ms=200) as stream:
                boss.app.c.insert_one({"seen": True})
                event = None
                for _ in range(50):
                    event = stream.try_next()
                    if event is not None:
                        break
                assert event is not None and event["operationType"] == "insert", event
            try:
                r.app.c.insert_one({})
                raise AssertionError("read wrote")
            except OperationFailure as e:
                assert e.code == 13, e.details

        check("the first user through the localhost exception", first_user)
        check("SCRAM-SHA-256 and SCRAM-SHA-1 logins over TLS", logins)
        check("a wrong password is AuthenticationFailed", wrong_password)
        check("a plain client is refused", plain_refused)
        check("read reads and watches, and does not write", reader)
    finally:
        server.terminate()
        server.wait()
    print(f"{passed} passed, {failed} failed: pymongo auth and TLS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
