"""Codex CLI (``@openai/codex`` from the npm registry, pinned), unchanged, as a
ProgramHarness rollout on the simulated model: it speaks Responses to the proxy (its ~40 KB
developer prompt; its tools with no Chat Completions counterpart dropped and recorded),
answers, and is rewarded and stored as one training sequence. The rollout runs in a process
in a network namespace of its own (bubblewrap's ``--unshare-net``: loopback only), so that
whatever else Codex might send never leaves the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_install import npm_binary

from rollout_ray._runtimes.sandbox import bwrap_path, sandbox_unavailable

CODEX_VERSION = "0.169.0"
ROLLOUT = str(Path(__file__).parent / "programs" / "codex_rollout.py")
REASON = sandbox_unavailable(disk_limit=False)


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=f"no network namespace on this machine: {REASON}")
def test_codex_exec_rollout_through_the_proxy_is_one_rewarded_sequence() -> None:
    codex = npm_binary("@openai/codex", CODEX_VERSION, "codex")
    done = subprocess.run([bwrap_path(), "--dev-bind", "/", "/", "--unshare-net", "--",
                           sys.executable, "-W", "error", ROLLOUT, str(codex.resolve())],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["errors"] == []
    (call,) = summary["calls"]
    assert call["endpoint"] == "/responses" and call["finish_reason"] == "stop"
    assert "store" in call["dropped"] and any("'web_search' tool" in why for why in call["dropped"].values())
    assert len(summary["tools"]) > 3  # Codex's function tools went upstream
    assert summary["last_reply"] == "4" and summary["rewards"] == {"correct": 1.0}
    assert summary["token_drift"] == [] and summary["sequences"] == 1
