"""The driver's side of a rollout actor: the ``RolloutActor`` handle.

``RolloutActor.create`` starts the actor (``rollout_actor``); ``run`` sends a spec through
the batched channel (``run_sender``) and comes back with the trace; the per-verb calls
(``open`` / ``step`` / ``close`` / ``abort``) are for callers that feed user turns. Specs
travel as shipments: the taskset's classes, the harness and the model cross once per actor.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from .._hosting.executor import RolloutSpec
from .._record.messages import Message
from .._record.trace import Trace
from .._runtimes.host import runtime_kind
from .calls import SHUTDOWN_GRACE, call, stop_actor
from .rollout_actor import RolloutActorClass
from .run_sender import RunSender
from .shipment import ShipmentPacker, deliver
from .trace_wire import trace_from_wire


def _shared(spec: RolloutSpec) -> tuple[Any, ...]:
    """What a spec shares with its neighbours, shipped once per actor: the harness, the model
    and the (frozen) budgets, one object each for a whole run (56 -> 43 us to pack a spec)."""
    return (spec.harness, spec.model, spec.limits, spec.timeouts)




class RolloutActor:
    """Handle to a long-lived actor hosting up to ``capacity`` concurrent rollouts.

    Create with ``RolloutActor.create(capacity=K)``; end with ``await actor.aclose()``.
    Specs travel as shipments: the taskset's classes, the harness and the model are sent to
    the actor once, not with every rollout. ``owner`` is the id under which the actor's
    registrations are held by its node's services.
    """

    def __init__(self, actor: Any, owner: str) -> None:
        self.actor = actor
        self.owner = owner
        self._packer = ShipmentPacker()
        self._runs = RunSender(actor, _shared)

    async def _ship(self, method: Any, spec: RolloutSpec) -> Any:
        return await deliver(self._packer, spec, lambda blob, bodies: call(method.remote(blob, bodies)),
                             shared=_shared(spec))

    @classmethod
    def create(cls, *, capacity: int = 1, runtime: str = "auto", policy: tuple[int | None, bool] | None = None,
               **options: Any) -> RolloutActor:
        """Start the actor. ``runtime`` is the kind of the runtimes its rollouts own
        (``"auto"``, ``"local"`` or ``"sandbox"``); ``policy`` is the ``(version, paused)`` it
        starts with; ``options`` go to ``.options()`` (e.g. a scheduling strategy)."""
        runtime_kind(runtime)  # an unknown kind fails here, not in the actor
        owner = uuid.uuid4().hex
        return cls(RolloutActorClass.options(**options).remote(capacity, runtime, owner, policy), owner)

    async def set_policy(self, version: int | None, paused: bool, timeout: float | None = None) -> None:
        """``_RolloutActor.set_policy``, bounded by ``timeout`` seconds."""
        await call(self.actor.set_policy.remote(version, paused), timeout=timeout)

    async def policy(self) -> tuple[int | None, bool]:
        return tuple(await call(self.actor.policy.remote()))  # type: ignore[return-value]

    async def open(self, spec: RolloutSpec) -> tuple[str, bool]:
        return await self._ship(self.actor.open, spec)

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await call(self.actor.step.remote(rollout_id, messages))

    async def close(self, rollout_id: str) -> Trace:
        return trace_from_wire(await call(self.actor.close.remote(rollout_id)))

    async def abort(self, rollout_id: str) -> None:
        await call(self.actor.abort.remote(rollout_id))

    async def run(self, spec: RolloutSpec) -> Trace:
        """Open, run and close a rollout; batched with the others in flight (``run_sender``)."""
        return trace_from_wire(await self._runs.run(spec))

    @property
    def runs(self) -> RunSender:
        """The batched channel ``run`` uses (its ``submits`` / ``collects`` count calls)."""
        return self._runs

    async def trace(self, rollout_id: str) -> Trace:
        return trace_from_wire(await call(self.actor.trace.remote(rollout_id)))

    async def node_id(self) -> str:
        return await call(self.actor.node_id.remote())

    async def aclose(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Abort open rollouts and stop the actor; ``ray.kill`` it after ``grace`` seconds."""
        await stop_actor(self.actor, grace)
