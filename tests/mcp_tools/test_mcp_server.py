"""A task's Toolset served as an MCP server, spoken to by the official ``mcp`` SDK client.

The client is the one agents use (``mcp`` on PyPI); the server is the real ``ToolServer`` on
loopback. Both eras of the protocol are exercised: the stateless one (``server/discover``,
per-request ``_meta``) the client picks by default, and the ``initialize`` handshake.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from rollout_ray import ToolCallRecord
from rollout_ray._core.toolset import Toolset, tool
from rollout_ray._serving.tool_server import ToolServer, mcp_url


class Shop(Toolset):
    name = "shop"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def basket(self, items: list[str]) -> dict[str, Any]:
        """Count the items."""
        return {"items": items, "count": len(items)}

    @tool
    def greet(self, who: str) -> str:
        return f"hello {who}"

    @tool
    def fail(self, reason: str) -> str:
        raise ValueError(reason)

    @tool
    async def hold(self) -> str:
        self.entered.set()
        await self.release.wait()
        return "released"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_mcp_client_lists_and_calls_the_task_tools(mode: str) -> None:
    async def main() -> None:
        records: list[ToolCallRecord] = []
        server = ToolServer()
        await server.start()
        try:
            async with server.serve([Shop()], None, on_call=records.append) as urls:
                async with Client(mcp_url(urls["shop"]), mode=mode) as client:  # type: ignore[arg-type]
                    listed = await client.list_tools()
                    assert [t.name for t in listed.tools] == ["add", "basket", "greet", "fail", "hold"]
                    add = listed.tools[0]
                    assert add.description == "Add two integers."
                    assert add.input_schema["required"] == ["a", "b"]

                    result = await client.call_tool("add", {"a": 2, "b": 3})
                    assert not result.is_error and result.content[0].text == "5"  # type: ignore[union-attr]
                    assert result.structured_content == {"result": 5}
                    result = await client.call_tool("basket", {"items": ["x", "y"]})
                    assert result.structured_content == {"items": ["x", "y"], "count": 2}
                    result = await client.call_tool("greet", {"who": "ann"})
                    assert result.content[0].text == "hello ann" and result.structured_content is None  # type: ignore[union-attr]

                    result = await client.call_tool("fail", {"reason": "out of stock"})
                    assert result.is_error and "out of stock" in result.content[0].text  # type: ignore[union-attr]
                    result = await client.call_tool("add", {"a": "two"})  # bad arguments: the model sees them
                    assert result.is_error and "invalid arguments for tool 'add'" in result.content[0].text  # type: ignore[union-attr]
                    with pytest.raises(MCPError) as unknown:
                        await client.call_tool("refund", {})
                    assert unknown.value.error.code == -32602 and "unknown tool 'refund'" in unknown.value.error.message
        finally:
            await server.stop()
        assert [(r.server, r.name, r.ok) for r in records] == [
            ("shop", "add", True),
            ("shop", "basket", True),
            ("shop", "greet", True),
            ("shop", "fail", False),
            ("shop", "add", False),
            ("shop", "refund", False),
        ]  # as the native route

    asyncio.run(main())


def test_bearer_token_route_and_its_refusals() -> None:
    async def main() -> None:
        server = ToolServer()
        base = await server.start()
        try:
            async with server.serve([Shop()], None) as urls:
                token = urls["shop"].split("/t/")[1].split("/")[0]
                headers = {"Authorization": f"Bearer {token}"}
                async with httpx2.AsyncClient(headers=headers) as http:
                    transport = streamable_http_client(f"{base}/mcp/shop", http_client=http)
                    async with Client(transport) as client:
                        assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content == {"result": 2}
                async with aiohttp.ClientSession() as http:
                    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
                    async with http.post(f"{base}/mcp/shop", json=ping) as r:  # no token
                        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
                    async with http.post(f"{base}/mcp/shop", json=ping, headers={"Authorization": "Bearer nope"}) as r:
                        assert r.status == 401
                    async with http.post(f"{base}/mcp/other", json=ping, headers=headers) as r:
                        assert r.status == 404
                    async with http.get(f"{base}/mcp/shop", headers=headers) as r:  # stateless: no stream
                        assert r.status == 405
                    async with http.post(f"{base}/mcp/shop", data=b"{nope", headers=headers) as r:
                        assert r.status == 400 and (await r.json())["error"]["code"] == -32700
                    async with http.post(f"{base}/mcp/shop", json=[ping], headers=headers) as r:
                        assert r.status == 400 and (await r.json())["error"]["code"] == -32600
                    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                    async with http.post(f"{base}/mcp/shop", json=note, headers=headers) as r:
                        assert r.status == 202
                    other = {"jsonrpc": "2.0", "id": 2, "method": "resources/list"}
                    async with http.post(f"{base}/mcp/shop", json=other, headers=headers) as r:
                        assert (await r.json())["error"]["code"] == -32601
            async with aiohttp.ClientSession() as http:  # the rollout ended: its token is dead
                async with http.post(f"{base}/mcp/shop", json=ping, headers=headers) as r:
                    assert r.status == 401
        finally:
            await server.stop()

    asyncio.run(main())


def test_mcp_calls_share_the_rollouts_bound_on_calls_in_flight() -> None:
    async def main() -> None:
        server = ToolServer(max_requests_per_rollout=1)
        await server.start()
        shop = Shop()
        try:
            async with server.serve([shop], None) as urls, aiohttp.ClientSession() as http:
                url = mcp_url(urls["shop"])
                call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hold"}}
                held = asyncio.ensure_future(http.post(url, json=call))
                await asyncio.wait_for(shop.entered.wait(), 30)
                second = {**call, "id": 2, "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}
                async with http.post(url, json=second) as r:
                    assert r.status == 429
                    assert "in flight" in (await r.json())["error"]["message"]
                async with http.post(f"{urls['shop']}/call", json={"name": "add", "arguments": {"a": 1, "b": 2}}) as r:
                    assert r.status == 429  # the native route counts against the same share
                shop.release.set()
                async with await held as r:
                    assert (await r.json())["result"]["content"][0]["text"] == "released"
        finally:
            await server.stop()

    asyncio.run(main())
