"""A turn's hooks: the request and response ``@intercept``s and ``@stop``s (B15, B25, B37).

The session (``session.py``) runs them around the model call of every turn: request
interceptors rewrite the new user and tool messages (each message once: a user turn rewritten
at open by ``prepare_users`` is not rewritten again), request stops may refuse the turn before
it goes upstream; response interceptors may replace the assistant's text with an inert one,
response stops end the rollout after the turn is committed. A hook gets a copy of the request
or response, so its side effects on it are not seen; what it returns is checked, and a bad
return or a failure is a ``TaskError`` naming the side.

A mixin of ``RolloutSession``: the hooks and the set of prepared messages stay the session's
attributes (``_hosting/trace_sync.py`` ships them with a session served elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .._errors import RolloutError, TaskError
from .._record.graph import ConversationGraph
from .._record.messages import (
    AssistantMessage,
    Message,
    Request,
    Response,
    ToolMessage,
    UserMessage,
    message_hash,
)
from .._record.trace import InterceptRecord, Trace
from .hooks import Hook, call_by_type, resolve

_CODEC_ENCODER = msgspec.msgpack.Encoder()
_REQUEST_DECODER = msgspec.msgpack.Decoder(Request)
_RESPONSE_DECODER = msgspec.msgpack.Decoder(Response)


def _copy_request(request: Request) -> Request:
    return _REQUEST_DECODER.decode(_CODEC_ENCODER.encode(request))


def _copy_response(response: Response) -> Response:
    return _RESPONSE_DECODER.decode(_CODEC_ENCODER.encode(response))


class TurnHooks:
    """The request and response hooks of a session's turns (mixed into ``RolloutSession``)."""

    trace: Trace
    graph: ConversationGraph
    request_stops: list[Hook]
    response_stops: list[Hook]
    request_interceptors: list[Hook]
    response_interceptors: list[Hook]
    prepared: set[bytes]

    # -- request side -----------------------------------------------------------------------

    async def prepare_users(self, request: Request) -> Request:
        """Rewrite a caller's new user turns with the request interceptors only (no stops).

        The rewritten messages are remembered, so that when the harness later sends them to
        the model they are not intercepted a second time (B15, B25, B37).
        """
        request, records = await self._intercept(request)
        self.trace.request_rewrites.extend(records)
        _, matched = self.graph.resolve(request.messages)
        for message in request.messages[matched:]:
            if isinstance(message, UserMessage):
                self.prepared.add(message_hash(message))
        return request

    async def rewrite_request(self, request: Request) -> tuple[Request, str | None]:
        """Run request interceptors, then request stops; returns the request and a stop name."""
        request, records = await self._intercept(request)
        self.trace.request_rewrites.extend(records)
        for hook in self.request_stops:
            fired = await self._run_request_hook(
                hook,
                lambda: call_by_type(hook.fn, {Request: _copy_request(request), Trace: self.trace}),  # noqa: B023 - awaited in this iteration
            )
            if not isinstance(fired, bool):
                raise TaskError(
                    f"request interception failed: TypeError: @stop must return bool, got {type(fired).__name__}"
                )
            if fired:
                return request, hook.name
        return request, None

    async def _intercept(self, request: Request) -> tuple[Request, list[InterceptRecord]]:
        records: list[InterceptRecord] = []
        if not self.request_interceptors:
            return request, records
        _, matched = self.graph.resolve(request.messages)
        if not any(self._rewritable(m) for m in request.messages[matched:]):
            # Nothing new to rewrite (e.g. prompt turns already rewritten at open): the
            # interceptors are not applied a second time.
            return request, records
        for hook in self.request_interceptors:
            current = request
            result = await self._run_request_hook(
                hook,
                lambda: call_by_type(hook.fn, {Request: _copy_request(current), Trace: self.trace}),  # noqa: B023 - awaited in this iteration
            )
            if result is None:
                continue
            try:
                self._validate_request(request, result, matched)
            except (TypeError, ValueError) as e:
                raise TaskError(f"request interception failed: {type(e).__name__}: {e}") from e
            if result != request:
                request = result
                records.append(InterceptRecord(hook.name))
        return request, records

    @staticmethod
    async def _run_request_hook(hook: Hook, call: Any) -> Any:
        try:
            return await resolve(call())
        except RolloutError:
            raise
        except Exception as e:
            raise TaskError(f"request interception failed: {type(e).__name__}: {e}") from e

    def _validate_request(self, before: Request, after: object, matched: int) -> None:
        if not isinstance(after, Request):
            raise TypeError(f"interceptor must return a Request or None, got {type(after).__name__}")
        if len(after.messages) != len(before.messages):
            raise ValueError("cannot add or remove messages")
        if after.tools != before.tools:
            raise ValueError("cannot rewrite tools")
        for i, (old, new) in enumerate(zip(before.messages, after.messages, strict=True)):
            if old == new:
                continue
            if i < matched or not self._rewritable(old):
                raise ValueError("can only rewrite new user or tool messages")
            if type(new) is not type(old):
                raise TypeError("cannot change a message's type")
            if isinstance(old, ToolMessage) and new.tool_call_id != old.tool_call_id:  # type: ignore[union-attr]
                raise ValueError("cannot change a tool message's tool_call_id")

    def _rewritable(self, message: Message) -> bool:
        """A user or tool message not already rewritten by ``prepare_users``."""
        return isinstance(message, UserMessage | ToolMessage) and message_hash(message) not in self.prepared

    def _consume_prepared(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.prepared.discard(message_hash(message))

    # -- response side ----------------------------------------------------------------------

    async def _rewrite_response(self, response: Response) -> tuple[Response, list[InterceptRecord], str | None]:
        records: list[InterceptRecord] = []
        for hook in self.response_interceptors:
            current = response
            result = await self._run_response_hook(
                hook,
                lambda: call_by_type(hook.fn, {Response: _copy_response(current), Trace: self.trace}),  # noqa: B023 - awaited in this iteration
            )
            if result is None or result == response:
                continue
            try:
                _validate_response(response, result)
            except (TypeError, ValueError) as e:
                raise TaskError(f"response interception failed: {type(e).__name__}: {e}") from e
            response = msgspec.structs.replace(result, finish_reason="stop")
            records.append(InterceptRecord(hook.name))
        for hook in self.response_stops:
            fired = await self._run_response_hook(
                hook,
                lambda: call_by_type(hook.fn, {Response: _copy_response(response), Trace: self.trace}),  # noqa: B023 - awaited in this iteration
            )
            if not isinstance(fired, bool):
                raise TaskError(
                    f"response interception failed: TypeError: @stop must return bool, got {type(fired).__name__}"
                )
            if fired:
                return response, records, hook.name
        return response, records, None

    @staticmethod
    async def _run_response_hook(hook: Hook, call: Any) -> Any:
        try:
            return await resolve(call())
        except RolloutError:
            raise
        except Exception as e:
            raise TaskError(f"response interception failed: {type(e).__name__}: {e}") from e


def _validate_response(before: Response, after: object) -> None:
    if not isinstance(after, Response):
        raise TypeError(f"interceptor must return a Response or None, got {type(after).__name__}")
    if msgspec.structs.replace(after, message=before.message, finish_reason=before.finish_reason) != before:
        raise ValueError("can only replace the assistant message")
    message = after.message
    if not isinstance(message, AssistantMessage) or (message.reasoning_content is not None or message.tool_calls):
        raise ValueError("must return an inert text-only message")
