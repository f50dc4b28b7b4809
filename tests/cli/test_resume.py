"""eval --resume: what it redoes (every stored failure with --retry-failed) and what it refuses
before Ray starts (other settings, named with their stored and given values; a run another eval
is starting). Real CLI processes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from rollout_ray import read_run

CLI = [sys.executable, "-m", "rollout_ray"]

FLAKY = '''
import os

from rollout_ray import ChatHarness, Task, Trace, reward

BROKEN = {broken!r}


class Add(Task):
    @reward
    def correct(self, task, trace: Trace) -> float:
        if os.path.exists(BROKEN):
            raise ValueError("the grader is broken")
        return 1.0


def tasks():
    return [Add({{"prompt": f"What is {{i}} + 1?"}}) for i in range(2)]


def harness():
    return ChatHarness()
'''


def _eval(tmp_path: pathlib.Path, *argv: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["RAY_TMPDIR"] = str(tmp_path / "ray-tmp")  # a Ray that starts shows
    return subprocess.run([*CLI, "eval", *map(str, argv)], capture_output=True, text=True, timeout=120,
                          env=environment)


@pytest.mark.slow
def test_resume_with_retry_failed_redoes_the_stored_task_failures(tmp_path: pathlib.Path) -> None:
    """A grader fixed after the run: --resume --retry-failed runs its failed rollouts again
    (their earlier errors kept); --resume alone keeps them, as a task failure is the task's."""
    broken = tmp_path / "broken"
    broken.touch()
    taskset = tmp_path / "flaky.py"
    taskset.write_text(FLAKY.format(broken=str(broken)))
    out = tmp_path / "run"
    common = ["--executor", "local", "--samples", "2", "--sim-ttft", "0", "--out", out]
    first = _eval(tmp_path, taskset, *common)
    assert first.returncode == 1 and "rollouts 4  ok 0  failed 4" in first.stdout, first.stderr[-2000:]
    broken.unlink()  # the fix

    kept = _eval(tmp_path, taskset, *common, "--resume")
    assert kept.returncode == 1 and "rollouts 4  ok 0  failed 4" in kept.stdout, kept.stderr[-2000:]

    redone = _eval(tmp_path, taskset, *common, "--resume", "--retry-failed")
    assert redone.returncode == 0, redone.stderr[-2000:]
    assert "rollouts 4  ok 4  failed 0  groups 2" in redone.stdout
    table = read_run(out, ["ok", "attempt", "attempts"])
    assert table["ok"].to_pylist() == [True] * 4
    assert table["attempt"].to_pylist() == [1] * 4  # numbered on from the stored attempt
    assert all(a[0]["errors"][0]["type"] == "TaskError" for a in table["attempts"].to_pylist())
