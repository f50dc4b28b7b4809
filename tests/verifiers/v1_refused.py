"""A v1 taskset written as users write it, with a feature the adapter does not map yet."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class HaltTask(vf.Task):
    @vf.stop
    async def said_stop(self, trace: vf.Trace) -> bool:
        return "stop" in trace.last_reply

    @vf.reward
    async def one(self) -> float:
        return 1.0


class HaltTaskset(vf.Taskset[HaltTask]):
    def load(self) -> Iterator[HaltTask]:
        yield HaltTask(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)


__all__ = ["HaltTaskset"]
