"""A mistyped flag or command is one line that names the nearest one (argparse's
``suggest_on_error`` is Python 3.14's; this is 3.11). Real CLI processes."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ARITH = str(pathlib.Path(__file__).parents[2] / "examples" / "arith.py")


def _refused(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "rollout_ray", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    return line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["eval", ARITH, "--sampels", "4"],
            "rollout-ray eval: error: unrecognized arguments: --sampels 4; did you mean --samples?",
        ),
        (
            ["eval", ARITH, "--sampels=4", "--max-in-fligt", "3"],
            "rollout-ray eval: error: unrecognized arguments: --sampels=4 --max-in-fligt 3; did you mean --samples for "
            "--sampels, --max-in-flight for --max-in-fligt?",
        ),
        (
            ["ctl", "RUN", "status", "--stal-after", "3"],
            "rollout-ray ctl: error: unrecognized arguments: --stal-after 3; did you mean --stall-after?",
        ),
        (["eval", ARITH, "--zzzz"], "rollout-ray eval: error: unrecognized arguments: --zzzz"),
    ],
)
def test_a_mistyped_flag_names_the_nearest_one(argv: list[str], line: str) -> None:
    assert _refused(*argv) == line


def test_a_mistyped_command_names_the_nearest_one() -> None:
    line = _refused("evl", ARITH)
    assert line.startswith("rollout-ray: error: argument command: invalid choice: 'evl' (choose from 'eval', ")
    assert line.endswith("); did you mean 'eval'?")
