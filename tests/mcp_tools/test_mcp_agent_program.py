"""An agent program that speaks MCP uses the task's tools unchanged: a ``ProgramHarness``
rollout whose program is an ``mcp`` SDK client reading ``ROLLOUT_RAY_MCP``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import msgspec
from calc_taskset import ArithWithDiv

from rollout_ray import LocalRuntime, Rollout, ToolServer, Trace
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import ScriptedModel

AGENT = """
import asyncio, json, os
from mcp import Client

async def main():
    config = json.loads(os.environ["ROLLOUT_RAY_MCP"])["mcpServers"]
    async with Client(config["calc"]["url"]) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        result = await client.call_tool("add", {"a": 20, "b": 22})
        open(os.environ["SEEN"], "w").write(json.dumps({"servers": sorted(config), "names": names, "text": result.content[0].text,
                          "structured": result.structured_content}))

asyncio.run(main())
"""


def test_an_mcp_speaking_program_calls_the_task_tools_and_each_call_is_on_the_trace(tmp_path: Any) -> None:
    seen = tmp_path / "seen.json"

    async def main() -> Trace:
        async with HTTPInterception() as proxy, ToolServer() as tools:
            harness = ProgramHarness([sys.executable, "-c", AGENT], env={"SEEN": str(seen)}, timeout=120)
            return await Rollout(
                ArithWithDiv({"prompt": "20+22?"}),
                harness,
                model=ScriptedModel(default="x"),
                interception=proxy,
                tool_server=tools.serve,
                runtime_factory=LocalRuntime,
            ).run()

    trace = asyncio.run(main())
    assert trace.errors == []
    said: dict[str, Any] = msgspec.json.decode(seen.read_bytes())
    assert said == {"servers": ["calc"], "names": ["add", "div"], "text": "42", "structured": {"result": 42}}
    assert [(r.server, r.name, r.arguments, r.ok) for r in trace.tool_calls] == [
        ("calc", "add", '{"a":20,"b":22}', True)
    ]
