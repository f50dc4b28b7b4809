"""HTTPInterception: the interception proxy (§5.1, §5.2).

One aiohttp server multiplexes many rollouts, each registered under two fresh secrets: the
*model secret* (the harness's key for ``/v1/*`` and the ``/tool`` gate) and the *state secret*
(``/task`` and ``/state``). The
pipeline itself lives in ``RolloutSession``; what depends on the format the agent speaks
(Chat Completions, Responses, Anthropic Messages: its routes, key header, request, answer,
stream, error body and ids) lives in its ``Dialect`` (``_serving/dialects``). This module
only maps HTTP onto them:

* unknown or missing secret → 401; a body over ``max_body`` → 413 (refused before it is read
  when its length is declared); more requests, or more body bytes, of one rollout in flight
  than its share → 429 before the body is read, and more body bytes in flight than the
  node's ``BodyBudget`` → 503 with ``Retry-After`` (``HTTPService.admitted``); a body not
  received within ``read_timeout`` → 408; malformed JSON or a wrong shape → 400 naming the field; a refused
  turn → 400 ``rollout stopped: <name>``; a released session → 409 ``rollout concluded``;
  provider errors → their status; a hook failure or a model client that raised something
  else → 502; our own bugs → 500.
* an SDK retry (header ``x-stainless-retry-count`` > 0) of the request just answered is
  replayed verbatim, and a retry of one still in flight (streamed or not) joins it: never
  sampled twice.
* a client that hangs up before its stream is written costs a debug line, not a traceback.
* a session unregistered (sealed) cancels its in-flight handlers and never commits late.

Streaming requests are answered as SSE synthesised from the committed turn, so the stream's
terminal event can never race ahead of the commit. Deliberate difference from upstream: the
upstream's chunks are not relayed one by one as they arrive (only the time to first byte
differs; the recorded turn is the same).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from .._core.interception import ChatClient, Interception, Slot
from .._core.session import RolloutSession
from .._errors import Refusal, RolloutError, UpstreamError, WireError
from .._record.messages import Message, Response
from . import channels
from .dialects import Dialect, Parsed, all_dialects
from .dialects.chat_completions import ChatCompletions
from .http_service import DEFAULT_READ_TIMEOUT, BodyBudget, Handlers, HTTPService, InFlight, Refused, Reservation

log = logging.getLogger("rollout_ray")

DEFAULT_MAX_BODY = 16 << 20
"""Largest request body accepted (bytes): a long chat with a few images fits."""

DEFAULT_MAX_REQUESTS_PER_ROLLOUT = 32
"""Requests of one rollout in flight at once; more are answered 429."""

DEFAULT_MAX_BODY_BYTES_PER_ROLLOUT = 32 << 20
"""Request body bytes of one rollout in flight at once (as declared, or ``max_body`` for a
body of unknown length); more are answered 429 before the body is read."""


@dataclass
class _Registration:
    session: RolloutSession
    last_hash: bytes | None = None
    last_response: Response | None = None
    inflight: dict[bytes, asyncio.Future[Response | None]] = field(default_factory=dict)
    history: dict[str, list[Message]] = field(default_factory=dict)
    """Each answer's id → the messages it answered and its reply (Responses'
    ``previous_response_id`` continues from one)."""
    handlers: Handlers = field(default_factory=Handlers)
    held: InFlight = field(default_factory=InFlight)
    """The rollout's requests being handled now, and the body bytes reserved for them."""


Answer = Callable[[RolloutSession, bytes], Awaitable[bytes]]
"""A side channel's answer to a session and a request body (``channels.py``)."""

_OPENAI = ChatCompletions()
"""The dialect of the routes every SDK shares (``/v1/models``) and of the state route."""


def _error(
    status: int,
    message: str,
    *,
    kind: str = "rollout_error",
    param: str | None = None,
    headers: dict[str, str] | None = None,
    dialect: Dialect = _OPENAI,
) -> web.Response:
    return web.Response(
        status=status,
        body=dialect.error(status, message, kind, param),
        content_type="application/json",
        headers=headers,
    )


class HTTPInterception(HTTPService, Interception):
    """The proxy server. ``await start()`` before ``serve``; ``await stop()`` at the end.

    Args: as ``HTTPService`` (``max_body`` defaults to ``DEFAULT_MAX_BODY``). Beyond
        ``max_requests_per_rollout`` or ``max_body_bytes_per_rollout`` in flight, a request is
        answered 429 before its body is read, so no rollout can grow the shared proxy's memory
        past its share; beyond ``body_budget``, 503, so no set of rollouts can.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_requests_per_rollout: int = DEFAULT_MAX_REQUESTS_PER_ROLLOUT,
        max_body_bytes_per_rollout: int = DEFAULT_MAX_BODY_BYTES_PER_ROLLOUT,
        body_budget: BodyBudget | None = None,
    ) -> None:
        super().__init__(
            host=host,
            port=port,
            advertise_host=advertise_host,
            max_body=max_body,
            read_timeout=read_timeout,
            max_requests_per_rollout=max_requests_per_rollout,
            max_body_bytes_per_rollout=max_body_bytes_per_rollout,
            body_budget=body_budget,
        )
        self.dialects = all_dialects()
        self._by_model: dict[str, _Registration] = {}
        self._by_state: dict[str, _Registration] = {}

    @property
    def load(self) -> int:
        """Number of registered sessions."""
        return len(self._by_model)

    def _routes(self, router: web.UrlDispatcher) -> None:
        for dialect in self.dialects:
            for path in dialect.paths:
                router.add_post(path, functools.partial(self._model_call, dialect))
            for path, answer in dialect.side_routes().items():
                router.add_post(path, functools.partial(self._side_route, dialect, answer))
        router.add_get("/v1/models", self._models)
        router.add_get("/task", self._task)
        router.add_get("/state", functools.partial(self._channel, self._by_state, "state", channels.get_state))
        router.add_put("/state", functools.partial(self._channel, self._by_state, "state", channels.put_state))
        router.add_post("/tool", functools.partial(self._channel, self._by_model, "rollout", channels.gate))

    async def stop(self) -> None:
        for registration in list(self._by_model.values()):
            self._unregister(registration)
        await super().stop()

    @asynccontextmanager
    async def serve(self, session: RolloutSession) -> AsyncIterator[Slot]:
        if not self.base_url:
            raise RuntimeError("HTTPInterception.serve before start(); await start() first")
        slot = Slot(self.base_url, secrets.token_urlsafe(16), secrets.token_urlsafe(16))
        registration = _Registration(session)
        self._by_model[slot.model_secret] = registration
        self._by_state[slot.state_secret] = registration
        try:
            yield slot
        finally:
            self._by_model.pop(slot.model_secret, None)
            self._by_state.pop(slot.state_secret, None)
            self._unregister(registration)

    def client(self, slot: Slot) -> ChatClient | None:
        return None

    def session_of_state(self, state_secret: str) -> RolloutSession | None:
        """The session registered under ``state_secret`` (its tool calls land on its trace)."""
        registration = self._by_state.get(state_secret)
        return registration.session if registration is not None else None

    @staticmethod
    def _unregister(registration: _Registration) -> None:
        registration.session.release()
        registration.handlers.cancel()

    # -- routes -----------------------------------------------------------------------------

    def _lookup(
        self, request: web.Request, table: dict[str, _Registration], dialect: Dialect = _OPENAI
    ) -> _Registration | None:
        token = dialect.secret(request.headers)
        return table.get(token) if token else None

    async def _models(self, request: web.Request) -> web.Response:
        registration = self._lookup(request, self._by_model)
        if registration is None:
            return _error(401, "unknown or missing rollout secret", kind="authentication_error")
        name = registration.session.model_name or "model"
        body = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "rollout_ray"}]}
        return web.json_response(body)

    async def _task(self, request: web.Request) -> web.Response:
        registration = self._lookup(request, self._by_state)
        if registration is None:
            return _error(401, "unknown or missing state secret", kind="authentication_error")
        trace = registration.session.trace
        return web.Response(
            body=msgspec.json.encode(
                {"cls": trace.task.data_cls, "task": msgspec.json.encode(trace.task.data).decode()}
            ),
            content_type="application/json",
        )

    async def _channel(
        self, table: dict[str, _Registration], key: str, answer: Answer, request: web.Request
    ) -> web.Response:
        """A side channel (``channels.py``): the session by its ``key`` secret, the body
        bounded as a model call's, and the channel's answer."""
        registration = self._lookup(request, table)
        if registration is None:
            return _error(401, f"unknown or missing {key} secret", kind="authentication_error")
        try:
            with self.admitted(request, registration.held) as reservation, registration.handlers.track():
                body = await self.read_body(request, reservation) if request.body_exists else b""
                return web.Response(body=await answer(registration.session, body), content_type="application/json")
        except Refused as e:
            refusal = _error(e.status, str(e), headers=self.refusal_headers(e))
            refusal.force_close()  # the body is never read into memory: no keep-alive after it
            return refusal
        except WireError as e:
            return _error(e.status, str(e))
        except channels.ChannelError as e:
            return _error(e.status, str(e), kind=e.kind)

    async def _side_route(
        self, dialect: Dialect, answer: Callable[[bytes], bytes], request: web.Request
    ) -> web.Response:
        registration = self._lookup(request, self._by_model, dialect)
        if registration is None:
            return _error(401, "unknown or missing rollout secret", kind="authentication_error", dialect=dialect)
        if (closed := _closed(registration.session)) is not None:  # before its body is read or parsed
            refusal = _error(*closed, dialect=dialect)
            refusal.force_close()  # its body is never read: no keep-alive after it
            return refusal
        try:
            with self.admitted(request, registration.held) as reservation:
                return web.Response(
                    body=answer(await self.read_body(request, reservation)), content_type="application/json"
                )
        except Refused as e:
            refusal = _error(e.status, str(e), headers=self.refusal_headers(e), dialect=dialect)
            refusal.force_close()
            return refusal
        except WireError as e:
            return _error(e.status, str(e), kind="invalid_request_error", param=e.param, dialect=dialect)

    async def _model_call(self, dialect: Dialect, request: web.Request) -> web.StreamResponse:
        registration = self._lookup(request, self._by_model, dialect)
        if registration is None:
            return _error(401, "unknown or missing rollout secret", kind="authentication_error", dialect=dialect)
        try:
            with self.admitted(request, registration.held) as reservation, registration.handlers.track():
                return await self._registered_call(dialect, request, registration, reservation)
        except Refused as e:
            refusal = _error(e.status, str(e), headers=self.refusal_headers(e), dialect=dialect)
            refusal.force_close()  # the body is never read into memory: no keep-alive after it
            return refusal

    async def _registered_call(
        self, dialect: Dialect, request: web.Request, reg: _Registration, reservation: Reservation
    ) -> web.StreamResponse:
        def error(status: int, message: str, kind: str = "rollout_error", param: str | None = None) -> web.Response:
            return _error(status, message, kind=kind, param=param, dialect=dialect)

        # A concluded or stopped rollout gets no body read nor parsed (a parse of a large body
        # stalls the node's loop), except an SDK retry that may be the replay of its last answer.
        retry = _retry_count(request) > 0
        if not (retry and reg.last_response is not None) and (closed := _closed(reg.session)) is not None:
            refusal = error(*closed)
            refusal.force_close()  # its body is never read: no keep-alive after it
            return refusal
        try:
            body = await self.read_body(request, reservation)
        except WireError as e:
            return error(e.status, str(e))
        digest = hashlib.blake2b(body, digest_size=16).digest()
        replay = retry and digest == reg.last_hash and reg.last_response is not None
        if not replay and (closed := _closed(reg.session)) is not None:
            return error(*closed)
        try:
            parsed = dialect.parse(body, reg.history.get)
        except WireError as e:
            return error(400, str(e), "invalid_request_error", e.param)
        except RecursionError:  # msgspec's answer to JSON nested past the recursion limit
            return error(400, "invalid request: JSON nested too deeply", "invalid_request_error")
        if replay and reg.last_response is not None:  # (replay says so; this line tells mypy)
            return await self._answer(request, dialect, parsed, reg.last_response, digest)
        if not retry and digest == reg.last_hash:
            reg.last_hash = reg.last_response = None
        session = reg.session
        if retry and digest in reg.inflight:
            joined = await asyncio.shield(reg.inflight[digest])
            if joined is None:
                return error(503, "upstream attempt failed")
            return await self._answer(request, dialect, parsed, joined, digest)
        future: asyncio.Future[Response | None] = asyncio.get_running_loop().create_future()
        reg.inflight[digest] = future
        response: Response | None = None
        try:
            response = await session.chat(
                parsed.request, parsed.params, endpoint=dialect.endpoint, dropped=parsed.dropped
            )
        except Refusal as e:
            return error(e.status_code, e.body)
        except RolloutError as e:
            return error(e.status_code or 502, str(e), type(e).__name__)
        except UpstreamError as e:
            return error(502, str(e), "UpstreamError")
        except Exception:
            log.exception("interception: unexpected error in the model call handler")
            return error(500, "internal error in the interception proxy")
        finally:
            reg.inflight.pop(digest, None)
            if not future.done():
                future.set_result(response)
        reg.last_hash, reg.last_response = digest, response
        if dialect.continued:
            reg.history[dialect.id_prefix + digest.hex()] = [
                *parsed.request.messages[parsed.uncarried :],
                response.message,
            ]
        return await self._answer(request, dialect, parsed, response, digest)

    async def _answer(
        self, request: web.Request, dialect: Dialect, parsed: Parsed, response: Response, digest: bytes
    ) -> web.StreamResponse:
        # The id derives from the request, so a replayed or joined retry gets the same one.
        answer_id = dialect.id_prefix + digest.hex()
        if not parsed.stream:
            return web.Response(body=dialect.encode(response, parsed, answer_id), content_type="application/json")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await out.prepare(request)
            for event in dialect.events(response, parsed, answer_id):
                await out.write(event)
            await out.write_eof()
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError too
            # The client hung up; the turn is committed all the same, and there is nobody to tell.
            log.debug("interception: client hung up before its stream was written")
        return out


def _closed(session: RolloutSession) -> tuple[int, str] | None:
    """The refusal of a request to a concluded (409) or stopped (400) rollout, or ``None``."""
    if session.released:
        return 409, "rollout concluded"
    if session.stopped:
        return 400, f"rollout stopped: {session.trace.stop_condition}"
    return None


def _retry_count(request: web.Request) -> int:
    try:
        return int(request.headers.get("x-stainless-retry-count", "0"))
    except ValueError:
        return 0
