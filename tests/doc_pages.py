"""The documentation's pages (README.md and docs/) and their code blocks, for the tests that
check what the pages say and run what they show.

Every fenced block of a page carries a mark on the line before it: ``<!-- runs: FILE::TEST -->``
names the test that runs it (the test finds its blocks with ``run_by``), ``<!-- not run:
REASON -->`` says why none does. ``tests/test_docs.py`` fails on a block without one."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# A fence opens at any indentation (a block inside a list item) and closes at the same one.
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!-- (runs|not run): (.*?) -->$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int
    lang: str
    code: str
    mark: tuple[str, str] | None  # ("runs", "FILE::TEST") or ("not run", reason)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[pathlib.Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def text(page: str) -> str:
    """A page by its path from the repository's root: ``text("docs/cli.md")``."""
    return (ROOT / page).read_text()


def blocks(page: pathlib.Path) -> list[Block]:
    source = page.read_text()
    found = []
    for match in FENCE.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        before = source[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mark = MARK.match(before)
        code = textwrap.dedent(match.group("indent") + match.group("code"))
        found.append(Block(page, line, match.group("lang"), code, (mark.group(1), mark.group(2)) if mark else None))
    return found


def run_by(test: str) -> list[Block]:
    """The blocks marked ``<!-- runs: TEST -->`` on every page; at least one, and all of one
    text (a page that repeats another's block repeats it exactly)."""
    mine = [b for page in pages() for b in blocks(page) if b.mark == ("runs", test)]
    assert mine, f"no block of README.md or docs/ is marked <!-- runs: {test} -->"
    assert len({b.code for b in mine}) == 1, f"the copies differ: {[b.where() for b in mine]}"
    return mine


def block_run_by(test: str) -> str:
    """The code of the blocks ``run_by(test)`` finds."""
    return run_by(test)[0].code
