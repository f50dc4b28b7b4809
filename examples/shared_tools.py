"""A taskset whose calculator is one MCP server shared by all its rollouts on a node.

``examples/mcp_calc_server.py`` (the official SDK's ``MCPServer``, ``pip install mcp``) is
started over HTTP by the first rollout on a node that needs it, reached by every other one,
restarted if it dies and stopped at the run's end. Each rollout's calls are still its own:
they land on its ``trace.tool_calls`` under its tool-server bounds.

    rollout-ray eval examples/shared_tools.py
"""

from __future__ import annotations

import pathlib
import random
import sys

from rollout_ray import ChatHarness, EvalConfig, RolloutLimits, SharedToolServer, Task, TaskData, Trace, metric, reward

SERVER = str(pathlib.Path(__file__).resolve().with_name("mcp_calc_server.py"))


class CalcData(TaskData):
    answer: int


class SharedCalc(Task):
    data_type = CalcData

    @classmethod
    def toolsets(cls, config: object) -> list[SharedToolServer]:
        return [SharedToolServer("calc", [sys.executable, SERVER, "{port}"])]

    @reward
    def correct(self, task: CalcData, trace: Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @metric
    def tool_calls(self, trace: Trace) -> float:
        return len(trace.tool_calls)


def tasks(n: int = 20, seed: int = 2) -> list[SharedCalc]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(SharedCalc({"idx": idx, "prompt": f"What is {a} + {b}? Use the calculator.", "answer": a + b}))
    return out


def harness() -> ChatHarness:
    return ChatHarness()


config = EvalConfig(samples_per_task=2, max_in_flight=16, limits=RolloutLimits(max_turns=6))
