"""The host end of a ``SandboxRuntime``'s allowed routes, and how a sandbox names them.

Each allowed route is a unix socket in the runtime's ``net`` directory (bind-mounted into the
sandbox, where ``forwarder.py`` serves it on ``127.0.0.1:<port>``); every connection to it is
relayed to the real ``host:port``. ``sandbox_url`` is the URL a program inside uses.
"""

from __future__ import annotations

import asyncio
import os
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
