"""Issue 32 §2: a rollout actor's boxes come from the same registry: with ``runtime="podman"``
its runtime actor makes Podman containers, and the rollout's ``RemoteRuntime`` asks the
provider (by the kind its runtime actor reports) what it enforces and how it names host
URLs. Skipped, with the reason, where Podman cannot run a container."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import ray

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtimes"))
import test_grader_files
import test_podman
from test_grader_files import Graded, agent

from rollout_ray import RolloutSpec
from rollout_ray._ray.rollout_client import RolloutActor
from rollout_ray.testing import ScriptedModel

ray.cloudpickle.register_pickle_by_value(test_grader_files)  # the actor's process cannot import it
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_a_rollout_actor_runs_its_rollout_in_a_podman_container() -> None:
    reason = test_podman.podman_reason()
    if reason is not None:
        pytest.skip(f"podman cannot run a container here: {reason}")

    async def main() -> object:
        actor = RolloutActor.create(capacity=1, runtime="podman")
        try:
            task = Graded({"prompt": "fix it", "image": test_podman.python_image()})
            return await actor.run(RolloutSpec(task, agent("42"), ScriptedModel(default="done")))
        finally:
            await actor.aclose()

    trace = asyncio.run(main())
    assert trace.errors == [], trace.errors  # type: ignore[attr-defined]
    assert trace.agent.runtime.type == "podman"  # type: ignore[attr-defined]
    assert {k: r.score for k, r in trace.rewards.items()} == {"passed": 1.0, "hidden_from_agent": 1.0}  # type: ignore[attr-defined]
