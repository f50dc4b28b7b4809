"""A rollout actor's runtime actor killed under its rollouts (issue 21 §5): the box's host is
gone, not the box, so the rollouts are infrastructure losses, run again by the driver (and by
``--resume``), never recorded as task failures."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import ChatHarness, Runtime, Toolset, Trace, reward, tool
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._errors import InfrastructureLost
from rollout_ray._hosting.executor import Executor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._record.arrow import table_to_traces
from rollout_ray._record.messages import Request, ToolMessage
from rollout_ray.testing import Reply, ScriptedModel

from conftest import Echo, wait_exit

ray = pytest.importorskip("ray")

from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.faults, pytest.mark.usefixtures("ray_cluster")]


class Box(Toolset):
    name = "box"

    @tool
    async def stall_once(self, folder: str, runtime: Runtime) -> str:
        """The first call reports its shell's pid and waits forever; later ones answer."""
        mark, fifo = os.path.join(folder, "mark"), os.path.join(folder, "pid")
        script = f"if mkdir {mark} 2>/dev/null; then echo $$ > {fifo}; exec sleep 1000; fi; echo again"
        return (await runtime.exec(["sh", "-c", script])).stdout.strip()


class UsesBox(Echo):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Box()]

    @reward
    def used_it(self, trace: Trace) -> float:
        return float(any(c.ok for c in trace.tool_calls))


def calls_the_tool_then_answers(folder: str) -> Callable[[Request], Reply]:
    def reply(request: Request) -> Reply:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return Reply("4")
        return Reply(tool_calls=[("stall_once", {"folder": folder})])

    return reply


class Watched(Executor):
    """Wraps an executor; ``lost`` is set when a rollout comes back lost."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.lost = asyncio.Event()

    @property
    def max_in_flight(self) -> int | None:
        return self.inner.max_in_flight

    async def run(self, spec: RolloutSpec) -> Trace:
        trace = await self.inner.run(spec)
        if any(e.is_a(InfrastructureLost) for e in trace.errors):
            self.lost.set()
        return trace


async def _first_line(fd: int, running: asyncio.Future[Any]) -> str:
    """What the shell writes to the fifo ``fd``; fails if the run ends first (no hang)."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait([readable, running], return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)
    assert readable.done(), f"the run ended before its tool ran: {running.result().samples.to_pylist()}"
    return os.read(fd, 64).decode()


def test_a_killed_runtime_actor_loses_its_rollouts_and_the_driver_runs_them_again(report: Any, tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # read-write: opening does not wait for a writer
    task = UsesBox({"prompt": "hi"})
    model = ScriptedModel(default=calls_the_tool_then_answers(str(tmp_path)))

    async def main() -> tuple[Any, float, int]:
        executor = RayExecutor(actors=1, capacity=2, runtime="local")  # the tool's pid is a host pid
        async with executor:
            watched = Watched(executor)
            driver = Driver(
                [task],
                ChatHarness(retries=0),
                model,
                executor=watched,  # type: ignore[arg-type]
                config=EvalConfig(max_infra_retries=1),
            )
            running = asyncio.ensure_future(driver.arun())
            async with asyncio.timeout(120):
                shell = int(await _first_line(fd, running))
            actor = executor._pool[0]
            assert actor is not None
            host = await actor.actor.runtime_actor.remote()
            t0 = time.monotonic()
            os.kill(await host.pid.remote(), signal.SIGKILL)
            async with asyncio.timeout(60):
                await watched.lost.wait()
            detected = time.monotonic() - t0
            async with asyncio.timeout(60):
                return await running, detected, shell

    try:
        result, detected, shell = asyncio.run(main())
    finally:
        os.close(fd)
    (row,) = result.samples.to_pylist()
    assert (row["ok"], row["attempt"], row["error_type"], row["reward"]) == (True, 1, None, 2.0)
    assert [[e["type"] for e in a["errors"]] for a in row["attempts"]] == [["InfrastructureLost"], []]
    (trace,) = table_to_traces(result.samples)
    assert [(c.name, c.ok) for c in trace.tool_calls] == [("stall_once", True)]  # the run again, whole
    wait_exit(shell, 5.0)
    report(
        "21§5 runtime actor killed",
        "SIGKILL of the runtime actor mid tool call",
        "lost, run again: ok (was SandboxError, never re-run)",
        "0",
        detected,
    )
