"""A driver whose rollouts never finish, for tests/ray/test_node_services_heal.py to kill.

Connects to the test session's Ray at ADDRESS, starts N rollouts on one rollout actor whose
harness never returns (each registered with the node's services), and waits forever.

    python hanging_driver.py ADDRESS N
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rollout_ray import Harness, ProgramResult, RolloutSpec, Task
from rollout_ray._ray.ray_executor import RayExecutor
from rollout_ray.testing import ScriptedModel


class Blocks(Harness):
    async def launch(self, ctx: Any) -> ProgramResult:
        await asyncio.Event().wait()
        return ProgramResult(0)


async def main(address: str, n: int) -> None:
    async with RayExecutor(actors=1, capacity=n, address=address) as executor:
        specs = [RolloutSpec(Task({"idx": i, "prompt": "hi"}), Blocks(), ScriptedModel(default="x")) for i in range(n)]
        await asyncio.gather(*(executor.run(spec) for spec in specs))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
