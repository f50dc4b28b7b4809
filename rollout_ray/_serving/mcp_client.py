"""Clients of MCP servers outside the process: the JSON-RPC client and its HTTP transport
(the stdio one is ``mcp_stdio``; which client serves which toolset, ``mcp_pool``).

One ``HTTPClient`` per server per process (``mcp_pool.http_client``): the node's tool server holds
one for all the rollouts it serves, so a burst of calls shares one connection pool
(``max_connections``) and one MCP session, never a connection per call. A connection the
server dropped is opened again and the request sent once more; a session the server forgot
(404 on ``Mcp-Session-Id``) is initialized again. One ``StdioClient`` per command per
runtime (``mcp_pool.stdio_client``), started under a per-process limit on starts in progress so a
burst of rollouts does not start a hundred servers at once (mcphub#1154: 74 of 99 timed out).

Everything a bad server can do is bounded and answered with ``ToolServerError`` naming it:
unreachable or dead (connection refused, process exited), hung (no answer in ``timeout``
seconds), garbage (not JSON-RPC), too much (a message over ``max_message`` bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from .._errors import ToolServerError

PROTOCOL_VERSION = "2025-11-25"
"""The handshake revision this client asks for: every server of the last two years speaks one."""

DEFAULT_MAX_MESSAGE = 16 << 20
"""Bytes of one message from a server; more fails the call (a server sending 100 MiB)."""


@dataclass(frozen=True)
class Limits:
    """Bounds of one MCP server's client: seconds per request and per start, bytes per message,
    connections per node (HTTP), servers starting at once per node (stdio)."""

    timeout: float = 30.0
    start_timeout: float = 30.0
    max_message: int = DEFAULT_MAX_MESSAGE
    max_connections: int = 32
    max_starting: int = 4


class RemoteError(Exception):
    """The server answered a request with a JSON-RPC error (e.g. an unknown tool): the
    model sees it as the call's error, the server is fine."""

    def __init__(self, code: Any, message: Any) -> None:
        super().__init__(f"MCP error {code}: {message}")
        self.code, self.message = code, message

    def __reduce__(self) -> tuple[type, tuple[Any, Any]]:  # it crosses a Ray call (a relayed request)
        return type(self), (self.code, self.message)


class _Retry(Exception):
    """The connection or session broke before an answer: open it again and resend once."""


class _Client:
    """JSON-RPC over one transport, with the ``initialize`` handshake done once."""

    def __init__(self, server: str, limits: Limits) -> None:
        self.server, self.limits = server, limits
        self.tools: list[dict[str, Any]] | None = None
        """The server's tools (``tools/list``), listed once per session."""
        self._ids = itertools.count(1)
        self._ready: asyncio.Task[None] | None = None

    def _fail(self, message: str) -> ToolServerError:
        return ToolServerError(self.server, message)

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Send one request and return its result.

        Raises:
            ToolServerError: the server is unreachable, died, hung, or answered garbage.
            RemoteError: the server answered with a JSON-RPC error.
        """
        for attempt in (0, 1):
            ready = await self.ready()
            try:
                return await self._bounded(self._exchange(method, params))  # type: ignore[no-any-return]
            except _Retry as e:
                self._reset(ready)
                if attempt:
                    raise self._fail(f"the connection broke twice: {e}") from None
        raise AssertionError("unreachable")

    async def ready(self) -> asyncio.Task[None]:
        """Initialized (once, shared by concurrent callers) and its tools listed."""
        if self._ready is None or (self._ready.done() and self._ready.exception() is not None):
            self._ready = asyncio.ensure_future(self._initialize())
        await asyncio.shield(self._ready)
        return self._ready

    def _reset(self, ready: asyncio.Task[None]) -> None:
        if self._ready is ready:  # one caller resets a broken session; the others use the new one
            self._ready = None

    async def _initialize(self) -> None:
        try:
            await self._handshake()
        except _Retry as e:  # broke while starting: nothing to retry on, the server is bad
            raise self._fail(f"broke while starting: {e}") from None

    async def _handshake(self) -> None:
        async with self._starting():
            await self._open()
            params = {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "rollout_ray", "version": "1"},
            }
            await self._bounded(self._exchange("initialize", params), self.limits.start_timeout)
            await self._bounded(self._send({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            listed = await self._bounded(self._exchange("tools/list", {}))
        tools = listed.get("tools")
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools
        ):
            raise self._fail(f"tools/list answered no list of named tools: {str(listed)[:200]}")
        self.tools = tools

    def _starting(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return contextlib.nullcontext()

    async def _bounded(self, work: Any, seconds: float | None = None) -> Any:
        seconds = self.limits.timeout if seconds is None else seconds
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                return await work
        except TimeoutError:
            if deadline.expired():
                raise self._fail(f"no answer within {seconds:g}s") from None
            raise

    async def _exchange(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        id = next(self._ids)
        message = await self._send({"jsonrpc": "2.0", "id": id, "method": method, "params": dict(params or {})})
        return self._result(message, id)

    def _result(self, message: Any, id: int) -> dict[str, Any]:
        if not isinstance(message, dict) or message.get("id") != id:
            raise self._fail(
                f"answered something that is not the JSON-RPC response to request {id}: {str(message)[:200]}"
            )
        if isinstance(message.get("error"), dict):
            raise RemoteError(message["error"].get("code"), message["error"].get("message"))
        if not isinstance(message.get("result"), dict):
            raise self._fail(f"answered request {id} with no result object: {str(message)[:200]}")
        result: dict[str, Any] = message["result"]
        return result

    def _decode(self, data: bytes) -> Any:
        try:
            return msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            raise self._fail(f"answered something that is not JSON: {data[:200]!r}") from None

    async def _open(self) -> None: ...

    async def _send(self, message: dict[str, Any]) -> Any: ...

    async def close(self) -> None: ...


class HTTPClient(_Client):
    """An MCP server over streamable HTTP, through one connection pool."""

    def __init__(self, server: str, url: str, headers: Mapping[str, str], limits: Limits) -> None:
        super().__init__(server, limits)
        self.url, self._headers = url, dict(headers)
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limits.max_connections), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._session_id: str | None = None

    async def _open(self) -> None:
        self._session_id = None

    async def _send(self, message: dict[str, Any]) -> Any:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", **self._headers}
        if message.get("method") != "initialize":
            headers["mcp-protocol-version"] = PROTOCOL_VERSION
            if self._session_id:
                headers["mcp-session-id"] = self._session_id
        try:
            async with self._http.post(self.url, data=msgspec.json.encode(message), headers=headers) as r:
                if r.status == 404 and self._session_id:
                    raise _Retry("the server forgot the session (404)")
                if r.status >= 400:
                    raise self._fail(f"HTTP {r.status}: {(await r.content.read(500)).decode(errors='replace')}")
                if "id" not in message:
                    return None  # a notification: 202, nothing to read
                self._session_id = r.headers.get("mcp-session-id", self._session_id)
                if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return await self._from_stream(r, message["id"])
                return self._decode(await self._read(r))
        except aiohttp.ClientConnectorError as e:
            raise self._fail(f"unreachable at {self.url}: {e}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
            raise _Retry(f"{type(e).__name__}: {e}") from None

    async def _read(self, r: aiohttp.ClientResponse) -> bytes:
        limit = self.limits.max_message
        if (r.content_length or 0) > limit:
            raise self._fail(f"answered {r.content_length} bytes, over the {limit} of max_message")
        body = bytearray()
        async for chunk in r.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > limit:
                raise self._fail(f"answered more than the {limit} bytes of max_message")
        return bytes(body)

    async def _from_stream(self, r: aiohttp.ClientResponse, id: int) -> Any:
        """The response to ``id`` among the server's SSE events (others are notifications)."""
        buffer, data, seen, answer = bytearray(), [], 0, None
        async for chunk in r.content.iter_chunked(1 << 16):
            seen += len(chunk)
            if seen > self.limits.max_message:
                raise self._fail(f"streamed more than the {self.limits.max_message} bytes of max_message")
            if answer is not None:
                continue  # read to the stream's end (the server ends it): the connection is reused
            buffer += chunk
            if b"\n" not in chunk:
                continue  # splitting only at a line's end keeps a long line's parse linear
            *lines, rest = buffer.split(b"\n")
            buffer = bytearray(rest)
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(bytes(line[5:].lstrip(b" ")))
                elif not line and data:
                    message, data = self._decode(b"\n".join(data)), []
                    if isinstance(message, dict) and message.get("id") == id:
                        answer = message
        if answer is None:
            raise self._fail(f"ended its event stream without answering request {id}")
        return answer

    @property
    def closed(self) -> bool:
        return self._http.closed

    async def close(self) -> None:
        await self._http.close()
