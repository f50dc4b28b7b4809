"""The node services actor: each node's proxy and tool server, and the rollouts' side of it.

One actor per node (named, get-if-exists, detached, pinned by node affinity, restarted by
Ray if its process dies) runs ``NodeServices``: every rollout actor of the node registers
its rollouts' sessions and toolsets there, and their programs talk to it over loopback.
``RayInterception`` and ``RayToolServer`` are the rollout actor's side: registrations
travel as shipments (each class and model once) in coalesced batches, and what the node's
copy of a trace added comes back through ``_hosting/trace_sync``.

It heals: a rollout actor renews its lease every ``LEASE_SECONDS / 3``; the actor reaps
what an owner whose lease ran out left behind. A call to a services actor that died or does
not answer within ``SERVICE_CALL_TIMEOUT`` raises ``InfrastructureLost`` (the rollouts it
broke are retried, not recorded as failures of their task) and the next call goes to its
replacement.

Policy (``_core/policy``): the rollouts of different rollout actors on a node may belong to
different drivers, so the node's services keep one ``PolicyControl`` per owner. A rollout
actor forwards every ``set_policy`` it gets under its owner id, and each batch of
registrations carries its state too, so services that were replaced learn it again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core.interception import ChatClient, Interception, Slot
from .._core.policy import PolicyControl, process_policy
from .._core.runtime import Runtime
from .._core.session import RolloutSession
from .._core.toolset import Toolset
from .._errors import InfrastructureLost
from .._hosting.gc_tuning import tune_for_rollouts
from .._hosting.node_services import NodeServices, lost_session
from .._hosting.trace_sync import Cursor, SessionDelta, SessionSpec, apply_delta
from .._record.messages import Request
from .calls import NAMESPACE, SHUTDOWN_GRACE, call, stop_actor
from .coalesce import Coalescer
from .shipment import Depot, Shipper, deliver

SERVICES_PREFIX = "node-services:"

SERVICE_CALL_TIMEOUT = 30.0
"""Seconds a rollout actor waits for one call to its node's services before giving them up."""

SERVICE_HOST_VARIABLE = "ROLLOUT_RAY_SERVICE_HOST"
"""Where the node services bind (default 127.0.0.1: runtimes on the same node only). Set it
in the environment of every node's ``ray start`` (e.g. to ``0.0.0.0``) when runtimes on other
machines must reach a node's proxy and tools; a wildcard advertises the node's IP."""


def _service_hosts() -> dict[str, str]:
    host = os.environ.get(SERVICE_HOST_VARIABLE, "127.0.0.1")
    advertise = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host
    return {"host": host, "advertise_host": advertise}


class _NodeServiceActor(NodeServices):
    """``NodeServices`` taking its registrations as batches of shipments (``shipment``), and
    reaping expired leases in the background."""

    def __init__(self) -> None:
        super().__init__(**_service_hosts())
        self._depot = Depot()
        self._reaper: asyncio.Task[None] | None = None
        self._policies: dict[str, PolicyControl] = {}
        tune_for_rollouts()

    def _reaping(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 4)
            await self.reap()

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> None:
        """Answers at once unless the actor's event loop is stuck."""

    def renew(self, owner: str | None, now: float | None = None) -> None:
        self._reaping()
        super().renew(owner, now)

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await super().shutdown()

    # -- policy, per owner ------------------------------------------------------------------

    def _policy(self, owner: str | None) -> PolicyControl:
        if owner is None:
            return process_policy()
        control = self._policies.get(owner)
        if control is None:
            control = self._policies[owner] = PolicyControl()
        return control

    def set_policy(self, owner: str | None, version: int | None, paused: bool) -> None:
        """The policy of ``owner``'s sessions (``Executor.set_policy``, through its actor).

        It renews ``owner``'s lease: an owner that dies before it registers anything leaves
        no policy behind for good (a live one's next registration brings it back)."""
        self.renew(owner)
        self._policy(owner).set(version, paused)

    def policy(self, owner: str | None) -> tuple[int | None, bool]:
        """``(version, paused)`` of ``owner``'s sessions."""
        return self._policy(owner).state()

    async def register(self, spec: SessionSpec) -> Slot:
        slot = await super().register(spec)
        session = self._sessions[slot.model_secret].session
        if session is not None:
            session.policy = self._policy(spec.owner)
        return slot

    async def drop_owner(self, owner: str) -> int:
        dropped = await super().drop_owner(owner)
        control = self._policies.pop(owner, None)
        if control is not None:
            control.set(control.version, False)  # calls held for a dead owner end (sealed: 409)
        return dropped

    # -- batches ----------------------------------------------------------------------------

    async def register_many(self, items: list[tuple[bytes, dict[str, bytes]]],
                            policy: tuple[str, int | None, bool] | None = None) -> list[Slot | Exception]:
        """Register each shipped ``SessionSpec``; an item that fails answers its exception.

        ``policy`` is the registering owner's ``(owner, version, paused)``, applied first.
        """
        if policy is not None:
            self.set_policy(*policy)
        return [await _outcome(self.register(self._depot.unpack(blob, bodies))) for blob, bodies in items]

    async def unregister_many(self, items: list[tuple[str, Cursor]]) -> list[Any]:
        """Seal each session and answer what it added; a session not held here is lost."""
        return [await _outcome(self._unregister_held(secret, since)) for secret, since in items]

    async def _unregister_held(self, secret: str, since: Cursor) -> SessionDelta:
        change = await self.unregister(secret, since)
        if change is None:
            raise lost_session()
        return change

    async def register_tools_many(self, items: list[tuple[bytes, dict[str, bytes]]]) -> list[Any]:
        """Register each shipped ``(toolsets, runtime, state_secret, owner)``."""
        return [await _outcome(self.register_tools(*self._depot.unpack(blob, bodies))) for blob, bodies in items]

    async def unregister_tools_many(self, keys: list[str]) -> list[Any]:
        return [await _outcome(self.unregister_tools(key)) for key in keys]


async def _outcome(pending: Awaitable[Any]) -> Any:
    """A batch item's result, or its exception as a value (it must not sink its neighbours)."""
    try:
        return await pending
    except Exception as e:
        return e


NodeServiceActorClass = ray.remote(num_cpus=0, max_concurrency=10_000, max_restarts=-1)(_NodeServiceActor)


def node_service_actor(node_id: str) -> Any:
    """The node's services actor, created on first use, pinned to ``node_id``.

    Detached, because it serves every rollout actor of the node whichever created it;
    ``shutdown_node_services`` ends it.
    """
    return NodeServiceActorClass.options(
        name=SERVICES_PREFIX + node_id,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()


class NodeServicesRef:
    """A rollout actor's handle on its node's services, replaced when they die.

    Every call is bounded by ``SERVICE_CALL_TIMEOUT``; one that fails because the actor died
    or hangs raises ``InfrastructureLost``, and the next call goes to the node's services as
    they are then (Ray restarts a dead one under the same handle; one that is gone for good
    is created anew under its name).
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._actor: Any = None
        self._recovery: asyncio.Future[None] | None = None

    @property
    def actor(self) -> Any:
        """The node's services actor, looked up (created if need be) on first use: the rollouts
        of an in-process harness never need it, and its process is ~1.3 CPU-s to start."""
        if self._actor is None:
            self._actor = node_service_actor(self.node_id)
        return self._actor

    @actor.setter
    def actor(self, actor: Any) -> None:
        self._actor = actor

    @property
    def used(self) -> bool:
        """Whether anything was asked of the node's services through this handle."""
        return self._actor is not None

    async def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the node's services.

        Raises:
            InfrastructureLost: they died or hung; raised once they answer again (or after
                ``SERVICE_CALL_TIMEOUT``), so that the retry of a rollout lands on live ones.
        """
        actor = self.actor
        try:
            return await call(getattr(actor, method).remote(*args), timeout=SERVICE_CALL_TIMEOUT)
        except (RayActorError, TimeoutError) as e:
            if self._recovery is None or self._recovery.done():
                self._recovery = asyncio.ensure_future(self._until_alive())
            await asyncio.shield(self._recovery)
            raise InfrastructureLost(f"the node's services were lost: {type(e).__name__}") from None

    async def _until_alive(self) -> None:
        deadline = time.monotonic() + SERVICE_CALL_TIMEOUT
        while time.monotonic() < deadline:
            try:
                await call(self.actor.ping.remote(), timeout=5.0)
                return
            except (RayActorError, TimeoutError):
                # Restarting under the same handle, or gone for good (a new one by its name).
                self.actor = node_service_actor(self.node_id)
                await asyncio.sleep(0.1)


class RayInterception(Interception):
    """Serves sessions through the node's services actor; pulls their turns after each segment.

    Each batch of registrations carries ``policy``'s state (default: the process's) under
    ``owner``, so the sessions obey the policy of the rollouts they serve.
    """

    def __init__(self, services: NodeServicesRef, owner: str | None = None,
                 policy: PolicyControl | None = None) -> None:
        self._services = services
        self._owner = owner
        self._secrets: dict[int, str] = {}
        self._shipper = Shipper()
        control = policy or process_policy()
        # Rollouts of one host start and end in bursts: their calls travel in batches.
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], Slot] = Coalescer(
            lambda items: services.call("register_many", items,
                                        None if owner is None else (owner, *control.state())))
        self._unregister: Coalescer[tuple[str, Cursor], SessionDelta] = Coalescer(
            lambda items: services.call("unregister_many", items))

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
            apply_delta(session, change)

    def client(self, slot: Slot) -> ChatClient | None:
        return None

    async def prepare_users(self, session: RolloutSession, request: Request) -> Request:
        rewritten: Request = await self._services.call("prepare_users", self._secrets[id(session)], request)
        await self.sync(session)
        return rewritten

    async def sync(self, session: RolloutSession) -> None:
        secret = self._secrets.get(id(session))
        if secret is not None:
            apply_delta(session, await self._services.call("sync", secret, Cursor.of(session.trace)))


class RayToolServer:
    """Serves toolsets through the node's services actor, which records every call on the
    node's copy of the rollout's trace (it comes back with the session's delta)."""

    def __init__(self, services: NodeServicesRef, owner: str | None = None) -> None:
        self._owner = owner
        self._shipper = Shipper()
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], tuple[str, dict[str, str]]] = Coalescer(
            lambda items: services.call("register_tools_many", items))
        self._unregister: Coalescer[str, None] = Coalescer(
            lambda keys: services.call("unregister_tools_many", keys))

    @asynccontextmanager
    async def serve(self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str, *,
                    on_call: Any = None) -> AsyncIterator[dict[str, str]]:
        # on_call is not needed: the calls are recorded on the node's copy of the trace.
        # The runtime handle travels only when a tool needs it: shipping it costs a pickle and
        # makes the runtime's teardown reach its actor even if nothing ever ran in it.
        needed = runtime if any(t.wants_runtime() for t in toolsets) else None
        key, urls = await deliver(
            self._shipper, (list(toolsets), needed, state_secret, self._owner),
            lambda blob, bodies: self._register((blob, bodies)),
        )
        try:
            yield urls
        finally:
            await self._unregister(key)


def _service_names() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and a["name"].startswith(SERVICES_PREFIX)]


async def shutdown_node_services(grace: float = SHUTDOWN_GRACE) -> list[str]:
    """End every node's services actor: gracefully, then ``ray.kill``; returns their names."""
    names = _service_names()
    for name in names:
        await stop_actor(ray.get_actor(name, namespace=NAMESPACE), grace)
    return names
