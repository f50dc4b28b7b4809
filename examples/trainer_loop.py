"""An asynchronous RL training loop on the driver's stream (it trains nothing).

The whole path a trainer takes, against the built-in simulated model with token capture and
token in / token out (its vLLM scale-out routes):

1. stream finalized groups from ``driver.groups()`` as their last sample closes;
2. turn each into a padded batch with ``Group.batch``: ``input_ids``, ``attention_mask``,
   ``loss_mask``, ``old_logprobs`` (what the policy sampled, as the server returned it) and
   ``advantages`` (group-relative, broadcast over the sampled tokens);
3. after every ``update_every`` groups (one trainer step), a weight update: ``async with
   driver.paused(version=v + 1, interrupt=True)`` stops every generation in flight at its
   server, keeping what it sampled, while ``reload_weights`` loads the new checkpoint into
   every server; after the block each stopped generation continues under ``v + 1`` (its
   tokens record both versions) and the agent sees one reply;
4. admission (``max_staleness`` with ``batch_groups``): a new group starts only while every
   group in flight can still be consumed within ``max_staleness`` versions of the one it
   started under, so a lagging trainer slows admission instead of paying in re-runs (with
   ``max_staleness=2`` a step's update finds the next groups generating: they continue);
5. the keep rule (``keep_group="nonzero_std"``): a group whose rewards do not differ carries
   no signal; it is stored, not streamed, and the next task takes its place until
   ``max_groups`` groups reached the trainer.

    python examples/trainer_loop.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import arith

from rollout_ray import (
    Driver,
    EvalConfig,
    LocalExecutor,
    OpenAIModel,
    SimulatedModelConfig,
    SimulatedModelServer,
    Trace,
    decode_trace,
    reload_weights,
    reward,
)


class LongArith(arith.Arith):
    """arith's task, for answers that open with a long preamble: the last word is the answer."""

    @reward
    def correct(self, task: arith.ArithData, trace: Trace) -> float:
        words = trace.last_reply.split()
        return float(bool(words) and words[-1] == str(task.answer))


@dataclass
class Report:
    """What the loop saw (the test reads it)."""

    steps: int = 0
    rows: int = 0
    trained_tokens: int = 0
    updates: int = 0
    stale: int = 0
    held: int = 0
    rejected: int = 0
    continued: int = 0
    """Samples with a model call interrupted by an update and continued (two versions)."""
    versions: list[tuple[int, list[int]]] = field(default_factory=list)
    """Per step: the current version when the group arrived, and its samples' oldest versions."""
    stds: list[float] = field(default_factory=list)
    """Per step: the std of the group's rewards (the keep rule streams only nonzero ones)."""
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    """Per step: the shape of the batch's ``input_ids``."""


def versions_of(samples: Any) -> list[set[int]]:
    """The policy versions that produced each sample's tokens."""
    out = []
    for blob in samples.column("trace").to_pylist():
        seen: set[int] = set()
        for call in decode_trace(blob).calls:
            runs = call.token_policy or [(call.policy, 1)]  # (version, tokens) per run
            seen.update(v for v, _ in runs if v is not None)
        out.append(seen)
    return out


async def main(
    groups: int = 16, samples: int = 4, update_every: int = 2, max_staleness: int = 2, quiet: bool = False
) -> Report:
    """Stream ``groups`` groups of ``samples`` that carry signal; a weight update after every
    ``update_every`` groups; admission keeps every group within ``max_staleness`` versions."""
    say = (lambda *_: None) if quiet else print
    config = EvalConfig(
        samples_per_task=samples,
        max_in_flight=16,
        max_staleness=max_staleness,
        batch_groups=update_every,
        keep_group="nonzero_std",
        max_groups=groups,
        sampling={"temperature": 1.0},
    )
    tasks = [LongArith(t.data) for t in arith.tasks(groups * 8)]  # room for refused groups
    report = Report()
    served = SimulatedModelConfig(ttft=0.005, per_token=0.002, preamble_tokens=60, scale_out=True, error_rate=0.3)
    async with SimulatedModelServer(served) as server:
        assert server.base_url is not None
        async with (
            OpenAIModel(server.base_url, name="simulated", token_capture="vllm") as model,
            LocalExecutor(runtime="local") as executor,
        ):
            driver = Driver(tasks, arith.harness(), model, executor=executor, config=config)
            async for group in driver.groups():
                batch = group.batch(pad_id=0)
                report.steps += 1
                report.rows += len(batch["input_ids"])
                report.shapes.append(batch["input_ids"].shape)
                report.trained_tokens += int(batch["loss_mask"].sum())
                versions = versions_of(group.samples)
                report.continued += sum(len(v) > 1 for v in versions)
                oldest = [min(v) for v in versions]
                report.versions.append((driver.policy_version, oldest))
                report.stds.append(group.summary["std"][0].as_py())
                sampled = batch["loss_mask"] > 0
                say(
                    f"step {report.steps:2d} group {group.group_id}: batch {batch['input_ids'].shape}, "
                    f"{int(sampled.sum())} sampled tokens, mean old logprob "
                    f"{float(batch['old_logprobs'][sampled].mean()):.2f}, rewards "
                    f"{group.samples['reward'].to_pylist()}, advantages "
                    f"{[round(a, 2) + 0.0 for a in group.samples['advantage'].to_pylist()]}, "
                    f"versions {[sorted(v) for v in versions]} (now {driver.policy_version})"
                )
                if report.steps % update_every == 0:
                    version = driver.policy_version + 1
                    async with driver.paused(version=version, interrupt=True):
                        # the trainer saves its checkpoint here; every server loads it in place
                        await reload_weights(model, f"/checkpoints/step-{version}", version)
                    report.updates += 1
                    say(f"         weights updated: policy version {version}")
        progress = driver.progress
        report.stale, report.held, report.rejected = progress.stale, progress.held, progress.rejected
        say(
            f"{report.steps} groups, {report.rows} sequences, {report.trained_tokens} sampled tokens, "
            f"{report.updates} weight updates; {report.continued} samples continued across an update; "
            f"admission held {report.held} groups, {report.stale} rollouts re-run as stale "
            f"(max_staleness={max_staleness}); {report.rejected} groups without signal not streamed"
        )
    return report


if __name__ == "__main__":
    asyncio.run(main())
