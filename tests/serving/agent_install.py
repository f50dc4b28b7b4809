"""Agent programs for the tests, installed at test time the way their users install them,
nothing committed: ``npm install`` of a pinned package, once per machine, under
``ROLLOUT_RAY_TEST_AGENTS`` (default ``~/.cache/rollout-ray-test-agents``). A test that cannot
install one (no npm, the registry unreachable) is skipped with the reason."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("ROLLOUT_RAY_TEST_AGENTS") or Path.home() / ".cache" / "rollout-ray-test-agents")


@functools.cache
def npm_binary(package: str, version: str, binary: str) -> Path:
    """The path of ``binary`` of ``package@version``, installed if it is not yet."""
    final = ROOT / f"{package.replace('/', '+')}@{version}"
    path = final / "node_modules" / ".bin" / binary
    if path.exists():
        return path
    if shutil.which("npm") is None:
        pytest.skip(f"cannot install {package}: no npm on this machine")
    ROOT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=ROOT, prefix=".install-"))
    try:
        try:  # bounded below pytest's per-test guard: a registry that stalls skips, never hangs the test
            done = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(work), f"{package}@{version}"],
                capture_output=True,
                text=True,
                timeout=240,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot install {package}@{version}: the npm registry did not answer within 240 s")
        if done.returncode != 0:
            pytest.skip(f"cannot install {package}@{version} from the npm registry: {done.stderr.strip()[-300:]}")
        try:
            work.rename(final)
        except OSError:  # another session installed it meanwhile
            shutil.rmtree(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return path
