"""An asynchronous RL training loop on the driver's stream (it trains nothing).

The whole path a trainer takes, against the built-in simulated model with token capture:

1. stream finalized groups from ``driver.groups()`` as their last sample closes;
2. turn each into a padded batch with ``Group.batch``: ``input_ids``, ``attention_mask``,
   ``loss_mask``, ``old_logprobs`` (what the policy sampled, as the server returned it) and
   ``advantages`` (group-relative, broadcast over the sampled tokens);
3. after every ``update_every`` groups, a "weight update": ``async with
   driver.paused(version=v + 1)`` holds every new model call before the server while the
   weights change (calls in flight finish; no rollout is charged the paused time), and the
   new weights are announced to the server (the simulated one's ``/admin/policy_version``);
4. ``max_staleness``: a rollout whose oldest turn is more than that many versions behind the
   current one when the trainer asks for its group is dropped and run again (never stored,
   never streamed); the summary counts them. Every group the loop receives is within it.

    python examples/trainer_loop.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp

sys.path.insert(0, os.path.dirname(__file__))
import arith  # noqa: E402

from rollout_ray import (  # noqa: E402
    Driver,
    EvalConfig,
    LocalExecutor,
    OpenAIModel,
    SimulatedModelConfig,
    SimulatedModelServer,
    decode_trace,
)


@dataclass
class Report:
    """What the loop saw (the test reads it)."""

    steps: int = 0
    rows: int = 0
    trained_tokens: int = 0
    updates: int = 0
    stale: int = 0
    versions: list[tuple[int, list[int]]] = field(default_factory=list)
    """Per step: the current version when the group arrived, and its samples' oldest versions."""
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    """Per step: the shape of the batch's ``input_ids``."""


async def announce(server: SimulatedModelServer, version: int) -> None:
    """Tell the inference server its weights are now ``version`` (it stamps X-Policy-Version)."""
    assert server.base_url is not None
    root = server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{root}/admin/policy_version", json={"version": version}) as answer:
            answer.raise_for_status()


def oldest_versions(samples: Any) -> list[int]:
    """The oldest policy version among each sample's model calls."""
    return [min(c.policy for c in decode_trace(blob).calls if c.policy is not None)
            for blob in samples.column("trace").to_pylist()]


async def main(tasks: int = 16, samples: int = 4, update_every: int = 2, max_staleness: int = 1,
               quiet: bool = False) -> Report:
    """Stream ``tasks`` groups of ``samples``; a weight update after every ``update_every``
    groups; rollouts more than ``max_staleness`` versions old are run again."""
    say = (lambda *_: None) if quiet else print
    config = EvalConfig(samples_per_task=samples, max_in_flight=16, max_staleness=max_staleness)
    report = Report()
    async with SimulatedModelServer(SimulatedModelConfig(ttft=0.005, error_rate=0.3)) as server:
        assert server.base_url is not None
        async with (OpenAIModel(server.base_url, name="simulated", token_capture="vllm") as model,
                    LocalExecutor(runtime="local") as executor):
            driver = Driver(arith.tasks(tasks), arith.harness(), model, executor=executor, config=config)
            async for group in driver.groups():
                batch = group.batch(pad_id=0)
                report.steps += 1
                report.rows += len(batch["input_ids"])
                report.shapes.append(batch["input_ids"].shape)
                report.trained_tokens += int(batch["loss_mask"].sum())
                oldest = oldest_versions(group.samples)
                report.versions.append((driver.policy_version, oldest))
                sampled = batch["loss_mask"] > 0
                say(f"step {report.steps:2d} group {group.group_id}: batch {batch['input_ids'].shape}, "
                    f"{int(sampled.sum())} sampled tokens, mean old logprob "
                    f"{float(batch['old_logprobs'][sampled].mean()):.2f}, rewards "
                    f"{group.samples['reward'].to_pylist()}, advantages "
                    f"{[round(a, 2) + 0.0 for a in group.samples['advantage'].to_pylist()]}, "
                    f"oldest versions {oldest} (now {driver.policy_version})")
                if report.steps % update_every == 0:
                    version = driver.policy_version + 1
                    async with driver.paused(version=version):
                        await announce(server, version)  # the weight sync would go here
                    report.updates += 1
                    say(f"         weights updated: policy version {version}")
        report.stale = driver.progress.stale
        say(f"{report.steps} groups, {report.rows} sequences, {report.trained_tokens} sampled tokens, "
            f"{report.updates} weight updates; {report.stale} rollouts dropped as stale "
            f"(max_staleness={max_staleness}) and run again")
        await model.aclose()
    return report


if __name__ == "__main__":
    asyncio.run(main())
