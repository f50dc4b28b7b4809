"""Rollouts reach a rollout actor in batches and come back in batches (``_ray/batched_runs``)."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
from typing import Any

import pytest

from rollout_ray import ChatHarness, Task
from rollout_ray.testing import Reply, ScriptedModel

ray = pytest.importorskip("ray")

from rollout_ray._core.executor import RolloutSpec  # noqa: E402
from rollout_ray._ray.rollout_actor import RolloutActor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


class _Unpicklable(Task):
    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.lock = threading.Lock()  # this spec cannot reach an actor


def test_concurrent_rollouts_share_one_submit_and_an_unpicklable_one_fails_alone() -> None:
    async def main() -> None:
        actor = RolloutActor.create(capacity=40, runtime="local")
        harness, model = ChatHarness(), ScriptedModel(default="4")
        specs = [RolloutSpec(Task({"prompt": f"{i}+0?"}), harness, model) for i in range(40)]
        specs.insert(7, RolloutSpec(_Unpicklable({"prompt": "x"}), harness, model))
        results = await asyncio.gather(*(actor.run(s) for s in specs), return_exceptions=True)
        bad = results.pop(7)
        assert isinstance(bad, TypeError) and "lock" in str(bad)
        assert all(not isinstance(r, BaseException) and r.ok for r in results), results
        assert len({r.id for r in results}) == 40
        assert actor.runs.submits == 1  # 40 rollouts, one actor call out
        assert actor.runs.collects <= 40
        await actor.aclose()

    asyncio.run(main())


class _Signals:
    """A script item: tells the test through a FIFO that the model was reached, then hangs."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    def __call__(self, request: Any) -> Reply:
        with open(self.fifo, "w") as f:
            f.write("1")
        return Reply("never", delay=3600)


def test_a_rollout_the_driver_stops_waiting_for_is_cancelled_in_the_actor() -> None:
    async def main() -> None:
        fifo = os.path.join(tempfile.mkdtemp(prefix="rr-test-"), "reached")
        os.mkfifo(fifo)
        actor = RolloutActor.create(capacity=2, runtime="local")
        running = asyncio.ensure_future(
            actor.run(RolloutSpec(Task({"prompt": "hi"}), ChatHarness(), ScriptedModel(default=_Signals(fifo)))))
        await asyncio.to_thread(_read, fifo)
        assert len(await actor.actor.open_ids.remote()) == 1
        running.cancel()
        await actor.runs.settled()  # the actor reported the cancelled rollout
        assert await actor.actor.open_ids.remote() == []
        await actor.aclose()

    asyncio.run(main())


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
