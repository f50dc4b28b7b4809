"""A rollout actor's side of its node's services: the handle, and the interception and tool
server that serve its rollouts' sessions and toolsets there.

``NodeServicesRef`` is a rollout actor's handle on the services actor of its node
(``node_service_actor``); every call is bounded, and one to services that died or hang
raises ``InfrastructureLost`` (the rollouts it broke are retried, not recorded as failures
of their task) at once, while the next waits for their replacement. ``RayInterception`` and
``RayToolServer`` register through it: registrations travel as shipments (each class and
model once) in coalesced batches, and what the node's copy of a trace added comes back
through ``_hosting/trace_sync``. Once it used them, the rollout actor renews its lease every
``LEASE_SECONDS / 3``, so what it left there is reaped if it dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ray.exceptions import RayActorError

from .._core.interception import ChatClient, Interception, Slot
from .._core.policy_gate import PolicyGate, process_gate
from .._core.runtime import Runtime
from .._core.session import RolloutSession
from .._core.toolset import Toolset
from .._errors import InfrastructureLost
from .._hosting.trace_sync import Cursor, SessionDelta, SessionSpec, apply_delta
from .._record.messages import Request
from .calls import call
from .coalesce import Coalescer
from .node_service_actor import node_service_actor
from .wire import ShipmentPacker, deliver

SERVICE_CALL_TIMEOUT = 30.0
"""Seconds a rollout actor waits for one call to its node's services before giving them up."""

_ABOUT_HELD_REGISTRATIONS = frozenset({"sync", "prepare_users", "unregister_many", "unregister_tools_many"})
"""Calls about a session or toolsets registered earlier: while the services recover, what
they ask about was held by the lost ones."""


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
            InfrastructureLost: they died or hung. Raised at once, so the rollouts they broke
                are retried within seconds (a replacement takes ~10 s to start on a busy
                node); the calls after it wait until the services answer again (at most
                ``SERVICE_CALL_TIMEOUT``), so that the retries land on live ones, except a
                call about a registration, which the lost services held: it raises at once.
        """
        if self._recovery is not None and not self._recovery.done():
            if method in _ABOUT_HELD_REGISTRATIONS:  # held by the lost services: nothing to wait for
                raise InfrastructureLost("the node's services were lost; their replacement is starting")
            await asyncio.shield(self._recovery)
        actor = self.actor
        try:
            return await call(getattr(actor, method).remote(*args), timeout=SERVICE_CALL_TIMEOUT)
        except (RayActorError, TimeoutError) as e:
            if self._recovery is None or self._recovery.done():
                self._recovery = asyncio.ensure_future(self._until_alive())
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

    def __init__(self, services: NodeServicesRef, owner: str | None = None, policy: PolicyGate | None = None) -> None:
        self._services = services
        self._owner = owner
        self._secrets: dict[int, str] = {}
        self._packer = ShipmentPacker()
        gate = policy or process_gate()
        # Rollouts of one host start and end in bursts: their calls travel in batches.
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], Slot] = Coalescer(
            lambda items: services.call("register_many", items, None if owner is None else (owner, *gate.state()))
        )
        self._unregister: Coalescer[tuple[str, Cursor], SessionDelta] = Coalescer(
            lambda items: services.call("unregister_many", items)
        )

    @asynccontextmanager
    async def serve(self, session: RolloutSession) -> AsyncIterator[Slot]:
        slot: Slot = await deliver(
            self._packer,
            SessionSpec.of(session, self._owner),
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
        self._packer = ShipmentPacker()
        self._register: Coalescer[tuple[bytes, dict[str, bytes]], tuple[str, dict[str, str]]] = Coalescer(
            lambda items: services.call("register_tools_many", items)
        )
        self._unregister: Coalescer[str, None] = Coalescer(lambda keys: services.call("unregister_tools_many", keys))

    @asynccontextmanager
    async def serve(
        self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str, *, on_call: Any = None
    ) -> AsyncIterator[dict[str, str]]:
        # on_call is not needed: the calls are recorded on the node's copy of the trace.
        # The runtime handle travels only when a tool needs it: shipping it costs a pickle and
        # makes the runtime's teardown reach its actor even if nothing ever ran in it.
        needed = runtime if any(t.wants_runtime() for t in toolsets) else None
        key, urls = await deliver(
            self._packer,
            (list(toolsets), needed, state_secret, self._owner),
            lambda blob, bodies: self._register((blob, bodies)),
        )
        try:
            yield urls
        finally:
            await self._unregister(key)
