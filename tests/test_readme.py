"""The README's commands and its tour snippet stay true."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block is not None and README.index("```bash") < 40
    run_cmd, test_cmd = block.group(1).strip().splitlines()
    assert "rollout-ray eval examples/arith.py" in run_cmd and "pytest" in test_cmd
    ci = (pathlib.Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()


def test_tour_snippet_runs_and_prints_what_it_claims(capsys) -> None:  # type: ignore[no-untyped-def]
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)  # type: ignore[union-attr]
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "True agent_completed 1.0"


@pytest.mark.slow
@pytest.mark.timeout(300)  # 39 s with the machine's two cores busy twice over
def test_on_ray_snippet_runs_in_a_fresh_process() -> None:
    """Starts its own Ray (about 10 s): the snippet is what a newcomer copies."""

    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    code = next(b for b in blocks if "RolloutActor" in b)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "100.0"


def test_readme_gives_the_suite_time_on_a_quiet_and_on_a_loaded_machine() -> None:
    """A newcomer on a busy machine should not think the suite hangs at minute 12."""
    line = re.search(r"whole suite \((.*?)\)", README, re.S)
    assert line is not None
    said = " ".join(line.group(1).split())
    assert "about 13 minutes on a quiet 2-core machine" in said and "about 15 minutes of tests on a loaded one" in said


def test_driver_run_is_documented_as_returning_a_run_result() -> None:
    from rollout_ray import Driver, RunResult

    assert Driver.run.__annotations__["return"] in ("RunResult", RunResult)
    assert "RunResult" in (Driver.run.__doc__ or "")
    sentence = re.search(r"`Driver\(\.\.\.\)\.run\(\)` blocks and returns (.*?)\(", README, re.S)
    assert sentence is not None and "RunResult" in sentence.group(1) and "table" not in sentence.group(1)
