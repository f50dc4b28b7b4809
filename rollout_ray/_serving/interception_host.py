"""InterceptionHost: serves rollout sessions whose rollouts run in other processes.

What an ``InterceptionActor`` runs (one per node). A rollout in a ``RolloutActor`` registers
its session here — a snapshot of its trace, its hooks, limits and model — and its harness
talks to this host's HTTP proxy. The session here is the live one: it commits turns and runs
the task's ``@stop`` / ``@intercept`` hooks. After each segment the rollout pulls a
``SessionDelta`` (what was committed since its last pull), so its own trace reflects every
turn (``apply_delta``). Models are pooled by configuration: rollouts of one model share one
keep-alive connection pool.
"""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .._errors import Unauthorized
from .._core.hooks import Hook
from .._core.interception import Slot
from .._core.limits import RolloutLimits
from .._record.messages import Request, Tool
from .._core.model import Model
from .proxy import HTTPInterception
from .._core.session import RolloutSession
from .._record.trace import InterceptRecord, MessageNode, ModelCall, Trace, decode_trace


class Cursor(msgspec.Struct, frozen=True):
    """How much of each growing part of the trace the caller already has."""

    nodes: int = 0
    calls: int = 0
    request_rewrites: int = 0
    response_rewrites: int = 0

    @classmethod
    def of(cls, trace: Trace) -> Cursor:
        return cls(len(trace.nodes), len(trace.calls), len(trace.request_rewrites), len(trace.response_rewrites))


class SessionDelta(msgspec.Struct):
    """What the live session committed since a cursor, and its stop and stashed error."""

    nodes: list[MessageNode]
    calls: list[ModelCall]
    request_rewrites: list[InterceptRecord]
    response_rewrites: list[InterceptRecord]
    tools: list[Tool]
    stop_condition: str | None
    is_completed: bool
    error: bytes | None = None
    """The stashed error, pickled (its type is the rollout's, not the wire's)."""


@dataclass
class SessionSpec:
    """Everything needed to rebuild a rollout's session in the interception's process."""

    trace: bytes
    model: Model
    limits: RolloutLimits
    hooks: dict[str, list[Hook]] = field(default_factory=dict)
    model_name: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    prepared: set[bytes] = field(default_factory=set)
    owner: str | None = None
    """Who registered it (a rollout actor's id), so a dead owner's sessions can be dropped."""

    @classmethod
    def of(cls, session: RolloutSession, owner: str | None = None) -> SessionSpec:
        return cls(
            owner=owner,
            trace=msgspec.msgpack.encode(session.trace),
            model=session.model,
            limits=session.limits,
            hooks={
                "trace_stops": session.trace_stops,
                "request_stops": session.request_stops,
                "response_stops": session.response_stops,
                "request_interceptors": session.request_interceptors,
                "response_interceptors": session.response_interceptors,
            },
            model_name=session.model_name,
            sampling=session.sampling,
            prepared=set(session.prepared),
        )


def delta(session: RolloutSession, since: Cursor) -> SessionDelta:
    trace = session.trace
    return SessionDelta(
        nodes=trace.nodes[since.nodes :],
        calls=trace.calls[since.calls :],
        request_rewrites=trace.request_rewrites[since.request_rewrites :],
        response_rewrites=trace.response_rewrites[since.response_rewrites :],
        tools=trace.tools,
        stop_condition=trace.stop_condition,
        is_completed=trace.is_completed,
        error=pickle.dumps(session.error) if session.error is not None else None,
    )


def apply_delta(session: RolloutSession, change: SessionDelta) -> None:
    """Bring the caller's copy of a session up to date with the live one."""
    trace = session.trace
    for node in change.nodes:
        session.graph.append(node)
    trace.calls.extend(change.calls)
    trace.request_rewrites.extend(change.request_rewrites)
    trace.response_rewrites.extend(change.response_rewrites)
    trace.tools = list(change.tools)
    if change.stop_condition is not None:
        trace.stop(change.stop_condition)
    trace.is_completed = trace.is_completed or change.is_completed
    session.error = pickle.loads(change.error) if change.error is not None else None


class InterceptionHost:
    """One HTTP proxy and a model pool, serving the sessions of many remote rollouts.

    Args:
        host / advertise_host / max_body: as for ``HTTPInterception``.
    """

    def __init__(self, *, host: str = "127.0.0.1", advertise_host: str | None = None,
                 max_body: int | None = None) -> None:
        kwargs: dict[str, Any] = {"host": host, "advertise_host": advertise_host}
        if max_body is not None:
            kwargs["max_body"] = max_body
        self._server = HTTPInterception(**kwargs)
        self._models: dict[bytes, Model] = {}
        self._sessions: dict[str, tuple[RolloutSession, contextlib.AbstractAsyncContextManager[Slot]]] = {}
        self._owners: dict[str, str | None] = {}

    async def base_url(self) -> str:
        if not self._server.base_url:
            await self._server.start()
        return self._server.base_url

    def _pooled(self, model: Model) -> Model:
        # Same configuration, same object: its connection pool is shared.
        if not model.shareable:
            return model
        key = pickle.dumps(model)
        return self._models.setdefault(key, model)

    async def register(self, spec: SessionSpec) -> Slot:
        await self.base_url()
        session = RolloutSession(
            decode_trace(spec.trace),
            self._pooled(spec.model),
            limits=spec.limits,
            model_name=spec.model_name,
            sampling=spec.sampling,
            **spec.hooks,
        )
        session.prepared = set(spec.prepared)
        serving = self._server.serve(session)
        slot = await serving.__aenter__()
        self._sessions[slot.model_secret] = (session, serving)
        self._owners[slot.model_secret] = spec.owner
        return slot

    def _session(self, secret: str) -> RolloutSession:
        entry = self._sessions.get(secret)
        if entry is None:
            raise Unauthorized()
        return entry[0]

    async def prepare_users(self, secret: str, request: Request) -> Request:
        return await self._session(secret).prepare_users(request)

    async def sync(self, secret: str, since: Cursor) -> SessionDelta:
        return delta(self._session(secret), since)

    async def unregister(self, secret: str, since: Cursor) -> SessionDelta | None:
        """Seal the session and return what it committed since ``since``."""
        entry = self._sessions.pop(secret, None)
        self._owners.pop(secret, None)
        if entry is None:
            return None
        session, serving = entry
        await serving.__aexit__(None, None, None)
        return delta(session, since)

    async def drop_owner(self, owner: str) -> int:
        """Seal and forget every session ``owner`` registered (it died); returns how many."""
        secrets = [k for k, o in self._owners.items() if o == owner]
        for secret in secrets:
            await self.unregister(secret, Cursor())
        return len(secrets)

    def load(self, owner: str | None = None) -> int:
        """Sessions served: all of them, or those ``owner`` registered."""
        if owner is None:
            return len(self._sessions)
        return sum(1 for o in self._owners.values() if o == owner)

    async def shutdown(self) -> None:
        for secret in list(self._sessions):
            await self.unregister(secret, Cursor())
        await self._server.stop()
        for model in self._models.values():
            await model.aclose()
        self._models.clear()
