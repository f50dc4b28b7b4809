"""On a real local Ray instance: a task's MCP server (the SDK's, over HTTP) is reached from
the node's tool server actor by a program agent in a rollout actor, and scored."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
from typing import Any, ClassVar

import pytest
from servers import SDK_SERVER, bad_http_server, sdk_http_server

from rollout_ray import (
    MCPToolset,
    OpenAIModel,
    ProgramHarness,
    RolloutSpec,
    SharedToolServer,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    Trace,
    metric,
    reward,
)

from conftest import process_alive

ray = pytest.importorskip("ray")

from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402
from rollout_ray._serving.shared_server import shared_dir  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AGENT = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()


class McpArith(Task):
    url: ClassVar[str] = ""  # set before the class first ships to an actor (it ships once)
    timeout: ClassVar[float] = 30.0

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [MCPToolset("calc", url=cls.url, timeout=cls.timeout)]

    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "42")


class HungArith(McpArith):
    timeout = 0.5


def test_program_agent_on_ray_uses_an_mcp_server_through_the_node_tool_server() -> None:
    async def main(url: str) -> tuple[Trace, Trace]:
        actor = RolloutActor.create(capacity=2)
        try:
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
                McpArith.url = url
                good = await actor.run(RolloutSpec(McpArith({"prompt": "What is 17 + 25?"}), harness, model))
                async with bad_http_server("hang", tool="add") as (hung, _):  # the same calculator, hung
                    HungArith.url = hung
                    bad = await actor.run(RolloutSpec(HungArith({"prompt": "What is 17 + 25?"}), harness, model))
                return good, bad
        finally:
            await actor.aclose()

    with sdk_http_server() as (url, _):
        good, bad = asyncio.run(main(url))
    assert good.errors == [] and good.ok and good.reward == 1.0
    assert [(r.server, r.name, r.ok) for r in good.tool_calls] == [("calc", "add", True)]
    # a hung server: the node's tool server answers the program 502 and stashes the error,
    # which crosses back to the rollout's process as the rollout's own
    assert [(e.type, e.message) for e in bad.errors] == [
        ("ToolServerError", "tool server 'calc': no answer within 0.5s")
    ]
    assert [(r.server, r.name, r.ok) for r in bad.tool_calls] == [("calc", "add", False)]


class SharedArith(McpArith):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [SharedToolServer("calc", [sys.executable, str(SDK_SERVER), "http", "{port}"])]


def test_program_agents_on_ray_share_one_server_started_by_the_node_tool_server() -> None:
    """A taskset's shared server on Ray: the node's tool server starts it for the first
    rollout, the second reaches the same process; each rollout records its own call."""
    declared = SharedToolServer("calc", [sys.executable, str(SDK_SERVER), "http", "{port}"])
    record = shared_dir() / f"{declared.key}.json"  # the workers' default directory too

    async def main() -> tuple[list[Trace], list[int]]:
        actor = RolloutActor.create(capacity=2)
        try:
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
                traces, pids = [], []
                for _ in range(2):
                    traces.append(
                        await actor.run(RolloutSpec(SharedArith({"prompt": "What is 17 + 25?"}), harness, model))
                    )
                    pids.append(json.loads(record.read_text())["pid"])
                return traces, pids
        finally:
            await actor.aclose()

    traces, pids = asyncio.run(main())
    assert all(t.ok and t.reward == 1.0 for t in traces)
    assert all([(r.server, r.name, r.ok) for r in t.tool_calls] == [("calc", "add", True)] for t in traces)
    assert pids[0] == pids[1] and process_alive(pids[0])  # one server, up for the node's next rollout


BOX_SERVER = """
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "b", "version": "1"}}
    elif m["method"] == "tools/list":
        schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
        r = {"tools": [{"name": "add", "description": "Add two integers.", "inputSchema": schema}]}
    else:
        args = m["params"]["arguments"]
        with open("served-here.json", "w") as f:  # its working directory: the runtime's
            json.dump({"pid": os.getpid(), "marker": os.environ.get("ROLLOUT_RAY_RUNTIME", "")}, f)
        r = {"content": [{"type": "text", "text": str(args["a"] + args["b"])}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"""


class BoxArith(McpArith):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [MCPToolset("calc", command=[sys.executable, "-c", BOX_SERVER])]

    @metric
    async def served_in_the_box(self, trace: Trace, runtime: Any) -> float:
        seen = json.loads(await runtime.read("served-here.json"))  # the rollout's own box holds it
        return float(bool(seen["marker"]) and seen["pid"] < 100)  # the runtime's marker, its PID namespace


def test_a_stdio_server_of_a_sandboxed_rollout_on_ray_runs_in_its_sandbox() -> None:
    """On Ray the node's tool server opens the stdio server in the rollout's runtime, held by
    the rollout actor's runtime actor and reached over its loopback bridge."""
    from rollout_ray._runtimes.sandbox import sandbox_unavailable

    if sandbox_unavailable() is not None:
        pytest.skip(str(sandbox_unavailable()))

    async def main() -> Trace:
        actor = RolloutActor.create(capacity=1, runtime="sandbox")
        try:
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
                return await actor.run(RolloutSpec(BoxArith({"prompt": "What is 17 + 25?"}), harness, model))
        finally:
            await actor.aclose()

    trace = asyncio.run(main())
    assert trace.errors == [] and trace.ok and trace.reward == 1.0
    assert [(r.server, r.name, r.ok) for r in trace.tool_calls] == [("calc", "add", True)]
    assert trace.metrics["served_in_the_box"] == 1.0
