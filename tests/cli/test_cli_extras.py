"""The command line without its ``[cli]`` extra (matplotlib, tqdm): ``eval`` runs and shows its
progress as plain lines even in a terminal; ``report`` and ``sweep`` print their results and,
where the plot's path would be, one line naming the install command.

The extra's absence is simulated in the command's own process: ``sys.modules[name] = None`` makes
``import name`` fail and ``find_spec(name)`` find nothing, as in an environment without it.
"""

from __future__ import annotations

import io
import os
import pathlib
import pty
import select
import subprocess
import sys
import time

import pytest

from rollout_ray._cli.progress_display import ProgressDisplay
from rollout_ray._driver.driver import Progress

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
WITHOUT_EXTRA = (
    "import runpy, sys; sys.modules.update(dict.fromkeys(('matplotlib', 'tqdm'))); "
    "runpy.run_module('rollout_ray', run_name='__main__')"
)
NO_PLOT = "plot: none, matplotlib is not installed (pip install -e '.[cli]' adds it)"


def _without_extra(*args: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_EXTRA, *args]


def _on_a_terminal(argv: list[str], timeout: float = 120) -> tuple[int | None, str]:
    """Run ``argv`` with its stderr on a pseudo-terminal: its exit code (None if it was still
    running after ``timeout`` s, and killed) and what the terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: no writer left
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    try:
        return proc.wait(timeout=max(5.0, deadline - time.monotonic())), seen.decode(errors="replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, seen.decode(errors="replace")


@pytest.mark.timeout(240)
def test_eval_and_report_run_without_the_cli_extra(tmp_path: pathlib.Path) -> None:
    run_dir = str(tmp_path / "run")
    code, terminal = _on_a_terminal(
        _without_extra(
            "eval", ARITH, "--executor", "local", "--limit", "2", "--samples", "2", "--sim-ttft", "0", "--out", run_dir
        )
    )
    assert code == 0, terminal[-2000:]
    assert "%|" not in terminal and "done 4/4  failed 0  in flight 0  reward 1.000" in terminal, terminal[-2000:]
    report = subprocess.run(_without_extra("report", run_dir), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "rollouts 4  ok 4  failed 0" in report.stdout
    assert report.stdout.strip().splitlines()[-1] == NO_PLOT
    assert not os.path.exists(os.path.join(run_dir, "report.png"))


@pytest.mark.timeout(240)
def test_a_sweep_without_the_cli_extra_compares_its_points_without_a_plot(tmp_path: pathlib.Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(f'taskset = "{ARITH}"\n[base]\nsamples = 1\nlimit = 2\n')
    out = tmp_path / "sweep"
    result = subprocess.run(
        _without_extra("sweep", str(grid), "--out", str(out), "--executor", "local"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == (
        f"comparison: {out}/comparison.parquet, {out}/comparison.csv, {NO_PLOT}"
    )
    assert sorted(os.listdir(out)) == ["001-model=simulated", "comparison.csv", "comparison.parquet", "grid.toml"]


def test_a_terminal_without_tqdm_gets_the_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    stream = io.StringIO()
    display = ProgressDisplay(stream, tty=True)
    display.update(Progress(done=0, total=4, failed=0, in_flight=1))
    display.update(Progress(done=3, total=4, failed=0, in_flight=1, reward_sum=1.5))  # the driver's mean
    display.close()
    first, second = stream.getvalue().splitlines()[:2]
    assert first.startswith("done 0/4  failed 0  in flight 1  reward -")
    assert second.startswith("done 3/4  failed 0  in flight 1  reward 0.500")
