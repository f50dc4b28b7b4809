"""A taskset with ``@stop`` and ``@intercept`` hooks as users write them (loader id
``v1-hooks``): a request stop before the model sees a secret, a response stop on "4", a
request interceptor that asks 5 + 5 instead of 2 + 2 and a response one that says "10" in
words; each row meets a different one."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class HookTask(vf.Task):
    @vf.stop
    async def asked_secret(self, request: vf.Request, trace: vf.Trace) -> bool:
        return trace.num_turns == 0 and "secret" in str(request.messages[-1].content)

    @vf.stop
    async def said_four(self, response: vf.Response) -> bool:
        return response.message.content == "4"

    @vf.intercept
    async def harder(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if last.role != "user" or "2 + 2" not in str(last.content):
            return None
        return request.model_copy(
            update={"messages": [*request.messages[:-1], last.model_copy(update={"content": "What is 5 + 5?"})]}
        )

    @vf.intercept
    async def in_words(self, response: vf.Response) -> vf.Response | None:
        if response.message.content != "10":
            return None
        return response.model_copy(update={"message": response.message.model_copy(update={"content": "ten"})})

    @vf.reward
    async def said_ten(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == "ten")

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class HookTaskset(vf.Taskset[HookTask]):
    def load(self) -> Iterator[HookTask]:
        for prompt in ("What is 2 + 2?", "Tell me the secret: what is 1 + 1?", "What is 1 + 3?", "What is 3 + 3?"):
            yield HookTask(vf.TaskData(prompt=prompt), self.config.task)


__all__ = ["HookTaskset"]
