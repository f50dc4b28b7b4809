"""A stdio MCP server runs IN its rollout's runtime (``Runtime.open_program``): a sandboxed
rollout's server sees the sandbox's filesystem and environment, not the host's; through a
runtime actor (``RuntimeHost.open_program``: a loopback bridge) as well as in process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from rollout_ray import SandboxRuntime
from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
from rollout_ray._errors import ToolServerError
from rollout_ray._record.messages import ToolCall
from rollout_ray._runtimes.host import RuntimeHost
from rollout_ray._runtimes.open_program import connect_program
from rollout_ray._runtimes.sandbox import sandbox_unavailable
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.mcp_toolset import MCPToolset

pytestmark = pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))

LOOK_SERVER = """
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "l", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "look", "inputSchema": {"type": "object"}}]}
    else:
        path = m["params"]["arguments"]["path"]
        seen = {"cwd": os.getcwd(), "files": sorted(os.listdir(".")), "host_file": os.path.exists(path),
                "env": sorted(os.environ), "pid": os.getpid()}
        r = {"content": [{"type": "text", "text": json.dumps(seen)}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"""


async def _look(tools: MCPToolset, host_file: str) -> dict[str, Any]:
    result = await LocalTools([tools], None).call(ToolCall("1", "look", {"path": host_file}))
    assert result.error is None, result.content
    return json.loads(result.content)  # type: ignore[no-any-return]


def test_a_stdio_server_runs_in_the_sandbox_and_sees_its_files_not_the_hosts(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("HOST_SECRET", "sk-host-do-not-leak")
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("the host's")

    async def main() -> None:
        box = SandboxRuntime()
        await box.start()
        try:
            await box.write("inside.txt", "the sandbox's")
            tools = MCPToolset("look", command=[sys.executable, "-c", LOOK_SERVER], env={"GIVEN": "1"})
            await open_toolsets([tools], box)
            try:
                seen = await _look(tools, str(host_file))
            finally:
                await close_toolsets([tools])
            assert seen["host_file"] is False  # the host's /tmp is not the sandbox's
            assert "inside.txt" in seen["files"] and seen["cwd"] == box.workdir
            assert "GIVEN" in seen["env"] and "HOST_SECRET" not in seen["env"]
            assert seen["pid"] < 100  # its own PID namespace: the host's PIDs are far higher here
        finally:
            await close_clients()
            await box.stop()

    asyncio.run(main())


def test_a_runtime_hosts_stdio_server_is_reached_over_its_loopback_bridge_and_dies_with_it(tmp_path: Any) -> None:
    """The runtime actor's path without Ray: ``RuntimeHost.open_program`` holds the program
    open in the host's process and serves it on loopback; the caller's toolset reaches it;
    the runtime's stop ends it, and the next request names the server."""
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("x")

    async def main() -> None:
        host = RuntimeHost(kind="sandbox")
        try:
            await host.create_started("r1")
            port, token = await host.open_program("r1", [sys.executable, "-c", LOOK_SERVER])
            wrong = await asyncio.open_connection("127.0.0.1", port)  # a caller without the token
            wrong[1].write(b"guess\n")
            assert await wrong[0].read() == b""  # refused: closed
            wrong[1].close()
            program = await connect_program(port, token, 1 << 20)
            request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            program.stdin.write(json.dumps(request).encode() + b"\n")
            assert json.loads(await program.stdout.readline())["result"]["serverInfo"]["name"] == "l"
            await program.kill()  # closing the connection kills the program
            await host.stop("r1")
        finally:
            await host.shutdown()

    asyncio.run(main())


def test_a_runtime_that_stops_under_its_server_fails_the_next_call_named(tmp_path: Any) -> None:
    async def main() -> None:
        box = SandboxRuntime()
        await box.start()
        tools = MCPToolset("look", command=[sys.executable, "-c", LOOK_SERVER], timeout=30)
        try:
            await open_toolsets([tools], box)
            await _look(tools, "/")
            await box.stop()  # kills every program of the box, its server too
            with pytest.raises(ToolServerError, match="tool server 'look'"):
                await LocalTools([tools], None).call(ToolCall("2", "look", {"path": "/"}))
        finally:
            await close_toolsets([tools])
            await close_clients()
            await box.stop()

    asyncio.run(main())


def _npm_install(prefix: Any) -> None:
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


@pytest.mark.slow
def test_the_npm_filesystem_server_runs_in_the_sandbox(tmp_path: Any) -> None:
    """``@modelcontextprotocol/server-filesystem`` (from the npm registry) started in a sandbox
    serves the sandbox's work directory: it reads what the rollout's box holds, and a host
    file outside it does not exist for it."""
    (tmp_path / "host-only.txt").write_text("the host's")

    async def main() -> None:
        box = SandboxRuntime()
        await box.start()
        try:
            # installed on the host, then put in the box as a task's setup would: files written
            # through the runtime (the sandbox sees none of the host's /tmp)
            prefix = tmp_path / "npm"
            _npm_install(prefix)
            for path in sorted((prefix / "node_modules").rglob("*")):
                if path.is_file() and not path.is_symlink():
                    await box.write(str(path.relative_to(prefix)), path.read_bytes())
            await box.write("data/notes.txt", "the answer is 42\n")
            entry = "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
            tools = MCPToolset("fs", command=["node", entry, f"{box.workdir}/data"], timeout=60, start_timeout=60)
            await open_toolsets([tools], box)
            try:
                local = LocalTools([tools], None)
                read = await local.call(ToolCall("1", "read_text_file", {"path": f"{box.workdir}/data/notes.txt"}))
                assert "the answer is 42" in read.content and read.error is None
                await local.call(ToolCall("2", "write_file", {"path": f"{box.workdir}/data/out.txt", "content": "hi"}))
                assert await box.read("data/out.txt") == b"hi"
                listed = await local.call(ToolCall("3", "list_allowed_directories", {}))
                assert f"{box.workdir}/data" in listed.content
                outside = await local.call(ToolCall("4", "read_text_file", {"path": str(tmp_path / "host-only.txt")}))
                assert outside.error is not None and "the host's" not in outside.content
            finally:
                await close_toolsets([tools])
        finally:
            await close_clients()
            await box.stop()

    asyncio.run(main())


def test_a_server_script_on_the_host_is_shipped_with_files_and_one_left_there_is_named(tmp_path: Any) -> None:
    """A sandbox sees no checkout: a script on the host does not exist there (the server exits
    before serving, and the error says where to look); shipped with ``files=`` it serves."""
    script = tmp_path / "look_server.py"
    script.write_text(LOOK_SERVER)

    async def main() -> None:
        box = SandboxRuntime()
        await box.start()
        try:
            left = MCPToolset("look", command=[sys.executable, str(script)], start_timeout=30)
            with pytest.raises(
                ToolServerError,
                match=r"(exited with code 2|closed its stdout) before serving, in runtime .* ship a script",
            ):
                await open_toolsets([left], box)
            shipped = MCPToolset("look", command=[sys.executable, "look.py"], files={"look.py": LOOK_SERVER})
            await open_toolsets([shipped], box)
            try:
                assert "look.py" in (await _look(shipped, "/"))["files"]
            finally:
                await close_toolsets([shipped])
        finally:
            await close_clients()
            await box.stop()

    asyncio.run(main())
