"""A taskset that keeps State as users write it (loader id ``v1-ledger``): the task's
``setup`` writes an offset into ``trace.state``, its toolset (``vf.Toolset`` over the same
``State``: upstream syncs it with the rollout over the interception's ``/state`` route) adds
that offset to each sum and logs the sum there, a ``@stop`` ends the rollout once a logged
sum is over 1000, and a reward and a metric read the state back. Rows: a right answer, one
made wrong by its offset, one stopped by the state before the model reads its tool result."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class Ledger(vf.State):
    offset: int = 0
    sums: list[int] = []


class LedgerConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[LedgerConfig, Ledger]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        total = a + b + self.state.offset
        self.state.sums.append(total)
        return total


class LedgerData(vf.TaskData):
    answer: int
    offset: int = 0


class LedgerTask(vf.Task[LedgerData, Ledger]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calc(LedgerConfig())]

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        trace.state.offset = self.data.offset

    @vf.stop
    async def over_budget(self, trace: vf.Trace) -> bool:
        return any(total > 1000 for total in trace.state.sums)

    @vf.reward
    async def correct(self, task: LedgerData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(task.answer))

    @vf.reward(weight=0.5)
    async def logged(self, task: LedgerData, trace: vf.Trace) -> float:
        return float(trace.state.sums == [task.answer + task.offset])

    @vf.metric
    async def ledger_entries(self, trace: vf.Trace) -> float:
        return float(len(trace.state.sums))


class LedgerTaskset(vf.Taskset[LedgerTask]):
    def load(self) -> Iterator[LedgerTask]:
        for a, b, offset in ((2, 3, 0), (10, 20, 1), (600, 700, 0)):
            yield LedgerTask(LedgerData(prompt=f"What is {a} + {b}?", answer=a + b, offset=offset), self.config.task)


__all__ = ["LedgerTaskset"]

if __name__ == "__main__":
    Calc.run()
