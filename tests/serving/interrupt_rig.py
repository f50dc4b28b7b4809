"""The simulated model generating long replies, a session on it, and the moment to interrupt.

``freeze_after`` waits (a bounded poll of the server's own clock) until the call in flight has
produced about ``tokens`` tokens and freezes the engine (vLLM's ``/pause?mode=keep``): whatever
the machine's load, an interrupt that follows stops the call at that point and not later, and
the call cannot finish first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rollout_ray import (
    Driver,
    EvalConfig,
    Harness,
    Request,
    RolloutSession,
    Task,
    Trace,
    TraceTask,
    UserMessage,
    reload_weights,
)
from rollout_ray._core.policy_gate import PolicyGate
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

PER_TOKEN = 0.002
LONG = {
    "ttft": 0.0,
    "per_token": PER_TOKEN,
    "preamble_tokens": 200,
    "max_completion_tokens": 400,
    "scale_out": True,
    "policy_version": 3,
}
"""A reply of 202 tokens (the preamble, the answer, the stop), 0.4 s of generation."""
SAMPLING = {"temperature": 1.0, "seed": 5}
QUESTION = Request([UserMessage("What is 2 + 3?")])


@asynccontextmanager
async def served(stream: bool = False, **config: Any) -> AsyncIterator[tuple[SimulatedModelServer, OpenAIModel]]:
    async with SimulatedModelServer(SimulatedModelConfig(**{**LONG, **config})) as server:
        assert server.base_url is not None
        model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm", stream=stream)
        try:
            yield server, model
        finally:
            await model.aclose()


def session(model: OpenAIModel, version: int = 3, **kwargs: Any) -> RolloutSession:
    gate = PolicyGate()
    gate.set(version, False)
    return RolloutSession(Trace(task=TraceTask(type="T")), model, policy=gate, sampling=dict(SAMPLING), **kwargs)


async def freeze_after(server: SimulatedModelServer, tokens: int, every: int = 0) -> None:
    """Freeze the engine once a generation in flight has produced ``tokens`` tokens (and each
    one ``every``: on a loaded machine a generation may be admitted well after the others)."""
    due, each = ((n + 0.5) * server.config.per_token + server.config.ttft for n in (tokens, every))

    def ready() -> bool:
        elapsed = [f.elapsed() for f in list(server.engine.flights.values())]
        return any(e >= due for e in elapsed) and all(e >= each for e in elapsed)

    async with asyncio.timeout(30):
        while not ready():
            await asyncio.sleep(server.config.per_token / 4)
    await server.engine.pause("keep")


async def interrupt(server: SimulatedModelServer, gate: PolicyGate, *, at: int, to: int | None) -> bool:
    """Interrupt the calls behind ``gate`` once one has produced ``at`` tokens; load version
    ``to`` into the server (``None``: keep it) and resume. Returns ``until_stopped``'s answer."""
    await freeze_after(server, at)
    version = gate.version
    gate.set(version, True, interrupt=True)
    stopped = await gate.until_stopped()
    server.engine.resume()
    if to is not None:
        server.policy_version = to
    gate.set(version if to is None else to, False)
    return stopped


async def update_mid_generation(
    executor: Any, tasks: list[Task], harness: Harness, *, interrupt: bool
) -> tuple[Any, list[int], SimulatedModelServer]:
    """Run one rollout per task (long replies, all at once, version 3); once one has sampled
    40 tokens, ``Driver.paused(version=4, interrupt=interrupt)`` loads version 4 into the server
    (``reload_weights``). Returns the result, the generations running at the server when the
    block began, and the server."""
    async with served() as (server, model):
        config = EvalConfig(max_in_flight=len(tasks), sampling=SAMPLING)
        driver = Driver(tasks, harness, model, executor=executor, config=config, policy_version=3)
        running = asyncio.ensure_future(driver.arun())
        async with asyncio.timeout(60):
            while len(server.engine.flights) < len(tasks):
                await asyncio.sleep(0.001)
        await freeze_after(server, 40, every=1 if interrupt else 0)  # each has tokens of version 3
        if not interrupt:
            server.engine.resume()  # the calls run on
        generating = []
        async with driver.paused(version=4, interrupt=interrupt):
            generating.append(len(server.engine.flights))
            server.engine.resume()
            await reload_weights(model, "/checkpoints/step-4", 4)  # waits for what still runs
        result = await asyncio.wait_for(running, 60)
        return result, generating, server


def check_continued(samples: Any) -> None:
    """Every rollout's one call was interrupted once: its tokens are version 3 then 4, in the
    trace and in the stored columns; the first to reach 40 tokens stopped at 40 or more."""
    from rollout_ray._record.trace import decode_trace

    n = samples.num_rows
    assert samples["ok"].to_pylist() == [True] * n
    assert samples["policy_min"].to_pylist() == [3] * n and samples["policy_max"].to_pylist() == [4] * n
    kept_all = []
    for blob, policy, mask in zip(
        samples["trace"].to_pylist(), samples["token_policy"].to_pylist(), samples["loss_mask"].to_pylist()
    ):
        (call,) = decode_trace(blob).calls
        (old, kept), (new, rest) = call.token_policy
        assert (old, new, call.interrupts) == (3, 4, 1) and kept > 0 and rest > 0
        [versions], [masks] = policy, mask
        assert [v for v, m in zip(versions, masks) if m] == [3] * kept + [4] * rest
        kept_all.append(kept)
    assert max(kept_all) >= 40
