"""Rollouts reach a rollout actor in batches and come back in batches (``_ray/rollout_client``'s ``RunSender``, ``_ray/rollout_actor``'s ``RunReceiver``)."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
from typing import Any

import pytest

from rollout_ray import ChatHarness, Driver, EvalConfig, Model, Task, Trace, reward
from rollout_ray._record.messages import AssistantMessage, Request, Response
from rollout_ray.testing import Reply, ScriptedModel

ray = pytest.importorskip("ray")

from rollout_ray._hosting.spec import RolloutSpec  # noqa: E402
from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402
from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402

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
            actor.run(RolloutSpec(Task({"prompt": "hi"}), ChatHarness(), ScriptedModel(default=_Signals(fifo))))
        )
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


class _Barrier(Model):
    """Answers only once ``parties`` calls wait at once (or "stuck" after 20 s): the run
    finishes correctly only if that many rollouts really run at the same time."""

    shareable = True

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self._waiting = 0
        self._all_here: asyncio.Event | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"parties": self.parties, "_waiting": 0, "_all_here": None}

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        if self._all_here is None:
            self._all_here = asyncio.Event()
        self._waiting += 1
        if self._waiting >= self.parties:
            self._all_here.set()
        try:
            async with asyncio.timeout(20):
                await self._all_here.wait()
            text = "4"
        except TimeoutError:
            text = "stuck"
        return Response(message=AssistantMessage(content=text))


def test_the_executor_runs_as_many_at_once_as_the_driver_asks_with_no_cap_of_its_own(caplog: Any) -> None:
    async def main() -> Any:
        async with RayExecutor(actors=1, runtime="local") as executor:
            assert executor.max_in_flight is None
            tasks = [Said4({"idx": i, "prompt": f"{i}"}) for i in range(6)]
            return await Driver(
                tasks, ChatHarness(), _Barrier(6), executor=executor, config=EvalConfig(max_in_flight=6)
            ).arun()

    result = asyncio.run(main())
    assert result.samples["reward"].to_pylist() == [1.0] * 6  # all six were in the model at once
    assert "below max_in_flight" not in caplog.text


def test_a_capped_executor_below_max_in_flight_is_stated(caplog: Any) -> None:
    async def main() -> None:
        async with RayExecutor(actors=1, capacity=2, runtime="local") as executor:
            assert executor.max_in_flight == 2
            await Driver(
                [Said4({"idx": 0, "prompt": "0"})],
                ChatHarness(),
                ScriptedModel(default="4"),
                executor=executor,
                config=EvalConfig(max_in_flight=4),
            ).arun()

    asyncio.run(main())
    assert "the executor runs at most 2 rollouts at once, below max_in_flight=4" in caplog.text


class Said4(Task):
    @reward
    def said_4(self, trace: Trace) -> float:
        return 1.0 if "4" in trace.last_reply else 0.0
