"""Where a rollout is now, as its host reports it to a live run's status (``_hosting/live``):
read from the spans and the calls in flight it keeps anyway."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout_ray import ChatHarness, Task, Toolset, tool
from rollout_ray._core.model import Model
from rollout_ray._core.rollout import Rollout
from rollout_ray._hosting.live import live_report, phase_of
from rollout_ray._record.messages import Request, Response
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedModel

from conftest import run

HELD: dict[str, asyncio.Event] = {}


class Slow(Toolset):
    name = "slow"

    @tool
    async def wait(self) -> str:
        """Returns once the test lets it."""
        await HELD["tool"].wait()
        return "waited"


class WithTool(Task):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Slow()]


class Held(Model):
    """``inner``'s answers, the second call held until the test lets it go."""

    def __init__(self) -> None:
        self.inner = ScriptedModel([Reply(tool_calls=[("wait", {})])], default="done")
        self.calls = 0

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        self.calls += 1
        if self.calls == 2:
            await HELD["model"].wait()
        return await self.inner.complete(request, model=model, sampling=sampling)


async def _until(rollout: Rollout, phase: str) -> float:
    for _ in range(10_000):  # loop turns, not time: the clock is virtual
        if phase_of(rollout)[0] == phase:
            return phase_of(rollout)[1]
        await asyncio.sleep(0)
    raise AssertionError(f"never in {phase!r}; now {phase_of(rollout)}")


def test_a_rollout_reads_boot_then_tool_call_then_model_call_then_done() -> None:
    async def main() -> None:
        HELD.update(tool=asyncio.Event(), model=asyncio.Event())
        rollout = Rollout(
            WithTool({"idx": 7, "prompt": "wait, then answer"}),
            ChatHarness(),
            model=Held(),
            runtime_factory=MemoryRuntime,
        )
        assert phase_of(rollout) == ("boot", rollout.trace.timing.start)
        running = asyncio.create_task(rollout.run())
        since = await _until(rollout, "tool call")
        assert rollout.trace.timing.agent.start <= since
        (report,) = live_report([("7-k#0", rollout)])["rollouts"]
        assert report == {"label": "7-k#0", "id": rollout.trace.id, "task": 7, "phase": "tool call", "since": since}
        HELD["tool"].set()
        assert await _until(rollout, "model call") >= since
        HELD["model"].set()
        trace = await running
        assert trace.ok and trace.last_reply == "done"

    run(main())
