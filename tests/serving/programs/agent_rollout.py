"""One rollout of a real agent, through the package's preset (``CodexHarness``,
``ClaudeCodeHarness``: their launchers, their config), on the simulated model, its trace
summarised as JSON on stdout: run by ``test_real_agents.py`` in a network namespace of its own
(loopback only), so that nothing the agent might send beyond the proxy leaves the machine.
Argument: the agent (``codex``, ``claude-code``), installed by the test beforehand."""

import asyncio
import json
import sys

from rollout_ray import LocalRuntime, Rollout, Task, Trace, reward
from rollout_ray._harnesses.agents import ClaudeCodeHarness, CodexHarness
from rollout_ray._record.tokens import token_sequences
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

PRESETS = {"codex": CodexHarness, "claude-code": ClaudeCodeHarness}


class Sum(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "4")


async def main(agent: str) -> Trace:
    harness = PRESETS[agent](model="simulated", timeout=120)
    harness.command[1:1] = ["-W", "error"]  # the launcher's own warnings fail the test
    config = SimulatedModelConfig(ttft=0, scale_out=True, template_drift=True)
    async with SimulatedModelServer(config) as server, HTTPInterception() as proxy:
        assert server.base_url is not None
        model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
        try:
            rollout = Rollout(
                Sum({"prompt": "What is 2+2?"}), harness, model=model, interception=proxy, runtime_factory=LocalRuntime
            )
            return await asyncio.wait_for(rollout.run(), 180)
        finally:
            await model.aclose()


trace = asyncio.run(main(sys.argv[1]))
print(
    json.dumps(
        {
            "errors": [f"{e.type}: {e.message}" for e in trace.errors],
            "calls": [
                {"endpoint": c.endpoint, "finish_reason": c.finish_reason, "dropped": c.dropped} for c in trace.calls
            ],
            "tools": [t.name for t in trace.tools or ()],
            "last_reply": trace.last_reply,
            "rewards": {name: r.score for name, r in trace.rewards.items()},
            "token_drift": trace.token_drift,
            "sequences": len(token_sequences(trace)),
            "branch_reasons": trace.branch_reasons,
        }
    )
)
