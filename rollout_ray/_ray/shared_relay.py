"""A cluster's shared tool server reached from another node: each request relayed over Ray.

The server of ``SharedToolServer(scope="cluster")`` listens on its holder's loopback only
(nothing of the taskset's is exposed on the network), so a rollout on another node cannot
reach it by HTTP. Its toolset there gets a ``RelayClient`` instead: each MCP request is one
Ray call to the holder actor (``_ray/shared_cluster``), which sends it with its own HTTP client
of the server (``relayed``: one connection pool and MCP session per bearer, on its node) and
returns the answer. The request keeps its caller's identity (the rollout's id in
``params._meta``, the toolset's headers with its bearer) and its bounds: the server's answer
is read under the toolset's ``max_message`` and ``timeout`` at the holder, and the Ray call is
bounded by ``timeout`` here. The server streams its answer as events at most; the holder reads
the stream to the answer (as a local client does), so the relay carries one result per request.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any

from ray.exceptions import RayActorError

from .._serving.mcp_client import Limits, _Client
from .._serving.mcp_pool import http_client
from .._serving.shared_server import SharedToolServer
from .calls import call

LIST_TOOLS = None
"""The relayed "method" that asks for the server's tools (listed once by the holder's client)."""


class RelayClient(_Client):
    """A client of the cluster's server on another node: its requests go through ``holder``."""

    def __init__(self, server: str, holder: Any, headers: Mapping[str, str], limits: Limits) -> None:
        super().__init__(server, limits)
        self.holder, self.headers = holder, dict(headers)
        self.closed = False
        """Its holder died: the next opening takes a new client of the new holder."""

    async def _handshake(self) -> None:
        # The holder's client did the MCP handshake; this one takes its tools.
        seconds = self.limits.start_timeout + self.limits.timeout
        tools = await self._bounded(self._relay(LIST_TOOLS, None), seconds)
        if not isinstance(tools, list):
            raise self._fail(f"its holder listed no tools: {str(tools)[:200]}")
        self.tools = tools

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        await self.ready()
        return await self._bounded(self._relay(method, params))  # type: ignore[no-any-return]

    async def _relay(self, method: str | None, params: Mapping[str, Any] | None) -> Any:
        try:  # the holder's ToolServerError or RemoteError comes back as itself
            return await call(self.holder.relay.remote(self.headers, self.limits, method, dict(params or {})))
        except RayActorError:
            self.closed = True
            raise self._fail("the actor holding the cluster's server died; the next rollout starts it anew") from None


async def relayed(
    server: str, url: str, headers: Mapping[str, str], limits: Limits, method: str | None, params: dict[str, Any]
) -> Any:
    """At the holder: send one relayed request to the server at ``url`` (its loopback), with
    this process's client of it; ``method`` ``LIST_TOOLS`` answers the server's tools."""
    client = http_client(server, url, headers, limits)
    if method is LIST_TOOLS:
        await client.ready()
        return client.tools
    return await client.request(method, params)


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], RelayClient]] = (
    weakref.WeakKeyDictionary()
)
"""This process's relay clients per event loop (a client's ready task belongs to its loop)."""


def relay_client(server: SharedToolServer, holder: Any) -> RelayClient:
    """This process's client of the cluster's ``server`` through ``holder`` (made on first use)."""
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (server.key, tuple(sorted(server.headers.items())), server.limits)
    client = clients.get(key)
    if client is None or client.closed or client.holder is not holder:
        client = clients[key] = RelayClient(server.name, holder, server.headers, server.limits)
    return client
