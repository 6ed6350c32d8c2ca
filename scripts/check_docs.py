"""Checks the user guide (docs/, an mdBook) and the README: run from the repository's root.

Usage: python3 scripts/check_docs.py

* every chapter under docs/src (every .md file but SUMMARY.md) is listed in docs/src/SUMMARY.md,
  and every SUMMARY entry names a file that exists;
* docs/book.toml names the book's title and `src = "src"`, and asks for no preprocessor or
  renderer that needs an extra install;
* every relative Markdown link in docs/src/**/*.md and in README.md points to a file that exists
  (relative to the file the link is in), and where it has a `#anchor`, to a heading of that
  file with that slug (mdBook's rule: lowercase, whitespace to '-', other characters than
  alphanumerics, '-' and '_' dropped; a repeated heading gets '-1', '-2', ...); an anchor alone
  (`#x`) is checked against the file's own headings;
* external http(s) and mailto links are listed, not fetched.

Prints each broken link as `file:line: ...` and exits non-zero when there is one.
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path.cwd()
DOCS = ROOT / "docs"
SRC = DOCS / "src"
SUMMARY = SRC / "SUMMARY.md"
README = ROOT / "README.md"

# [text](target) and ![alt](target), not inside code; <target> and "title" forms included.
LINK = re.compile(r"!?\[(?P<text>(?:(?!\n\s*\n)[^\[\]]|\[[^\]]*\])*)\]\(\s*(?P<target><[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
# [text]: target  (reference definitions)
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(?P<target>\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s:]+)[^}]*\}\}")
HTML_ID = re.compile(r"""<a\s+[^>]*(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)


def lines_outside_code(path: pathlib.Path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            continue
        yield n, line


def heading_text(raw: str) -> str:
    """A heading's text as rendered: code spans, links and emphasis markers reduced to text."""
    text = re.sub(r"`+([^`]*)`+", r"\1", raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*\*|__|\*|(?<!\w)_(?=\w)|(?<=\w)_(?!\w))", "", text)
    return text.strip()


def slug(text: str) -> str:
    """mdBook's `normalize_id`."""
    out = []
    for ch in text:
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower() if ch.isascii() else ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


_anchors: dict[pathlib.Path, set[str]] = {}


def anchors(path: pathlib.Path) -> set[str]:
    if path not in _anchors:
        found: set[str] = set()
        counts: dict[str, int] = {}
        for _, line in lines_outside_code(path):
            # mdBook's `{{#include file}}`: the file's headings are the chapter's.
            for m in INCLUDE.finditer(line):
                found |= anchors((path.parent / m.group(1)).resolve())
            for m in HTML_ID.finditer(line):
                found.add(m.group(1))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(heading_text(m.group("text")))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def links(path: pathlib.Path):
    """(line, target) of every Markdown link in the file, outside code; a link's text may run
    over several lines, as a paragraph wraps."""
    kept = dict(lines_outside_code(path))
    total = len(path.read_text(encoding="utf-8").splitlines())
    # Code blocks blanked, so offsets still map to lines; code spans blanked (they may wrap).
    text = "\n".join(kept.get(n, "") for n in range(1, total + 1))
    text = re.sub(r"(`+)(.+?)\1", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            starts.append(i + 1)

    def line_of(offset: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    for m in LINK.finditer(text):
        yield line_of(m.start()), m.group("target").strip("<>")
    for n, line in enumerate(text.split("\n"), 1):
        m = REFDEF.match(line)
        if m:
            yield n, m.group("target").strip("<>")


def check_link(path: pathlib.Path, n: int, target: str, problems: list, external: list):
    where = f"{path.relative_to(ROOT)}:{n}"
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        if target.startswith(("http://", "https://", "mailto:")):
            external.append(f"{where}: {target}")
        else:
            problems.append(f"{where}: unsupported link scheme: {target}")
        return
    if not target:
        problems.append(f"{where}: empty link target")
        return
    file_part, _, anchor = target.partition("#")
    if target.startswith("/"):
        problems.append(f"{where}: absolute path (use a relative link): {target}")
        return
    dest = (path.parent / file_part).resolve() if file_part else path.resolve()
    if not dest.exists():
        problems.append(f"{where}: no such file: {target}")
        return
    if anchor:
        if dest.is_dir() or dest.suffix.lower() != ".md":
            problems.append(f"{where}: anchor into a file that is not Markdown: {target}")
        elif anchor not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")


def check_summary(problems: list):
    if not SUMMARY.exists():
        problems.append(f"{SUMMARY.relative_to(ROOT)}: missing")
        return
    listed = set()
    for n, target in links(SUMMARY):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        file_part = target.partition("#")[0]
        if not file_part:
            continue
        dest = (SRC / file_part).resolve()
        listed.add(dest)
        if not dest.is_file():
            problems.append(f"{SUMMARY.relative_to(ROOT)}:{n}: SUMMARY entry has no file: {target}")
    for chapter in sorted(SRC.rglob("*.md")):
        if chapter.resolve() == SUMMARY.resolve():
            continue
        if chapter.resolve() not in listed:
            problems.append(f"{chapter.relative_to(ROOT)}:1: chapter not listed in SUMMARY.md")


def check_book_toml(problems: list):
    path = DOCS / "book.toml"
    where = path.relative_to(ROOT)
    try:
        book = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{where}: missing")
        return
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{where}: not TOML: {e}")
        return
    meta = book.get("book", {})
    if meta.get("title") != "Tributary":
        problems.append(f'{where}: [book] title must be "Tributary"')
    if meta.get("src", "src") != "src":
        problems.append(f'{where}: [book] src must be "src"')
    if book.get("preprocessor"):
        problems.append(f"{where}: preprocessors need extra installs: {sorted(book['preprocessor'])}")
    others = sorted(k for k in book.get("output", {}) if k != "html")
    if others:
        problems.append(f"{where}: renderers other than html need extra installs: {others}")


def main() -> int:
    if not SRC.is_dir():
        print(f"run from the repository's root: no {SRC.relative_to(ROOT) if SRC.is_relative_to(ROOT) else SRC}")
        return 2
    problems: list[str] = []
    external: list[str] = []
    check_book_toml(problems)
    check_summary(problems)
    files = sorted(SRC.rglob("*.md")) + ([README] if README.exists() else [])
    count = 0
    for path in files:
        for n, target in links(path):
            count += 1
            check_link(path, n, target, problems, external)
    if external:
        print(f"external links (listed, not fetched): {len(external)}")
        for e in external:
            print(f"  {e}")
    for p in problems:
        print(p)
    chapters = len(files) - (1 if README.exists() else 0)
    print(
        f"{count} links in {chapters} guide files and README.md: "
        f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
