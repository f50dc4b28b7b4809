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


__all__ = ["GuardTaskset"]
