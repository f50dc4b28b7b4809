"""The run-level warm-up: once it returns, every actor a rollout needs answers, so the first
rollouts' ``setup`` spans are not charged with the actors' cold start."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from rollout_ray._cli.taskset_loader import import_taskset, taskset_harness, taskset_tasks
from rollout_ray._cli.warmup import warm_up

CALC = str(pathlib.Path(__file__).parents[2] / "examples" / "calc_tool.py")


def test_without_ray_there_is_nothing_to_warm() -> None:
    from rollout_ray import LocalExecutor

    assert asyncio.run(warm_up(LocalExecutor(runtime="local"))) is None


@pytest.mark.ray
@pytest.mark.slow
def test_after_warm_up_the_actors_answer_and_setup_is_short(ray_cluster: Any) -> None:
    from rollout_ray import Driver, EvalConfig, OpenAIModel, SimulatedModelServer
    from rollout_ray._ray.calls import call
    from rollout_ray._ray.node_service_actor import node_service_actor
    from rollout_ray._ray.ray_executor import RayExecutor

    module = import_taskset(CALC)
    tasks, harness = taskset_tasks(module, CALC, 2), taskset_harness(module, CALC)

    async def main() -> tuple[str | None, list[float]]:
        async with SimulatedModelServer() as server, RayExecutor(actors=2, capacity=4, runtime="local") as executor:
            what = await warm_up(executor, timeout=120)
            for actor in executor._pool:  # all up: each answers at once
                node = await call(actor.actor.node_id.remote(), timeout=5)
                await call(node_service_actor(node).ping.remote(), timeout=5)
            model = OpenAIModel(server.base_url, name="simulated")
            try:
                driver = Driver(tasks, harness, model, executor=executor, config=EvalConfig(samples_per_task=2))
                result = await driver.arun()
            finally:
                await model.aclose()
            return what, result.samples["setup_s"].to_pylist()

    what, setups = asyncio.run(main())
    assert what is not None and what.startswith("2 rollout actors with their runtime actors, the services of ")
    assert len(setups) == 4 and max(setups) < 1.0  # the cold start was 2.7 s of setup here
