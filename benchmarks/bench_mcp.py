#!/usr/bin/env python
"""What does an MCP tool call cost at the node, beside a native ``Toolset`` call? And do 500
rollouts in flight over one shared MCP server drop any call?

This process is the node's tool server (``ToolServer``) and the agents' HTTP client (the
same client for every row); the external MCP server (the official SDK's ``MCPServer``,
``tests/mcp_tools/sdk_server.py``) runs in its own process and its CPU is not counted. Rows,
each ``add(a, b)`` called N times, C at once:

* ``native``: ``POST <url>/call`` to a native ``Toolset`` (the floor);
* ``native over MCP``: the same toolset through the tool server's MCP route (an agent that
  speaks MCP: ``tools/call`` JSON-RPC to ``<url>/mcp``);
* ``MCPToolset http``: ``POST <url>/call`` to an ``MCPToolset`` whose server is the SDK
  server over streamable HTTP (through this process's one client of it);
* ``MCPToolset stdio``: the same, the SDK server over stdio (one process).

CPU ms per call of this process, and calls per second (wall); the stdio server also run in a
sandbox (``stdio in sandbox``: inside the rollout's runtime, as a sandboxed rollout's is). ``--inflight R``: R rollouts
registered at once, each making 4 calls to the shared HTTP MCP server; prints failed calls
and the TCP connections the server saw.

    python benchmarks/bench_mcp.py                 # N=2000, C=32
    python benchmarks/bench_mcp.py --inflight 500
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import subprocess
import sys
import time
from typing import Any

import aiohttp

from rollout_ray import MCPToolset, SandboxRuntime, ToolServer, Toolset, tool
from rollout_ray._runtimes.sandbox import sandbox_unavailable
from rollout_ray._serving.mcp_pool import close_clients

SERVER = pathlib.Path(__file__).resolve().parents[1] / "tests" / "mcp_tools" / "sdk_server.py"


class Calc(Toolset):
    name = "calc"

    @tool
    def add(self, a: int, b: int) -> int:
        return a + b


async def _calls(n: int, c: int, call: Any) -> tuple[float, float]:
    """CPU ms per call of this process and calls per second, ``n`` calls ``c`` at once."""
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await call(i)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    return (time.process_time() - cpu) * 1e3 / n, n / (time.perf_counter() - wall)


async def rows(url: str, n: int, c: int) -> None:
    # one rollout makes all C calls at once: its share of calls in flight is raised to C
    async with ToolServer(max_requests_per_rollout=c) as server, aiohttp.ClientSession() as http:

        async def native(tool_url: str) -> Any:
            async def call(i: int) -> None:
                async with http.post(f"{tool_url}/call", json={"name": "add", "arguments": {"a": i, "b": 1}}) as r:
                    assert (await r.json())["content"] == str(i + 1), await r.text()

            return call

        async def over_mcp(tool_url: str) -> Any:
            async def call(i: int) -> None:
                body = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "add", "arguments": {"a": i, "b": 1}},
                }
                async with http.post(f"{tool_url}/mcp", json=body) as r:
                    assert (await r.json())["result"]["content"][0]["text"] == str(i + 1)

            return call

        print(f"N={n} calls, C={c} at once; CPU of this process (the node's tool server and the agents' client)")
        print(f"| {'row':<18} | CPU ms / call | calls / s |")
        print(f"| {'-' * 18} | ---: | ---: |")
        stdio = [sys.executable, str(SERVER), "stdio"]
        box = SandboxRuntime() if sandbox_unavailable() is None else None
        if box is not None:  # the sandbox sees no checkout: its server file goes in as a task's would
            await box.start()
            await box.write("sdk_server.py", SERVER.read_bytes())
        cases: list[tuple[str, list[Any], Any, Any]] = [
            ("native", [Calc()], native, None),
            ("native over MCP", [Calc()], over_mcp, None),
            ("MCPToolset http", [MCPToolset("calc", url=url)], native, None),
            ("MCPToolset stdio", [MCPToolset("calc", command=stdio)], native, None),
        ]
        if box is not None:  # the server in the rollout's sandbox (its pipes are the sandbox's)
            in_box = [sys.executable, "sdk_server.py", "stdio"]
            cases.append(("stdio in sandbox", [MCPToolset("calc", command=in_box)], native, box))
        for label, toolsets, make, runtime in cases:
            async with server.serve(toolsets, runtime) as urls:
                call = await make(urls["calc"])
                await _calls(min(200, n), c, call)  # warm-up
                cpu, rate = await _calls(n, c, call)
            print(f"| {label:<18} | {cpu:.3f} | {rate:,.0f} |")
        await close_clients()
        if box is not None:
            await box.stop()


async def inflight(url: str, rollouts: int) -> None:
    async with (
        ToolServer(max_requests_per_rollout=8) as server,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
    ):
        failed, done = 0, 0
        everyone_in = asyncio.Barrier(rollouts)

        async def rollout(k: int) -> None:
            nonlocal failed, done
            async with server.serve([MCPToolset("calc", url=url)], None) as urls:
                await everyone_in.wait()  # all R registered and in flight before any call
                for j in range(4):
                    async with http.post(
                        f"{urls['calc']}/call", json={"name": "add", "arguments": {"a": k, "b": j}}
                    ) as r:
                        ok = r.status == 200 and (await r.json()).get("content") == str(k + j)
                    failed += not ok
                    done += 1

        wall = time.perf_counter()
        await asyncio.gather(*(rollout(k) for k in range(rollouts)))
        wall = time.perf_counter() - wall
        async with server.serve([MCPToolset("calc", url=url)], None) as urls:
            async with http.post(f"{urls['calc']}/call", json={"name": "connections"}) as r:
                connections = (await r.json())["content"]
        await close_clients()
    print(
        f"{rollouts} rollouts in flight, {done} calls to one MCP server: {failed} failed, "
        f"{connections} TCP connections at the server, {wall:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("-c", type=int, default=32)
    parser.add_argument("--inflight", type=int, default=0)
    args = parser.parse_args()
    process = subprocess.Popen([sys.executable, str(SERVER), "http"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/mcp"
        asyncio.run(inflight(url, args.inflight) if args.inflight else rows(url, args.n, args.c))
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


if __name__ == "__main__":
    main()
