"""The policy on Ray: set_policy reaches every rollout actor and, per owner, its node's
services; held calls carry the version of the resume; stale rollouts are dropped and re-run
(issue 12 §4, §5)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Any

import msgspec
import pytest

from rollout_ray import ChatHarness, ProgramHarness, Request, RolloutTimeouts, Task, Trace, reward
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._record.store import read_run
from rollout_ray.testing import ScriptedModel

from conftest import tasks

ray = pytest.importorskip("ray")

from rollout_ray._ray.calls import call  # noqa: E402
from rollout_ray._ray.node_service_actor import node_service_actor  # noqa: E402
from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AGENT = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()


class Says(ChatHarness):
    """Writes "launched" to a FIFO (the test reads it), then chats as usual."""

    def __init__(self, fifo: str) -> None:
        super().__init__(retries=0)
        self.fifo = fifo

    async def launch(self, ctx: Any) -> Any:
        await asyncio.to_thread(pathlib.Path(self.fifo).write_text, "launched")
        return await super().launch(ctx)


class StampsZeroOnce(ScriptedModel):
    """Its very first reply (whichever process makes it) says the server sampled it at
    version 0; later replies carry no version (the driver's current one is recorded)."""

    def __init__(self, marker: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Any:
        response = await super().complete(request, model=model, sampling=sampling)
        if not os.path.exists(self.marker):
            pathlib.Path(self.marker).write_text("")
            response = msgspec.structs.replace(response, policy_version=0)
        return response


class Answers42(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "42")


def versions(samples: Any) -> list[list[int | None]]:
    from rollout_ray._record.trace import decode_trace

    return [[c.policy for c in decode_trace(blob).calls] for blob in samples.column("trace").to_pylist()]


async def states(executor: RayExecutor) -> tuple[list[Any], list[Any]]:
    """Each pool actor's policy, and its node's services' policy for it."""
    actors = [a for a in executor._pool if a is not None]
    ours = [await a.policy() for a in actors]
    nodes = [await a.node_id() for a in actors]
    services = [
        tuple(await call(node_service_actor(n).policy.remote(a.owner), timeout=30)) for n, a in zip(nodes, actors)
    ]
    return ours, services


@pytest.mark.slow
def test_a_pause_reaches_every_actor_and_held_calls_carry_the_version_of_the_resume(tmp_path: Any) -> None:
    fifo = str(tmp_path / "launched")
    os.mkfifo(fifo)

    async def main() -> Any:
        async with asyncio.timeout(60), RayExecutor(actors=2, runtime="local") as executor:
            await executor.ready(programs=True)  # the node's services in use: the pause reaches them
            driver = Driver(
                tasks(1),
                Says(fifo),
                ScriptedModel(default="4"),
                executor=executor,
                policy_version=2,
                config=EvalConfig(timeouts=RolloutTimeouts(agent=1.5)),
            )
            await driver.pause()
            paused = await states(executor)
            running = asyncio.create_task(driver.arun())
            assert await asyncio.to_thread(pathlib.Path(fifo).read_text) == "launched"  # it runs, paused
            await asyncio.sleep(2.0)  # the weight update outlasts the agent's 1.5 s: not charged
            await driver.resume(version=3)
            result = await running
            return paused, await states(executor), result

    paused, resumed, result = asyncio.run(main())
    assert paused == ([(2, True)] * 2, [(2, True)] * 2)
    assert resumed == ([(3, False)] * 2, [(3, False)] * 2)
    assert versions(result.samples) == [[3]] and result.samples["reward"].to_pylist() == [1.0]
    assert result.samples["ok"].to_pylist() == [True]


@pytest.mark.slow
def test_a_program_served_by_the_node_proxy_records_its_owners_version() -> None:
    harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})

    async def main() -> Any:
        async with asyncio.timeout(60), RayExecutor(actors=1, runtime="local") as executor:
            driver = Driver(
                [Answers42({"idx": 0, "prompt": "What is 17 + 25?"})],
                harness,
                ScriptedModel(default="42"),
                executor=executor,
                policy_version=5,
            )
            result = await driver.arun()
            (actor,) = executor._pool
            node = await actor.node_id()  # type: ignore[union-attr]
            other = tuple(await call(node_service_actor(node).policy.remote("some-other-owner"), timeout=30))
            await driver.pause()
            replacement = executor._new_actor({})  # as for an actor that died
            try:
                replaced = await replacement.policy()
            finally:
                await replacement.aclose()
            await driver.resume()
            return result, other, replaced

    result, other, replaced = asyncio.run(main())
    assert versions(result.samples) == [[5]] and result.samples["reward"].to_pylist() == [1.0]
    assert other == (None, False)  # another driver's rollouts on the node are not touched
    assert replaced == (5, True)  # a replacement starts paused like the rest


def test_a_stale_rollout_is_dropped_and_run_again_on_ray(tmp_path: Any) -> None:
    model = StampsZeroOnce(str(tmp_path / "stamped"), default="4")
    config = EvalConfig(samples_per_task=2, max_in_flight=1, max_staleness=0)

    async def main() -> Any:
        async with asyncio.timeout(60), RayExecutor(actors=1, runtime="local") as executor:
            driver = Driver(
                tasks(1),
                ChatHarness(retries=0),
                model,
                executor=executor,
                config=config,
                policy_version=1,
                run_dir=str(tmp_path / "run"),
            )
            return driver, await driver.arun()

    driver, result = asyncio.run(main())
    assert (driver.progress.stale, result.stale) == (1, 1)
    stored = read_run(str(tmp_path / "run"))  # with the traces
    assert sorted(stored["sample_idx"].to_pylist()) == [0, 1]  # the stale one never stored
    assert versions(stored) == [[1], [1]]
