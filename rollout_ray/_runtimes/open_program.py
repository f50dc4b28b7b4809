"""Programs held open in a runtime (``Runtime.open_program``): a stdio MCP server of a rollout.

``runtime.PipedProgram`` is one spawned by this process (``LocalRuntime`` and ``SandboxRuntime``: the
same spawn as an ``exec``, so the same sandbox), its pipes read and written directly. A runtime
hosted by another process (a runtime actor) cannot hand pipes over: its host serves the
program's stdin/stdout on a loopback port for one connection that first sends a one-time
token (``serve_program``), and the caller connects (``connect_program``). Closing that
connection kills the program; the program's exit, or its runtime's stop, closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from typing import Any

from .._core.runtime import KILL_WAIT, OpenProgram

ACCEPT_TIMEOUT = 60.0
"""Seconds a served program waits for its caller to connect; then it is killed."""
CHUNK = 1 << 16


class SocketProgram(OpenProgram):
    """A program held open by another process, reached over its loopback connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stdin, self.stdout = writer, reader

    @property
    def returncode(self) -> int | None:
        return None  # the host knows it; here the connection's end says it is gone

    async def kill(self) -> None:
        self.stdin.close()  # the host kills the program when its connection closes
        with contextlib.suppress(Exception):
            async with asyncio.timeout(KILL_WAIT):
                await self.stdin.wait_closed()


_SERVED: set[asyncio.Task[Any]] = set()  # bridges running: held so they are not collected


async def serve_program(program: OpenProgram) -> tuple[int, str]:
    """Serve ``program``'s stdin/stdout on a loopback port to the first connection that sends
    the token; returns ``(port, token)``. Killed when nobody connects within ``ACCEPT_TIMEOUT``."""
    token = secrets.token_urlsafe(24)
    accepted = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                line = await reader.readline()
        except (TimeoutError, ConnectionError, ValueError):
            line = b""
        if accepted.is_set() or not hmac.compare_digest(line.strip(), token.encode()):
            writer.close()
            return
        accepted.set()
        server.close()
        task = asyncio.current_task()
        assert task is not None
        _SERVED.add(task)
        try:
            await _pump(program, reader, writer)
        finally:
            _SERVED.discard(task)
            writer.close()  # first: a kill cut short by the loop's end still leaves no socket open
            await program.kill()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])

    async def expire() -> None:
        try:
            async with asyncio.timeout(ACCEPT_TIMEOUT):
                await accepted.wait()
        except TimeoutError:
            server.close()
            await program.kill()

    watch = asyncio.ensure_future(expire())
    _SERVED.add(watch)
    watch.add_done_callback(_SERVED.discard)
    return port, token


async def _pump(program: OpenProgram, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes both ways until the caller or the program closes its side."""

    async def up() -> None:
        while data := await reader.read(CHUNK):
            program.stdin.write(data)
            await program.stdin.drain()

    async def down() -> None:
        while data := await program.stdout.read(CHUNK):
            writer.write(data)
            await writer.drain()

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def connect_program(port: int, token: str, limit: int) -> SocketProgram:
    """The caller's end of ``serve_program``; ``limit``: bytes of one line its reader buffers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=limit)
    writer.write(token.encode() + b"\n")
    await writer.drain()
    return SocketProgram(reader, writer)
