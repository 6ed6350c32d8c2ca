"""Runs the README's subscription consumer loop (the python block of its "Subscriptions"
section) against a live router, in a database of its own.

Usage: python3 tests/py/readme_consumer.py mongodb://127.0.0.1:PORT/
"""

import contextlib
import io
import pathlib
import re
import sys
import uuid


def main(uri: str) -> None:
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Subscriptions", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    db = f"readme_{uuid.uuid4().hex[:8]}"
    code = code.replace('"mongodb://127.0.0.1:27017/"', repr(uri)).replace(".shop", f"[{db!r}]")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip() == "[10, 25]", out.getvalue()
    print("readme consumer: ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017/")
