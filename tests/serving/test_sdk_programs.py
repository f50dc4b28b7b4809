"""Agent programs written against the official SDKs, unchanged, as ProgramHarness rollouts
through the real proxy to the simulated model: an OpenAI Agents SDK program
(``programs/agents_sdk_calc.py``, Responses) and an ``anthropic`` SDK tool loop
(``programs/anthropic_calc.py``, Messages, streamed) each call their calculator tool, and
the rollout is rewarded and stored as one training sequence on a drifting template."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from rollout_ray import LocalRuntime, Reward, Rollout, Task, Trace, reward
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._record.tokens import token_sequences
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

PROGRAMS = Path(__file__).parent / "programs"


class Product(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "51")


@pytest.mark.parametrize(
    ("program", "endpoint"), [("agents_sdk_calc.py", "/responses"), ("anthropic_calc.py", "/messages")]
)
def test_sdk_program_with_a_tool_is_one_rewarded_sequence(program: str, endpoint: str) -> None:
    command = [sys.executable, "-W", "error", str(PROGRAMS / program)]

    async def main() -> Trace:
        config = SimulatedModelConfig(ttft=0, scale_out=True, template_drift=True)
        async with SimulatedModelServer(config) as server, HTTPInterception() as proxy:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                rollout = Rollout(
                    Product({"prompt": "Use the calculator: what is 17*3?"}),
                    ProgramHarness(command),
                    model=model,
                    interception=proxy,
                    runtime_factory=LocalRuntime,
                )
                return await asyncio.wait_for(rollout.run(), 120)
            finally:
                await model.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.errors == [], trace.errors
    assert [c.endpoint for c in trace.calls] == [endpoint, endpoint]
    assert trace.nodes[trace.calls[0].node].message.tool_calls[0].name == "calculator"  # type: ignore[index,union-attr]
    assert trace.rewards == {"correct": Reward(1.0)}
    assert trace.token_drift == [] and len(token_sequences(trace)) == 1
