"""A taskset's shared tool server (the SDK's MCP server over HTTP, a real process): started once
per node for every rollout and process that needs it, restarted when it dies, stopped with the
process that started it; each rollout's calls stay its own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from servers import SDK_SERVER

from rollout_ray import SharedToolServer, ToolCallRecord
from rollout_ray._core.tools import LocalTools, close_toolsets, open_toolsets
from rollout_ray._errors import ToolsetError
from rollout_ray._record.messages import ToolCall
from rollout_ray._serving.mcp_pool import close_clients
from rollout_ray._serving.shared_server import stop_shared_servers

from conftest import process_alive, wait_exit

COMMAND = [sys.executable, str(SDK_SERVER), "http", "{port}"]

OTHER_PROCESS = """
import asyncio, sys
from rollout_ray import SharedToolServer
from rollout_ray._core.tools import LocalTools, open_toolsets
from rollout_ray._record.messages import ToolCall

async def main():
    toolset = SharedToolServer("calc", sys.argv[1:])
    await open_toolsets([toolset], None)
    print((await LocalTools([toolset], None).call(ToolCall("1", "pid", {}))).content, flush=True)

asyncio.run(main())
"""


@pytest.fixture
def shared_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROLLOUT_RAY_SHARED_DIR", str(tmp_path))
    return tmp_path


def _state(shared_dir: Path) -> dict[str, Any]:
    [path] = shared_dir.glob("calc-*.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


async def _call(
    toolset: SharedToolServer, name: str, arguments: dict[str, Any], calls: list[ToolCallRecord] | None = None
) -> str:
    tools = LocalTools([toolset], None, on_call=None if calls is None else calls.append)
    return (await tools.call(ToolCall("1", name, json.dumps(arguments)))).content


def _other_process() -> str:
    """The pid of the server another process on this node reaches (its own rollout)."""
    result = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, *COMMAND],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_one_server_per_node_for_many_rollouts_and_processes_each_rollouts_calls_its_own(shared_dir: Path) -> None:
    async def main() -> None:
        toolsets = [SharedToolServer("calc", COMMAND) for _ in range(20)]
        await asyncio.gather(*(open_toolsets([t], None) for t in toolsets))
        records: list[list[ToolCallRecord]] = [[] for _ in toolsets]
        pids = {await _call(t, "pid", {}, r) for t, r in zip(toolsets, records)}
        sums = await asyncio.gather(
            *(_call(t, "add", {"a": i, "b": 1}, r) for i, (t, r) in enumerate(zip(toolsets, records)))
        )
        assert sums == [str(i + 1) for i in range(20)]
        assert len(pids) == 1 and await asyncio.to_thread(_other_process) == next(iter(pids))
        assert _state(shared_dir)["starts"] == 1
        for i, calls in enumerate(records):  # each rollout's record holds its own two calls only
            assert [(c.name, c.ok) for c in calls] == [("pid", True), ("add", True)]
            assert json.loads(calls[1].arguments) == {"a": i, "b": 1}
        await close_toolsets(toolsets)
        await stop_shared_servers()
        await close_clients()

    asyncio.run(main())


def test_a_shared_server_that_dies_is_restarted_and_stopped_at_the_end(shared_dir: Path) -> None:
    async def main() -> None:
        first = SharedToolServer("calc", COMMAND)
        await open_toolsets([first], None)
        pid = int(await _call(first, "pid", {}))
        os.kill(pid, 9)  # a server this test started (through the toolset), by its PID
        await asyncio.to_thread(wait_exit, pid, 30)
        deadline = time.monotonic() + 60  # the starting process's watcher restarts it at once
        while _state(shared_dir)["pid"] == pid:
            assert time.monotonic() < deadline, "the dead server was not restarted"
            await asyncio.sleep(0.05)
        again = SharedToolServer("calc", COMMAND)
        await open_toolsets([again], None)
        restarted = int(await _call(again, "add", {"a": 2, "b": 2}) and await _call(again, "pid", {}))
        assert restarted != pid and _state(shared_dir)["starts"] == 2
        await close_toolsets([first, again])
        await stop_shared_servers()
        await asyncio.to_thread(wait_exit, restarted, 30)
        assert _state(shared_dir)["pid"] == restarted  # dead now: the next user starts one
        await close_clients()

    asyncio.run(main())


def test_a_shared_server_dies_with_the_process_that_started_it(shared_dir: Path) -> None:
    pid = int(_other_process())  # that process started it, used it, and ended
    wait_exit(pid, 30)
    assert not process_alive(pid)


def test_a_shared_server_declaration_says_what_is_wrong() -> None:
    with pytest.raises(ToolsetError, match="command must contain '\\{port\\}'"):
        SharedToolServer("calc", [sys.executable, str(SDK_SERVER), "http"])
    with pytest.raises(ToolsetError, match="scope must be 'node' or 'cluster', got 'world'"):
        SharedToolServer("calc", COMMAND, scope="world")


def test_a_cluster_scoped_server_without_ray_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_ray._errors import ToolServerError
    from rollout_ray._serving import shared_server

    monkeypatch.setattr(shared_server, "CLUSTER", None)  # a process where Ray's layer never loaded

    async def main() -> None:
        with pytest.raises(ToolServerError, match="tool server 'calc': scope='cluster' needs Ray"):
            await open_toolsets([SharedToolServer("calc", COMMAND, scope="cluster")], None)

    asyncio.run(main())
