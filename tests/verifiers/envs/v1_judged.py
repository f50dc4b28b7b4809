"""A taskset with a plugged judge and a ``@stop`` (loader id ``v1-judged``): its config
plugs the ``v1-sum-judge`` plugin, weight 0.5; a response ``@stop`` ends a rollout whose
reply is "10"; an ``@intercept`` turns "3 + 3" into "3 + 4", which the judge (asked the
row's own question) disagrees with."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.configs.judge import resolve_judges


class JudgedConfig(vf.TaskConfig):
    judges: vf.Judges = Field(default_factory=lambda: resolve_judges([{"id": "v1-sum-judge", "weight": 0.5}]))


class JudgedTask(vf.Task[vf.TaskData, vf.State, JudgedConfig]):
    @vf.stop
    async def said_ten(self, response: vf.Response) -> bool:
        return response.message.content == "10"

    @vf.intercept
    async def off(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if "3 + 3" not in str(last.content):
            return None
        return request.model_copy(
            update={"messages": [*request.messages[:-1], last.model_copy(update={"content": "What is 3 + 4?"})]}
        )

    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class JudgedTasksetConfig(vf.TasksetConfig):
    task: JudgedConfig = Field(default_factory=JudgedConfig)  # made with each taskset: its judge URL then


class JudgedTaskset(vf.Taskset[JudgedTask, JudgedTasksetConfig]):
    def load(self) -> Iterator[JudgedTask]:
        for prompt in ("What is 2 + 2?", "What is 3 + 3?", "What is 5 + 5?"):
            yield JudgedTask(vf.TaskData(prompt=prompt), self.config.task)


__all__ = ["JudgedTaskset"]
