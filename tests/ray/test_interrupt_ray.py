"""``Driver.paused(version, interrupt=True)`` on Ray (issue 22 §1): the interrupt travels with the
pause to every rollout actor (a chat harness's calls, made in the actor) and, through each, to
its node's services (a program's calls, made by the node's proxy); each returns once its calls
stopped, and they continue under the new version."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from typing import Any

import pytest

from rollout_ray import ChatHarness, ProgramHarness

from conftest import tasks

ray = pytest.importorskip("ray")

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "serving"))
import interrupt_rig  # noqa: E402
from interrupt_rig import check_continued, update_mid_generation  # noqa: E402

from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(interrupt_rig)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

AGENT = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()


@pytest.mark.parametrize("kind", ["chat", "program"])
def test_an_interrupting_update_reaches_every_actor_and_node_and_the_calls_continue(kind: str) -> None:
    harness: Any = (
        ChatHarness(retries=0)
        if kind == "chat"
        else ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
    )

    async def main() -> Any:
        async with asyncio.timeout(120), RayExecutor(actors=2, runtime="local") as executor:
            await executor.ready(programs=kind == "program")
            return await update_mid_generation(executor, tasks(4), harness, interrupt=True)

    result, generating, server = asyncio.run(main())
    assert generating == [0] and server.policy_version == 4
    check_continued(result.samples)
