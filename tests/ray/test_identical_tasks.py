"""Identical tasks on Ray: a task's group is its position in the taskset, so none shares a group
and every reader counts every row (issue 19 §1)."""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

from rollout_ray import ChatHarness, Driver, EvalConfig, Task, Trace, read_groups, read_run, reward
from rollout_ray.testing import ScriptedModel

ray = pytest.importorskip("ray")

from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


class Said4(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


def test_identical_tasks_are_distinct_groups_on_ray(tmp_path: pathlib.Path) -> None:
    same = {"prompt": "What is 2 + 2?"}
    tasks = [Said4(same), Said4(same), Said4({"prompt": "What is 1 + 3?"})]
    out = str(tmp_path / "run")

    async def main() -> None:
        async with RayExecutor(actors=1, runtime="local") as executor:
            await Driver(
                tasks,
                ChatHarness(),
                ScriptedModel(default="4"),
                executor=executor,
                config=EvalConfig(samples_per_task=2),
                run_dir=out,
            ).arun()

    asyncio.run(main())
    table = read_run(out, ["group_id", "sample_idx", "task_idx", "reward"])
    keys = set(zip(table["group_id"].to_pylist(), table["sample_idx"].to_pylist()))
    assert table.num_rows == len(keys) == 6
    assert sorted(table["task_idx"].to_pylist()) == [0, 0, 1, 1, 2, 2]
    assert read_groups(out)["n"].to_pylist() == [2, 2, 2]
