"""Issue 32 (what was left): the runtime kind is chosen per task (``TaskData.runtime``), per run
(``EvalConfig.runtime``) and by the executor (``--runtime``), in that order, through the
provider registry; one run mixes kinds on one host; a kind the host cannot make fails that
task's rollouts as data, naming why, and ``rollout-ray eval`` refuses it before anything runs."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from image_rig import image_unavailable, python_image

from rollout_ray import ChatHarness, Driver, EvalConfig, Task, TaskData, metric, reward
from rollout_ray._cli.protections import check_runtimes, runtime_line
from rollout_ray._errors import UsageError
from rollout_ray._hosting.local_executor import LocalExecutor
from rollout_ray._runtimes import providers
from rollout_ray.testing import ScriptedModel


class Row(TaskData):
    expected: str
    """The kind its rollout must run in."""


class Where(Task):
    """Scores 1 when a program ran, in a runtime of the expected kind."""

    data: Row

    @reward
    async def in_expected_kind(self, runtime: Any) -> float:
        ran = await runtime.exec(["sh", "-c", "echo ran"])
        return float(runtime.info().type == self.data.expected and ran.stdout == "ran\n")


class Budgeted(Where):
    """Also measures the memory limit its programs run under (bytes; 0: none found)."""

    @metric
    async def memory_limit(self, runtime: Any) -> float:
        found = await runtime.exec(["sh", "-c", MEMORY_LIMIT])
        words = found.stdout.split()
        return float(words[0]) if words and words[0].isdigit() else 0.0


MEMORY_LIMIT = "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
"""The memory limit of the programs' cgroup (v2, else v1), as a program in a container sees it."""


@functools.cache
def runnable() -> frozenset[str]:
    """The kinds this machine runs (podman and the sandbox: with the test image)."""
    kinds = {"local"}
    if providers.provider("sandbox").unavailable() is None:
        kinds.add("sandbox")
    if providers.provider("podman").unavailable() is None and image_unavailable() is None:
        kinds.add("podman")
    return frozenset(kinds)


def row(idx: int, expected: str, **fields: Any) -> Where:
    image = {"image": python_image()} if expected == "podman" or fields.pop("image", False) else {}
    return Where(Row(idx=idx, prompt="go", expected=expected, **image, **fields))


def rewards(tasks: list[Where], config: EvalConfig, runtime: str = "local") -> list[float]:
    async def main() -> list[float]:
        async with LocalExecutor(runtime=runtime) as executor:
            result = await Driver(
                tasks, ChatHarness(), ScriptedModel(default="done"), executor=executor, config=config
            ).arun()
        table = result.samples.sort_by("task_idx")
        return [float(r) for r in table.column("reward").to_pylist()]

    return asyncio.run(main())


def test_one_run_mixes_kinds_each_task_in_its_own_and_the_rest_in_the_runs() -> None:
    kinds = sorted(runnable())  # local always; sandbox and podman where they run
    run_kind = "sandbox" if "sandbox" in kinds else "local"
    tasks = [row(i, kind, runtime=kind) for i, kind in enumerate(kinds)]
    tasks.append(row(len(kinds), run_kind))  # names none: the run's (EvalConfig.runtime) ...
    assert rewards(tasks, EvalConfig(runtime=run_kind)) == [1.0] * len(tasks)
    # ... and without one, the executor's (--runtime)
    assert rewards([row(0, "local")], EvalConfig()) == [1.0]


def test_a_task_asking_for_a_kind_there_is_not_fails_as_data_naming_the_kinds() -> None:
    async def main() -> Any:
        async with LocalExecutor(runtime="local") as executor:
            driver = Driver([row(0, "local", runtime="nope")], ChatHarness(), ScriptedModel(), executor=executor)
            return await driver.arun()

    samples = asyncio.run(main()).samples
    assert samples.column("reward").to_pylist() == [0.0]
    error = samples.column("error_message").to_pylist()[0]
    assert "runtime must be one of" in error and "'nope'" in error and "podman" in error


def test_eval_refuses_a_kind_this_machine_cannot_run_before_anything_runs() -> None:
    providers.register(
        providers.Provider(
            "absent", lambda *a: None, providers.Capabilities(), unavailable=lambda: "no such thing here"
        )
    )  # type: ignore[arg-type,return-value]
    try:
        tasks = [row(0, "local"), row(1, "absent", runtime="absent")]
        with pytest.raises(
            UsageError, match=r"task 1 asks for runtime 'absent': this machine cannot run it \(no such thing here\)"
        ):
            check_runtimes("local", tasks, EvalConfig(), remote=False)
        with pytest.raises(UsageError, match=r"runtime 'nope'"):
            check_runtimes("local", [row(0, "local", runtime="nope")], EvalConfig(), remote=False)
        check_runtimes("local", tasks[:1], EvalConfig(runtime="local"), remote=False)  # every kind runs: silent
    finally:
        providers._registry.pop("absent")


def test_the_summary_names_the_runs_kind_and_the_kinds_tasks_asked_for() -> None:
    """The summary's runtime line named ``--runtime`` whatever EvalConfig.runtime or the tasks
    asked for: a run of podman tasks read "runtime  LocalRuntime (--runtime local) ...".
    Each kind asked for is named with its count of tasks."""
    tasks = [row(0, "local", runtime="local"), row(1, "local", runtime="local"), row(2, "local")]
    sandbox, local = providers.provider("sandbox").label, providers.provider("local").label
    assert (
        runtime_line("sandbox", tasks, EvalConfig())
        == f"runtime  {sandbox}; tasks' own: {local} (2 tasks, not isolated)"
    )
    assert runtime_line("sandbox", tasks[2:], EvalConfig(runtime="local")) == (
        f"runtime  {local} (EvalConfig.runtime local): rollouts isolated neither from each other nor from the host"
    )
    assert runtime_line("local", tasks, EvalConfig()) == (  # the tasks ask for the run's own kind: nothing more
        f"runtime  {local} (--runtime local): rollouts isolated neither from each other nor from the host"
    )
