"""The tool server (§5.5), over plain HTTP instead of MCP.

A ``ToolServer`` hosts the toolsets of many rollouts: ``serve`` registers one rollout's under
a random token and yields ``{name: url}``. The URL is the capability: an unknown token gets
401, never another rollout's tools. ``GET <url>`` answers ``{"tools": [OpenAI specs]}``;
``POST <url>/call`` with ``{"name", "arguments"}`` answers ``{"content"}``,
``{"content", "is_error": true}`` when the tool raised or timed out (the model sees it, as
with MCP), or 400 / 404 / 408 / 413 ``{"error"}``, or 503 when the tool failed because the
rollout's runtime died (``SandboxError`` and the runtime no longer alive). Each call is
reported to ``on_call`` as a ``ToolCallRecord``.
"""


from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .._errors import SandboxError, ToolsetError
from .._core.runtime import Runtime

log = logging.getLogger("rollout_ray")

from .._core.toolset import _NAME, DEFAULT_CALL_TIMEOUT, Toolset, _invoke, _text
from .._errors import ToolInputError
from .._record.trace import ToolCallRecord

DEFAULT_MAX_BODY = 16 << 20
DEFAULT_READ_TIMEOUT = 60.0


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
    handlers: set[asyncio.Task[Any]] = field(default_factory=set)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class ToolServer:
    """Serves the toolsets of many rollouts; ``await start()`` first, ``await stop()`` last.

    Binds ``host:port`` (port 0: a free one) and puts ``advertise_host`` in the URLs. A tool
    call running over ``call_timeout`` seconds is answered as an error; bodies over
    ``max_body`` bytes get 413. A request's headers, and then its body, must arrive within
    ``read_timeout`` seconds (else the connection is closed, or the call answered 408).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None,
                 call_timeout: float = DEFAULT_CALL_TIMEOUT, max_body: int = DEFAULT_MAX_BODY,
                 read_timeout: float = DEFAULT_READ_TIMEOUT) -> None:
        self.host, self.port, self.advertise_host = host, port, advertise_host or host
        self.call_timeout, self.max_body, self.read_timeout = call_timeout, max_body, read_timeout
        self.base_url = ""
        self._registrations: dict[str, _Registration] = {}
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Bind and serve; returns ``base_url``. Raises ``ToolsetError`` if it cannot bind."""
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get("/t/{token}/{server}", self._handle)
        app.router.add_post("/t/{token}/{server}/call", self._handle)
        # aiohttp's keep-alive timer also runs from a connection's start until its headers are
        # complete, so it bounds a client that stalls mid-headers (its default is an hour).
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.read_timeout)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as e:
            await self.stop()
            raise ToolsetError(f"tool server cannot bind {self.host}:{self.port}: {e}") from e
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://{self.advertise_host}:{self.port}"
        return self.base_url

    async def stop(self) -> None:
        for registration in self._registrations.values():
            for task in registration.handlers:
                task.cancel()
        self._registrations.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ToolServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @asynccontextmanager
    async def serve(
        self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str = "", *,
        on_call: Callable[[ToolCallRecord], None] | None = None,
    ) -> AsyncIterator[dict[str, str]]:
        """Register one rollout's toolsets and yield ``{name: url}``; on exit the URLs die
        (401) and calls in flight are cancelled. ``on_call`` gets a record of every call that
        reached a toolset (pass it with ``functools.partial`` through ``Rollout(tool_server=)``).

        Raises ``ToolsetError``: not started, a duplicate or invalid name, an unusable tool.
        """
        if not self.base_url:
            raise ToolsetError("ToolServer.serve before start(); await start() first")
        by_name: dict[str, Toolset] = {}
        for toolset in toolsets:
            if not isinstance(toolset, Toolset):
                raise ToolsetError(f"not a Toolset: {toolset!r}")
            if not _NAME.match(toolset.name) or toolset.name in by_name:
                raise ToolsetError(f"duplicate or invalid tool server name {toolset.name!r}")
            toolset.specs()  # build the schemas now: a broken toolset fails the rollout's open
            by_name[toolset.name] = toolset
        base = runtime.host_url(self.base_url) if runtime is not None else self.base_url
        token = secrets.token_urlsafe(24)
        registration = self._registrations[token] = _Registration(by_name, runtime, state_secret, on_call)
        try:
            yield {name: f"{base}/t/{token}/{name}" for name in by_name}
        finally:
            self._registrations.pop(token, None)
            for task in registration.handlers:
                task.cancel()

    async def _handle(self, request: web.Request) -> web.Response:
        registration = self._registrations.get(request.match_info["token"])
        if registration is None:
            return _error(401, "unknown or expired tool server token")
        toolset = registration.toolsets.get(request.match_info["server"])
        if toolset is None:
            return _error(404, f"no tool server named {request.match_info['server']!r}")
        if request.method == "GET":
            return web.json_response({"tools": [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}}
                for t in toolset.specs()
            ]})
        task = asyncio.current_task()
        assert task is not None
        registration.handlers.add(task)
        try:
            return await self._call(request, registration, toolset)
        finally:
            registration.handlers.discard(task)

    async def _call(self, request: web.Request, reg: _Registration, toolset: Toolset) -> web.Response:
        try:
            # Bounded: a client that sends its headers and then stalls or trickles the body
            # would otherwise hold this handler forever (aiohttp has no body deadline).
            async with asyncio.timeout(self.read_timeout):
                raw = await request.read()
            call = _CALL.decode(raw)
            args = call.arguments
            if isinstance(args, str):  # OpenAI tool calls carry their arguments as JSON text
                args = msgspec.json.decode(args)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body over {self.max_body} bytes")
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            return _error(400, f"invalid tool call body: {e}")
        except RecursionError:  # msgspec's answer to JSON nested past the recursion limit
            return _error(400, "invalid tool call body: JSON nested too deeply")
        except TimeoutError:
            return _error(408, f"request body not received within {self.read_timeout:g}s")
        except ConnectionError:  # the client hung up mid-body: nobody to answer, not our bug
            return _error(400, "connection lost while reading the request body")
        started, deadline = time.monotonic(), asyncio.timeout(self.call_timeout)
        fn, status, error = None, 200, None
        try:
            fn, kwargs = toolset._bind(call.name, args, reg.runtime)
            async with deadline:
                body: dict[str, Any] = {"content": _text(await _invoke(fn, kwargs))}
        except Exception as e:
            if fn is None and isinstance(e, ToolInputError):  # the caller's fault: 4xx
                status, error = e.status_code or 400, str(e)
                body = {"error": error}
            elif isinstance(e, SandboxError) and not await _alive(reg.runtime):
                # Not the tool's fault: the box is gone, and with it the rollout. A 503 makes
                # the harness stop, and the rollout fail with SandboxError, not go on without it.
                status, error = 503, f"{type(e).__name__}: {e}"
                body = {"error": f"the rollout's runtime died: {error}"}
            else:  # the tool's fault: the model sees it as the result
                expired = isinstance(e, TimeoutError) and deadline.expired()
                timed_out = f"tool {call.name!r} timed out after {self.call_timeout:g}s"
                error = timed_out if expired else f"{type(e).__name__}: {e}"
                body = {"content": error, "is_error": True}
        if reg.on_call is not None:
            arguments = msgspec.json.encode(args).decode()
            try:
                reg.on_call(ToolCallRecord(toolset.name, call.name, arguments, error is None, error,
                                           time.monotonic() - started))
            except Exception:
                log.exception("tool server: on_call callback failed")
        return web.json_response(body, status=status)


async def _alive(runtime: Runtime | None) -> bool:
    return runtime is not None and await runtime.alive()


class ToolHost:
    """A ``ToolServer`` serving rollouts that run in other processes (a ``ToolActor``).

    ``register`` returns a key and the URLs; ``unregister`` returns the calls recorded
    meanwhile, for the rollout to put on its trace.
    """

    def __init__(self, *, host: str = "127.0.0.1", advertise_host: str | None = None) -> None:
        self._server = ToolServer(host=host, advertise_host=advertise_host)
        self._registrations: dict[str, tuple[Any, list[ToolCallRecord]]] = {}

    async def register(self, toolsets: Sequence[Toolset], runtime: Runtime | None,
                       state_secret: str) -> tuple[str, dict[str, str]]:
        if not self._server.base_url:
            await self._server.start()
        records: list[ToolCallRecord] = []
        serving = self.serve_for(toolsets, runtime, state_secret, records)
        urls = await serving.__aenter__()
        key = secrets.token_urlsafe(16)
        self._registrations[key] = (serving, records)
        return key, urls

    def serve_for(self, toolsets: Sequence[Toolset], runtime: Runtime | None, state_secret: str,
                  records: list[ToolCallRecord]) -> Any:
        return self._server.serve(toolsets, runtime, state_secret, on_call=records.append)

    async def unregister(self, key: str) -> list[ToolCallRecord]:
        entry = self._registrations.pop(key, None)
        if entry is None:
            return []
        serving, records = entry
        await serving.__aexit__(None, None, None)
        return records

    def load(self) -> int:
        return len(self._registrations)

    async def shutdown(self) -> None:
        for key in list(self._registrations):
            await self.unregister(key)
        await self._server.stop()
