"""One real agent's rollout for the tests: the package's preset on the simulated model (its
scripted plans drive the agent), through an in-process proxy, in a ``SandboxRuntime`` (loopback
and the framework's routes only: nothing the agent sends leaves the machine), no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollout_ray import HarnessError, Rollout, SandboxRuntime, Task, Trace
from rollout_ray._harnesses.agents import AgentHarness
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer


def install_or_skip(harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the agent here, bounded below the test's guard: a registry that stalls or is
    unreachable skips the test with the reason rather than failing the rollout."""
    monkeypatch.setenv("ROLLOUT_RAY_AGENT_INSTALL_TIMEOUT", "360")
    try:
        harness.install()
    except HarnessError as exc:
        pytest.skip(f"cannot install {harness.id} on this machine: {exc}")


def sandboxed_rollout(task: Task, harness: AgentHarness, root: Path) -> Trace:
    """``task`` run by ``harness`` (installed) in a sandbox under ``root``."""

    async def run() -> Trace:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0)) as server, HTTPInterception() as proxy:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                rollout = Rollout(
                    task,
                    harness,
                    model=model,
                    interception=proxy,
                    runtime_factory=lambda name: SandboxRuntime(name, root=str(root)),
                )
                return await asyncio.wait_for(rollout.run(), 240)
            finally:
                await model.aclose()

    return asyncio.run(run())
