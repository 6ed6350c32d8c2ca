"""The router's HTTP status page (--httpPort) in headless Chromium, against live traffic.

Usage: python3 tests/py/http_status_page.py [ignored URI]
Starts its own server (TRIBUTARY_BIN, else target/debug/tributary) with two in-process shards on
free ports, writes to test_http_status.c about 50 times a second while a change stream on it
reads the events, checks GET /v1/status and GET /, then opens the page in headless Chromium
(found as chromium, chromium-browser or google-chrome; none found is a failure) and, once the
page has polled a few times, saves a screenshot and checks the page's DOM: a row per shard, the
poll count, and an events/s chart with points above zero. The last line is "N passed, N failed";
the exit status is non-zero on failure.

Chromium is driven over the DevTools protocol on --remote-debugging-pipe rather than with
--dump-dom and --screenshot: those act at the load event (--timeout is only an upper bound), and
--virtual-time-budget fast-forwards the page's 1 s poll timer, so its polls would all land within
a fraction of a real second and see no events in between.
"""

import base64
import fcntl
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from html.parser import HTMLParser

from pymongo import MongoClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1280,900", "--remote-debugging-pipe"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, seconds, server):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with status {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing accepts on port {port} after {seconds} s")


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """The DevTools protocol over Chromium's --remote-debugging-pipe: JSON messages ended by
    a NUL byte, commands on the browser's fd 3 and replies and events on its fd 4."""

    def __init__(self, binary, profile, url):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # bash moves the child's ends to fds 3 and 4 (no preexec_fn: other threads run);
        # first above 9, so that neither already is 3 or 4 (dash takes only fds 0 to 9).
        for_child = []
        for fd in (to_chrome_r, from_chrome_w):
            for_child.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
            os.close(fd)
        to_chrome_r, from_chrome_w = for_child
        script = f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-'
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url],
            pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer = b""
        self.next_id = 0
        self.session = None

    def call(self, method, params=None, timeout=15):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise AssertionError(f"DevTools {method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_chrome], [], [], left)[0]:
                raise AssertionError(f"DevTools {method}: no reply in {timeout} s")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise AssertionError(f"Chromium exited (status {self.proc.poll()}) during {method}")
            self.buffer += chunk

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - the process group is killed below either way
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


# The page's own progress, read while waiting.
PROGRESS_JS = """(() => {
  const line = document.querySelector('#chart-events polyline');
  return {updates: Number(document.body && document.body.dataset.updates || 0),
          points: Number(line && line.getAttribute('data-points') || 0),
          max: Number(line && line.getAttribute('data-max') || 0)};
})()"""


def render_page(url, work, min_updates=5, wait_s=20):
    """Opens url in headless Chromium, waits (real time, at most wait_s) until the page has
    polled min_updates times and its events/s chart has 2 points and a non-zero maximum, then
    saves a screenshot to work/status.png. Returns (png path, serialized DOM, seconds taken)."""
    binary = chromium_binary()
    if binary is None:
        raise AssertionError("no chromium, chromium-browser or google-chrome on PATH")
    started = time.monotonic()
    browser = DevTools(binary, os.path.join(work, "chromium-profile"), "about:blank")
    try:
        pages = [t for t in browser.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        target = pages[0]["targetId"] if pages else browser.call(
            "Target.createTarget", {"url": "about:blank"})["targetId"]
        browser.session = browser.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        # The page's viewport is --window-size less the window's frame: make it 1280x900.
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        browser.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            p = browser.evaluate(PROGRESS_JS) or {}
            if p.get("updates", 0) >= min_updates and p.get("points", 0) >= 2 and p.get("max", 0) > 0:
                break
            time.sleep(0.25)
        shot = browser.call("Page.captureScreenshot", {"format": "png"})
        png = os.path.join(work, "status.png")
        with open(png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        dom = browser.evaluate("'<!DOCTYPE html>\\n' + document.documentElement.outerHTML")
    finally:
        browser.close()
    return png, dom, time.monotonic() - started


class PageDom(HTMLParser):
    """What the checks need from the serialized page."""

    def __init__(self, dom):
        super().__init__()
        self.shards, self.updates, self.polylines, self.svg = [], None, {}, None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.updates = a.get("data-updates")
        elif tag == "tr" and "data-shard" in a:
            self.shards.append(a["data-shard"])
        elif tag == "svg":
            self.svg = a.get("id")
        elif tag == "polyline" and self.svg:
            self.polylines[self.svg] = a

    def handle_endtag(self, tag):
        if tag == "svg":
            self.svg = None


def main():
    binary = os.environ.get("TRIBUTARY_BIN", os.path.join(ROOT, "target", "debug", "tributary"))
    if not os.path.exists(binary):
        print(f"FAIL  no server binary at {binary} (cargo build --bin tributary, or TRIBUTARY_BIN)")
        print("0 passed, 1 failed: the HTTP status page in headless Chromium")
        return 1
    work = tempfile.mkdtemp(prefix="tributary-http-status-")
    port, http_port = free_port(), free_port()
    log = open(os.path.join(work, "tributary.log"), "wb")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--httpPort", str(http_port),
         "--dbpath", os.path.join(work, "data"), "--shards", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}/"
    stop = threading.Event()
    seen = {"events": 0, "writes": 0, "error": None}
    ready = threading.Event()  # the change stream is open
    threads = []
    passed, failed = 0, 0

    def check(name, fn):
        nonlocal passed, failed
        try:
            fn()
            print(f"ok    {name}")
            passed += 1
        except Exception as e:  # noqa: BLE001 - any error is this check's failure
            print(f"FAIL  {name}: {e!r}")
            failed += 1

    def traffic(kind):
        """Inserts about 50 documents a second, or reads a change stream on them."""
        client = MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                             serverSelectionTimeoutMS=10000)
        coll = client.test_http_status.c
        try:
            if kind == "write":
                while not stop.is_set():
                    coll.insert_one({"at": time.time()})
                    seen["writes"] += 1
                    stop.wait(0.02)
            else:
                with coll.watch(max_await_time_ms=200) as stream:
                    ready.set()
                    while not stop.is_set():
                        if stream.try_next() is not None:
                            seen["events"] += 1
        except Exception as e:  # noqa: BLE001 - reported by the checks
            seen["error"] = repr(e)
        finally:
            ready.set()
            client.close()

    def get(path):
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()

    result = {}
    try:
        wait_for_port(port, 30, server)
        wait_for_port(http_port, 30, server)
        watcher = threading.Thread(target=traffic, args=("watch",), daemon=True)
        watcher.start()
        ready.wait(15)  # the stream is open before the first write
        writer = threading.Thread(target=traffic, args=("write",), daemon=True)
        writer.start()
        threads = [watcher, writer]

        def events_flow():
            deadline = time.monotonic() + 15
            while seen["events"] == 0 and time.monotonic() < deadline and not seen["error"]:
                time.sleep(0.1)
            assert seen["events"] > 0, (
                f"the change stream saw no event in 15 s ({seen['writes']} writes, error {seen['error']})")

        def status_json():
            status, ctype, body = get("v1/status")
            assert status == 200, f"GET /v1/status is {status}"
            assert ctype.startswith("application/json"), f"GET /v1/status Content-Type is {ctype!r}"
            s = json.loads(body)
            up = {sh["name"]: sh["up"] for sh in s["shards"]}
            assert up == {"shard0": True, "shard1": True}, f"shards up: {up}"
            assert s["streams"]["open"] >= 1, f"no open stream in {s['streams']}"
            assert s["streams"]["eventsDelivered"] > 0, f"no event delivered: {s['streams']}"

        def page_served():
            status, ctype, body = get("")
            assert status == 200, f"GET / is {status}"
            assert ctype.startswith("text/html"), f"GET / Content-Type is {ctype!r}"
            assert b'id="chart-events"' in body, "GET / is not the status page"

        def chromium():
            png, dom, seconds = render_page(base, work)
            result.update(png=png, dom=PageDom(dom))
            print(f"      chromium took {seconds:.1f} s; screenshot saved to {png}")

        def screenshot():
            png = result.get("png")
            assert png and os.path.exists(png), "no screenshot was saved"
            size = os.path.getsize(png)
            with open(png, "rb") as f:
                magic = f.read(8)
            assert magic == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
            assert size > 5000, f"{png} is only {size} bytes"

        def dom_checks():
            dom = result.get("dom")
            assert dom, "no DOM from Chromium"
            for name in ("shard0", "shard1"):
                assert name in dom.shards, f'no row data-shard="{name}" (rows: {dom.shards})'
            updates = int(dom.updates or 0)
            assert updates >= 2, f"body data-updates is {dom.updates!r}, want >= 2"
            line = dom.polylines.get("chart-events")
            assert line, f"no polyline in #chart-events (charts: {list(dom.polylines)})"
            points = int(line.get("data-points") or 0)
            top = float(line.get("data-max") or 0)
            assert points >= 2, f"#chart-events polyline data-points is {points}, want >= 2"
            assert top > 0, f"#chart-events polyline data-max is {top}: no events/s while the page polled"

        check("a change stream on test_http_status.c receives the writes", events_flow)
        check("GET /v1/status is JSON with shard0 and shard1 up and events delivered", status_json)
        check("GET / is the status page as text/html", page_served)
        check("headless Chromium renders the page and polls it", chromium)
        check("the screenshot is a PNG over 5 KB", screenshot)
        check("the page shows both shards, its polls and a non-zero events/s chart", dom_checks)
    except Exception as e:  # noqa: BLE001 - e.g. the server never listened
        print(f"FAIL  setup: {e!r}")
        failed += 1
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        # Keep the screenshot and the log; drop the data and Chromium's profile.
        for d in ("data", "chromium-profile"):
            shutil.rmtree(os.path.join(work, d), ignore_errors=True)
        if failed:
            with open(log.name, "rb") as f:
                tail = f.read()[-3000:].decode(errors="replace")
            print(f"server log ({log.name}), last lines:\n{tail}")
    print(f"{passed} passed, {failed} failed: the HTTP status page in headless Chromium")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
