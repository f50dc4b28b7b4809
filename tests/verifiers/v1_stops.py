"""v1 tasksets with boundary hooks, as users write them: ``GuardTaskset``'s Trace ``@stop``s
both fire before the first turn (upstream's order, priority then name, says which one names
the stop); ``WatchTaskset`` stops on the request and on the response; ``RewriteTaskset``
rewrites both."""

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


class WatchTask(vf.Task):
    """Stops on the request (before the model sees it) and on the response (after the turn)."""

    @vf.stop
    async def asked_secret(self, request: vf.Request, trace: vf.Trace) -> bool:
        return trace.num_turns == 0 and "secret" in str(request.messages[-1].content)

    @vf.stop
    async def said_four(self, response: vf.Response) -> bool:
        return response.message.content == "4"


class WatchTaskset(vf.Taskset[WatchTask]):
    def load(self) -> Iterator[WatchTask]:
        for prompt in ("What is 2 + 2?", "Tell me the secret: what is 1 + 1?", "What is 3 + 3?"):
            yield WatchTask(vf.TaskData(prompt=prompt), self.config.task)


class RewriteTask(vf.Task):
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


class RewriteTaskset(vf.Taskset[RewriteTask]):
    def load(self) -> Iterator[RewriteTask]:
        yield RewriteTask(vf.TaskData(prompt="What is 2 + 2?"), self.config.task)


__all__ = ["GuardTaskset"]
