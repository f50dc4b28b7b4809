"""A real coding agent uses the task's tools over MCP: the task's ``Toolset`` (the calculator
of ``calc_tool.py``) is served to the agent as an MCP server (``ROLLOUT_RAY_MCP``, which the
presets put in Claude Code's ``--mcp-config`` and Codex's ``config.toml``); every call lands on
``trace.tool_calls`` as a native one would. ``AGENT=codex`` or ``AGENT=agents_sdk`` runs Codex
CLI or the Agents SDK preset instead of Claude Code.

    rollout-ray eval examples/agent_mcp.py --limit 2
    AGENT=codex rollout-ray eval examples/agent_mcp.py --limit 2
"""

from __future__ import annotations

import os
import sys

from rollout_ray import AgentHarness, AgentsSdkHarness, ClaudeCodeHarness, CodexHarness, Trace, metric

sys.path.insert(0, os.path.dirname(__file__))
from calc_tool import Calc


class McpCalc(Calc):
    @metric
    def mcp_calls(self, trace: Trace) -> float:
        return sum(call.name == "add" for call in trace.tool_calls)


def tasks(n: int = 4) -> list[McpCalc]:
    return [McpCalc({"idx": i, "prompt": f"What is {100 + i} + {23 * i}?", "answer": 100 + 24 * i}) for i in range(n)]


PRESETS = {"claude_code": ClaudeCodeHarness, "codex": CodexHarness, "agents_sdk": AgentsSdkHarness}


def harness() -> AgentHarness:
    agent = os.environ.get("AGENT", "claude_code")
    if agent not in PRESETS:
        raise ValueError(f"AGENT={agent!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[agent](timeout=300)
