"""The record, the lifecycle core and hosting type-check: ``mypy`` with the project's settings
(``[tool.mypy]`` in pyproject.toml). Without a checker, annotations and ``# type: ignore``
comments are claims nobody verifies."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_the_gated_packages_type_check(tmp_path: pathlib.Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "no issues found" in result.stdout
