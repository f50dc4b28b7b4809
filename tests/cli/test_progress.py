"""eval's progress: rate and ETA after warm-up, the running mean reward, a bar in a terminal, a
plain line every few seconds otherwise. A fake clock; no waiting."""

from __future__ import annotations

import io

import pytest

from rollout_ray._cli.progress import PLAIN_EVERY, ProgressDisplay, Watched
from rollout_ray._driver.driver import Progress
from rollout_ray._hosting.executor import Executor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._record.trace import Reward, Trace, TraceTask

from conftest import run


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Rewarding(Executor):
    def __init__(self, rewards: list[float]) -> None:
        self.rewards = iter(rewards)

    async def run(self, spec: RolloutSpec) -> Trace:
        trace = Trace(task=TraceTask(type="T"), ok=True)
        trace.rewards["r"] = Reward(next(self.rewards))
        return trace


def test_rate_and_eta_count_from_the_first_finished_rollout_not_from_the_start() -> None:
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=False)
    p = Progress(total=100)
    clock.now += 30  # Ray, actors, the first model answer: warm-up
    p.done = 1
    assert display.fields(p)["rate"] is None and display.fields(p)["eta"] is None
    clock.now += 2
    p.done = 21
    f = display.fields(p)
    assert f["rate"] == pytest.approx(10.0)  # 20 in 2 s, not 21 in 32 s
    assert f["eta"] == pytest.approx(7.9)
    assert f["wall"] == pytest.approx(32.0)


def test_skipped_samples_of_a_resume_are_not_in_the_total() -> None:
    display = ProgressDisplay(io.StringIO(), clock=Clock(), tty=False)
    assert display.fields(Progress(total=100, skipped=60))["total"] == 40


def test_a_plain_line_every_few_seconds_and_at_the_end() -> None:
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=False)
    p = Progress(total=4)
    for done in range(1, 4):
        p.done = done
        display.update(p)
        clock.now += 1
    clock.now += PLAIN_EVERY
    display.update(p)
    p.done = 4
    display.update(p)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # the first, one after PLAIN_EVERY, the last
    assert lines[0] == "done 1/4  failed 0  in flight 0  reward -  wall 0s  warming up"
    assert lines[-1].startswith("done 4/4  failed 0") and "rollouts/s  ETA 0s" in lines[-1]


def test_a_run_with_no_known_total_ends_its_log_on_the_last_counts() -> None:
    """max_groups: no total, so no "done >= total" line; close writes the held-back counts."""
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=False)
    p = Progress(total=None)
    for done in range(1, 11):
        p.done = done
        display.update(p)
    display.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("done 1  failed 0") and lines[-1].startswith("done 10  failed 0")
    display.close()
    assert len(stream.getvalue().splitlines()) == len(lines)  # written once


def test_the_running_mean_reward_comes_from_the_traces_handed_back() -> None:
    watched = Watched(_Rewarding([1.0, 0.0, 0.5]))
    for _ in range(3):
        run(watched.run(None))  # type: ignore[arg-type]
    assert watched.mean_reward == pytest.approx(0.5)
    display = ProgressDisplay(io.StringIO(), watched, clock=Clock(), tty=False)
    assert display.fields(Progress(total=3, done=3))["mean_reward"] == pytest.approx(0.5)

    class Bounded(_Rewarding):
        max_in_flight = 3

    assert Watched(Bounded([])).max_in_flight == 3  # the driver's bound check sees the real one

    class Policed(_Rewarding):
        policy: tuple[int | None, bool] | None = None

        async def set_policy(self, version: int | None, paused: bool) -> None:
            self.policy = (version, paused)

    inner = Policed([])
    run(Watched(inner).set_policy(3, True))
    assert inner.policy == (3, True)  # a pause from the driver reaches the real executor


def test_in_a_terminal_a_live_bar_with_failures_reward_and_eta() -> None:
    clock, stream = Clock(), io.StringIO()
    watched = Watched(_Rewarding([1.0, 0.0]))
    for _ in range(2):
        run(watched.run(None))  # type: ignore[arg-type]
    display = ProgressDisplay(stream, watched, clock=clock, tty=True)
    p = Progress(total=10, done=1, failed=1)
    display.update(p)
    clock.now += 65
    p.done = 6
    display.update(p)
    display.close()
    frames = [f for f in stream.getvalue().split("\r") if f.strip()]
    first = next(f for f in frames if "1/10" in f)
    assert "warming up" in first
    assert "60%" in frames[-1]
    assert "6/10, failed 1  reward 0.500  [wall 1:05, 0.1/s ETA 52s]" in frames[-1]  # 5 in the 65 s after the first


def test_the_display_costs_nothing_per_rollout() -> None:
    """The driver calls the display at most every 0.5 s; per rollout there is only the
    executor wrapper, whose CPU cost is measured here against the bare executor."""
    import time

    async def many(executor: Executor, n: int) -> float:
        started = time.process_time()
        for _ in range(n):
            await executor.run(None)  # type: ignore[arg-type]
        return time.process_time() - started

    n = 2000
    bare = run(many(_Rewarding([1.0] * n), n))
    wrapped = run(many(Watched(_Rewarding([1.0] * n)), n))
    assert (wrapped - bare) / n < 20e-6  # under 20 µs of CPU per rollout (measured: ~1 µs)


@pytest.mark.slow
def test_a_real_terminal_gets_the_bar_and_a_pipe_the_plain_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The CLI with its stderr on a pseudo-terminal (which reports no size, as some do)."""
    import os
    import pathlib
    import pty
    import subprocess
    import sys

    arith = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
    argv = [sys.executable, "-m", "rollout_ray", "eval", arith, "--executor", "local", "--limit", "2",
            "--samples", "2", "--sim-ttft", "0"]
    master, slave = pty.openpty()
    proc = subprocess.Popen([*argv, "--out", str(tmp_path / "tty")], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:  # until the process closes its end of the terminal
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: no writer left
            break
        if not chunk:
            break
        seen += chunk
    proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0
    frames = seen.decode(errors="replace").replace("\r\n", "\n").split("\r")
    assert any("100%|" in f and "4/4, failed 0  reward 1.000" in f for f in frames), seen[-2000:]
    piped = subprocess.run([*argv, "--out", str(tmp_path / "pipe")], capture_output=True, text=True, timeout=60)
    assert "%|" not in piped.stderr
    assert piped.stderr.splitlines()[-1].startswith("done 4/4  failed 0  in flight 0  reward 1.000")


def test_the_wall_clock_is_the_commands_not_the_drivers() -> None:
    """eval hands over when it started (before Ray): the line's wall is the summary's."""
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=False, started=clock.now - 3.5)  # Ray took 3.5 s
    display.update(Progress(total=4, done=1))
    assert "  wall 3s  " in stream.getvalue()


class _Failing(Executor):
    async def run(self, spec: RolloutSpec) -> Trace:
        trace = Trace(task=TraceTask(type="T"))
        trace.rewards["r"] = Reward(1.0)  # scored, then failed: it counts as 0
        trace.record_error(RuntimeError("late"))
        return trace


def test_a_failed_rollout_counts_as_reward_zero_in_the_running_mean() -> None:
    watched = Watched(_Failing())
    run(watched.run(None))  # type: ignore[arg-type]
    assert watched.mean_reward == 0.0
