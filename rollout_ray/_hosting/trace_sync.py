"""Trace sync: one owner for the Trace, and what crosses when its session is served elsewhere.

The rollout owns its Trace. When its model boundary (the session) and its tools are served
in the same process, as by ``LocalInterception`` or an ``HTTPInterception`` of the rollout's
own event loop, both sides hold the *same* Trace object and nothing here is needed. When
they are served by another process (a node's services actor on Ray, for a program running
in a runtime), that process holds a *copy* of the trace for the length of the registration,
built from a ``SessionSpec``; it commits turns and runs the task's ``@stop`` / ``@intercept``
hooks on the copy, and its tool server records calls on it. What the copy added comes back
as a ``SessionDelta`` since a ``Cursor``, and ``apply_delta`` folds it into the owner's Trace.

Which side owns each field while a registration is live, and when it crosses:

=========================  ===============  ===============================================
field                      owner            crossing
=========================  ===============  ===============================================
nodes, calls               serving side     back, appended since the cursor
request_rewrites           serving side     back, appended (``prepare_users`` runs there)
response_rewrites          serving side     back, appended
tool_calls                 serving side     back, appended (the node's tool server records
                                            each call on the session's copy, so a trace
                                            ``@stop`` sees it before the next model call)
tools                      serving side     back, the whole list (replaced)
state                      serving side     back, the whole object (replaced: ``/state``
                                            writes and stateful tools replace it whole,
                                            last write wins, as upstream)
stop_condition,            serving side     back; folded in with ``Trace.stop``, so the
is_completed                                first stop wins on both sides
session error (stashed)    serving side     back, as the error itself (B30, B31)
prepared user turns        serving side     out at registration
id, task, agent, version   rollout          out at registration (never change after)
rewards, metrics, info     rollout          out at registration (setup may write them);
                                            scoring runs on the owner after close
ok, errors, timing         rollout          never (the rollout records failures itself)
extra_usage, verifiers     rollout          never (judges run in scoring, on the owner;
                                            the build is the owner's)
user_turns                 rollout          never (the simulated user speaks between
                                            segments, in the rollout's process)
=========================  ===============  ===============================================

When: out once, at registration (after setup, so the copy sees what setup wrote); back after
every segment of ``Rollout.step`` (``Interception.sync``), whenever a harness asks
(``HarnessContext.sync``), and a last time with the unregistration at close, after the
tools were unregistered (so every tool call is in it).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic import BaseModel

from .._core.hooks import Hook
from .._core.limits import RolloutLimits
from .._core.model import Model
from .._core.session import RolloutSession
from .._record.messages import Tool
from .._record.trace import InterceptRecord, MessageNode, ModelCall, ToolCallRecord, Trace, decode_trace


class Cursor(msgspec.Struct, frozen=True):
    """How much of each growing part of the trace the owner already has."""

    nodes: int = 0
    calls: int = 0
    request_rewrites: int = 0
    response_rewrites: int = 0
    tool_calls: int = 0

    @classmethod
    def of(cls, trace: Trace) -> Cursor:
        return cls(
            len(trace.nodes),
            len(trace.calls),
            len(trace.request_rewrites),
            len(trace.response_rewrites),
            len(trace.tool_calls),
        )


class SessionDelta(msgspec.Struct):
    """What the serving side's copy added since a cursor, its stop, and its stashed error."""

    nodes: list[MessageNode]
    calls: list[ModelCall]
    request_rewrites: list[InterceptRecord]
    response_rewrites: list[InterceptRecord]
    tool_calls: list[ToolCallRecord]
    tools: list[Tool]
    stop_condition: str | None
    is_completed: bool
    error: bytes | None = None
    """The stashed error, pickled (its type is the rollout's, not the wire's)."""
    state: dict[str, Any] | None = None
    """The copy's ``trace.state`` (``None`` from a sender that predates it: keep the owner's)."""


@dataclass
class SessionSpec:
    """Everything needed to serve a rollout's session in another process."""

    trace: bytes
    model: Model
    limits: RolloutLimits
    hooks: dict[str, list[Hook]] = field(default_factory=dict)
    model_name: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    prepared: set[bytes] = field(default_factory=set)
    state_type: type[BaseModel] | None = None
    """The task's state model, which the serving side's ``/state`` validates writes into."""
    owner: str | None = None
    """Who registered it (a rollout actor), so a dead owner's sessions can be dropped."""

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
            state_type=session.state_type,
        )

    def session(self, model: Model) -> RolloutSession:
        """The serving side's session over a copy of the trace, calling ``model``."""
        hooks = self.hooks
        session = RolloutSession(
            decode_trace(self.trace),
            model,
            limits=self.limits,
            model_name=self.model_name,
            sampling=self.sampling,
            trace_stops=hooks.get("trace_stops", ()),
            request_stops=hooks.get("request_stops", ()),
            response_stops=hooks.get("response_stops", ()),
            request_interceptors=hooks.get("request_interceptors", ()),
            response_interceptors=hooks.get("response_interceptors", ()),
            state_type=self.state_type,
        )
        session.prepared = set(self.prepared)
        return session


def delta(session: RolloutSession, since: Cursor) -> SessionDelta:
    """What the serving side's ``session`` holds beyond ``since``."""
    trace = session.trace
    return SessionDelta(
        nodes=trace.nodes[since.nodes :],
        calls=trace.calls[since.calls :],
        request_rewrites=trace.request_rewrites[since.request_rewrites :],
        response_rewrites=trace.response_rewrites[since.response_rewrites :],
        tool_calls=trace.tool_calls[since.tool_calls :],
        tools=trace.tools,
        stop_condition=trace.stop_condition,
        is_completed=trace.is_completed,
        error=pickle.dumps(session.error) if session.error is not None else None,
        state=trace.state,
    )


def apply_delta(session: RolloutSession, change: SessionDelta) -> None:
    """Fold what the serving side added into the owner's session and trace."""
    trace = session.trace
    for node in change.nodes:
        session.graph.append(node)
    trace.calls.extend(change.calls)
    trace.request_rewrites.extend(change.request_rewrites)
    trace.response_rewrites.extend(change.response_rewrites)
    trace.tool_calls.extend(change.tool_calls)
    trace.tools = list(change.tools)
    if change.state is not None:
        trace.state = dict(change.state)
    if change.stop_condition is not None:
        trace.stop(change.stop_condition)
    trace.is_completed = trace.is_completed or change.is_completed
    session.error = pickle.loads(change.error) if change.error is not None else None  # noqa: S301 - the error our own rollout actor pickled, over Ray's trusted channel
