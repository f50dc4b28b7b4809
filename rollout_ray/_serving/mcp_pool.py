"""This process's MCP clients: one per HTTP server, one per stdio command and runtime.

Kept per event loop (a client's connections and processes belong to the loop that made
them): the node's tool server has one loop, so one client per server per node.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.runtime import Runtime
from .mcp_client import HTTPClient, Limits
from .mcp_stdio import StdioClient


class _Pool:
    """This event loop's clients: one per HTTP server, one per stdio command and runtime."""

    def __init__(self) -> None:
        self.http: dict[tuple[Any, ...], HTTPClient] = {}
        self.stdio: dict[tuple[Any, ...], tuple[StdioClient, int]] = {}
        self.starting: dict[int, asyncio.Semaphore] = {}


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    return _POOLS.setdefault(asyncio.get_running_loop(), _Pool())


def http_client(server: str, url: str, headers: Mapping[str, str], limits: Limits) -> HTTPClient:
    """This process's client of the HTTP MCP server at ``url`` (made on first use)."""
    key = (server, url, tuple(sorted(headers.items())), limits)
    pool = _pool()
    client = pool.http.get(key)
    if client is None or client.closed:
        client = pool.http[key] = HTTPClient(server, url, headers, limits)
    return client


def stdio_client(
    server: str,
    command: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    limits: Limits,
    runtime_id: str,
    runtime: Runtime | None = None,
    files: Mapping[str, str | bytes] | None = None,
) -> StdioClient:
    """The stdio MCP server ``command`` of one runtime (or one caller: ``runtime_id`` is whose
    server it is, never shared beyond it), leased: ``release_stdio`` when done. With
    ``runtime``, the server runs in it (the first lease's runtime: every lease names the same box)."""
    if not runtime_id:
        raise ValueError(
            f"stdio MCP server {server!r}: runtime_id must name the runtime (or caller) it serves; "
            "a server keyed on nothing would be shared by every rollout of the process"
        )
    shipped = tuple(sorted((files or {}).items()))
    key = (server, tuple(command), tuple(sorted((env or {}).items())), cwd, limits, runtime_id, shipped)
    pool = _pool()
    client, leases = pool.stdio.get(key, (None, 0))
    if client is None:
        starting = pool.starting.setdefault(limits.max_starting, asyncio.Semaphore(limits.max_starting))
        client = StdioClient(server, command, env, cwd, limits, starting, runtime, files)
    pool.stdio[key] = (client, leases + 1)
    return client


async def release_stdio(client: StdioClient) -> None:
    """Return a lease of ``stdio_client``; the last one stops the server."""
    pool = _pool()
    for key, (held, leases) in list(pool.stdio.items()):
        if held is client:
            if leases > 1:
                pool.stdio[key] = (held, leases - 1)
                return
            del pool.stdio[key]
            await client.close()
            return


async def close_clients() -> None:
    """Close this event loop's clients (the end of a node's tool server, or of a test)."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        for client in [*pool.http.values(), *(c for c, _ in pool.stdio.values())]:
            await client.close()
