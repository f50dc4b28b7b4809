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
