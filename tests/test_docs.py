"""The project carries its own docs: every link and path the docs and comments name is inside
the repository and exists, the README and docs/ link nothing outside it, every code block of
theirs is run by a test or says why not, and every rule number the code and tests cite is in
docs/lifecycle.md."""

from __future__ import annotations

import ast
import os
import pathlib
import re

from doc_pages import blocks, pages

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "runs", "site", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
TEXT = {".py", ".md", ".toml", ".sh", ".yaml", ".yml", ".txt", ".cfg", ".html", ".js", ".css"}
TOP = tuple(f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and p.name not in SKIP_DIRS)
LIFECYCLE = (ROOT / "docs" / "lifecycle.md").read_text()

# A markdown link or image target, and a path in a code span that climbs with ``../``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CLIMB = re.compile(r"`+(\.\./[^`\s]*)")
CODE_PATH = re.compile(r"`([\w.\-/]+)`")


def _files() -> list[pathlib.Path]:
    found = []
    for parent, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [
            pathlib.Path(parent, n) for n in names if pathlib.Path(n).suffix in TEXT or n in ("Dockerfile", "run")
        ]
    return found


def _inside(target: pathlib.Path) -> bool:
    return target.resolve().is_relative_to(ROOT)


def _anchors(doc: pathlib.Path) -> set[str]:
    text = doc.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        ids.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return ids


def test_docs_link_only_inside_the_repository_and_every_link_resolves() -> None:
    docs = [p for p in _files() if p.suffix == ".md"]
    assert {ROOT / "README.md", ROOT / "docs" / "lifecycle.md", ROOT / "docs" / "architecture.md"} <= set(docs)
    problems = []
    for doc in docs:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:: not a file
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path) if path else doc
            if not _inside(resolved) or not resolved.exists():
                problems.append(f"{doc.relative_to(ROOT)}: {target} is not a file of the repository")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                problems.append(f"{doc.relative_to(ROOT)}: {target} names no anchor of {path or doc.name}")
        for span in CODE_PATH.findall(doc.read_text()):
            if span.startswith(TOP) and "*" not in span and not (ROOT / span.rstrip("/")).exists():
                problems.append(f"{doc.relative_to(ROOT)}: `{span}` does not exist")
    assert problems == []


def test_no_file_names_a_path_outside_the_repository() -> None:
    problems = []
    for path in _files():
        text = path.read_text(errors="replace")
        for climb in CLIMB.findall(text):
            if not _inside(path.parent / climb):
                problems.append(f"{path.relative_to(ROOT)}: {climb}")
        if "../shared" in text and path != pathlib.Path(__file__).resolve():
            problems.append(f"{path.relative_to(ROOT)}: ../shared")
    assert problems == []


def test_every_rule_the_code_cites_is_anchored_in_docs_lifecycle() -> None:
    anchors = _anchors(ROOT / "docs" / "lifecycle.md")
    assert {f"b{n}" for n in range(1, 56)} <= anchors
    cited = set()
    for path in _files():
        if path.suffix in (".py", ".md") and path.name != "lifecycle.md":
            cited |= {m.lower() for m in re.findall(r"\b([BQ][1-9][0-9]?)\b", path.read_text(errors="replace"))}
    assert sorted(cited - anchors) == []
    for section in ("2.1", "2.4", "2.10", "3.", "4.", "5.1", "5.2", "5.3", "5.4", "5.5"):
        assert re.search(rf"^#+ {re.escape(section)} ", LIFECYCLE, re.M), section


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _benchmark_numbers_missing(quoted: str, benchmarks: str) -> list[str]:
    """The numbers of ``quoted`` that no number of ``benchmarks`` equals to within 3 % (the
    docs round: ~220 for 216–224, ~290 for 291)."""
    measured = [float(n.replace(",", "")) for n in NUMBER.findall(benchmarks)]
    return [
        n
        for n in NUMBER.findall(quoted)
        if not any(abs(m - float(n.replace(",", ""))) <= 0.03 * float(n.replace(",", "")) for m in measured)
    ]


def test_every_number_the_docs_quote_from_the_benchmarks_is_in_their_readme() -> None:
    performance = (ROOT / "docs" / "performance.md").read_text()
    glance = performance[performance.index("## At a glance") :]
    quoted = glance[: glance.index("\n## ", 1)]  # the summary; the fleet's runs below quote their own tables
    tokens = (ROOT / "docs" / "tokens.md").read_text()
    quoted += tokens[tokens.index("Cost at 1,000-token completions") :]
    assert _benchmark_numbers_missing(quoted, (ROOT / "benchmarks" / "README.md").read_text()) == []


def test_the_benchmark_number_check_finds_a_number_no_table_holds() -> None:
    tables = "| ray | 1.69 (1.46–2.17) | 849 | 216–224 µs |"
    assert _benchmark_numbers_missing("1.69 CPU-ms at 849/s, ~220 µs, 2.70 at 588/s", tables) == ["2.70", "588"]


# A link with a scheme (https:, mailto:), an autolink, or a bare web address in the text.
OUTSIDE = re.compile(
    r"\]\(\s*<?[a-z][a-z0-9+.-]*:|<[a-z][a-z0-9+.-]*://|(?<![`/\w])(?:https?://|www\.)(?!127\.0\.0\.1|localhost)"
)


def _outside_links(text: str) -> list[str]:
    """What in a page's prose leads out of the project (code blocks and spans are examples, not links)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`]*`", "", prose)
    return [line.strip() for line in prose.splitlines() if OUTSIDE.search(line)]


def test_the_readme_and_docs_link_nothing_outside_the_project() -> None:
    found = {str(p.relative_to(ROOT)): _outside_links(p.read_text()) for p in pages()}
    assert {page: lines for page, lines in found.items() if lines} == {}


def test_the_outside_link_check_finds_each_kind_of_link_out() -> None:
    page = "See [vLLM](https://docs.vllm.ai), <https://x.org>, www.example.org, [mail](mailto:a@b).\n"
    assert len(_outside_links(page.replace(", ", "\n"))) == 4
    assert _outside_links("`https://x.org` and ```\nhttp://gpu0:8000\n``` and http://127.0.0.1:8000/v1") == []


def _tests_that_read_blocks(path: pathlib.Path) -> set[str]:
    """The test functions of ``path`` that look their blocks up with ``run_by`` / ``block_run_by``."""
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(n, ast.Name) and n.id in ("run_by", "block_run_by") for n in ast.walk(node))
    }


def test_every_code_block_of_the_docs_is_run_by_a_test_or_says_why_not() -> None:
    """As the README's blocks were: each runs in the suite, found by its mark, or says why it cannot."""
    problems = []
    for page in pages():
        for block in blocks(page):
            if block.mark is None:
                problems.append(f"{block.where()}: no <!-- runs: FILE::TEST --> or <!-- not run: REASON --> before it")
            elif block.mark[0] == "not run" and len(block.mark[1].split()) < 3:
                problems.append(f"{block.where()}: say why it is not run, not {block.mark[1]!r}")
            elif block.mark[0] == "not run":  # a test or example the reason points to exists
                named = re.findall(r"\b(?:tests|examples)/[\w/.-]+\.py\b", block.mark[1])
                problems += [f"{block.where()}: {path} does not exist" for path in named if not (ROOT / path).is_file()]
            elif block.mark[0] == "runs":
                file, _, test = block.mark[1].partition("::")
                if not (ROOT / file).is_file() or test not in _tests_that_read_blocks(ROOT / file):
                    problems.append(f"{block.where()}: {block.mark[1]} is no test that reads its blocks with run_by")
    assert problems == []


def test_the_block_check_reads_marks_and_indented_blocks(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("<!-- not run: needs a GPU fleet -->\n```bash\nx\n```\n\n- item\n\n  ```py\n  y = 1\n  ```\n")
    first, second = blocks(page)
    assert (first.mark, first.code, first.line) == (("not run", "needs a GPU fleet"), "x\n", 2)
    assert (second.mark, second.code, second.lang) == (None, "y = 1\n", "py")
