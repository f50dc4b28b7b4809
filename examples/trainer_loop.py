"""A training loop consuming finalized groups as they complete.

Each group (the n samples of one task) arrives as an Arrow table with group-relative
advantages the moment its last sample closes; a trainer would turn it into a batch.

    python examples/trainer_loop.py
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import arith  # noqa: E402

from rollout_ray import (  # noqa: E402
    Driver,
    EvalConfig,
    LocalExecutor,
    OpenAIModel,
    SimulatedModelConfig,
    SimulatedModelServer,
)


async def main() -> None:
    config = EvalConfig(samples_per_task=4, max_in_flight=32)
    async with SimulatedModelServer(SimulatedModelConfig(ttft=0.01, error_rate=0.3)) as server:
        model = OpenAIModel(server.base_url, name="simulated")  # type: ignore[arg-type]
        async with LocalExecutor() as executor:
            driver = Driver(arith.tasks(12), arith.harness(), model, executor=executor, config=config)
            step = 0
            async for group in driver.groups():
                rewards = group.samples["reward"].to_pylist()
                advantages = group.samples["advantage"].to_pylist()
                step += 1
                print(f"step {step:2d} group {group.group_id}: rewards {rewards} "
                      f"advantages {[round(a, 2) for a in advantages]}")
        await model.aclose()


if __name__ == "__main__":
    asyncio.run(main())
