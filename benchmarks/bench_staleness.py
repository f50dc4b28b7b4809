#!/usr/bin/env python
"""How stale are the rollouts a lagging trainer receives, and what does it cost, under
admission control against drop-and-rerun?

A trainer loop on ``Driver.groups()``: it takes ``batch`` groups, "trains" ``train`` seconds,
then updates the policy (``async with driver.paused(version=v + 1)``, the simulated model
told the new version). The rollouts (``examples/arith.py`` tasks x 4 samples at temperature 1,
``LocalExecutor``, the built-in simulated model answering after ``latency`` seconds, wrong
58 % of the time) come much faster than the trainer takes them, as in asynchronous RL with a slow learner. Modes, each on a
fresh server and driver:

  unbounded   no ``max_staleness``: every rollout runs as soon as a slot is free
  discard     ``max_staleness=k``: a rollout older than k when its group is handed on is
              dropped and run again (the finalize check alone)
  mask        the same check, ``stale_samples="mask"``: such a rollout is kept in its group
              (its reward in the baseline) with its tokens masked from the loss
  admission   ``max_staleness=k, batch_groups=batch``: a group is admitted only while the
              groups in flight can be consumed within k versions (``_driver/admission.py``);
              the finalize check stays as the fallback
  admission+keep  the same, with ``keep_group="nonzero_std"``: groups whose 4 rewards agree are
              stored, not streamed, and replaced by further tasks

Per mode: groups the trainer received, rollouts run (re-runs included; those in flight when the
trainer stops are cancelled, not counted), re-runs, stale rollouts masked, groups whose
admission waited for the trainer, groups rejected by the keep rule, the staleness of every
sample received (the version when its group arrived minus its first model call's version) as
a distribution, wall time, and the seconds the trainer waited for groups.

    python benchmarks/bench_staleness.py                   # 48 steps of 4 groups, k = 1
    python benchmarks/bench_staleness.py --steps 12 --k 2
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import arith  # noqa: E402
from bench_driver import source_version, table  # noqa: E402

from rollout_ray import (  # noqa: E402
    Driver,
    EvalConfig,
    LocalExecutor,
    OpenAIModel,
    SimulatedModelConfig,
    SimulatedModelServer,
    decode_trace,
)

MODES = ("unbounded", "discard", "mask", "admission", "admission+keep")


@dataclass
class Outcome:
    mode: str
    groups: int = 0
    rollouts: int = 0
    reruns: int = 0
    masked: int = 0
    held: int = 0
    rejected: int = 0
    staleness: Counter[int] = field(default_factory=Counter)
    wall: float = 0.0
    waited: float = 0.0


def config_of(mode: str, k: int, batch: int, samples: int, in_flight: int) -> EvalConfig:
    bound: dict[str, Any] = {} if mode == "unbounded" else {"max_staleness": k}
    if mode.startswith("admission"):
        bound["batch_groups"] = batch
    if mode == "admission+keep":
        bound["keep_group"] = "nonzero_std"
    if mode == "mask":
        bound["stale_samples"] = "mask"
    # Temperature 1: the simulated model answers wrong with probability 0.58 (error_rate 0.3),
    # so the samples of a task differ.
    return EvalConfig(samples_per_task=samples, max_in_flight=in_flight, sampling={"temperature": 1.0}, **bound)


def first_versions(samples: Any) -> list[int]:
    return [
        min(c.policy for c in decode_trace(blob).calls if c.policy is not None)
        for blob in samples.column("trace").to_pylist()
    ]


async def trainer(mode: str, args: argparse.Namespace) -> Outcome:
    out = Outcome(mode)
    steps_groups = args.steps * args.batch
    config = config_of(mode, args.k, args.batch, args.samples, args.in_flight)
    model_config = SimulatedModelConfig(ttft=args.latency, error_rate=0.3)
    async with SimulatedModelServer(model_config) as server:
        assert server.base_url is not None
        async with OpenAIModel(server.base_url, name="simulated") as model, LocalExecutor(runtime="local") as executor:
            driver = Driver(arith.tasks(steps_groups * 4), arith.harness(), model, executor=executor, config=config)
            started = asked = time.monotonic()
            stream = driver.groups()
            async for group in stream:
                out.waited += time.monotonic() - asked
                out.groups += 1
                out.staleness.update(driver.policy_version - v for v in first_versions(group.samples))
                if out.groups % args.batch == 0:
                    await asyncio.sleep(args.train)
                    version = driver.policy_version + 1
                    async with driver.paused(version=version):
                        server.policy_version = version  # the weight sync would go here
                if out.groups == steps_groups:
                    break
                asked = time.monotonic()
            await stream.aclose()  # the rollouts still in flight are cancelled
            out.wall = time.monotonic() - started
            p = driver.progress
            out.rollouts, out.reruns, out.masked = p.done + p.stale, p.stale, p.masked
            out.held, out.rejected = p.held, p.rejected
        await model.aclose()
    return out


def row(o: Outcome, k: int) -> list[Any]:
    total = sum(o.staleness.values()) or 1
    share = [o.staleness[s] / total for s in range(k + 2)]
    over = sum(n for s, n in o.staleness.items() if s > k + 1) / total
    mean = sum(s * n for s, n in o.staleness.items()) / total
    return [
        o.mode,
        o.groups,
        o.rollouts,
        o.reruns,
        o.masked,
        o.held,
        o.rejected,
        " / ".join(f"{x:.0%}" for x in (*share, over)),
        f"{mean:.2f}",
        max(o.staleness, default=0),
        f"{o.wall:.1f}",
        f"{o.waited:.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=48, help="trainer steps (default 48)")
    p.add_argument("--batch", type=int, default=4, help="groups per step, batch_groups (default 4)")
    p.add_argument("--samples", type=int, default=4, help="samples per task (default 4)")
    p.add_argument("--in-flight", type=int, default=64, help="max_in_flight (default 64)")
    p.add_argument("--train", type=float, default=0.25, help="seconds a step trains (default 0.25)")
    p.add_argument("--k", type=int, default=1, help="max_staleness (default 1)")
    p.add_argument("--latency", type=float, default=0.25, help="simulated model ttft, s (default 0.25)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    args = p.parse_args(argv)
    outcomes = [asyncio.run(trainer(mode, args)) for mode in args.modes.split(",")]
    k = args.k
    print(
        f"{source_version()}; {args.steps} steps x {args.batch} groups x {args.samples} samples, "
        f"train {args.train} s per step, rollout ~{args.latency} s, "
        f"max_in_flight {args.in_flight}, max_staleness {k}"
    )
    stale_header = " / ".join([*(str(s) for s in range(k + 2)), f">{k + 1}"])
    print(
        table(
            [
                "mode",
                "groups",
                "rollouts run",
                "re-runs",
                "masked",
                "held",
                "rejected",
                f"staleness {stale_header}",
                "mean",
                "max",
                "wall s",
                "trainer waited s",
            ],
            [row(o, k) for o in outcomes],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
