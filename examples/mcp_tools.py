"""A task whose tools are an MCP server: ``examples/mcp_calc_server.py`` (the official SDK's
``MCPServer``), started over stdio once per rollout runtime and inside it (a sandbox sees no
checkout: the script is shipped with ``files=``), its tools offered to the model as they are,
every call on ``trace.tool_calls``. Needs ``pip install mcp``.

    rollout-ray eval examples/mcp_tools.py

With the server already running over HTTP (``python examples/mcp_calc_server.py 8000``), one
client per node serves every rollout: ``MCP_URL=http://127.0.0.1:8000/mcp rollout-ray eval
examples/mcp_tools.py``.
"""

from __future__ import annotations

import os
import pathlib
import random
import sys

from rollout_ray import ChatHarness, EvalConfig, MCPToolset, RolloutLimits, Task, TaskData, Trace, reward

SERVER = pathlib.Path(__file__).resolve().with_name("mcp_calc_server.py")


class CalcData(TaskData):
    answer: int


class McpCalc(Task):
    data_type = CalcData

    @classmethod
    def toolsets(cls, config: object) -> list[MCPToolset]:
        url = os.environ.get("MCP_URL")
        if url:
            return [MCPToolset("calc", url=url)]
        files = {"mcp_calc_server.py": SERVER.read_text()}
        return [MCPToolset("calc", command=[sys.executable, "mcp_calc_server.py"], files=files)]

    @reward
    def correct(self, task: CalcData, trace: Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))


def tasks(n: int = 10, seed: int = 1) -> list[McpCalc]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(McpCalc({"idx": idx, "prompt": f"What is {a} + {b}? Use the calculator.", "answer": a + b}))
    return out


def harness() -> ChatHarness:
    return ChatHarness()


config = EvalConfig(samples_per_task=1, max_in_flight=8, limits=RolloutLimits(max_turns=6))
