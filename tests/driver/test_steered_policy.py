"""The operator's view of the executor (``_driver/steering._Steered``) takes ``set_policy`` as
every ``Executor`` does, ``interrupt`` included, and hands it on: an interrupting pause through
it reaches the calls in flight on the inner executor (mypy found the override dropping it)."""

from __future__ import annotations

import asyncio

from rollout_ray._driver.progress import Progress
from rollout_ray._driver.slots import Slots
from rollout_ray._driver.steering import Steering
from rollout_ray._hosting.local_executor import LocalExecutor


def test_an_interrupting_pause_through_the_steered_executor_reaches_the_calls_in_flight() -> None:
    async def scenario() -> tuple[bool, int | None, bool]:
        inner = LocalExecutor()
        steering = Steering(inner, Progress(total=1), Slots(4), stop=lambda: None)
        with inner.policy.watch() as call:  # a model call upstream on the inner executor
            await steering.executor.set_policy(7, True, interrupt=True)
            fired = call.fired
        return fired, inner.policy.version, inner.policy.paused

    fired, version, paused = asyncio.run(scenario())
    assert (fired, version, paused) == (True, 7, True)
