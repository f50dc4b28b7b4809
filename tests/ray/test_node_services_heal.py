"""Node services heal (issue 10 §5): a dead services actor is replaced and the rollouts it
broke are retried; what a dead rollout actor or a dead driver registered is reaped; a hung
rollout actor becomes an infrastructure loss instead of pinning a driver slot."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_ray import ChatHarness, Harness, ProgramResult, RolloutSpec, Task, Toolset, Trace, reward, tool
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._errors import InfrastructureLost
from rollout_ray._hosting.executor import Executor
from rollout_ray.testing import Reply, ScriptedModel

from conftest import process_alive, wait_exit

ray = pytest.importorskip("ray")

from rollout_ray._hosting.node_services import LEASE_SECONDS  # noqa: E402
from rollout_ray._ray.node_service_actor import node_service_actor  # noqa: E402
from rollout_ray._ray.ray_executor import RayExecutor  # noqa: E402
from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.faults, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

SCRIPT = Path(__file__).resolve().parents[1] / "fault_scripts" / "hanging_driver.py"


class Answers(Task):
    @reward
    def said_four(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


class Adder(Toolset):
    name = "adder"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class WithTools(Task):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Adder()]


class Blocks(Harness):
    async def launch(self, ctx: Any) -> ProgramResult:
        await asyncio.Event().wait()
        return ProgramResult(0)


class HangsOnce(ChatHarness):
    """The first attempt of each task hangs (after dropping a marker file); later ones answer."""

    def __init__(self, folder: str) -> None:
        super().__init__(retries=0)
        self.folder = folder

    async def launch(self, ctx: Any) -> Any:
        marker = os.path.join(self.folder, f"task-{ctx.data.idx}")
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            await asyncio.Event().wait()
        return await super().launch(ctx)


def _services() -> Any:
    """This node's services actor (created if no rollout actor did yet)."""
    return node_service_actor(ray.get_runtime_context().get_node_id())


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not await predicate():
        assert time.monotonic() - t0 < timeout, f"{what} not within {timeout}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def _tasks(n: int) -> list[Answers]:
    return [Answers({"idx": i, "prompt": f"question {i}"}) for i in range(n)]


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


def test_a_killed_node_services_actor_is_replaced_and_its_rollouts_retried(report: Any) -> None:
    """Its rollouts come back lost within 3 s of the kill, as for the other actors (issue 21
    §5), not once the replacement answers; they are run again on the replacement."""
    model = ScriptedModel(default=Reply("4", delay=1.0))  # answered by the node's services

    async def main() -> tuple[Any, int, int, float, float]:
        async with RayExecutor(actors=1, capacity=8) as executor:
            watched = Watched(executor)
            # Over HTTP, as a program would: served by the node's services.
            driver = Driver(
                _tasks(8),
                ChatHarness(retries=0, transport="http"),
                model,
                executor=watched,  # type: ignore[arg-type]
                config=EvalConfig(max_infra_retries=3, max_in_flight=8),
            )
            services = _services()
            baseline = await services.load.remote()  # what other tests' dead owners still hold
            running = asyncio.create_task(driver.arun())
            await _until(lambda: _load(services, at_least=baseline + 8), 30, "8 sessions registered")
            before = await services.pid.remote()
            t0 = time.monotonic()
            os.kill(before, signal.SIGKILL)
            await asyncio.wait_for(watched.lost.wait(), 30)
            detected = time.monotonic() - t0
            result = await asyncio.wait_for(running, 120)
            after = await _services().pid.remote()
            return result, before, after, detected, time.monotonic() - t0

    result, before, after, detected, seconds = asyncio.run(main())
    rows = result.samples.to_pylist()
    assert len(rows) == 8 and all(r["ok"] for r in rows), [(r["error_type"], r["error_message"]) for r in rows]
    assert sum(r["attempt"] > 0 for r in rows) == 8  # every one of them was lost and retried
    assert after != before and not process_alive(before)
    print(f"lost detected {detected:.2f}s after the kill; all retried ok {seconds:.2f}s after")
    assert detected < 3.0, f"the rollouts came back lost {detected:.1f}s after the kill"
    report(
        "10§5 node services killed",
        "SIGKILL of the services actor, 8 rollouts in flight",
        "replaced; 8/8 retried ok",
        f"0 (InfrastructureLost, retried; all done {seconds:.1f}s)",
        seconds,
    )
    report(
        "21§5 node services death detected",
        "SIGKILL of the services actor, 8 rollouts in flight",
        "its rollouts lost (seconds to detect)",
        "0",
        detected,
    )


def test_a_session_the_services_no_longer_hold_is_an_infrastructure_loss() -> None:
    """A rollout whose services were restarted between two calls (its next call reaches the
    new ones, which never saw its session) is retried, not failed as its harness's error."""
    from rollout_ray import InfrastructureLost
    from rollout_ray._hosting.trace_sync import Cursor

    services = _services()
    for method, args in (
        ("sync", ("forgotten-secret", Cursor())),
        ("unregister_many", ([("forgotten-secret", Cursor())],)),
        ("register_tools", ([Adder()], None, "forgotten-state")),
    ):
        with pytest.raises(InfrastructureLost, match="no longer hold this rollout's session"):
            answer = ray.get(getattr(services, method).remote(*args))
            if isinstance(answer, list):  # a batch answers each item's exception as a value
                raise answer[0]


async def _load(services: Any, at_least: int = 1, owner: str | None = None) -> bool:
    return await services.load.remote(owner) >= at_least


def test_a_killed_rollout_actor_leaves_no_registration(report: Any) -> None:
    async def main() -> float:
        actor = RolloutActor.create(capacity=2)
        spec = RolloutSpec(WithTools({"prompt": "2 + 3?"}), Blocks(), ScriptedModel(default="5"))
        running = asyncio.ensure_future(actor.run(spec))
        services = _services()
        await _until(lambda: _load(services, at_least=2, owner=actor.owner), 30, "session and tools registered")
        os.kill(await actor.actor.pid.remote(), signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            await running
        return await _until(lambda: _none_left(services, actor.owner), 3 * LEASE_SECONDS, "the reaping")

    seconds = asyncio.run(main())
    report(
        "10§5 rollout actor killed",
        "SIGKILL mid-segment, with a session and tools",
        "lease expired, reaped",
        "0 registrations left",
        seconds,
    )


async def _none_left(services: Any, owner: str | None = None) -> bool:
    return await services.load.remote(owner) == 0


def test_a_killed_driver_leaves_no_registration(report: Any, tmp_path: Path) -> None:
    address = ray.get_runtime_context().gcs_address

    async def main() -> float:
        services = _services()
        baseline = await services.load.remote()
        driver = subprocess.Popen(
            [sys.executable, str(SCRIPT), address, "4"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
            start_new_session=True,
        )
        try:
            await _until(lambda: _load(services, at_least=baseline + 4), 60, "the driver's 4 sessions")
            driver.kill()
            driver.wait(10)
            return await _until(
                lambda: _load_is(services, baseline),
                3 * LEASE_SECONDS + 30,
                "the dead driver's registrations to be reaped",
            )
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)

    seconds = asyncio.run(main())
    report(
        "10§5 driver killed",
        "SIGKILL of a driver with 4 rollouts in flight",
        "its actors died, their leases expired",
        "0 registrations left",
        seconds,
    )


async def _load_is(services: Any, count: int) -> bool:
    return await services.load.remote() == count


def test_a_hung_rollout_actor_becomes_an_infrastructure_loss(report: Any, tmp_path: Path) -> None:
    async def main() -> tuple[Any, float, int]:
        executor = RayExecutor(actors=1, capacity=2, probe_interval=0.2, probe_timeout=1.0)
        async with executor:
            driver = Driver(
                _tasks(1),
                HangsOnce(str(tmp_path)),
                ScriptedModel(default="4"),
                executor=executor,
                config=EvalConfig(max_infra_retries=1),
            )
            running = asyncio.create_task(driver.arun())
            marker = tmp_path / "task-0"
            await _until(lambda: _exists(marker), 30, "the first attempt to start")
            pid = int(marker.read_text())
            t0 = time.monotonic()
            os.kill(pid, signal.SIGSTOP)  # hung, not dead: Ray alone would wait forever
            result = await asyncio.wait_for(running, 60)
            return result, time.monotonic() - t0, pid

    result, seconds, pid = asyncio.run(main())
    (row,) = result.samples.to_pylist()
    assert row["ok"] and row["attempt"] == 1 and row["reward"] == 1.0
    wait_exit(pid, 10)  # killed, though stopped
    report(
        "10§5 rollout actor hung",
        "SIGSTOP mid-segment",
        "probe timed out, killed, retried ok",
        "0 (1 InfrastructureLost, retried)",
        seconds,
    )


async def _exists(path: Path) -> bool:
    return path.exists()


def test_replaced_services_answer_each_registration_of_a_batch_on_its_own() -> None:
    """Issue 32 §3: killing the services actor left in-flight rollouts failed with
    ``MissingShipment`` (7 of 8, in one run of two). Its replacement was never sent the bodies
    (the model, the classes) the first one was, so a batch reaching it mixes resends carrying
    every body and first sends carrying none; one item lacking a body sank the whole batch,
    resends included, and a resend that fails is not sent again. Driven here directly, on a
    fresh actor: each item answers on its own."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rollout_ray._core.interception import Slot
    from rollout_ray._core.session import RolloutSession
    from rollout_ray._hosting.trace_sync import Cursor, SessionSpec
    from rollout_ray._ray.node_service_actor import NodeServiceActorClass
    from rollout_ray._ray.wire import MissingShipment, ShipmentPacker
    from rollout_ray._record.trace import TraceTask

    model, packer = ScriptedModel(default="4"), ShipmentPacker()

    def shipped(resend: bool) -> tuple[bytes, dict[str, bytes]]:
        spec = SessionSpec.of(RolloutSession(Trace(task=TraceTask(type="T")), model), owner="probe")
        blob, keys = packer.pack(spec, shared=(model,))
        return blob, packer.bodies(keys, resend=resend)  # not resent: the sender believes them there

    node = ray.get_runtime_context().get_node_id()
    replaced = NodeServiceActorClass.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote()
    try:
        resend, first = shipped(resend=True), shipped(resend=False)
        assert resend[1] and not first[1]
        answers = ray.get(replaced.register_many.remote([first, resend]), timeout=60)
        assert isinstance(answers[0], MissingShipment), answers  # its rollout sends it again, with bodies
        assert isinstance(answers[1], Slot), answers
        again = ray.get(replaced.register_many.remote([shipped(resend=True)]), timeout=60)
        assert isinstance(again[0], Slot), again
        held = [(slot.model_secret, Cursor()) for slot in (answers[1], again[0])]
        assert ray.get(replaced.load.remote(), timeout=60) == 2
        assert all(not isinstance(d, Exception) for d in ray.get(replaced.unregister_many.remote(held), timeout=60))
    finally:
        ray.get(replaced.shutdown.remote(), timeout=60)
        ray.kill(replaced)
