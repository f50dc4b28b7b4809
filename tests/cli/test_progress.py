"""eval's progress: rate and ETA after warm-up, the running mean reward, a bar in a terminal, a
plain line every few seconds otherwise. A fake clock; no waiting."""

from __future__ import annotations

import io

import pytest

from rollout_ray._cli.progress_display import PLAIN_EVERY, ProgressDisplay
from rollout_ray._driver.driver import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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
    assert lines[0] == "done 1/4  failed 0  in flight 0  reward 0.000  wall 0s  measuring rate"
    assert lines[1].endswith("0.2 rollouts/s  ETA 4s")  # 2 more in the 8 s after the first
    assert lines[-1].startswith("done 4/4  failed 0") and lines[-1].endswith("finished")


def test_a_run_that_ends_in_one_burst_never_reads_warming_up_after_its_first_rollout() -> None:
    """A group of 8 finishing together: before, the last line said "warming up" (no rate from one
    finishing) or a rate since the first finished far from the summary's; now it says finished."""
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=False)
    p = Progress(total=8)
    display.update(p)
    clock.now += 30
    p.done = 8
    display.update(p)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("warming up")
    assert lines[-1].startswith("done 8/8") and lines[-1].endswith("finished")
    assert "rollouts/s" not in lines[-1] and "warming up" not in lines[-1]


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


def test_the_running_mean_reward_is_the_drivers_count_of_kept_outcomes() -> None:
    """The display shows ``Progress.mean_reward``: a failure counts 0, a stale sample taken
    back (to run again) leaves the mean as if it had never been counted."""
    p = Progress(total=3)
    for ok, r in [(True, 1.0), (False, 0.7), (True, 0.5), (True, float("nan"))]:
        p.count(ok, r)
    assert (p.done, p.failed, p.reward_sum) == (4, 1, 1.5)
    p.count(False, 0.7, sign=-1)  # taken back
    assert (p.done, p.failed, p.mean_reward) == (3, 0, pytest.approx(0.5))
    display = ProgressDisplay(io.StringIO(), clock=Clock(), tty=False)
    assert display.fields(p)["mean_reward"] == pytest.approx(0.5)
    assert display.fields(Progress(total=3))["mean_reward"] is None


@pytest.mark.slow
def test_with_retry_failed_the_bar_and_the_summary_show_one_mean_reward(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real eval whose reward raises on some first attempts (issue 28): the progress line
    averaged attempts (4 of 6 scored: 0.667) where the summary averaged the stored rollouts (1.0)."""
    import pathlib
    import re
    import subprocess
    import sys

    flaky = pathlib.Path(__file__).parent / "tasksets" / "flaky_reward.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            str(flaky),
            "--executor",
            "local",
            "--retry-failed",
            "--retries",
            "1",
            "--sim-ttft",
            "0",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stderr.splitlines()[-1]
    assert last.startswith("done 4/4  failed 0  in flight 0  reward 1.000"), result.stderr[-2000:]
    summary = re.search(r"^mean reward ([\d.]+)", result.stdout, re.M)
    assert summary and float(summary.group(1)) == 1.0, result.stdout


def test_in_a_terminal_a_live_bar_with_failures_reward_and_eta() -> None:
    clock, stream = Clock(), io.StringIO()
    display = ProgressDisplay(stream, clock=clock, tty=True)
    p = Progress(total=10, done=1, failed=1)
    display.update(p)
    clock.now += 65
    p.done, p.reward_sum = 6, 3.0
    display.update(p)
    display.close()
    frames = [f for f in stream.getvalue().split("\r") if f.strip()]
    first = next(f for f in frames if "1/10" in f)
    assert "measuring rate" in first
    assert "60%" in frames[-1]
    assert "6/10, failed 1  reward 0.500  [wall 1:05, 0.1/s ETA 52s]" in frames[-1]  # 5 in the 65 s after the first


@pytest.mark.slow
def test_a_real_terminal_gets_the_bar_and_a_pipe_the_plain_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The CLI with its stderr on a pseudo-terminal (which reports no size, as some do)."""
    import os
    import pathlib
    import pty
    import subprocess
    import sys

    arith = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
    argv = [
        sys.executable,
        "-m",
        "rollout_ray",
        "eval",
        arith,
        "--executor",
        "local",
        "--limit",
        "2",
        "--samples",
        "2",
        "--sim-ttft",
        "0",
    ]
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


def test_with_an_adaptive_bound_the_line_shows_the_target_and_why() -> None:
    stream = io.StringIO()
    display = ProgressDisplay(stream, clock=Clock(), tty=False)
    p = Progress(total=4, done=1, in_flight=30, target=40, target_why="servers have room")
    display.update(p)
    assert stream.getvalue().startswith("done 1/4  failed 0  in flight 30/40 (servers have room)  reward")


def test_max_in_flight_takes_a_number_or_auto() -> None:
    import argparse

    from rollout_ray._cli.arguments import in_flight_bound

    assert in_flight_bound("auto") == "auto" and in_flight_bound("8") == 8
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be >= 1, got 0 \(or 'auto'"):
        in_flight_bound("0")
