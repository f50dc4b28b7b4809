"""A multi-turn tool taskset as users write it (loader id ``v1-tools``): the task's toolset
is a ``vf.Toolset`` whose ``@vf.tool`` methods the model calls (upstream serves it over MCP,
one server per rollout: ``python -m v1_tools``). Its ``add`` is off by one for a sum over
100, so rewards differ task by task."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class CalcConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[CalcConfig]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b + (a + b > 100)


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calc(CalcConfig())]

    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.messages if m.role == "assistant"))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self) -> Iterator[SumTask]:
        for a, b in ((2, 3), (60, 70), (10, 20), (99, 1)):
            yield SumTask(SumData(prompt=f"What is {a} + {b}?", answer=a + b), self.config.task)


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    Calc.run()
