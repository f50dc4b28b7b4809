"""``rollout-ray sweep`` stopped by SIGINT or SIGTERM: one line with the points stored and the
command that continues it; SIGINT stops it even when it started with SIGINT ignored, as a
background job of a shell does. Real CLI processes."""

from __future__ import annotations

import os
import pathlib
import shlex
import signal
import subprocess
import sys

import pytest

from rollout_ray._record.store import read_run

ARITH = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")
CLI = [sys.executable, "-m", "rollout_ray"]
GRID = f"""
taskset = "{ARITH}"
[base]
samples = 2
limit = 3
executor = "local"
[grid]
model = [{{name = "slow", ttft = 0.3}}]
sampling = [{{temperature = 0.0}}, {{temperature = 0.1}}, {{temperature = 0.2}}]
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does for `cmd &`


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_sweep_with_the_points_stored_and_how_to_continue(
    tmp_path: pathlib.Path, signum: int, code: int
) -> None:
    grid, out = tmp_path / "grid.toml", tmp_path / "sweep"
    grid.write_text(GRID)
    proc = subprocess.Popen(
        [*CLI, "sweep", str(grid), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # waits on output, not on time: the first point is stored
        seen.append(line)
        if line.startswith("[1/3] ") and ": completed, mean reward" in line:
            break
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    stderr = "".join(seen) + err
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (line,) = [s for s in stderr.splitlines() if s.startswith("interrupted")]
    head, command = line.split("; continue with: ")
    complete = sum(
        read_run(str(out / name), ["reward"]).num_rows == 6
        for name in os.listdir(out)
        if (out / name / "manifest.json").exists()
    )
    assert head == f"interrupted: {complete} of 3 points stored" and complete >= 1
    assert shlex.split(command) == ["rollout-ray", "sweep", str(grid), "--resume", "--out", str(out)]
    again = subprocess.run([*CLI, *shlex.split(command)[1:]], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(n for n in os.listdir(out) if n[0].isdigit()) == [
        "001-model=slow-temperature=0.0",
        "002-model=slow-temperature=0.1",
        "003-model=slow-temperature=0.2",
    ]
