"""``rollout-ray eval examples/<agent>.py`` runs real coding agents (Codex CLI, Claude Code),
unchanged, mini-swe-agent and an OpenAI Agents SDK program, on Ray in the default sandbox, driven by the simulated model's scripted plan: the
rewards read the files each agent left in its sandbox, token data is stored for every rollout,
and a task's tools reach Codex, Claude Code and the Agents SDK as an MCP server, its calls on ``trace.tool_calls``
(issue 29 §2, issue 30's "Done when"). The agents are installed by the presets from the npm
registry and the package index once per node; a test is skipped, with the reason, where that install cannot be made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_ray import HarnessError, read_run, table_to_traces
from rollout_ray._harnesses.agents import AgentsSdkHarness, ClaudeCodeHarness, CodexHarness, MiniSweAgentHarness

HARNESSES = {
    "codex": CodexHarness,
    "claude_code": ClaudeCodeHarness,
    "mini_swe_agent": MiniSweAgentHarness,
    "agents_sdk": AgentsSdkHarness,
}


def _installed(agent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed here first, within a bound that leaves the test its time (a registry that
    stalls skips the test rather than running into pytest's guard); the eval then finds it."""
    monkeypatch.setenv("ROLLOUT_RAY_AGENT_INSTALL_TIMEOUT", "360")
    try:
        HARNESSES[agent]().install()
    except HarnessError as exc:
        pytest.skip(f"cannot install {agent} on this machine: {exc}")


def _eval(example: str, out: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            f"examples/{example}.py",
            "--limit",
            "2",
            "--samples",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollouts 2  ok 2  failed 0  groups 2" in done.stdout, done.stdout
    assert "mean reward 1.0000" in done.stdout and "token data: stored for 2 of 2 rollouts" in done.stdout
    assert "runtime  sandbox" in done.stdout or "fell back" in done.stdout
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("agent", "tools"),
    [
        ("codex", ["exec_command", "exec_command"]),
        ("claude_code", ["Bash", "Write"]),
        # the plan's two steps, then its submit command
        ("mini_swe_agent", ["bash", "bash", "bash"]),
        ("agents_sdk", ["bash", "bash"]),
    ],
)
def test_eval_runs_a_real_agent_that_leaves_the_files_its_reward_reads(
    agent: str, tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(agent, monkeypatch)
    _eval(agent, tmp_path / "run")
    for trace in table_to_traces(read_run(tmp_path / "run")):
        calls = [c.name for m in trace.assistant_messages for c in m.tool_calls or ()]
        assert calls == tools  # the plan's steps, through the agent's own tools
        assert trace.rewards["file_written"].score == 1.0
        if agent != "mini_swe_agent":  # it ends on its submit command, not on a text answer
            assert trace.last_reply.startswith("saved out/result")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("agent", "name"), [("claude_code", "mcp__calc__add"), ("agents_sdk", "add"), ("codex", "mcp__calc__add")]
)  # Codex: a namespace tool, joined
def test_an_agent_calls_the_tasks_tool_over_mcp_and_the_call_is_on_the_trace(
    agent: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(agent, monkeypatch)
    _eval("agent_mcp", tmp_path / "run", {"AGENT": agent})
    for trace in table_to_traces(read_run(tmp_path / "run")):
        assert name in [t.name for t in trace.tools or ()]  # the task's tool, as the agent names it
        (call,) = trace.tool_calls
        assert call.server == "calc" and call.name == "add" and call.ok
        a, b = json.loads(call.arguments).values()
        assert trace.last_reply == str(a + b)
