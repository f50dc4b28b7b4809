"""Bad MCP servers (dead, dying, hung, garbage, 100 MiB) fail the rollout that uses them with
a ``ToolServerError`` naming the server, within a bound; nothing else fails.

The HTTP ones are real aiohttp servers on loopback that do the MCP handshake properly and
then misbehave on ``tools/call``; the stdio ones are real processes.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, ClassVar

import aiohttp
import pytest
from servers import bad_http_server

from rollout_ray import LocalRuntime, Rollout, Task, ToolServer, Trace
from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
from rollout_ray._core.toolset import Toolset, tool
from rollout_ray._errors import ToolServerError
from rollout_ray._harnesses.chat import ChatHarness
from rollout_ray._record.messages import ToolCall
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.mcp_toolset import MCPToolset
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel


def _closed_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Native(Toolset):
    name = "native"

    @tool
    def add(self, a: int, b: int) -> int:
        return a + b


@pytest.mark.parametrize(
    "behaviour,message",
    [
        ("hang", "no answer within 0.5s"),
        ("garbage", "not JSON"),
        ("not-jsonrpc", "not the JSON-RPC response"),
        ("huge", "bytes of max_message"),
        ("huge-stream", "bytes of max_message"),
    ],
)
def test_a_bad_http_server_fails_its_call_named_and_bounded_and_nothing_else(behaviour: str, message: str) -> None:
    async def main() -> None:
        server = ToolServer()
        await server.start()
        try:
            async with bad_http_server(behaviour) as (url, _), aiohttp.ClientSession() as http:
                # only the hung one is failed by time; the others must fail by what they send
                bad = MCPToolset("flaky", url=url, timeout=0.5 if behaviour == "hang" else 60)
                async with server.serve([bad, Native()], None) as urls, server.serve([Native()], None) as other:
                    async with http.post(f"{urls['flaky']}/call", json={"name": "go"}) as r:
                        assert r.status == 502
                        error = (await r.json())["error"]
                        assert error.startswith("tool server 'flaky': ") and message in error
                    for where in (urls, other):  # the rollout's other toolset, another rollout's
                        async with http.post(
                            f"{where['native']}/call", json={"name": "add", "arguments": {"a": 1, "b": 1}}
                        ) as r:
                            assert (r.status, await r.json()) == (200, {"content": "2"})
        finally:
            await server.stop()
            await close_clients()

    asyncio.run(main())


def test_an_unreachable_http_server_fails_the_open_named() -> None:
    async def main() -> None:
        server = ToolServer()
        await server.start()
        try:
            with pytest.raises(ToolServerError, match=r"tool server 'gone': unreachable at http://127\.0\.0\.1"):
                async with server.serve([MCPToolset("gone", url=f"http://127.0.0.1:{_closed_port()}/mcp")], None):
                    pass
            assert server._registrations == {}
        finally:
            await server.stop()
            await close_clients()

    asyncio.run(main())


STDIO_BAD = {
    "exits": ("import sys; sys.exit(5)", r"exited with code 5|closed its stdout"),
    "garbage": ("print('hello, I am not MCP', flush=True); import sys; sys.stdin.read()", "not JSON"),
    "huge": (
        "import sys; sys.stdout.write('x' * (100 << 20) + '\\n'); sys.stdout.flush(); sys.stdin.read()",
        "over the 16777216 bytes of max_message",
    ),
    "hangs": ("import sys; sys.stdin.read()", "no answer within 0.5s"),
}


@pytest.mark.parametrize("kind", list(STDIO_BAD))
def test_a_bad_stdio_server_fails_the_open_named_and_bounded(kind: str) -> None:
    code, message = STDIO_BAD[kind]

    async def main() -> None:
        bound = 0.5 if kind == "hangs" else 60
        bad = MCPToolset("box", command=[sys.executable, "-c", code], start_timeout=bound, timeout=bound)
        with pytest.raises(ToolServerError, match=f"tool server 'box': .*({message})"):
            await open_toolsets([Native(), bad], None)
        local = LocalTools([Native()], None)  # the process's other tools are untouched
        assert (await local.call(ToolCall("1", "add", {"a": 2, "b": 2}))).content == "4"
        await close_clients()

    asyncio.run(main())


def test_a_stdio_server_that_dies_mid_call_fails_that_call_named() -> None:
    async def main() -> None:
        from servers import sdk_stdio_command

        tools = MCPToolset("calc", command=sdk_stdio_command())
        await open_toolsets([tools], None)
        local = LocalTools([tools], None)
        assert (await local.call(ToolCall("1", "echo", {"text": "up"}))).content == "up"
        with pytest.raises(ToolServerError, match=r"tool server 'calc': (exited with code 3|closed its stdout)"):
            await local.call(ToolCall("2", "die", {}))
        # the next call starts it again (once per runtime, on demand)
        assert (await local.call(ToolCall("3", "echo", {"text": "again"}))).content == "again"
        await close_toolsets([tools])
        await close_clients()

    asyncio.run(main())


class HungShop(Task):
    url: ClassVar[str] = ""

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [MCPToolset("shop", url=cls.url, timeout=0.5)]


@pytest.mark.parametrize("transport", ["inprocess", "http"])
def test_the_rollout_fails_with_the_servers_toolset_error(transport: Any) -> None:
    async def main() -> Trace:
        async with bad_http_server("hang") as (url, _):
            HungShop.url = url
            model = ScriptedModel([Reply(tool_calls=[("go", {})]), "done"])
            harness = ChatHarness(transport=transport)
            async with HTTPInterception() as proxy, ToolServer(sessions=proxy.session_of_state) as tools:
                rollout = Rollout(
                    HungShop({"prompt": "buy"}),
                    harness,
                    model=model,
                    interception=None if harness.in_process else proxy,
                    tool_server=tools.serve,
                    runtime_factory=LocalRuntime,
                )
                trace = await rollout.run()
            await close_clients()
            return trace

    trace = asyncio.run(main())
    assert not trace.ok
    assert [(r.server, r.name, r.ok) for r in trace.tool_calls] == [("shop", "go", False)]
    assert "tool server 'shop': no answer within 0.5s" in (trace.tool_calls[0].error or "")
    # in process the rollout gets the ToolServerError itself; an agent over HTTP gets a 502
    # naming the server and stops, and the rollout's error is still the server's (stashed)
    assert [e.type for e in trace.errors] == ["ToolServerError"]
    assert "tool server 'shop': no answer within 0.5s" in trace.errors[0].message
