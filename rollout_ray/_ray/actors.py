"""The Ray layer: thin actors over the hosts, their placement, and handles to use them.

The only module of the package that imports ``ray``. Each actor is a plain host class made
remote here; it adds no lifecycle logic.

* ``RolloutActor`` hosts up to K rollouts (``RolloutHost``). It creates its own
  ``RuntimeActor`` for the runtimes its rollouts own, so by Ray's ownership rules that actor —
  and, through its guardian, every process of every runtime in it — dies with it.
* ``RuntimeActor`` hosts runtimes (``RuntimeHost``). One created by a caller is a pool to
  borrow from: ``await pool.runtime()`` gives a started runtime that outlives any rollout.
* ``InterceptionActor`` and ``ToolActor``: one of each per node (named, get-if-exists, pinned
  by node affinity): the OpenAI-compatible proxy every rollout of that node talks to
  (``InterceptionHost``), and the server of their tools (``ToolHost``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .coalesce import Coalescer
from .._core.interception import ChatClient, Interception, Slot
from .._serving.interception_host import Cursor, InterceptionHost, SessionDelta, SessionSpec, apply_delta
from .._record.messages import Message, Request
from .._core.executor import RolloutSpec
from .._core.host import RolloutHost
from .._core.runtime import Runtime
from .remote_runtime import RemoteRuntime as RemoteRuntime
from .remote_runtime import _call
from .._runtimes.host import RUNTIME_KINDS, RuntimeHost
from .._core.session import RolloutSession
from .shipment import Depot, Shipper, deliver
from .._serving.tool_server import ToolHost
from .._core.toolset import Toolset
from .._record.trace import ToolCallRecord
from .._record.trace import Trace, decode_trace

NAMESPACE = "rollout_ray"
INTERCEPTION_PREFIX = "interception:"
TOOLS_PREFIX = "tools:"
SHUTDOWN_GRACE = 5.0

SERVICE_HOST_VARIABLE = "ROLLOUT_RAY_SERVICE_HOST"
"""Where the node services bind (default 127.0.0.1: runtimes on the same node only). Set it
in the environment of every node's ``ray start`` (e.g. to ``0.0.0.0``) when runtimes on other
machines must reach a node's proxy and tools; a wildcard advertises the node's IP."""


def _service_hosts() -> dict[str, str]:
    host = os.environ.get(SERVICE_HOST_VARIABLE, "127.0.0.1")
    advertise = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host
    return {"host": host, "advertise_host": advertise}


class _InterceptionService(InterceptionHost):
    """``InterceptionHost`` taking its registrations as shipments (``_shipment``)."""

    def __init__(self) -> None:
        super().__init__(**_service_hosts())
        self._depot = Depot()

    async def register_many(self, items: list[tuple[bytes, dict[str, bytes]]]) -> list[Slot | Exception]:
        """Register each shipped ``SessionSpec``; an item that fails answers its exception."""
        return [await _outcome(self.register(self._depot.unpack(blob, bodies))) for blob, bodies in items]

    async def unregister_many(self, items: list[tuple[str, Cursor]]) -> list[Any]:
        return [await _outcome(self.unregister(secret, since)) for secret, since in items]


class _ToolService(ToolHost):
    """``ToolHost`` taking its registrations as shipments (``_shipment``)."""

    def __init__(self) -> None:
        super().__init__(**_service_hosts())
        self._depot = Depot()

    async def register_many(self, items: list[tuple[bytes, dict[str, bytes]]]) -> list[Any]:
        """Register each shipped ``(toolsets, runtime, state_secret)``."""
        return [await _outcome(self.register(*self._depot.unpack(blob, bodies))) for blob, bodies in items]

    async def unregister_many(self, keys: list[str]) -> list[Any]:
        return [await _outcome(self.unregister(key)) for key in keys]


async def _outcome(call: Awaitable[Any]) -> Any:
    """A batch item's result, or its exception as a value (it must not sink its neighbours)."""
    try:
        return await call
    except Exception as e:
        return e


_RuntimeActor = ray.remote(num_cpus=0, max_concurrency=1000)(RuntimeHost)
_InterceptionActor = ray.remote(num_cpus=0, max_concurrency=10_000)(_InterceptionService)
_ToolActor = ray.remote(num_cpus=0, max_concurrency=10_000)(_ToolService)


# -- sessions served by the node's interception actor ---------------------------------------


class RayInterception(Interception):
    """Serves sessions through an ``InterceptionActor``; pulls their turns after each segment."""

    def __init__(self, actor: Any, owner: str | None = None) -> None:
        self._actor = actor
        self._owner = owner
        self._secrets: dict[int, str] = {}
        self._shipper = Shipper()
        # Rollouts of one host start and end in bursts: their calls travel in batches.
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], Slot] = Coalescer(
            lambda items: _call(actor.register_many.remote(items)))
        self._unregister: Coalescer[tuple[str, Cursor], SessionDelta | None] = Coalescer(
            lambda items: _call(actor.unregister_many.remote(items)))

    @asynccontextmanager
    async def serve(self, session: RolloutSession) -> AsyncIterator[Slot]:  # type: ignore[override]
        slot: Slot = await deliver(
            self._shipper, SessionSpec.of(session, self._owner),
            lambda blob, bodies: self._register((blob, bodies)),
            shared=(session.model,),
        )
        self._secrets[id(session)] = slot.model_secret
        try:
            yield slot
        finally:
            del self._secrets[id(session)]
            try:
                change = await self._unregister((slot.model_secret, Cursor.of(session.trace)))
            finally:
                session.release()
            if change is not None:
                apply_delta(session, change)

    def client(self, slot: Slot) -> ChatClient | None:
        return None

    async def prepare_users(self, session: RolloutSession, request: Request) -> Request:
        rewritten: Request = await _call(self._actor.prepare_users.remote(self._secrets[id(session)], request))
        await self.sync(session)
        return rewritten

    async def sync(self, session: RolloutSession) -> None:
        secret = self._secrets.get(id(session))
        if secret is not None:
            apply_delta(session, await _call(self._actor.sync.remote(secret, Cursor.of(session.trace))))


class RayToolServer:
    """Serves toolsets through the node's ``ToolActor``; its calls land on the trace at exit."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._shipper = Shipper()
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], tuple[str, dict[str, str]]] = Coalescer(
            lambda items: _call(actor.register_many.remote(items)))
        self._unregister: Coalescer[str, list[ToolCallRecord]] = Coalescer(
            lambda keys: _call(actor.unregister_many.remote(keys)))

    @asynccontextmanager
    async def serve(self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str, *,
                    on_call: Any = None) -> AsyncIterator[dict[str, str]]:
        # The runtime handle travels only when a tool needs it: shipping it costs a pickle and
        # makes the runtime's teardown reach its actor even if nothing ever ran in it.
        needed = runtime if any(t.wants_runtime() for t in toolsets) else None
        key, urls = await deliver(
            self._shipper, (list(toolsets), needed, state_secret),
            lambda blob, bodies: self._register((blob, bodies)),
        )
        try:
            yield urls
        finally:
            records = await self._unregister(key)
            for record in records if on_call is not None else ():
                on_call(record)


def _node_service(cls: Any, prefix: str, node_id: str) -> Any:
    """The node's ``cls`` actor, created on first use, pinned to ``node_id``.

    Detached, because it serves every rollout actor of the node whichever created it;
    ``shutdown_node_services`` ends it.
    """
    return cls.options(
        name=prefix + node_id,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()


def interception_actor(node_id: str) -> Any:
    """The node's ``InterceptionActor``."""
    return _node_service(_InterceptionActor, INTERCEPTION_PREFIX, node_id)


def tool_actor(node_id: str) -> Any:
    """The node's ``ToolActor``."""
    return _node_service(_ToolActor, TOOLS_PREFIX, node_id)


async def forget_dead_actor(actor_id: str) -> int:
    """Drop the sessions a dead rollout actor left in every node's interception actor."""
    dropped = 0
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == NAMESPACE and a["name"].startswith(INTERCEPTION_PREFIX):
            try:
                actor = ray.get_actor(a["name"], namespace=NAMESPACE)
                dropped += await _call(actor.drop_owner.remote(actor_id))
            except (RayActorError, ValueError):
                continue  # that node's service is gone too
    return dropped


async def shutdown_node_services(grace: float = SHUTDOWN_GRACE) -> list[str]:
    """End every node's interception and tool actors: gracefully, then ``ray.kill``."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE
             and a["name"].startswith((INTERCEPTION_PREFIX, TOOLS_PREFIX))]
    for name in names:
        actor = ray.get_actor(name, namespace=NAMESPACE)
        await _stop_actor(actor, grace)
    return names


async def _stop_actor(actor: Any, grace: float) -> None:
    try:
        async with asyncio.timeout(grace):
            await actor.shutdown.remote()
    except (TimeoutError, RayActorError):
        pass
    ray.kill(actor, no_restart=True)


# -- the rollout actor ----------------------------------------------------------------------


class _RolloutActorImpl:
    """A ``RolloutHost`` wired to its node's interception and its own runtime actor."""

    def __init__(self, capacity: int, runtime: str = "local") -> None:
        node_id = ray.get_runtime_context().get_node_id()
        self._runtime_options = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        self._runtime_kind = runtime
        self._runtimes = _RuntimeActor.options(**self._runtime_options).remote(kind=runtime)
        self._watcher: asyncio.Task[None] | None = None
        self.replaced_runtime_actors = 0
        self._interception = interception_actor(node_id)
        self._tools = tool_actor(node_id)
        self.host = RolloutHost(
            capacity,
            interception=RayInterception(self._interception, ray.get_runtime_context().get_actor_id()),
            runtime_factory=lambda name: RemoteRuntime(self._runtimes, name, owner=name, lazy=True,
                                                       runtime_type=runtime),
            tool_server=RayToolServer(self._tools).serve,
        )
        self._depot = Depot()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def runtime_actor(self) -> Any:
        return self._runtimes

    def _watch_runtimes(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._replace_dead_runtime_actor())

    async def _replace_dead_runtime_actor(self) -> None:
        """Long-poll the runtime actor; if it dies, new rollouts get a new one.

        The rollouts whose runtimes it held fail with ``SandboxError`` (their box is gone);
        without a replacement every later rollout of this actor would too.
        """
        while True:
            try:
                await self._runtimes.wait_closed.remote()
                return  # shut down on purpose
            except RayActorError:
                if self.replaced_runtime_actors:  # one that cannot live must not spin
                    await asyncio.sleep(min(5.0, 0.5 * self.replaced_runtime_actors))
                self._runtimes = _RuntimeActor.options(**self._runtime_options).remote(kind=self._runtime_kind)
                self.replaced_runtime_actors += 1

    async def open(self, blob: bytes, bodies: dict[str, bytes]) -> tuple[str, bool]:
        self._watch_runtimes()
        return await self.host.open(self._depot.unpack(blob, bodies))

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await self.host.step(rollout_id, messages)

    async def close(self, rollout_id: str) -> bytes:
        return await self.host.close(rollout_id)

    async def abort(self, rollout_id: str) -> None:
        await self.host.abort(rollout_id)

    async def run(self, blob: bytes, bodies: dict[str, bytes]) -> bytes:
        self._watch_runtimes()
        return await self.host.run(self._depot.unpack(blob, bodies))

    async def trace(self, rollout_id: str) -> bytes:
        return await self.host.trace(rollout_id)

    def open_ids(self) -> list[str]:
        return self.host.open_ids()

    async def shutdown(self) -> None:
        await self.host.shutdown()
        await self._runtimes.shutdown.remote()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)


_RolloutActor = ray.remote(num_cpus=0, max_concurrency=10_000)(_RolloutActorImpl)


class RolloutActor:
    """Handle to a long-lived actor hosting up to ``capacity`` concurrent rollouts.

    Create with ``RolloutActor.create(capacity=K)``; end with ``await actor.aclose()``.
    Specs travel as shipments: the taskset's classes, the harness and the model are sent to
    the actor once, not with every rollout.
    """

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._shipper = Shipper()

    async def _ship(self, method: Any, spec: RolloutSpec) -> Any:
        return await deliver(self._shipper, spec, lambda blob, bodies: _call(method.remote(blob, bodies)),
                             shared=(spec.harness, spec.model))

    @classmethod
    def create(cls, *, capacity: int = 1, runtime: str = "local", **options: Any) -> RolloutActor:
        """Start the actor. ``runtime`` is the kind of the runtimes its rollouts own
        (``"local"`` or ``"sandbox"``); ``options`` go to ``.options()`` (e.g. a scheduling
        strategy)."""
        if runtime not in RUNTIME_KINDS:
            raise ValueError(f"runtime must be one of {RUNTIME_KINDS}, got {runtime!r}")
        return cls(_RolloutActor.options(**options).remote(capacity, runtime))

    async def open(self, spec: RolloutSpec) -> tuple[str, bool]:
        return await self._ship(self.actor.open, spec)

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await _call(self.actor.step.remote(rollout_id, messages))

    async def close(self, rollout_id: str) -> Trace:
        return decode_trace(await _call(self.actor.close.remote(rollout_id)))

    async def abort(self, rollout_id: str) -> None:
        await _call(self.actor.abort.remote(rollout_id))

    async def run(self, spec: RolloutSpec) -> Trace:
        return decode_trace(await self._ship(self.actor.run, spec))

    async def trace(self, rollout_id: str) -> Trace:
        return decode_trace(await _call(self.actor.trace.remote(rollout_id)))

    async def node_id(self) -> str:
        return await _call(self.actor.node_id.remote())

    async def aclose(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Abort open rollouts and stop the actor; ``ray.kill`` it after ``grace`` seconds."""
        await _stop_actor(self.actor, grace)


class RuntimeActor:
    """Handle to a runtime pool: runtimes to *borrow*, alive until the pool stops them."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._count = 0

    @classmethod
    def create(cls, *, kind: str = "local", **options: Any) -> RuntimeActor:
        """A pool of ``kind`` runtimes (``"local"`` or ``"sandbox"``)."""
        return cls(_RuntimeActor.options(**options).remote(kind=kind))

    async def runtime(self, name: str | None = None) -> RemoteRuntime:
        """A new started runtime owned by this pool (not by any rollout)."""
        self._count += 1
        runtime = RemoteRuntime(self.actor, name or f"pool-{self._count}-{id(self):x}")
        await runtime.start()
        return runtime

    async def aclose(self, grace: float = SHUTDOWN_GRACE) -> None:
        await _stop_actor(self.actor, grace)
