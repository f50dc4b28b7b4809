"""A v1 taskset with Trace ``@stop`` hooks, as users write them: both fire before the first
turn; upstream's order (priority, then name) says which one names the stop."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class GuardTask(vf.Task):
    @vf.stop(priority=1)
    async def out_of_budget(self, trace: vf.Trace) -> bool:
        return trace.num_turns == 0 and not trace.errors

    @vf.stop
    async def always(self, state: vf.Trace) -> bool:
        return True

    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class GuardTaskset(vf.Taskset[GuardTask]):
    def load(self) -> Iterator[GuardTask]:
        for a in range(2):
            yield GuardTask(vf.TaskData(prompt=f"What is {a} + 1?"), self.config.task)


__all__ = ["GuardTaskset"]
