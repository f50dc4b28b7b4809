"""Codex CLI (``@openai/codex``) and Claude Code (``@anthropic-ai/claude-code``), from the
npm registry, pinned, unchanged, through the package's presets (``CodexHarness``,
``ClaudeCodeHarness``: their installs, launchers and config) on the simulated model: Codex
speaks Responses to the proxy, Claude Code Messages (``?beta=true``, its system messages
among the turns), each with its long prompt and its tools (those with no Chat Completions
counterpart dropped and recorded); each answers, and is rewarded and stored as one training
sequence. A rollout runs in a process in a network namespace of its own (bubblewrap's
``--unshare-net``: loopback only), so that whatever else an agent might send never leaves
the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_rig import install_or_skip

from rollout_ray._harnesses.agents import AgentHarness, ClaudeCodeHarness, CodexHarness
from rollout_ray._runtimes.sandbox import bwrap_path, sandbox_unavailable

ROLLOUT = str(Path(__file__).parent / "programs" / "agent_rollout.py")
AGENTS = [
    pytest.param(CodexHarness, "codex", "/responses", "'web_search' tool", id="codex"),
    pytest.param(ClaudeCodeHarness, "claude-code", "/messages", "(a thinking budget)", id="claude-code"),
]
REASON = sandbox_unavailable(disk_limit=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(REASON is not None, reason=f"no network namespace on this machine: {REASON}")
@pytest.mark.parametrize(("preset", "agent", "endpoint", "dropped"), AGENTS)
def test_real_agent_rollout_through_the_proxy_is_one_rewarded_sequence(
    preset: type[AgentHarness], agent: str, endpoint: str, dropped: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_or_skip(preset(), monkeypatch)  # here, where the registry is reachable; not in the namespace
    done = subprocess.run(
        [
            bwrap_path(),
            "--dev-bind",
            "/",
            "/",
            "--unshare-net",
            "--",
            sys.executable,
            "-W",
            "error",
            ROLLOUT,
            agent,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["errors"] == []
    (call,) = summary["calls"]
    assert call["endpoint"] == endpoint and call["finish_reason"] == "stop"
    assert any(dropped in why for why in call["dropped"].values()), call["dropped"]
    assert len(summary["tools"]) > 3  # the agent's function tools went upstream
    assert summary["last_reply"] == "4" and summary["rewards"] == {"correct": 1.0}
    assert summary["token_drift"] == [] and summary["sequences"] == 1 and summary["branch_reasons"] == ["main"]
