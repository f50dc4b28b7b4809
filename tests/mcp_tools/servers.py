"""MCP servers for the tests, each a real process on loopback, stopped by its PID."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

SDK_SERVER = pathlib.Path(__file__).with_name("sdk_server.py")
HUNDRED_MIB = 100 << 20


@contextlib.contextmanager
def sdk_http_server(port: int | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The SDK server over streamable HTTP: its URL and process (killed on exit)."""
    args = [sys.executable, str(SDK_SERVER), "http", *([str(port)] if port else [])]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens: connections queue
        assert line.startswith("PORT "), f"the SDK server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp", process
    finally:
        process.kill()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def sdk_stdio_command() -> list[str]:
    return [sys.executable, str(SDK_SERVER), "stdio"]


@asynccontextmanager
async def bad_http_server(behaviour: str, tool: str = "go") -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An MCP server that lists one tool, ``tool`` (of two integers ``a``, ``b``), and answers
    its call as ``behaviour`` says."""
    release = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        result: dict[str, Any] = {}
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "bad"}}
        elif message["method"] == "tools/list":
            schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
            result = {"tools": [{"name": tool, "description": "Add two integers.", "inputSchema": schema}]}
        elif behaviour == "hang":
            await release.wait()
        elif behaviour == "garbage":
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        elif behaviour == "not-jsonrpc":
            return web.json_response({"hello": "world"})
        elif behaviour == "huge":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            chunk = b" " * (1 << 20)
            try:
                for _ in range(HUNDRED_MIB // len(chunk)):
                    await response.write(chunk)
            except (ConnectionError, RuntimeError):
                pass  # the client hung up at its bound, as it should
            return response
        elif behaviour == "huge-stream":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            try:  # one 100 MiB event, in 1 MiB writes
                await response.write(b"data: ")
                for _ in range(HUNDRED_MIB >> 20):
                    await response.write(b"x" * (1 << 20))
            except (ConnectionError, RuntimeError):
                pass
            return response
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    app = web.Application()
    app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", release
    finally:
        release.set()
        await runner.cleanup()
