"""Any MCP server as a task's tools (``MCPToolset``): the SDK's own server over HTTP and
stdio, served by the real ``ToolServer`` (natively and again as MCP) and in process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from mcp import Client
from servers import sdk_http_server, sdk_stdio_command

from rollout_ray import LocalRuntime, ToolCallRecord
from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
from rollout_ray._errors import ToolServerError
from rollout_ray._record.messages import ToolCall
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.mcp_toolset import MCPToolset
from rollout_ray._serving.tool_server import ToolServer, mcp_url


async def _native(http: aiohttp.ClientSession, url: str, name: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(f"{url}/call", json={"name": name, "arguments": arguments}) as r:
        return r.status, await r.json()


def test_http_mcp_server_served_by_the_node_tool_server_through_one_pool() -> None:
    async def main(url: str) -> None:
        server = ToolServer()
        await server.start()
        records: list[ToolCallRecord] = []
        try:
            async with aiohttp.ClientSession() as http:

                async def rollout(i: int) -> None:
                    async with server.serve(
                        [MCPToolset("calc", url=url, max_connections=4)], None, on_call=records.append
                    ) as urls:
                        async with http.get(urls["calc"]) as r:
                            listed = [t["function"]["name"] for t in (await r.json())["tools"]]
                            assert listed[:3] == ["add", "echo", "refuse"]
                        for j in range(5):
                            assert await _native(http, urls["calc"], "add", {"a": i, "b": j}) == (
                                200,
                                {"content": str(i + j)},
                            )
                        status, body = await _native(http, urls["calc"], "refuse", {"reason": "no"})
                        assert status == 200 and body["is_error"] and "no" in body["content"]

                await asyncio.gather(*(rollout(i) for i in range(40)))
                async with server.serve([MCPToolset("calc", url=url)], None) as urls:
                    # the task's MCP server, served again as MCP to an agent speaking MCP
                    async with Client(mcp_url(urls["calc"])) as client:
                        assert (await client.call_tool("echo", {"text": "hi"})).content[0].text == "hi"  # type: ignore[union-attr]
                    seen = await _native(http, urls["calc"], "connections", {})
            assert len(records) == 40 * 6 and sum(not r.ok for r in records) == 40
            # 241 calls and 41 rollouts, over at most max_connections (4) + 1 (the second pool) connections
            assert seen[0] == 200 and int(seen[1]["content"]) <= 5
        finally:
            await server.stop()
            await close_clients()

    with sdk_http_server() as (url, _):
        asyncio.run(main(url))


def test_http_mcp_server_restarted_is_reconnected_and_while_down_fails_named() -> None:
    async def main() -> None:
        with sdk_http_server() as (url, process):
            tools = MCPToolset("calc", url=url, timeout=20)
            await open_toolsets([tools], None)
            local = LocalTools([tools], None)
            assert (await local.call(ToolCall("1", "echo", {"text": "a"}))).content == "a"
            first_pid = (await local.call(ToolCall("2", "pid", {}))).content
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(ToolServerError, match="'calc'.*unreachable"):  # down: named, at once
            await local.call(ToolCall("3", "echo", {"text": "b"}))
        with sdk_http_server(port) as (same_url, _):
            assert same_url == url
            # the pooled connection and the MCP session died with the old process: both renewed
            assert (await local.call(ToolCall("4", "echo", {"text": "c"}))).content == "c"
            assert (await local.call(ToolCall("5", "pid", {}))).content != first_pid
        await close_clients()

    asyncio.run(main())


def test_stdio_mcp_server_started_once_per_runtime_and_stopped_with_its_last_rollout() -> None:
    async def main() -> None:
        command = sdk_stdio_command()
        r1, r2 = LocalRuntime(), LocalRuntime()
        await r1.start()
        await r2.start()
        runtimes = [r1, r1, r2]
        toolsets = [MCPToolset("calc", command=command, max_starting=1) for _ in runtimes]
        await asyncio.gather(*(open_toolsets([t], r) for t, r in zip(toolsets, runtimes)))
        pids = [(await LocalTools([t], None).call(ToolCall("1", "pid", {}))).content for t in toolsets]
        assert pids[0] == pids[1] != pids[2]
        assert (await LocalTools([toolsets[2]], None).call(ToolCall("2", "add", {"a": 2, "b": 2}))).content == "4"
        first = toolsets[0]._client.process  # type: ignore[union-attr]
        await close_toolsets(toolsets[:1])
        assert first.returncode is None  # the runtime's other rollout still holds it
        await close_toolsets(toolsets[1:])
        assert first.returncode is not None
        await close_clients()
        await r1.stop()
        await r2.stop()

    asyncio.run(main())


@pytest.mark.slow
def test_filesystem_server_from_npm(tmp_path: Any) -> None:
    """``@modelcontextprotocol/server-filesystem``, a server nobody here wrote, from the npm registry."""
    prefix = tmp_path / "npm"
    try:
        installed = subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(prefix),
                "--no-audit",
                "--no-fund",
                "@modelcontextprotocol/server-filesystem",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"npm cannot install @modelcontextprotocol/server-filesystem here: {e}")
    if installed.returncode != 0:
        pytest.skip(f"the npm registry is unreachable: {installed.stderr[-300:]}")
    binary = prefix / "node_modules" / ".bin" / "mcp-server-filesystem"
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the answer is 42\n")

    async def main() -> None:
        tools = MCPToolset("fs", command=[str(binary), str(data)], env={**os.environ}, timeout=60, start_timeout=60)
        await open_toolsets([tools], None)
        try:
            local = LocalTools([tools], None)
            names = {t.name for t in local.specs()}
            assert {"read_text_file", "write_file", "list_directory"} <= names
            read = await local.call(ToolCall("1", "read_text_file", {"path": str(data / "notes.txt")}))
            assert "the answer is 42" in read.content and read.error is None
            await local.call(ToolCall("2", "write_file", {"path": str(data / "out.txt"), "content": "hi"}))
            assert (data / "out.txt").read_text() == "hi"
            outside = await local.call(ToolCall("3", "read_text_file", {"path": "/etc/hostname"}))
            assert outside.error is not None  # the server's own refusal: the model sees it
        finally:
            await close_toolsets([tools])
            await close_clients()

    asyncio.run(main())


GATED_SERVER = r"""
import json, sys
# A minimal stdio MCP server that holds its `initialize` answer until the test opens the FIFO.
first = json.loads(sys.stdin.readline())
open(sys.argv[1]).read()
def answer(id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + "\n")
    sys.stdout.flush()
answer(first["id"], {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "gated"}})
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "tools/list":
        answer(message["id"], {"tools": [{"name": "noop", "inputSchema": {"type": "object"}}]})
"""


def test_stdio_servers_start_at_most_max_starting_at_once(tmp_path: Any) -> None:
    from rollout_ray._serving.mcp_pool import _pool

    gate = tmp_path / "gate"
    os.mkfifo(gate)

    async def release_one() -> None:  # returns once a server opened the gate: it then answers
        await asyncio.to_thread(lambda: os.close(os.open(gate, os.O_WRONLY)))

    async def processes() -> list[Any]:
        return [c.process for c, _ in _pool().stdio.values()]

    async def main() -> None:
        toolsets = [
            MCPToolset("gated", command=[sys.executable, "-c", GATED_SERVER, str(gate)], max_starting=1)
            for _ in range(2)
        ]
        runtimes = [LocalRuntime(), LocalRuntime()]
        for runtime in runtimes:
            await runtime.start()
        try:
            opening = [asyncio.ensure_future(open_toolsets([t], r)) for t, r in zip(toolsets, runtimes)]
            async with asyncio.timeout(30):
                while sum(p is not None for p in await processes()) == 0:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # a window for a second start to show were the limit broken (not a wait)
                assert sum(p is not None for p in await processes()) == 1  # the other waits its turn
                await release_one()
                while sum(p is not None for p in await processes()) < 2:
                    await asyncio.sleep(0.01)
                await release_one()
                await asyncio.gather(*opening)
            assert [t.name for ts in toolsets for t in ts.specs()] == ["noop", "noop"]
        finally:
            await close_toolsets(toolsets)
            await close_clients()  # kills the servers still held at the gate, if any
            for runtime in runtimes:
                await runtime.stop()

    asyncio.run(main())


ENV_SERVER = """
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "e", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "env", "inputSchema": {"type": "object"}}]}
    else:
        seen = {"cwd": os.getcwd(), "files": os.listdir("."), "env": dict(os.environ)}
        r = {"content": [{"type": "text", "text": json.dumps(seen)}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"""


def test_stdio_server_sees_no_host_secret_nor_the_tool_servers_directory(monkeypatch: Any, tmp_path: Any) -> None:
    """Security review F3: a stdio server of a rollout without a runtime runs on the host,
    unsandboxed; a secret of the tool server's environment must not reach it (nor, through its
    results, a rollout)."""
    import json

    monkeypatch.setenv("HOST_SECRET", "sk-host-do-not-leak")
    (tmp_path / "host-file").write_text("x")
    monkeypatch.chdir(tmp_path)

    async def main() -> None:
        bare = MCPToolset("envs", command=[sys.executable, "-c", ENV_SERVER])  # env=None: was all of the host's
        given = MCPToolset("envs", command=[sys.executable, "-c", ENV_SERVER], env={"GIVEN": "1"})
        await open_toolsets([bare], None)
        await open_toolsets([given], None)
        try:
            seen, seen_given = [
                json.loads((await LocalTools([t], None).call(ToolCall("1", "env", {}))).content) for t in (bare, given)
            ]
        finally:
            await close_toolsets([bare, given])
            await close_clients()
        assert "HOST_SECRET" not in seen["env"]
        assert seen["env"].get("PATH") == os.environ.get("PATH")
        allowed = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LC_CTYPE"}  # LC_CTYPE: Python's own
        assert set(seen["env"]) <= allowed  # locale coercion (PEP 538) in the server
        assert seen_given["env"]["GIVEN"] == "1" and "HOST_SECRET" not in seen_given["env"]
        assert seen["cwd"] != str(tmp_path) and seen["files"] == []
        assert not os.path.exists(seen["cwd"])  # its scratch directory went with it

    asyncio.run(main())


def test_runtime_less_rollouts_do_not_share_a_stdio_server() -> None:
    """Security review F3: with no runtime (a ChatHarness rollout), every rollout of the process
    got the one server keyed on ``None``: each saw the others' server state and files."""

    async def main() -> None:
        toolsets = [MCPToolset("calc", command=sdk_stdio_command()) for _ in range(2)]
        try:
            for t in toolsets:
                await open_toolsets([t], None)
            pids = [(await LocalTools([t], None).call(ToolCall("1", "pid", {}))).content for t in toolsets]
            assert pids[0] != pids[1]
        finally:
            await close_toolsets(toolsets)
            await close_clients()

    asyncio.run(main())
