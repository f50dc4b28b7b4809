"""A call to an MCP server carries the calling rollout's identity (``_meta``), so a server
shared by many rollouts knows whose call it serves: in process and through the tool server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from rollout_ray import ChatHarness, MCPToolset, Rollout, RolloutSession, Task, Trace, TraceTask
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.mcp_toolset import ROLLOUT_META
from rollout_ray._serving.tool_server import ToolServer
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedModel


@asynccontextmanager
async def recording_server() -> AsyncIterator[tuple[str, list[Any]]]:
    """An MCP server over HTTP (loopback) with one tool, ``whoami``, that keeps each call's
    ``_meta`` and answers it."""
    seen: list[Any] = []

    async def handle(request: web.Request) -> web.Response:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        method, params = message["method"], message.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "rec"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "whoami", "description": "Who calls.", "inputSchema": {"type": "object"}}]}
        else:
            seen.append(params.get("_meta"))
            result = {"content": [{"type": "text", "text": str((params.get("_meta") or {}).get(ROLLOUT_META))}]}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    app = web.Application()
    app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/mcp", seen
    finally:
        await runner.cleanup()


class WhoAmI(Task):
    url = ""

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [MCPToolset("rec", url=cls.url)]


def test_in_process_rollouts_calls_carry_their_trace_ids() -> None:
    async def main() -> tuple[list[Trace], list[Any]]:
        async with recording_server() as (url, seen):
            WhoAmI.url = url
            model = ScriptedModel(
                default=lambda r: "done" if r.messages[-1].role == "tool" else Reply(tool_calls=[("whoami", {})])
            )
            rollouts = [
                Rollout(WhoAmI({"prompt": "who?"}), ChatHarness(), model=model, runtime_factory=MemoryRuntime)
                for _ in range(3)
            ]
            traces = await asyncio.gather(*(r.run() for r in rollouts))
            await close_clients()
            return traces, seen

    traces, seen = asyncio.run(main())
    assert all(t.ok for t in traces)
    assert sorted(m[ROLLOUT_META] for m in seen) == sorted(t.id for t in traces)
    for trace in traces:  # each rollout's tool message is its own id, as the server saw it
        assert [m.content for m in trace.tool_messages] == [trace.id]


def test_calls_through_the_tool_server_carry_the_rollout_of_the_session() -> None:
    session = RolloutSession(Trace(task=TraceTask(type="T")), ScriptedModel())

    async def main() -> tuple[list[Any], str]:
        async with recording_server() as (url, seen):
            server = ToolServer(sessions=lambda secret: session if secret == "s1" else None)
            await server.start()
            try:
                async with (
                    server.serve([MCPToolset("rec", url=url)], None, "s1") as urls,
                    aiohttp.ClientSession() as http,
                ):
                    async with http.post(urls["rec"] + "/call", json={"name": "whoami", "arguments": {}}) as r:
                        answer = (await r.json())["content"]
            finally:
                await server.stop()
                await close_clients()
            return seen, answer

    seen, answer = asyncio.run(main())
    assert seen == [{ROLLOUT_META: session.trace.id}] and answer == session.trace.id
