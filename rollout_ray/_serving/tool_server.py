"""The tool server (§5.5): a rollout's toolsets over plain HTTP, and as MCP servers.

A ``ToolServer`` hosts the toolsets of many rollouts: ``serve`` registers one rollout's under
a random token and yields ``{name: url}``. The URL is the capability: an unknown token gets
401, never another rollout's tools. ``GET <url>`` answers ``{"tools": [OpenAI specs]}``;
``POST <url>/call`` with ``{"name", "arguments"}`` answers ``{"content"}``,
``{"content", "is_error": true}`` when the tool raised or timed out (the model sees it, as
with MCP), or 400 / 404 / 408 / 413 ``{"error"}``, or 503 when the tool failed because the
rollout's runtime died (``SandboxError`` and the runtime no longer alive, or
``InfrastructureLost``: its host died), or 502 when the MCP server behind a toolset failed
(``ToolServerError``, stashed on the rollout's session when ``sessions`` finds it). The same toolsets are served as MCP servers
(``mcp_server``): ``POST {base}/mcp/{name}`` with the token as ``Authorization: Bearer``, or
``POST <url>/mcp`` (``mcp_url``). Each call is reported to ``on_call`` as a
``ToolCallRecord`` (its arguments cut at a cap: ``_core/tools``).

Bounded as the proxy is (``HTTPService.admitted``): more calls, or more body bytes, of one
rollout in flight than its share → 429 before the body is read; more body bytes in flight
than the ``BodyBudget`` it shares with the node's proxy → 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .._core.runtime import Runtime
from .._core.session import RolloutSession
from .._core.tools import call_tool, calling_as, close_toolsets, index_toolsets, open_toolsets, tool_specs
from .._core.toolset import DEFAULT_CALL_TIMEOUT, Toolset
from .._errors import InfrastructureLost, SandboxError, ToolInputError, ToolServerError, ToolsetError, WireError
from .._record.trace import ToolCallRecord
from . import mcp_server
from .http_service import DEFAULT_READ_TIMEOUT, BodyBudget, Handlers, HTTPService, InFlight, Refused, Reservation
from .mcp_pool import close_clients
from .shared_server import stop_shared_servers

log = logging.getLogger("rollout_ray")

DEFAULT_MAX_BODY = 16 << 20

DEFAULT_MAX_CALLS_PER_ROLLOUT = 16
"""Tool calls of one rollout in flight at once; more are answered 429."""

DEFAULT_MAX_CALL_BYTES_PER_ROLLOUT = 32 << 20
"""Call body bytes of one rollout in flight at once; more are answered 429."""


class _Call(msgspec.Struct):
    name: str
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)


_CALL = msgspec.json.Decoder(_Call)


@dataclass
class _Registration:
    toolsets: dict[str, Toolset]
    runtime: Runtime | None
    state_secret: str
    on_call: Callable[[ToolCallRecord], None] | None
    handlers: Handlers = field(default_factory=Handlers)
    held: InFlight = field(default_factory=InFlight)
    """The rollout's calls being handled now, and the body bytes reserved for them."""


def mcp_url(tool_url: str) -> str:
    """The MCP endpoint of a tool server URL ``serve`` yielded (the token in its path)."""
    return f"{tool_url}/mcp"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class ToolServer(HTTPService):
    """Serves the toolsets of many rollouts; ``await start()`` first, ``await stop()`` last.

    A tool call running over ``call_timeout`` seconds is answered as an error. Other
    arguments as ``HTTPService`` (``max_body`` defaults to ``DEFAULT_MAX_BODY``; a rollout's
    share of calls in flight to ``DEFAULT_MAX_CALLS_PER_ROLLOUT`` and
    ``DEFAULT_MAX_CALL_BYTES_PER_ROLLOUT``). ``sessions`` finds a rollout's session by its
    ``state_secret`` (the proxy's ``session_of_state``): an MCP server's failure
    (``ToolServerError``) is stashed on it, so the rollout fails with that error, not with
    the harness's exit after its 502.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_requests_per_rollout: int = DEFAULT_MAX_CALLS_PER_ROLLOUT,
        max_body_bytes_per_rollout: int = DEFAULT_MAX_CALL_BYTES_PER_ROLLOUT,
        body_budget: BodyBudget | None = None,
        sessions: Callable[[str], RolloutSession | None] | None = None,
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
        self.call_timeout = call_timeout
        self._sessions = sessions
        self._registrations: dict[str, _Registration] = {}

    def _routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/t/{token}/{server}", self._handle)
        router.add_post("/t/{token}/{server}/call", self._handle)
        router.add_route("*", "/t/{token}/{server}/mcp", self._handle_mcp)
        router.add_route("*", "/mcp/{server}", self._handle_mcp)

    async def start(self) -> str:
        """Bind and serve; returns ``base_url``. Raises ``ToolsetError`` if it cannot bind."""
        try:
            return await super().start()
        except OSError as e:
            raise ToolsetError(f"tool server cannot bind {self.host}:{self.port}: {e}") from e

    async def stop(self) -> None:
        for registration in self._registrations.values():
            registration.handlers.cancel()
        self._registrations.clear()
        await close_clients()  # the MCP servers' clients of this process (mcp_toolset)
        await stop_shared_servers()  # the taskset's shared servers this process started
        await super().stop()

    @asynccontextmanager
    async def serve(
        self,
        toolsets: Sequence[Toolset],
        runtime: Runtime | None,
        state_secret: str = "",
        *,
        on_call: Callable[[ToolCallRecord], None] | None = None,
    ) -> AsyncIterator[dict[str, str]]:
        """Register one rollout's toolsets and yield ``{name: url}``; on exit the URLs die
        (401) and calls in flight are cancelled. ``on_call`` gets a record of every call that
        reached a toolset (pass it with ``functools.partial`` through ``Rollout(tool_server=)``).

        Raises ``ToolsetError``: not started, a duplicate or invalid name, an unusable tool.
        """
        if not self.base_url:
            raise ToolsetError("ToolServer.serve before start(); await start() first")
        await open_toolsets(toolsets, runtime)
        try:
            by_name = index_toolsets(toolsets)
            base = runtime.host_url(self.base_url) if runtime is not None else self.base_url
            token = secrets.token_urlsafe(24)
            registration = self._registrations[token] = _Registration(by_name, runtime, state_secret, on_call)
            try:
                yield {name: f"{base}/t/{token}/{name}" for name in by_name}
            finally:
                self._registrations.pop(token, None)
                registration.handlers.cancel()
        finally:
            await close_toolsets(toolsets)

    async def _handle(self, request: web.Request) -> web.Response:
        registration = self._registrations.get(request.match_info["token"])
        if registration is None:
            return _error(401, "unknown or expired tool server token")
        toolset = registration.toolsets.get(request.match_info["server"])
        if toolset is None:
            return _error(404, f"no tool server named {request.match_info['server']!r}")
        if request.method == "GET":
            return web.json_response({"tools": tool_specs(toolset.specs())})
        try:
            with (
                self.admitted(request, registration.held) as reservation,
                registration.handlers.track(),
                self._calling(registration),
            ):
                return await self._call(request, registration, toolset, reservation)
        except Refused as e:
            refusal = _error(e.status, str(e), self.refusal_headers(e))
            refusal.force_close()  # the body is never read into memory: no keep-alive after it
            return refusal

    def _calling(self, registration: _Registration) -> AbstractContextManager[None]:
        """Calls run as the rollout's a registration serves, on its trace (``calling_as``),
        when its session can be found: its trace id to shared servers, its state to tools."""
        session = self._sessions(registration.state_secret) if self._sessions is not None else None
        return calling_as(None) if session is None else calling_as(session.trace.id, session.trace)

    def _stash(self, registration: _Registration, error: ToolServerError) -> None:
        """Make ``error`` the rollout's (its session's stashed error), when it can be found."""
        session = self._sessions(registration.state_secret) if self._sessions is not None else None
        if session is not None:
            session.error = error

    async def _handle_mcp(self, request: web.Request) -> web.Response:
        token = request.match_info.get("token")
        if token is None:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            token = token.strip() if scheme.lower() == "bearer" else ""
        registration = self._registrations.get(token)
        if registration is None:
            return mcp_server.rpc_error(
                401,
                mcp_server.INVALID_REQUEST,
                "unknown or expired tool server token (send the rollout's as Authorization: Bearer)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        toolset = registration.toolsets.get(request.match_info["server"])
        if toolset is None:
            return mcp_server.rpc_error(
                404, mcp_server.INVALID_REQUEST, f"no tool server named {request.match_info['server']!r}"
            )
        if request.method != "POST":  # stateless: no server-to-client stream, no session to delete
            return web.Response(status=405, headers={"Allow": "POST"})
        try:
            with (
                self.admitted(request, registration.held) as reservation,
                registration.handlers.track(),
                self._calling(registration),
            ):
                try:
                    body = await self.read_body(request, reservation)
                except WireError as e:
                    return mcp_server.rpc_error(e.status, mcp_server.INVALID_REQUEST, str(e))
                return await mcp_server.answer(
                    body,
                    request.headers.get("mcp-protocol-version"),
                    toolset,
                    registration.runtime,
                    timeout=self.call_timeout,
                    on_call=registration.on_call,
                    on_error=lambda e: self._stash(registration, e),
                )
        except Refused as e:
            refusal = mcp_server.rpc_error(e.status, mcp_server.INTERNAL_ERROR, str(e), headers=self.refusal_headers(e))
            refusal.force_close()
            return refusal

    async def _call(
        self, request: web.Request, reg: _Registration, toolset: Toolset, reservation: Reservation
    ) -> web.Response:
        try:
            call = _CALL.decode(await self.read_body(request, reservation))
            args = call.arguments
        except WireError as e:
            return _error(e.status, str(e))
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            return _error(400, f"invalid tool call body: {e}")
        except RecursionError:  # msgspec's answer to JSON nested past the recursion limit
            return _error(400, "invalid tool call body: JSON nested too deeply")
        try:
            outcome = await call_tool(
                toolset, call.name, args, reg.runtime, timeout=self.call_timeout, on_call=reg.on_call
            )
        except ToolInputError as e:  # the caller's fault: 4xx
            return _error(e.status_code or 400, str(e))
        except ToolServerError as e:  # the MCP server behind the toolset failed, not the tool
            self._stash(reg, e)
            return _error(502, str(e))
        except (SandboxError, InfrastructureLost) as e:
            # Not the tool's fault: the box is gone (or its host), and with it the rollout. A
            # 503 makes the harness stop, and the rollout fail with SandboxError (or be lost
            # and run again), not go on without it.
            return _error(503, f"the rollout's runtime died: {type(e).__name__}: {e}")
        if outcome.error is not None:  # the tool's fault: the model sees it as the result
            return web.json_response({"content": outcome.content, "is_error": True})
        return web.json_response({"content": outcome.content})
