"""Multi-turn with a tool: the model calls a calculator served by the tool server, then answers.

rollout-ray eval examples/calc_tool.py
"""

from __future__ import annotations

import random

from rollout_ray import (
    ChatHarness,
    EvalConfig,
    RolloutLimits,
    Task,
    TaskData,
    Toolset,
    Trace,
    metric,
    reward,
    tool,
)


class Calculator(Toolset):
    name = "calc"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcData(TaskData):
    answer: int


class Calc(Task):
    data_type = CalcData

    @classmethod
    def toolsets(cls, config: object) -> list[Toolset]:
        return [Calculator()]

    @reward
    def correct(self, task: CalcData, trace: Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @metric
    def tool_calls(self, trace: Trace) -> float:
        return len(trace.tool_calls)


def tasks(n: int = 50, seed: int = 1) -> list[Calc]:
    rng = random.Random(seed)
    out = []
    for idx in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(Calc({"idx": idx, "prompt": f"What is {a} + {b}? Use the calculator.", "answer": a + b}))
    return out


def harness() -> ChatHarness:
    return ChatHarness()


config = EvalConfig(samples_per_task=2, max_in_flight=64, limits=RolloutLimits(max_turns=6))
