"""A v1 taskset written as users write it, with a feature the adapter does not map yet."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class AskTask(vf.Task):
    @vf.stop
    async def asked_twice(self, request: vf.Request) -> bool:
        return len(request.messages) > 2

    @vf.reward
    async def one(self) -> float:
        return 1.0


class AskTaskset(vf.Taskset[AskTask]):
    def load(self) -> Iterator[AskTask]:
        yield AskTask(vf.TaskData(prompt="What is 1 + 1?"), self.config.task)


__all__ = ["AskTaskset"]
