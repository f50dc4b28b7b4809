"""``rollout-ray rescore`` (issue 24 §3): a run's scoring again on its stored traces, on real
processes — a deliberately wrong reward fixed after the run, and every reader shows the fix:
``read_run``, ``read_groups``, ``rollout-ray report`` and ``rollout-ray view``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from view_api import view_api

from rollout_ray._record.arrow import table_to_traces
from rollout_ray._record.store import read_groups, read_run

CLI = [sys.executable, "-m", "rollout_ray"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # several CLI processes each

TASKSET = """
from rollout_ray import ChatHarness, EvalConfig, Task, TaskData, Trace, metric, reward


class ArithData(TaskData):
    answer: int


class Arith(Task):
    data_type = ArithData

    @reward
    def correct(self, task: ArithData, trace: Trace) -> float:
        return {correct}

    @metric
    def reply_chars(self, trace: Trace) -> float:
        {metric}
        return len(trace.last_reply)


def tasks():
    return [Arith({{"idx": i, "prompt": f"What is {{i}} + 2?", "answer": i + 2}}) for i in range(3)]


def harness():
    return ChatHarness(retries=0)


def judge(group):
    return {{"metric_group_rows": [float(group.num_rows)] * group.num_rows}}


config = EvalConfig(samples_per_task=2)
"""

WRONG = TASKSET.format(correct="float(trace.last_reply.strip() == str(task.answer + 1))  # off by one", metric="pass")
RIGHT = TASKSET.format(correct="float(trace.last_reply.strip() == str(task.answer))", metric="pass")


def _run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def rescored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run made with a wrong reward (eval, local executor), then rescored with the right one."""
    base = tmp_path_factory.mktemp("rescore")
    wrong, right, out = base / "wrong.py", base / "right.py", base / "run"
    wrong.write_text(WRONG)
    right.write_text(RIGHT)
    made = _run("eval", wrong, "--executor", "local", "--out", out)
    assert made.returncode == 0, made.stderr[-2000:]
    before = read_run(out)
    fixed = _run("rescore", out, "--taskset", right, "--workers", "2")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    return {"out": out, "before": before, "made": made, "fixed": fixed, "wrong": wrong, "right": right}


def test_the_stored_run_had_the_wrong_reward(rescored: dict[str, Any]) -> None:
    before = rescored["before"]
    assert before["ok"].to_pylist() == [True] * 6 and before["reward"].to_pylist() == [0.0] * 6


def test_rescore_writes_a_new_version_and_read_run_reads_it(rescored: dict[str, Any]) -> None:
    out, fixed = rescored["out"], rescored["fixed"]
    assert fixed.stdout.splitlines()[0].startswith("rescored 6 of 6 rollouts (0 failed before scoring) in ")
    assert fixed.stdout.splitlines()[0].endswith(": 6 rewards changed, 0 scoring failures; mean reward 0.000 -> 1.000")
    after = read_run(out)
    assert after["reward"].to_pylist() == [1.0] * 6 and after["rescored"].to_pylist() == [True] * 6
    assert [dict(r) for r in after["rewards"].to_pylist()] == [{"correct": 1.0}] * 6
    assert after["metric_group_rows"].to_pylist() == [2.0] * 6  # the group judge ran again
    assert {t.reward for t in table_to_traces(after)} == {1.0}  # the trace blobs agree
    assert read_groups(out)["mean"].to_pylist() == [1.0] * 3
    assert read_run(out, scores=1)["reward"].to_pylist() == [0.0] * 6  # the stored version is kept
    assert read_groups(out, scores=1)["mean"].to_pylist() == [0.0] * 3
    assert sorted(p.name for p in (out / "scores").iterdir()) == ["v2"]


def test_report_shows_the_new_scores(rescored: dict[str, Any]) -> None:
    report = _run("report", rescored["out"])
    assert report.returncode == 0, report.stderr[-2000:]
    assert "mean reward 1.0000" in report.stdout and "pass@1 1.0000" in report.stdout


def test_the_viewer_shows_the_new_scores(rescored: dict[str, Any]) -> None:
    out = rescored["out"]
    run, page = view_api(out, "api/run?run=run", "api/rollouts?run=run&limit=100")
    assert run["mean_reward"] == 1.0
    assert [r["reward"] for r in page["rows"]] == [1.0] * 6
    rid = page["rows"][0]["rollout_id"]
    one, group = view_api(out, f"api/rollout?run=run&id={rid}", f"api/siblings?run=run&id={rid}")
    assert (one["ok"], one["reward"], one["rewards"]) == (True, 1.0, [{"name": "correct", "score": 1.0, "weight": 1.0}])
    assert group["mean_reward"] == 1.0 and [r["reward"] for r in group["rows"]] == [1.0, 1.0]


def test_a_task_whose_scoring_needs_its_sandbox_is_refused_in_one_line(
    rescored: dict[str, Any], tmp_path: Path
) -> None:
    boxed = tmp_path / "boxed.py"
    boxed.write_text(
        RIGHT.replace(
            "def correct(self, task: ArithData, trace: Trace)",
            "def correct(self, task: ArithData, trace: Trace, runtime)",
        )
    )
    refused = _run("rescore", rescored["out"], "--taskset", boxed)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        "rollout-ray rescore: error: task Arith's @reward correct takes `runtime`: its scoring "
        "needs the rollout's sandbox, which a rescore does not have\n"
    )


def test_another_taskset_is_refused(rescored: dict[str, Any], tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text(RIGHT.replace('"answer": i + 2', '"answer": i + 3'))
    refused = _run("rescore", rescored["out"], "--taskset", other)
    assert refused.returncode == 2
    assert refused.stderr.startswith("rollout-ray rescore: error: the taskset's task at position 0 is not the run's")


def test_rescore_of_a_stored_scoring_failure(tmp_path: Path) -> None:
    """A reward that raised on some rollouts (they failed in scoring): fixed, they are ok."""
    raising = tmp_path / "raising.py"
    raising.write_text(TASKSET.format(correct="1.0 / (task.idx - 1)  # idx 1 divides by zero", metric="pass"))
    out = tmp_path / "run"
    assert _run("eval", raising, "--executor", "local", "--out", out).returncode == 0
    stored = read_run(out)
    assert [(r["ok"], r["error_type"]) for r in stored.select(["ok", "error_type"]).to_pylist()].count(
        (False, "TaskError")
    ) == 2
    right = tmp_path / "right.py"
    right.write_text(RIGHT)
    fixed = _run("rescore", out, "--taskset", right, "--workers", "1")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    after = read_run(out)
    assert after["ok"].to_pylist() == [True] * 6 and after["error_type"].to_pylist() == [None] * 6
    assert after["num_errors"].to_pylist() == [0] * 6
    assert all(t.ok and not t.errors for t in table_to_traces(after))


def test_a_scoring_function_that_never_returns_is_that_rollouts_failure(
    rescored: dict[str, Any], tmp_path: Path
) -> None:
    """Bounded per rollout (``--timeout``): the rescore ends, the two rollouts of task 0 failed."""
    run = tmp_path / "run"
    shutil.copytree(rescored["out"], run)
    hangs = tmp_path / "hangs.py"
    hangs.write_text(
        TASKSET.format(
            correct="float(trace.last_reply.strip() == str(task.answer))",
            metric='if trace.task.idx == 0: __import__("time").sleep(3600)',
        )
    )
    done = _run("rescore", run, "--taskset", hangs, "--timeout", "0.5")
    assert done.returncode == 0, done.stderr[-2000:]
    assert ": 2 rewards changed, 2 scoring failures; mean reward 1.000 -> 0.667" in done.stdout.splitlines()[0]
    after = read_run(run)
    assert after["score_error"].to_pylist() == ["rescoring did not finish within 0.5s"] * 2 + [None] * 4
    assert after["ok"].to_pylist() == [False] * 2 + [True] * 4
    assert sorted(p.name for p in (run / "scores").iterdir()) == ["v2", "v3"]


def test_a_scores_folder_that_is_a_link_is_refused_and_nothing_written_through_it(
    rescored: dict[str, Any], tmp_path: Path
) -> None:
    """A run directory someone else can write: ``scores`` planted as a link to an outside folder."""
    out, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(rescored["out"], out, symlinks=True)
    (out / "scores").rename(outside)
    (out / "scores").symlink_to(outside)
    refused = _run("rescore", out, "--taskset", rescored["right"])
    assert refused.returncode == 2 and "is a symbolic link" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in outside.iterdir()) == ["v2"]  # nothing written through the link


def test_a_version_name_taken_by_a_plain_file_is_refused_in_one_line_and_nothing_is_left(
    rescored: dict[str, Any], tmp_path: Path
) -> None:
    """``scores/v2`` a plain file (planted, or left by hand): no traceback, no ``scores/v2.tmp``."""
    out = tmp_path / "run"
    shutil.copytree(rescored["out"], out)
    shutil.rmtree(out / "scores" / "v2")
    (out / "scores" / "v2").write_text("not a version")
    refused = _run("rescore", out, "--taskset", rescored["right"])
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr[-2000:]
    assert "scores/v2 is not a score version's folder" in refused.stderr and "move it aside" in refused.stderr
    assert sorted(p.name for p in (out / "scores").iterdir()) == ["v2"]
    assert (out / "scores" / "v2").read_text() == "not a version"
