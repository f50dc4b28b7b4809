"""The group judge seen from the command line: its ``reward_*`` / ``metric_*`` columns in eval's
summary and in ``report``, and a failed judge's hint is the command that stores the fix
(``rescore``; ``finalize(read_run(DIR), judge=...)`` stores nothing). Real CLI processes."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from rollout_ray import read_run

ROOT = pathlib.Path(__file__).parents[2]
CLI = [sys.executable, "-m", "rollout_ray"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # three to four CLI processes each


def _run(*argv: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, timeout=120)


def _judge_lines(text: str) -> dict[str, tuple[float, float, float]]:
    """The summary's judge block: each column's mean, p50, p95."""
    lines = text.splitlines()
    start = lines.index("judge columns (mean / p50 / p95, over the rollouts it gave a value)")
    found = {}
    for line in lines[start + 1 :]:
        match = re.fullmatch(r"  (\S+) +([\d.]+) +([\d.]+) +([\d.]+)", line)
        if match is None:
            break
        found[match.group(1)] = tuple(float(v) for v in match.groups()[1:])
    return found  # type: ignore[return-value]


def test_the_judges_columns_are_in_the_summary_and_in_report(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    done = _run(
        "eval",
        ROOT / "examples" / "judged.py",
        "--executor",
        "local",
        "--limit",
        "3",
        "--samples",
        "4",
        "--temperature",
        "1.5",
        "--seed",
        "1",
        "--sim-ttft",
        "0",
        "--out",
        out,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = _run("report", out)
    assert report.returncode == 0, report.stderr[-2000:]
    table = read_run(out, ["metric_majority", "reward_shortest"])
    expected = {}
    for name in ("metric_majority", "reward_shortest"):
        values = [v for v in table[name].to_pylist() if v is not None]
        expected[name] = round(sum(values) / len(values), 4)
    for text in (done.stdout, report.stdout):
        judged = _judge_lines(text)
        assert sorted(judged) == ["metric_majority", "reward_shortest"]  # not reward_weights: every run has it
        assert {name: mean for name, (mean, _, _) in judged.items()} == expected


JUDGE = """
from rollout_ray import ChatHarness, Task


def tasks():
    return [Task({{"prompt": f"What is {{i}} + 1?"}}) for i in range(3)]


def harness():
    return ChatHarness()


def judge(group):
    return {body}
"""


def test_a_failed_judges_hint_is_rescore_and_rescore_stores_the_fixed_columns(tmp_path: pathlib.Path) -> None:
    taskset = tmp_path / "judged_taskset.py"
    taskset.write_text(JUDGE.format(body="[1.0] * group.num_rows  # a list: the judge fails"))
    out = tmp_path / "run"
    bad = _run("eval", taskset, "--executor", "local", "--samples", "2", "--sim-ttft", "0", "--out", out)
    assert bad.returncode == 4, bad.stderr[-2000:]
    hint = bad.stderr.splitlines()[-1]
    assert hint.startswith("rollout-ray eval: the judge failed on 3 of 3 groups (ValueError: ")
    assert hint.endswith(
        f"the rollouts are stored: fix the judge, then `rollout-ray rescore {out}` stores its columns, without a model"
    )
    assert "metric_rows" not in read_run(out).column_names

    taskset.write_text(JUDGE.format(body='{"metric_rows": [float(group.num_rows)] * group.num_rows}'))
    command = re.search(r"`(rollout-ray rescore [^`]+)`", hint).group(1).split()  # type: ignore[union-attr]
    fixed = _run(*command[1:])
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert read_run(out, ["metric_rows"])["metric_rows"].to_pylist() == [2.0] * 6
    assert _judge_lines(_run("report", out).stdout) == {"metric_rows": (2.0, 2.0, 2.0)}
