"""The proxy's side channels beside the model routes: ``/state`` (§5.4) and the ``/tool``
gate (§5.3). The proxy finds the session by its secret, bounds and reads the body
(``proxy._channel``); each answer here takes the session and the body and gives the JSON
answer, or raises ``ChannelError`` with its status."""

from __future__ import annotations

from typing import Any

import msgspec

from .._core.session import RolloutSession
from .._core.state import StateRejected, validated_state
from .._core.tool_gate import decide_tool
from .._errors import RolloutError


class ChannelError(Exception):
    """A refused channel request: ``status``, the message, and its error ``kind``."""

    def __init__(self, status: int, message: str, kind: str = "rollout_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class _GateCall(msgspec.Struct):
    tool_call_id: str = ""
    name: str | None = None
    arguments: Any = None


_GATE = msgspec.json.Decoder(_GateCall)


async def get_state(session: RolloutSession, body: bytes) -> bytes:
    """``GET /state`` (state secret): ``trace.state`` as JSON."""
    return msgspec.json.encode(session.trace.state)


async def put_state(session: RolloutSession, body: bytes) -> bytes:
    """``PUT /state`` (state secret): replace ``trace.state`` with ``body``, validated into the
    task's ``state_type``; last write wins, as upstream."""
    try:
        state = validated_state(body, session.state_type)
    except StateRejected as e:
        raise ChannelError(400, str(e), "invalid_request_error") from None
    if session.released:  # a straggler write must not land on a sealed trace
        raise ChannelError(409, "rollout concluded")
    session.trace.state = state
    return b'{"ok":true}'


async def gate(session: RolloutSession, body: bytes) -> bytes:
    """``POST /tool`` (model secret): the gate's verdict on ``{"tool_call_id", "name",
    "arguments"}`` (``_core/tool_gate``). A hook's failure, or a call that matches no turn,
    is the rollout's error (stashed) and a 400."""
    if session.released:
        raise ChannelError(409, "rollout concluded")
    try:
        call = _GATE.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as e:
        raise ChannelError(400, f"invalid tool gate body (send tool_call_id, name, arguments): {e}") from None
    try:
        return msgspec.json.encode(await decide_tool(session, call.tool_call_id, call.name, call.arguments))
    except RolloutError as e:
        session.error = e
        raise ChannelError(400, str(e), type(e).__name__) from None
