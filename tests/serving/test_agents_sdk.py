"""An OpenAI Agents SDK program (``programs/agents_sdk_calc.py``), unchanged, as a
ProgramHarness rollout through the real proxy to the simulated model: it speaks Responses,
calls its function tool, and the rollout is rewarded and stored as one training sequence."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from rollout_ray import LocalRuntime, Reward, Rollout, Task, Trace, reward
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._record.tokens import token_sequences
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.server import SimulatedModelServer

PROGRAM = [sys.executable, "-W", "error", str(Path(__file__).parent / "programs" / "agents_sdk_calc.py")]


class Product(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "51")


def test_agents_sdk_program_with_a_function_tool_is_one_rewarded_sequence() -> None:
    async def main() -> Trace:
        config = SimulatedModelConfig(ttft=0, scale_out=True, template_drift=True)
        async with SimulatedModelServer(config) as server, HTTPInterception() as proxy:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                rollout = Rollout(Product({"prompt": "Use the calculator: what is 17*3?"}), ProgramHarness(PROGRAM),
                                  model=model, interception=proxy, runtime_factory=LocalRuntime)
                return await asyncio.wait_for(rollout.run(), 120)
            finally:
                await model.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.errors == [], trace.errors
    assert [c.endpoint for c in trace.calls] == ["/responses", "/responses"]
    assert trace.nodes[trace.calls[0].node].message.tool_calls[0].name == "calculator"  # type: ignore[index,union-attr]
    assert trace.rewards == {"correct": Reward(1.0)}
    assert trace.token_drift == [] and len(token_sequences(trace)) == 1
