"""Runs the user guide's runnable samples against a live Tributary server.

Usage: python3 tests/py/guide_samples.py mongodb://127.0.0.1:PORT/ [PATH]

With PATH, only the samples of files whose path (from the repository's root) contains it.

Every code block fenced as ```python,runnable in docs/src/**/*.md and README.md is a sample a
reader can run
against the embedded default (`tributary`: a router on 127.0.0.1:27017 with three shards). Each
is run in a `python3` process of its own (60 s at most), with the literal
`mongodb://127.0.0.1:27017` replaced by the URI given here. A sample fails when it exits
non-zero, times out, or does not connect to that literal URI (it could not be pointed at the
server under test). Prints `ok` or `FAIL` with `<file>:<line>` of the sample's opening fence,
then "N passed, N failed: the guide's runnable samples"; exits non-zero on any failure, or when
it finds no sample at all.
"""

import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOOK = ROOT / "docs" / "src"
LITERAL = "mongodb://127.0.0.1:27017"
TIMEOUT_S = 60
SLOW_S = 5
OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def is_runnable(info: str) -> bool:
    words = [w.strip() for w in info.strip().split(",")]
    return len(words) >= 2 and words[0] == "python" and "runnable" in words[1:]


def samples(path: pathlib.Path):
    """(line of the opening fence, code) for each runnable block of one Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        start = i
        body = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
                break
            line = lines[i]
            # A fence indented inside a list item: its lines carry the same indentation.
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            i += 1
        i += 1
        if is_runnable(m.group("info")):
            yield start + 1, "\n".join(body) + "\n"


def target(uri: str) -> str:
    """The URI that stands in for the literal: without a trailing slash unless it has options."""
    return uri if "?" in uri else uri.rstrip("/")


def run(code: str, name: str, workdir: pathlib.Path):
    script = workdir / name
    script.write_text(code, encoding="utf-8")
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=workdir,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return False, f"timed out after {TIMEOUT_S} s\n{out}", time.monotonic() - started
    took = time.monotonic() - started
    return done.returncode == 0, done.stdout + done.stderr, took


def main(uri: str, only: str = "") -> int:
    found = []
    for path in [ROOT / "README.md", *sorted(BOOK.rglob("*.md"))]:
        if only not in str(path.relative_to(ROOT)):
            continue
        for line, code in samples(path):
            found.append((path.relative_to(ROOT), line, code))
    if not found:
        print(f"FAIL no ```python,runnable sample found under {BOOK.relative_to(ROOT)}")
        print("0 passed, 1 failed: the guide's runnable samples")
        return 1

    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="guide-samples-") as tmp:
        workdir = pathlib.Path(tmp)
        for rel, line, code in found:
            where = f"{rel}:{line}"
            if LITERAL not in code:
                ok, output, took = False, f"does not connect to {LITERAL}", 0.0
            else:
                pointed = re.sub(re.escape(LITERAL) + r"/?", lambda _: target(uri), code)
                name = re.sub(r"[^A-Za-z0-9]+", "_", f"{rel.with_suffix('')}_{line}") + ".py"
                ok, output, took = run(pointed, name, workdir)
            if ok:
                passed += 1
                slow = f" (slow: {took:.1f} s)" if took > SLOW_S else ""
                print(f"ok   {where}{slow}")
            else:
                failed += 1
                print(f"FAIL {where}")
                for out_line in output.rstrip().splitlines()[-40:]:
                    print(f"     | {out_line}")
    print(f"{passed} passed, {failed} failed: the guide's runnable samples")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/",
                  sys.argv[2] if len(sys.argv) > 2 else ""))
