"""The README's commands and the docs' snippets stay true; the README stays a first day's read."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow as pa
import pytest
from doc_pages import README as README_PATH
from doc_pages import ROOT, block_run_by, blocks, text

README = README_PATH.read_text()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    """The README's first block (the docs' getting-started page repeats it), under the title."""
    first = blocks(README_PATH)[0]
    assert [line for line in README[: README.index("```bash")].splitlines() if line][:-1] == [
        "# rollout_ray"
    ]  # the title, the mark
    assert first.code == block_run_by(
        "tests/test_readme.py::test_readme_starts_with_the_two_commands_and_ci_runs_the_second"
    )
    run_cmd, test_cmd = first.code.strip().splitlines()
    assert "rollout-ray eval examples/arith.py" in run_cmd and "pytest" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()


def test_the_readme_is_a_first_day_read() -> None:
    """At most 300 lines: what it is, the two commands, a tour, links; the rest is in docs/."""
    assert len(README.splitlines()) <= 300
    for heading in ("## The command line", "## A short tour", "## Where to read next"):
        assert heading in README
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", README))
    assert sorted(pages - linked) == [], "the README's map of docs/ misses these pages"
    linked = set(re.findall(r"\]\(([\w.-]+\.md)", text("docs/index.md")))
    assert sorted(pages - linked) == [], "docs/index.md's map misses these pages"


def test_tour_snippet_runs_and_prints_what_it_claims(capsys) -> None:  # type: ignore[no-untyped-def]
    code = block_run_by("tests/test_readme.py::test_tour_snippet_runs_and_prints_what_it_claims")
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "True agent_completed 1.0"


@pytest.mark.slow
@pytest.mark.timeout(300)  # 39 s with the machine's two cores busy twice over
def test_on_ray_snippet_runs_in_a_fresh_process() -> None:
    """Starts its own Ray (about 10 s): the snippet is what a newcomer copies (docs/ray.md)."""

    code = block_run_by("tests/test_readme.py::test_on_ray_snippet_runs_in_a_fresh_process")
    assert "RolloutActor" in code
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "100.0"


def test_the_judge_example_returns_a_column_per_row() -> None:
    """docs/runs.md's judge, on a group of three samples: one value per row, 1.0 for the shortest."""
    scope: dict[str, object] = {"pa": pa}
    exec(block_run_by("tests/test_readme.py::test_the_judge_example_returns_a_column_per_row"), scope)
    judge = scope["judge"]
    assert callable(judge)
    assert judge(pa.table({"num_output_tokens": [7, 3, 5]})) == {"metric_shortest": [0.0, 1.0, 0.0]}


def test_readme_gives_the_suite_time_on_a_quiet_and_on_a_loaded_machine() -> None:
    """A newcomer on a busy machine should not think the suite hangs at minute 12."""
    line = re.search(r"whole suite \((.*?)\)", README, re.S)
    assert line is not None
    said = " ".join(line.group(1).split())
    assert "about 16 minutes on a quiet 2-core machine" in said and "about 15 minutes of tests on a loaded one" in said


def test_driver_run_is_documented_as_returning_a_run_result() -> None:
    from rollout_ray import Driver, RunResult

    assert Driver.run.__annotations__["return"] in ("RunResult", RunResult)
    assert "RunResult" in (Driver.run.__doc__ or "")
    sentence = re.search(r"`Driver\(\.\.\.\)\.run\(\)` blocks and returns (.*?)\(", text("docs/runs.md"), re.S)
    assert sentence is not None and "RunResult" in sentence.group(1) and "table" not in sentence.group(1)
