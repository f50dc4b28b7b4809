"""ruff's rules (``[tool.ruff.lint]`` in pyproject.toml) hold over the package, the tests, the
benchmarks and the examples, and every suppression is a rule's code the check knows: without the
check in the suite, a ``# noqa: BLE001 - why`` comment is a claim nobody verifies."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "rollout_ray",
            "tests",
            "benchmarks",
            "examples",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_code_is_formatted() -> None:
    """`ruff format` owns the layout, so a diff shows what changed, not whose editor saved it."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--check",
            "--no-cache",
            "rollout_ray",
            "tests",
            "benchmarks",
            "examples",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, "run `ruff format rollout_ray tests benchmarks examples`:\n" + result.stdout[-4000:]
