"""An MCP server built on the official SDK (``mcp.server.mcpserver.MCPServer``), for the tests.

``python sdk_server.py http``: streamable HTTP (stateful, the SDK's default) on a loopback
port it picks and prints first (``PORT <n>``); ``python sdk_server.py http <port>`` binds that
port (a restart). ``python sdk_server.py stdio``: over stdin/stdout. Its ``connections`` tool
says how many TCP connections (distinct client ports) reached it; ``whoami`` whose call it
serves (the rollout in the call's ``_meta``, the request's ``Authorization``); ``hang`` never
answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("calc")
_clients: set[tuple[str, int]] = set()


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def echo(text: str) -> str:
    """Say it back."""
    return text


@app.tool()
def refuse(reason: str) -> str:
    """Always fails."""
    raise ToolError(reason)  # the SDK shows the model a ToolError's message (it hides others)


@app.tool()
def connections() -> int:
    """TCP connections this server has seen."""
    return len(_clients)


@app.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@app.tool()
def whoami(ctx: Context) -> str:
    """Whose call this is."""
    meta = dict(ctx.request_context.meta or {})
    bearer = (ctx.headers or {}).get("authorization")
    return json.dumps({"rollout": meta.get("rollout-ray/rollout"), "authorization": bearer})


@app.tool()
async def hang() -> str:
    """Never answers (a hung tool)."""
    await asyncio.Event().wait()
    return "never"


@app.tool()
def die() -> str:
    """Exit the server at once, mid-call."""
    os._exit(3)


def _counting(inner):  # an ASGI middleware: each connection is a distinct client (host, port)
    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope.get("client"):
            _clients.add(tuple(scope["client"]))
        await inner(scope, receive, send)

    return wrapped


def main() -> None:
    if sys.argv[1] == "stdio":
        app.run("stdio")
        return
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0))
    sock.listen(512)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(_counting(app.streamable_http_app()), log_level="warning")
    asyncio.run(uvicorn.Server(config).serve([sock]))


if __name__ == "__main__":
    main()
