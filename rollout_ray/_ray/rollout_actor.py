"""The actor's side of a rollout actor: a ``RolloutHost`` wired to its node's services and its
own runtime actor (the driver's side, the ``RolloutActor`` handle, is ``rollout_client``).

It hosts up to K rollouts and adds no lifecycle logic. It creates its own runtime actor for
the runtimes its rollouts own (when a rollout first needs a box), so by Ray's ownership rules
that actor — and, through its guardian, every process of every runtime in it — dies with it.
Its programs' sessions and tools are served by the node's services actor
(``node_service_actor``, reached on first use) under its owner id, which it renews every few
seconds once it used them: what a dead rollout actor left there is reaped.

Its process's ``PolicyGate`` (``_core/policy_gate``) is its rollouts' policy: ``set_policy``
sets it, then forwards it to the node's services for the sessions of its programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core.policy_gate import process_gate
from .._errors import InfrastructureLost
from .._hosting.gc_tuning import tune_for_rollouts
from .._hosting.node_services import LEASE_SECONDS
from .._hosting.rollout_host import RolloutHost
from .._record.messages import Message
from .._record.trace import Trace
from .._runtimes.host import runtime_kind
from . import shared_cluster  # noqa: F401 - makes scope="cluster" shared servers work here
from .calls import call
from .node_services_client import NodeServicesRef, RayInterception, RayToolServer
from .remote_runtime import owned_runtime
from .runtime_actor import RuntimeActorClass
from .wire import Result, ShipmentUnpacker, portable, trace_to_wire

PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 30.0
"""How often the runtime actor is pinged, and how long it may take to answer before it
counts as hung."""


class RunReceiver:
    """The actor's side of batched runs: runs each submitted spec, and holds its result until
    the next ``collect`` takes it.

    Args:
        run: runs one spec to its trace (``RolloutHost.run``).
    """

    def __init__(self, run: Callable[[Any], Awaitable[Trace]]) -> None:
        self._run = run
        self._unpacker = ShipmentUnpacker()
        self._running: dict[int, asyncio.Task[Trace]] = {}
        self._done: list[Result] = []
        self._ready = asyncio.Event()

    def submit(self, items: list[tuple[int, bytes]], bodies: dict[str, bytes]) -> list[tuple[int, Exception]]:
        """Start each item; returns the items that could not be unpacked, with why."""
        failed: list[tuple[int, Exception]] = []
        for sid, blob in items:
            try:
                spec = self._unpacker.unpack(blob, bodies)
            except Exception as e:  # noqa: BLE001 - that rollout fails (MissingShipment: sent again)
                failed.append((sid, portable(e)))
                continue
            task = asyncio.ensure_future(self._run(spec))
            self._running[sid] = task
            task.add_done_callback(partial(self._finished, sid))
        return failed

    def _finished(self, sid: int, task: asyncio.Task[Trace]) -> None:
        # The trace is encoded here, as it is held for ``collect``: no coroutine of its own
        # between the host's run and the wire.
        self._running.pop(sid, None)
        result: bytes | BaseException | None = None
        if not task.cancelled():
            error = task.exception()
            if error is None:
                try:
                    result = trace_to_wire(task.result())
                except Exception as e:  # noqa: BLE001 - a trace that cannot be encoded: that rollout fails with it
                    error = e
            if error is not None:
                result = portable(error)
        self._done.append((sid, result))
        self._ready.set()

    async def collect(self, wait: float | None = None) -> list[Result]:
        """Every result since the last call; waits for one while rollouts run, ``wait``
        seconds at most (``None``: as long as they run). An empty answer says the actor is
        alive: its caller bounds its own wait on the call by it."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                while not self._done and self._running:
                    self._ready.clear()
                    await self._ready.wait()
        done, self._done = self._done, []
        return done

    def cancel(self, sids: Iterable[int]) -> None:
        for sid in sids:
            task = self._running.get(sid)
            if task is not None:
                task.cancel()

    def __len__(self) -> int:
        return len(self._running)


class _RolloutActor:
    """What a ``RolloutActor`` runs: the host, its node's services and its runtime actor."""

    def __init__(self, capacity: int, runtime: str, owner: str, policy: tuple[int | None, bool] | None = None) -> None:
        if policy is not None:
            process_gate().set(*policy)
        runtime, _ = runtime_kind(runtime)  # "auto" is decided by the node that runs the boxes
        node_id = ray.get_runtime_context().get_node_id()
        self._runtime_options = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        self._runtime_kind = runtime
        self._runtimes: Any = None  # started on first use: ``_runtime_actor``
        self._watcher: asyncio.Task[None] | None = None
        self.replaced_runtime_actors = 0
        self._owner = owner
        self._services = services = NodeServicesRef(node_id)
        self._heartbeat: asyncio.Task[None] | None = None
        self.host = RolloutHost(
            capacity,
            interception=RayInterception(services, owner),
            runtime_factory=functools.partial(owned_runtime, kind=runtime, actor=self._runtime_actor, default=runtime),
            tool_server=RayToolServer(services, owner).serve,
        )
        self._unpacker = ShipmentUnpacker()
        self._receiver = RunReceiver(self.host.run)
        tune_for_rollouts()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    async def runtime_actor(self) -> Any:
        """This actor's runtime actor, started now if no rollout needed a box yet."""
        return self._runtime_actor()

    async def start_services(self) -> Any:
        """Start what programs need (the runtime actor, the node's services, reached through
        this actor's own handle so that policy changes are forwarded there from now on) and
        return the runtime actor."""
        await self._services.call("ping")
        return self._runtime_actor()

    def warm(self, argument: Any = None) -> None:
        """Nothing, called with an argument: an actor's first call with one builds Ray's
        serialization context (~1 s of CPU on 2 cores), which would otherwise land on the
        first rollouts (``RayExecutor.ready``)."""

    def _runtime_actor(self) -> Any:
        """Started when first needed: most rollouts of an in-process harness never touch a box,
        and its process (~1.3 CPU-s to start) would be the slowest part of a cold start.
        ``RayExecutor.ready(programs=True)`` starts it ahead for harnesses that need one."""
        if self._runtimes is None:
            self._runtimes = RuntimeActorClass.options(**self._runtime_options).remote(kind=self._runtime_kind)
            if self._watcher is None or self._watcher.done():
                self._watcher = asyncio.create_task(self._replace_dead_runtime_actor())
        return self._runtimes

    def ping(self) -> None:
        """Answers at once unless the actor's event loop is stuck (``RayExecutor`` probes it)."""

    async def prepare(self, images: dict[str, int], setups: list[tuple[str, str]]) -> None:
        """The schedule ahead, for its runtime actor (``RuntimeHost.prepare``): started now if
        rollouts over images are coming."""
        if images or self._runtimes is not None:
            await call(self._runtime_actor().prepare.remote(images, setups), timeout=PROBE_TIMEOUT)

    async def set_policy(self, version: int | None, paused: bool, interrupt: bool = False) -> None:
        """This actor's rollouts, and its sessions at the node's services, see ``version`` and
        the pause (``interrupt``: their calls in flight are interrupted, and this returns once
        they stopped). Paused here first and resumed here last, so no agent clock runs while
        the node's proxy holds calls."""
        gate = process_gate()
        if paused:
            gate.set(version, paused, interrupt)
        try:
            if self._services.used:  # else the first registrations there carry it
                await self._services.call("set_policy", self._owner, version, paused, interrupt)
        except InfrastructureLost:
            pass  # replaced services learn it with the next registrations
        gate.set(version, paused)
        if paused and interrupt:
            await gate.until_stopped()

    def policy(self) -> tuple[int | None, bool]:
        """``(version, paused)`` as this actor's rollouts see it."""
        return process_gate().state()

    def _watch(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._renew_lease())

    async def _renew_lease(self) -> None:
        """Keep this actor's registrations at the node's services alive while it lives."""
        while True:
            try:
                if self._services.used:  # nothing of this actor's is held there otherwise
                    await self._services.call("renew", self._owner)
            except InfrastructureLost:
                pass  # the services were replaced; the next renewal goes to the new ones
            await asyncio.sleep(LEASE_SECONDS / 3)

    async def _replace_dead_runtime_actor(self) -> None:
        """Long-poll the runtime actor; if it dies, new rollouts get a new one.

        The rollouts whose runtimes it held are lost (``InfrastructureLost``: their box's host
        is gone) and run again; without a replacement every later rollout of this actor would be.
        """
        while True:
            try:
                await self._until_closed(self._runtimes)
                return  # shut down on purpose
            except RayActorError:
                if self.replaced_runtime_actors:  # one that cannot live must not spin
                    await asyncio.sleep(min(5.0, 0.5 * self.replaced_runtime_actors))
                self._runtimes = RuntimeActorClass.options(**self._runtime_options).remote(kind=self._runtime_kind)
                self.replaced_runtime_actors += 1

    @staticmethod
    async def _until_closed(actor: Any) -> None:
        """Return when ``actor`` shuts down; raise ``RayActorError`` when it dies, or once it
        was killed for not answering a ping within ``PROBE_TIMEOUT`` (hung)."""
        closed = asyncio.ensure_future(actor.wait_closed.remote())
        try:
            while not (await asyncio.wait({closed}, timeout=PROBE_INTERVAL))[0]:
                try:
                    await call(actor.pid.remote(), timeout=PROBE_TIMEOUT)
                except TimeoutError:
                    ray.kill(actor, no_restart=True)  # its calls fail: its rollouts fail as data
                except RayActorError:
                    pass  # ``closed`` says so
            closed.result()
        finally:
            closed.cancel()

    async def open(self, blob: bytes, bodies: dict[str, bytes]) -> tuple[str, bool]:
        self._watch()
        return await self.host.open(self._unpacker.unpack(blob, bodies))

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await self.host.step(rollout_id, messages)

    async def close(self, rollout_id: str) -> bytes:
        return trace_to_wire(await self.host.close(rollout_id))

    async def abort(self, rollout_id: str) -> None:
        await self.host.abort(rollout_id)

    async def submit(self, items: list[tuple[int, bytes]], bodies: dict[str, bytes]) -> list[tuple[int, Exception]]:
        self._watch()
        return self._receiver.submit(items, bodies)

    async def collect(self, wait: float | None = None) -> list[Result]:
        return await self._receiver.collect(wait)

    async def cancel(self, sids: list[int]) -> None:
        self._receiver.cancel(sids)

    def trace(self, rollout_id: str) -> bytes:
        return trace_to_wire(self.host.trace(rollout_id))

    def open_ids(self) -> list[str]:
        return self.host.open_ids()

    def live(self) -> dict[str, Any]:
        return self.host.live()

    async def shutdown(self) -> None:
        await self.host.shutdown()
        if self._runtimes is not None:
            await self._runtimes.shutdown.remote()
        tasks = [t for t in (self._watcher, self._heartbeat) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


RolloutActorClass = ray.remote(num_cpus=0, max_concurrency=10_000)(_RolloutActor)  # type: ignore[call-overload]  # ray's overloads omit actor options
