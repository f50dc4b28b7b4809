"""The actor's side of a node's services: one actor per node running ``NodeServices``.

One actor per node (named, get-if-exists, detached, pinned by node affinity, restarted by
Ray if its process dies) runs ``NodeServices``: every rollout actor of the node registers
its rollouts' sessions and toolsets there (``node_services_client`` is their side), and
their programs talk to it over loopback. Registrations arrive as shipments (each class and
model once) in batches.

It heals: it reaps what an owner whose lease ran out left behind (``NodeServices.reap``),
and Ray restarts it if its process dies.

Policy (``_core/policy_gate``): the rollouts of different rollout actors on a node may belong to
different drivers, so the node's services keep one ``PolicyGate`` per owner, set by each
rollout actor under its owner id and carried by each batch of registrations, so services
that were replaced learn it again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core.interception import Slot
from .._core.policy_gate import PolicyGate, process_gate
from .._hosting.gc_tuning import tune_for_rollouts
from .._hosting.node_services import NodeServices, lost_session
from .._hosting.trace_sync import Cursor, SessionDelta, SessionSpec
from . import shared_cluster  # noqa: F401 - makes scope="cluster" shared servers work here
from .calls import NAMESPACE, SHUTDOWN_GRACE, stop_actor
from .wire import ShipmentUnpacker

SERVICES_PREFIX = "node-services:"

SERVICE_HOST_VARIABLE = "ROLLOUT_RAY_SERVICE_HOST"
"""Where the node services bind (default 127.0.0.1: runtimes on the same node only). Set it
in the environment of every node's ``ray start`` (e.g. to ``0.0.0.0``) when runtimes on other
machines must reach a node's proxy and tools; a wildcard advertises the node's IP."""


def _service_hosts() -> dict[str, str]:
    host = os.environ.get(SERVICE_HOST_VARIABLE, "127.0.0.1")
    advertise = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host  # noqa: S104 - compares the bind host, binds nothing
    return {"host": host, "advertise_host": advertise}


class _NodeServiceActor(NodeServices):
    """``NodeServices`` taking its registrations as batches of shipments (``shipment``), and
    reaping expired leases in the background."""

    def __init__(self) -> None:
        hosts = _service_hosts()
        super().__init__(host=hosts["host"], advertise_host=hosts["advertise_host"])
        self._unpacker = ShipmentUnpacker()
        self._reaper: asyncio.Task[None] | None = None
        self._policies: dict[str, PolicyGate] = {}
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

    def _policy(self, owner: str | None) -> PolicyGate:
        if owner is None:
            return process_gate()
        gate = self._policies.get(owner)
        if gate is None:
            gate = self._policies[owner] = PolicyGate()
        return gate

    async def set_policy(self, owner: str | None, version: int | None, paused: bool, interrupt: bool = False) -> None:
        """The policy of ``owner``'s sessions (``Executor.set_policy``, through its actor);
        ``interrupt``: returns once their interrupted calls stopped.

        It renews ``owner``'s lease: an owner that dies before it registers anything leaves
        no policy behind for good (a live one's next registration brings it back)."""
        self.renew(owner)
        gate = self._policy(owner)
        gate.set(version, paused, interrupt)
        if paused and interrupt:
            await gate.until_stopped()

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
        gate = self._policies.pop(owner, None)
        if gate is not None:
            gate.set(gate.version, False)  # calls held for a dead owner end (sealed: 409)
        return dropped

    # -- batches ----------------------------------------------------------------------------

    async def register_many(
        self, items: list[tuple[bytes, dict[str, bytes]]], policy: tuple[str, int | None, bool] | None = None
    ) -> list[Slot | Exception]:
        """Register each shipped ``SessionSpec``; an item that fails answers its exception.

        ``policy`` is the registering owner's ``(owner, version, paused)``, applied first.
        """
        if policy is not None:
            await self.set_policy(*policy)
        return [await _outcome(self._register_shipped(blob, bodies)) for blob, bodies in items]

    async def _register_shipped(self, blob: bytes, bodies: dict[str, bytes]) -> Slot:
        # Unpacked inside the item's outcome: one item lacking a body (replaced services, never
        # sent it) answers MissingShipment alone, and the resends beside it still register.
        return await self.register(self._unpacker.unpack(blob, bodies))

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
        return [await _outcome(self._register_tools_shipped(blob, bodies)) for blob, bodies in items]

    async def _register_tools_shipped(self, blob: bytes, bodies: dict[str, bytes]) -> tuple[str, dict[str, str]]:
        return await self.register_tools(*self._unpacker.unpack(blob, bodies))  # as _register_shipped

    async def unregister_tools_many(self, keys: list[str]) -> list[Any]:
        return [await _outcome(self.unregister_tools(key)) for key in keys]


async def _outcome(pending: Awaitable[Any]) -> Any:
    """A batch item's result, or its exception as a value (it must not sink its neighbours)."""
    try:
        return await pending
    except Exception as e:  # noqa: BLE001 - one batch item's exception is returned as its value
        return e


NodeServiceActorClass = ray.remote(num_cpus=0, max_concurrency=10_000, max_restarts=-1)(_NodeServiceActor)  # type: ignore[call-overload]  # ray's overloads omit actor options


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


def _service_names() -> list[str]:
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and a["name"].startswith(SERVICES_PREFIX)
    ]


async def shutdown_node_services(grace: float = SHUTDOWN_GRACE) -> list[str]:
    """End every node's services actor: gracefully, then ``ray.kill``; returns their names."""
    names = _service_names()
    for name in names:
        await stop_actor(ray.get_actor(name, namespace=NAMESPACE), grace)
    return names
