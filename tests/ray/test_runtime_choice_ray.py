"""Issue 32 (what was left): on Ray, one rollout actor's rollouts run in the kinds their tasks
name (``TaskData.runtime``) — local, sandbox and podman side by side in its one runtime actor —
and the rest in the actor's; a task's resources reach its Podman container there."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest
import ray

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtimes"))
import test_runtime_choice
from test_runtime_choice import Budgeted, Row, Where, runnable

from rollout_ray import RolloutSpec, TaskResources
from rollout_ray._ray.rollout_client import RolloutActor
from rollout_ray.testing import ScriptedHarness, ScriptedModel

ray.cloudpickle.register_pickle_by_value(test_runtime_choice)  # the actor's process cannot import it
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_one_rollout_actor_runs_each_task_in_its_kind() -> None:
    kinds = sorted(runnable())

    async def main() -> list[Any]:
        actor = RolloutActor.create(capacity=len(kinds) + 1, runtime="local")
        try:
            specs = []
            for i, kind in enumerate(kinds):
                image = {"image": test_runtime_choice.python_image()} if kind == "podman" else {}
                resources = TaskResources(memory=0.2) if kind == "podman" else None
                row = Row(idx=i, prompt="go", expected=kind, runtime=kind, resources=resources, **image)
                specs.append(RolloutSpec(Budgeted(row), ScriptedHarness(), ScriptedModel(default="done")))
            specs.append(
                RolloutSpec(
                    Where(Row(idx=len(kinds), prompt="go", expected="local")),
                    ScriptedHarness(),
                    ScriptedModel(default="done"),
                )
            )
            return list(await asyncio.gather(*(actor.run(s) for s in specs)))
        finally:
            await actor.aclose()

    traces = asyncio.run(main())
    assert [t.errors for t in traces] == [[]] * len(traces)
    assert [t.agent.runtime.type for t in traces] == [*kinds, "local"]
    assert [t.rewards["in_expected_kind"].score for t in traces] == [1.0] * len(traces)
    if "podman" in kinds:  # its task's resources reached its container through the runtime actor
        limit = traces[kinds.index("podman")].metrics["memory_limit"]
        assert 200_000_000 - 4096 < limit <= 200_000_000  # 0.2 GB, rounded down to a page
