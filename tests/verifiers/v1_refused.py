"""A v1 taskset written as users write it, with a feature the adapter does not map yet."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class RedactTask(vf.Task):
    @vf.intercept
    async def redact(self, request: vf.Request) -> vf.Request | None:
        return None

    @vf.reward
    async def one(self) -> float:
        return 1.0


class RedactTaskset(vf.Taskset[RedactTask]):
    def load(self) -> Iterator[RedactTask]:
        yield RedactTask(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)


__all__ = ["RedactTaskset"]
