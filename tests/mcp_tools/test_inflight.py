"""500 rollouts in flight over one shared MCP server (the SDK's, a real process), served by
the real ``ToolServer``: every call answered right, none dropped (prime-rl#3084 dropped
connections at 512 in flight), over a bounded pool of connections."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest
from servers import SDK_SERVER

from rollout_ray import SharedToolServer, ToolCallRecord, ToolServer
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.shared_server import stop_shared_servers

ROLLOUTS = 500
CALLS = 2
MAX_CONNECTIONS = 32


@pytest.mark.slow
def test_500_rollouts_in_flight_over_one_shared_mcp_server_drop_no_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_RAY_SHARED_DIR", str(tmp_path))
    command = [sys.executable, str(SDK_SERVER), "http", "{port}"]

    async def main() -> None:
        records: list[list[ToolCallRecord]] = [[] for _ in range(ROLLOUTS)]
        answers: list[tuple[int, str]] = []
        everyone_in = asyncio.Barrier(ROLLOUTS)
        async with (
            ToolServer(max_requests_per_rollout=8) as server,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
        ):

            async def rollout(k: int) -> None:
                toolset = SharedToolServer("calc", command, max_connections=MAX_CONNECTIONS)
                async with server.serve([toolset], None, on_call=records[k].append) as urls:
                    await everyone_in.wait()  # all registered and in flight before any call
                    for j in range(CALLS):
                        arguments = {"a": k, "b": j}
                        async with http.post(f"{urls['calc']}/call", json={"name": "add", "arguments": arguments}) as r:
                            answers.append((r.status, (await r.json()).get("content")))
                        assert answers[-1] == (200, str(k + j)), answers[-1]

            try:
                await asyncio.gather(*(rollout(k) for k in range(ROLLOUTS)))
                async with server.serve([SharedToolServer("calc", command)], None) as urls:
                    async with http.post(f"{urls['calc']}/call", json={"name": "connections"}) as r:
                        connections = int((await r.json())["content"])
            finally:
                await close_clients()
                await stop_shared_servers()
        assert len(answers) == ROLLOUTS * CALLS and all(status == 200 for status, _ in answers)
        assert all([(c.name, c.ok) for c in calls] == [("add", True)] * CALLS for calls in records)
        assert 1 <= connections <= MAX_CONNECTIONS  # one pool for the node, never one per call

    asyncio.run(main())
