"""On a real local Ray instance: a task's MCP server (the SDK's, over HTTP) is reached from
the node's tool server actor by a program agent in a rollout actor, and scored."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from typing import Any, ClassVar

import pytest
from servers import sdk_http_server

from rollout_ray import (
    MCPToolset,
    OpenAIModel,
    ProgramHarness,
    RolloutSpec,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    Trace,
    reward,
)

ray = pytest.importorskip("ray")

from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AGENT = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()


class McpArith(Task):
    url: ClassVar[str] = ""

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [MCPToolset("calc", url=cls.url)]

    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "42")


def test_program_agent_on_ray_uses_an_mcp_server_through_the_node_tool_server() -> None:
    async def main(url: str) -> Trace:
        McpArith.url = url
        actor = RolloutActor.create(capacity=2)
        try:
            async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
                model = OpenAIModel(server.base_url, name="simulated")
                harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
                return await actor.run(RolloutSpec(McpArith({"prompt": "What is 17 + 25?"}), harness, model))
        finally:
            await actor.aclose()

    with sdk_http_server() as (url, _):
        trace = asyncio.run(main(url))
    assert trace.errors == [] and trace.ok and trace.reward == 1.0
    assert [(r.server, r.name, r.ok) for r in trace.tool_calls] == [("calc", "add", True)]
