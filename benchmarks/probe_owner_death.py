#!/usr/bin/env python
"""How long after a rollout actor is killed are its runtime actor and the runtime's processes gone?

    python benchmarks/probe_owner_death.py [N] [--private]   # N kills (12), ray.kill / SIGKILL

Without ``--private`` Ray starts as the test session starts it (tests/conftest.py: on the
machine's address); with it, as ``rollout-ray eval`` does (``init_ray``: private, loopback).

Each round: a rollout actor (runtime "local") runs a task whose setup starts a background
process in the rollout's own runtime and reports its pid; the actor is then killed, and the
probe waits (pidfd events, not polling) for the runtime actor's process, then for that
background process. Ray ends an actor whose owner died ("fate sharing"); the runtime's
guardian then kills what the runtime started. Prints one line per round: how, seconds from the
kill to the runtime actor's exit, then to the background process's exit (None: still running
after 20 s). Behind ``OWNER_DEATH`` in tests/ray/test_ray_actors.py.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray

from rollout_ray import Task, Trace, reward
from rollout_ray._core.harness import Harness
from rollout_ray._core.runtime import ProgramResult, Runtime
from rollout_ray._core.task import TaskData
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray._ray.calls import call
from rollout_ray._ray.head import init_ray, lean_head
from rollout_ray._ray.rollout_client import RolloutActor
from rollout_ray.testing import ScriptedModel

SLEEPER = ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"]


class FifoData(TaskData):
    fifo: str


class SpawnsSleeper(Task):
    data_type = FifoData

    async def setup(self, runtime: Runtime) -> None:
        out = await runtime.exec(SLEEPER)
        await asyncio.to_thread(Path(self.data.fifo).write_text, out.stdout)  # type: ignore[attr-defined]

    @reward
    def done(self, trace: Trace) -> float:
        return 1.0


class Blocks(Harness):
    async def launch(self, ctx: Any) -> ProgramResult:
        await asyncio.Event().wait()
        return ProgramResult(0)


def seconds_until_gone(pid: int, timeout: float = 20.0) -> float | None:
    t0 = time.monotonic()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0.0
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return round(time.monotonic() - t0, 2) if ready else None


async def one(how: str) -> tuple[str, float | None, float | None]:
    actor = RolloutActor.create(capacity=2, runtime="local")
    fifo = os.path.join(tempfile.mkdtemp(prefix="rr-probe-"), "pid")
    os.mkfifo(fifo)
    spec = RolloutSpec(SpawnsSleeper({"prompt": "hi", "fifo": fifo}), Blocks(), ScriptedModel(default="x"))
    running = asyncio.ensure_future(actor.run(spec))
    sleeper = int(await asyncio.to_thread(Path(fifo).read_text))
    host = await call(actor.actor.runtime_actor.remote())
    host_pid = await call(host.pid.remote())
    if how == "ray.kill":
        ray.kill(actor.actor, no_restart=True)
    else:
        os.kill(await call(actor.actor.pid.remote()), signal.SIGKILL)
    try:
        await running
    except Exception:  # noqa: BLE001 - the actor died: expected
        pass
    host_gone = await asyncio.to_thread(seconds_until_gone, host_pid)
    sleeper_gone = await asyncio.to_thread(seconds_until_gone, sleeper)
    return how, host_gone, sleeper_gone


async def main(rounds: int) -> None:
    for i in range(rounds):
        print(await one("ray.kill" if i % 2 else "SIGKILL"), flush=True)


if __name__ == "__main__":
    if "--private" in sys.argv:  # as rollout-ray eval starts Ray: on loopback
        init_ray(None, num_cpus=2)
    else:  # as the test session does (tests/conftest.py): Ray on the machine's address
        with lean_head():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        asyncio.run(main(int(args[0]) if args else 12))
    finally:
        ray.shutdown()
