"""eval --resume: what it redoes (every stored failure with --retry-failed) and what it refuses
before Ray starts (other settings, named with their stored and given values; a run another eval
is starting). Real CLI processes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout_ray import read_run

CLI = [sys.executable, "-m", "rollout_ray"]

FLAKY = """
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
"""


def _eval(tmp_path: pathlib.Path, *argv: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["RAY_TMPDIR"] = str(tmp_path / "ray-tmp")  # a Ray that starts shows
    return subprocess.run([*CLI, "eval", *map(str, argv)], capture_output=True, text=True, timeout=120, env=environment)


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


def _refused(tmp_path: pathlib.Path, *argv: str | pathlib.Path) -> str:
    """The one line of an eval refused before Ray (its own Ray temp dir never made)."""
    done = _eval(tmp_path, *argv)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert not (tmp_path / "ray-tmp").exists()  # Ray never started
    (line,) = done.stderr.splitlines()
    return line


def test_a_resume_with_other_settings_is_refused_before_ray_with_the_values(tmp_path: pathlib.Path) -> None:
    arith = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
    out = tmp_path / "run"
    first = _eval(tmp_path, arith, "--executor", "local", "--limit", "1", "--sim-ttft", "0", "--out", out)
    assert first.returncode == 0, first.stderr[-2000:]
    # The default executor is Ray: a check made only after Ray's start would show in ray-tmp.
    line = _refused(tmp_path, arith, "--limit", "1", "--samples", "2", "--temperature", "0.5", "--resume", "--out", out)
    assert line == (
        f"rollout-ray eval: error: {out} was run with other settings (eval.samples_per_task: stored 4, given 2; "
        "eval.sampling.temperature: stored none, given 0.5; model.simulated.ttft: stored 0.0, given 0.05); "
        "resume with the settings it was run with, or start a new run in another directory"
    )


class _HeldModels(BaseHTTPRequestHandler):
    """``GET /v1/models`` answers once ``release`` is set: an eval asking it is held in its start."""

    asked = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.asked.set()
        self.release.wait(60)
        body = json.dumps({"object": "list", "data": [{"id": "held", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_second_eval_on_a_starting_run_is_refused_before_ray_and_ctl_says_it_starts(tmp_path: pathlib.Path) -> None:
    """The first eval is held in its start (before Ray) by a model server the test holds: a
    second eval on its --out is refused in one line before its own Ray, and ctl says the run
    is starting, not that there is none. Released, the first runs to the end."""
    handler = type("Held", (_HeldModels,), {"asked": threading.Event(), "release": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    arith = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
    out = tmp_path / "run"
    first = subprocess.Popen(
        [
            *CLI,
            "eval",
            arith,
            "--executor",
            "local",
            "--limit",
            "1",
            "--samples",
            "1",
            "--model-url",
            f"http://127.0.0.1:{server.server_address[1]}/v1",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert handler.asked.wait(60), "the first eval never asked for its model"
        line = _refused(tmp_path, arith, "--out", out)
        assert line == (
            f"rollout-ray eval: error: {out} is in use by another process (pid {first.pid}); wait for "
            "it, or use another --out"
        )
        ctl = subprocess.run([*CLI, "ctl", str(out), "status"], capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 2 and ctl.stderr.splitlines() == [
            f"rollout-ray ctl: error: {out}: its run (pid {first.pid}) has no control endpoint yet: it opens when "
            "the rollouts start, after Ray's warm-up; try again in a few seconds"
        ]
        handler.release.set()
        _, stderr = first.communicate(timeout=120)
    finally:
        handler.release.set()
        if first.poll() is None:
            first.kill()
            first.wait()
        server.shutdown()
        server.server_close()
    assert first.returncode == 1, stderr[-2000:]  # "held" answers nothing right: every rollout fails, stored
    assert len(read_run(out, ["ok"])) == 1
