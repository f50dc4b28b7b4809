"""The host end of a ``SandboxRuntime``'s allowed routes, and how a sandbox names them.

Each allowed route is a unix socket in the runtime's ``net`` directory (bind-mounted into the
sandbox, where ``forwarder.py`` serves it on ``127.0.0.1:<port>``); every connection to it is
relayed to the real ``host:port``. ``sandbox_url`` is the URL a program inside uses.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from .cgroup import KILL_BUDGET

LOOPBACK = ("127.0.0.1", "localhost", "::1")
CONNECT_TIMEOUT = 10.0
"""Seconds the host end of a route waits to connect to the real route."""
CHUNK = 1 << 16


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


class Route:
    """A unix socket whose connections are relayed to ``host:port``; ``close`` ends them all."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def open(self, path: str) -> None:
        # Through the directory's fd: a socket path is limited to 107 bytes, a work dir is not.
        fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
        try:
            short = f"/proc/self/fd/{fd}/{os.path.basename(path)}"
            self.server = await asyncio.start_unix_server(self._handle, short)
        finally:
            os.close(fd)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, TimeoutError):
                return  # the program sees the connection closed, as by a dead route
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(_pump(reader, up_writer))
                    tg.create_task(_pump(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            self.handlers.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.handlers):
            task.cancel()
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=KILL_BUDGET)


def sandbox_url(url: str) -> str:
    """``url`` as a sandbox reaches it: loopback URLs are unchanged, any other host is served on
    ``127.0.0.1`` with the same port (once allowed by ``prepare_execution``)."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname in LOOPBACK:
        return url
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port_of(url)}"))


def port_of(url: str) -> int:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"route {url!r} has a bad port") from e
    return port if port is not None else (443 if parts.scheme == "https" else 80)


def wanted_routes(routes: Sequence[str] | None, remote: Mapping[int, tuple[str, int]]) -> dict[int, tuple[str, int]]:
    """``{port inside: (host, port)}`` of route URLs; a loopback one is ``remote``'s target of
    its port when ``host_url`` rewrote a remote URL to it.

    Raises:
        ValueError: a route is not an ``http(s)://`` URL with a port >= 1024, or two need one port.
    """
    wanted: dict[int, tuple[str, int]] = {}
    for url in routes or ():
        parts = urlsplit(url)
        port = port_of(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None or port < 1024:
            raise ValueError(f"route {url!r} must be an http(s) URL with a port >= 1024")
        target = (parts.hostname, port)
        if parts.hostname in LOOPBACK:
            target = remote.get(port, target)
        if wanted.setdefault(port, target) != target:
            raise ValueError(f"routes {target} and {wanted[port]} both need port {port}")
    return wanted


class RouteSet:
    """A runtime's allowed routes by their port inside, and the real targets of the remote
    URLs ``host_url`` rewrote to loopback ones."""

    def __init__(self) -> None:
        self.routes: dict[int, Route] = {}
        self.remote: dict[int, tuple[str, int]] = {}

    def host_url(self, url: str) -> str:
        """``url`` as the sandbox reaches it (``sandbox_url``), remembering the real target."""
        inside = sandbox_url(url)
        if inside != url:
            self.remote[port_of(url)] = (urlsplit(url).hostname or "", port_of(url))
        return inside

    async def allow(self, routes: Sequence[str] | None, net_dir: str) -> None:
        """Serve exactly ``routes`` (full URLs), each on a unix socket in ``net_dir``.

        Raises:
            ValueError: as ``wanted_routes``.
        """
        wanted = wanted_routes(routes, self.remote)
        for port in [p for p, r in self.routes.items() if wanted.get(p) != (r.host, r.port)]:
            await self.routes.pop(port).close()
        for port, (host, target_port) in wanted.items():
            if port not in self.routes:
                route = Route(host, target_port)
                await route.open(os.path.join(net_dir, f"{port}.sock"))
                self.routes[port] = route

    async def close(self) -> None:
        for route in self.routes.values():
            await route.close()
        self.routes = {}
