"""A v1 taskset written as users write it, with a feature the adapter does not map yet."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class SetupTask(vf.Task):
    async def stage_verifier(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        await runtime.run(["touch", "ready"], {})

    @vf.reward
    async def one(self) -> float:
        return 1.0


class SetupTaskset(vf.Taskset[SetupTask]):
    def load(self) -> Iterator[SetupTask]:
        yield SetupTask(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)


__all__ = ["SetupTaskset"]
