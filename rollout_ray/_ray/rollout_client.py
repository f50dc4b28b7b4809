"""The driver's side of a rollout actor: the ``RolloutActor`` handle.

``RolloutActor.create`` starts the actor (``rollout_actor``); ``run`` sends a spec through
the batched channel (``RunSender``, below) and comes back with the trace (an actor that stops
answering is killed, so its rollouts fail rather than wait: ``ANSWER_TIMEOUT``); the per-verb calls
(``open`` / ``step`` / ``close`` / ``abort``) are for callers that feed user turns. Specs
travel as shipments: the taskset's classes, the harness and the model cross once per actor.

Batched runs: one actor call per rollout costs, per rollout, a ``.remote()`` and a reply on the
driver and a task receipt and a reply in the rollout actor: on Ray the largest share of a short
rollout's CPU. So ``RunSender`` keeps at most one ``submit`` in flight per actor and sends every
spec queued meanwhile with it; the actor's ``RunReceiver`` starts them and answers at once; one
long-polling ``collect`` per actor brings back every trace finished since the last one. Under
load both batches grow by themselves; an idle system sends a batch of one at once. Each spec is
pickled on its own (an unpicklable task fails its rollout only, never its batch); a driver that
stops waiting for a rollout has it cancelled in the actor; if the actor dies, every rollout it
held raises the ``RayActorError`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError

from .._hosting.spec import RolloutSpec
from .._record.messages import Message
from .._record.trace import Trace
from .._runtimes.host import runtime_kind
from .calls import SHUTDOWN_GRACE, call, stop_actor
from .rollout_actor import RolloutActorClass
from .wire import MissingShipment, ShipmentPacker, deliver, trace_from_wire

MAX_BATCH = 512
"""The most specs sent in one ``submit``."""
COLLECT_WAIT = 10.0
"""Seconds a ``collect`` waits in the actor for a finished rollout before it answers empty."""
ANSWER_TIMEOUT = 30.0
"""Seconds beyond ``COLLECT_WAIT`` an actor that answered before may take to answer a
``collect``; past them it is hung (its event loop stuck, or its process stopped): it is
killed, and every rollout it held fails with Ray's ``RayActorError``."""


class RunSender:
    """The driver's side for one rollout actor: ``await sender.run(spec)`` → trace bytes.

    Args:
        actor: the actor handle (with ``submit``, ``collect`` and ``cancel`` methods).
        shared: the objects of a spec to ship once per actor (harness, model).
    """

    def __init__(self, actor: Any, shared: Callable[[Any], Iterable[Any]]) -> None:
        self._actor = actor
        self._shared = shared
        self._packer = ShipmentPacker()
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._outbox: list[tuple[int, Any]] = []
        self._awaiting: set[int] = set()
        """Accepted by the actor, not yet collected: what keeps the collector polling."""
        self._sender: asyncio.Task[None] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._dead: RayActorError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancels: set[asyncio.Task[None]] = set()
        self.answered = False
        """The actor answered a call of this channel: it was placed and started."""
        self.collect_wait, self.answer_timeout = COLLECT_WAIT, ANSWER_TIMEOUT
        """The watchdog on the actor (``COLLECT_WAIT``, ``ANSWER_TIMEOUT``): a caller without
        ``RayExecutor``'s probe has one too."""
        self.submits = 0
        self.collects = 0

    async def run(self, spec: Any) -> bytes:
        if self._dead is not None:
            raise self._dead
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a handle used from a new event loop (asyncio.run again)
            self._loop, self._sender, self._collector = loop, None, None
            self._pending.clear()
            self._outbox.clear()
            self._awaiting.clear()
        sid = next(self._ids)
        future: asyncio.Future[bytes] = loop.create_future()
        self._pending[sid] = future
        self._outbox.append((sid, spec))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(sid, None) is not None and sid in self._awaiting:
                cancelling = asyncio.create_task(self._cancel([sid]))
                self._cancels.add(cancelling)  # the loop holds tasks weakly
                cancelling.add_done_callback(self._cancels.discard)
            raise

    async def _send(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox[:MAX_BATCH], self._outbox[MAX_BATCH:]
            items, keys = self._pack([(sid, spec) for sid, spec in batch if sid in self._pending])
            if not items:
                continue
            try:
                failed = await self._submit(items, self._packer.bodies(keys))
                missing = [sid for sid, e in failed if isinstance(e, MissingShipment)]
                if missing:  # the actor lacks a body (a later batch overtook the first)
                    again = [item for item in items if item[0] in set(missing)]
                    failed = [f for f in failed if not isinstance(f[1], MissingShipment)]
                    failed += await self._submit(again, self._packer.bodies(keys, resend=True))
            except RayActorError as e:
                self._die(e)
                return
            except Exception as e:  # noqa: BLE001 - the batch's rollouts fail with it, not the sender
                for sid, _ in items:
                    self._fail(sid, e)
                continue
            for sid, error in failed:
                self._awaiting.discard(sid)
                self._fail(sid, error)

    def _pack(self, batch: list[tuple[int, Any]]) -> tuple[list[tuple[int, bytes]], set[str]]:
        items: list[tuple[int, bytes]] = []
        keys: set[str] = set()
        for sid, spec in batch:
            try:
                blob, spec_keys = self._packer.pack(spec, self._shared(spec))
            except Exception as e:  # noqa: BLE001 - e.g. a task that cannot be pickled
                self._fail(sid, e)
                continue
            items.append((sid, blob))
            keys |= spec_keys
        return items, keys

    async def _submit(self, items: list[tuple[int, bytes]], bodies: dict[str, bytes]) -> list[tuple[int, Exception]]:
        self.submits += 1
        # Awaited before the call leaves: a result may come back before the call's reply.
        self._awaiting.update(sid for sid, _ in items)
        if self._collector is None or self._collector.done():
            self._collector = asyncio.create_task(self._collect())
        failed = await call(self._actor.submit.remote(items, bodies))
        self.answered = True
        return failed  # type: ignore[no-any-return]

    async def _collect(self) -> None:
        while self._awaiting:
            try:
                results = await self._collect_once()
            except TimeoutError:
                # Hung: killed, and its rollouts fail now, not when Ray reports the death (a
                # stopped process's death took over 120 s to be reported on a loaded machine).
                ray.kill(self._actor, no_restart=True)
                self._die(
                    RayActorError(
                        error_msg=f"rollout actor hung: no answer to collect within "
                        f"{self.collect_wait + self.answer_timeout:g}s; killed"
                    )
                )
                return
            except RayActorError as e:
                self._die(e)
                return
            self.collects += 1
            for sid, result in results:
                self._awaiting.discard(sid)
                future = self._pending.pop(sid, None)
                if future is None or future.done():
                    continue  # cancelled here meanwhile
                if isinstance(result, BaseException):
                    future.set_exception(result)
                elif result is None:
                    future.set_exception(RuntimeError("rollout cancelled in the actor"))
                else:
                    future.set_result(result)

    async def _collect_once(self) -> list[Any]:
        """One ``collect``, bounded once the actor has answered a call: before, it may still
        be waiting to be placed, which is not hanging.

        Raises:
            TimeoutError: the actor answered before, and not this within its bound.
        """
        pending = asyncio.ensure_future(call(self._actor.collect.remote(self.collect_wait)))
        try:
            while not self.answered:
                if (await asyncio.wait({pending}, timeout=self.collect_wait))[0]:
                    return pending.result()  # type: ignore[no-any-return]
            return await asyncio.wait_for(pending, self.collect_wait + self.answer_timeout)
        finally:
            pending.cancel()

    async def _cancel(self, sids: list[int]) -> None:
        with contextlib.suppress(Exception):  # a dead actor has nothing left to cancel
            await call(self._actor.cancel.remote(sids))

    def _fail(self, sid: int, error: BaseException) -> None:
        future = self._pending.pop(sid, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _die(self, error: RayActorError) -> None:
        self._dead = error
        self._awaiting.clear()
        self._outbox.clear()
        for sid in list(self._pending):
            self._fail(sid, error)

    async def settled(self) -> None:
        """Return once the actor has reported every rollout it accepted (cancelled ones too)."""
        while self._collector is not None and not self._collector.done():
            await asyncio.shield(self._collector)


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
        return await deliver(
            self._packer, spec, lambda blob, bodies: call(method.remote(blob, bodies)), shared=_shared(spec)
        )

    @classmethod
    def create(
        cls, *, capacity: int = 1, runtime: str = "auto", policy: tuple[int | None, bool] | None = None, **options: Any
    ) -> RolloutActor:
        """Start the actor. ``runtime`` is the kind of the runtimes its rollouts own
        (``"auto"`` or a provider's name); ``policy`` is the ``(version, paused)`` it
        starts with; ``options`` go to ``.options()`` (e.g. a scheduling strategy)."""
        runtime_kind(runtime)  # an unknown kind fails here, not in the actor
        owner = uuid.uuid4().hex
        return cls(RolloutActorClass.options(**options).remote(capacity, runtime, owner, policy), owner)

    async def set_policy(
        self, version: int | None, paused: bool, interrupt: bool = False, timeout: float | None = None
    ) -> None:
        """``_RolloutActor.set_policy``, bounded by ``timeout`` seconds."""
        await call(self.actor.set_policy.remote(version, paused, interrupt), timeout=timeout)

    async def policy(self) -> tuple[int | None, bool]:
        return tuple(await call(self.actor.policy.remote()))

    async def open(self, spec: RolloutSpec) -> tuple[str, bool]:
        return await self._ship(self.actor.open, spec)  # type: ignore[no-any-return]

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await call(self.actor.step.remote(rollout_id, messages))  # type: ignore[no-any-return]

    async def close(self, rollout_id: str) -> Trace:
        return trace_from_wire(await call(self.actor.close.remote(rollout_id)))

    async def abort(self, rollout_id: str) -> None:
        await call(self.actor.abort.remote(rollout_id))

    async def run(self, spec: RolloutSpec) -> Trace:
        """Open, run and close a rollout; batched with the others in flight (``RunSender``)."""
        return trace_from_wire(await self._runs.run(spec))

    @property
    def runs(self) -> RunSender:
        """The batched channel ``run`` uses (its ``submits`` / ``collects`` count calls)."""
        return self._runs

    async def trace(self, rollout_id: str) -> Trace:
        return trace_from_wire(await call(self.actor.trace.remote(rollout_id)))

    async def node_id(self) -> str:
        return await call(self.actor.node_id.remote())  # type: ignore[no-any-return]

    async def aclose(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Abort open rollouts and stop the actor; ``ray.kill`` it after ``grace`` seconds."""
        await stop_actor(self.actor, grace)
