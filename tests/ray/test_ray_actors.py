"""The Ray layer on a real local Ray instance: hosting, ownership and fate sharing."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from typing import Any

import pytest

from rollout_ray import Harness, InfrastructureLost, ProgramResult, Runtime, Task, TaskData, Trace, reward

from conftest import SLEEPER, wait_exit
from conftest import process_alive as _alive

ray = pytest.importorskip("ray")

from rollout_ray._hosting.spec import RolloutSpec  # noqa: E402
from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402
from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402
from rollout_ray._ray.runtime_actor import RuntimeActor  # noqa: E402
from rollout_ray._runtimes.guardian import BUDGET  # noqa: E402
from rollout_ray.testing import ScriptedModel  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def _wait_gone(pid: int, timeout: float) -> None:
    wait_exit(pid, timeout)


OWNER_DEATH = 5.0
"""Seconds Ray may take to end an actor after its owner died. benchmarks/probe_owner_death.py
measures it: one sitting saw ~5.0 s in 4 of 32 kills of a rollout actor (ray.kill or SIGKILL,
the tree before this change and after alike), ~0.03 s otherwise; a later one saw no slow kill
in 60. The guardian's own budget (guardian.BUDGET) comes on top."""


class FifoData(TaskData):
    fifo: str


class SpawnsSleeper(Task):
    """Setup starts a background process in the runtime and reports its pid through a FIFO."""

    data_type = FifoData

    async def setup(self, runtime: Runtime) -> None:
        out = await runtime.exec(SLEEPER)
        await asyncio.to_thread(_write_fifo, self.data.fifo, out.stdout)  # type: ignore[attr-defined]

    @reward
    def done(self, trace: Trace) -> float:
        return 1.0


def _write_fifo(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Blocks(Harness):
    async def launch(self, ctx: Any) -> ProgramResult:
        await asyncio.Event().wait()
        return ProgramResult(0)


class Idle(Harness):
    async def launch(self, ctx: Any) -> ProgramResult:
        return ProgramResult(0)


def _fifo() -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="rr-test-"), "pid")
    os.mkfifo(path)
    return path


def _read_fifo(path: str) -> int:
    with open(path) as f:
        return int(f.read())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_killing_a_rollout_actor_mid_segment_removes_its_owned_runtimes(how: str) -> None:
    async def main() -> None:
        # Host pids are what this test follows, so the runtimes are the host-process kind.
        actor = RolloutActor.create(capacity=2, runtime="local")
        pool = RuntimeActor.create(kind="local")
        borrowed = await pool.runtime()
        borrowed_pid = int((await borrowed.exec(SLEEPER)).stdout)
        fifo = _fifo()
        spec = RolloutSpec(SpawnsSleeper({"prompt": "hi", "fifo": fifo}), Blocks(), ScriptedModel(default="x"))
        running = asyncio.ensure_future(actor.run(spec))
        owned_pid = await asyncio.to_thread(_read_fifo, fifo)
        assert _alive(owned_pid)
        if how == "SIGKILL":
            os.kill(await actor.actor.pid.remote(), signal.SIGKILL)
        else:
            ray.kill(actor.actor, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):
            await running
        await asyncio.to_thread(_wait_gone, owned_pid, OWNER_DEATH + BUDGET + 2.0)
        assert _alive(borrowed_pid) and await borrowed.alive()
        await pool.aclose()
        await asyncio.to_thread(_wait_gone, borrowed_pid, 5.0)

    asyncio.run(main())


class SaysThenBlocks(Harness):
    """Writes ``started`` to a FIFO once its segment runs, then never returns."""

    in_process = True

    def __init__(self, fifo: str) -> None:
        super().__init__("says-then-blocks")
        self.fifo = fifo

    async def launch(self, ctx: Any) -> ProgramResult:
        await asyncio.to_thread(_write_fifo, self.fifo, "started")
        await asyncio.Event().wait()
        return ProgramResult(0)


def test_a_rollout_whose_actor_died_comes_back_from_the_ray_executor_as_a_lost_trace() -> None:
    """``Executor.run`` never raises the loss: it is the trace's typed error, as on every executor."""

    async def main() -> Trace:
        async with RayExecutor(actors=1, capacity=1, runtime="local") as executor:
            fifo = _fifo()
            running = asyncio.ensure_future(
                executor.run(RolloutSpec(Task({"prompt": "hi"}), SaysThenBlocks(fifo), ScriptedModel(default="x")))
            )
            await asyncio.to_thread(_read_started, fifo)
            actor = executor._pool[0]
            assert actor is not None
            ray.kill(actor.actor, no_restart=True)
            return await running

    trace = asyncio.run(main())
    assert not trace.ok and trace.is_completed and [e.type for e in trace.errors] == ["InfrastructureLost"]
    assert trace.errors[0].is_a(InfrastructureLost) and trace.errors[0].message.startswith("rollout actor died: ")


def _read_started(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_borrowed_runtime_survives_the_rollout_and_is_never_stopped_by_it() -> None:
    async def main() -> None:
        actor = RolloutActor.create(capacity=1)
        pool = RuntimeActor.create()
        runtime = await pool.runtime("shared-box")
        trace = await actor.run(
            RolloutSpec(Task({"prompt": "hi"}), Idle(), ScriptedModel(default="x"), runtime=runtime)
        )
        assert trace.agent.runtime is not None and trace.agent.runtime.borrowed
        assert trace.errors == [] and await runtime.alive()
        await actor.aclose()
        assert await runtime.alive()
        await pool.aclose()

    asyncio.run(main())


def test_borrowed_runtime_already_stopped_raises_to_the_caller() -> None:
    async def main() -> None:
        actor = RolloutActor.create(capacity=1)
        pool = RuntimeActor.create()
        runtime = await pool.runtime("gone")
        await pool.actor.stop.remote("gone")
        with pytest.raises(ValueError, match="already torn down by its owner"):
            await actor.run(RolloutSpec(Task({"prompt": "hi"}), Idle(), ScriptedModel(default="x"), runtime=runtime))
        await actor.aclose()
        await pool.aclose()

    asyncio.run(main())


def test_node_services_bind_loopback_unless_told_and_advertise_the_node_ip_on_a_wildcard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollout_ray._ray.node_service_actor import SERVICE_HOST_VARIABLE, _service_hosts

    monkeypatch.delenv(SERVICE_HOST_VARIABLE, raising=False)
    assert _service_hosts() == {"host": "127.0.0.1", "advertise_host": "127.0.0.1"}
    monkeypatch.setenv(SERVICE_HOST_VARIABLE, "0.0.0.0")
    assert _service_hosts() == {"host": "0.0.0.0", "advertise_host": ray.util.get_node_ip_address()}
    monkeypatch.setenv(SERVICE_HOST_VARIABLE, "10.1.2.3")
    assert _service_hosts() == {"host": "10.1.2.3", "advertise_host": "10.1.2.3"}
