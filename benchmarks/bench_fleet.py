"""How much of the fleet's GPU time does an async RL run keep busy? (issue 33 §4)

A simulated fleet in this process (``--servers`` SimulatedModelServers on 127.0.0.1 with the
capacity model: ``--batch`` sequence slots each, batch-step latency, a KV cache with prefix
caching, lognormal answer lengths of median ``--gen-median`` and sigma ``--gen-sigma``, the long
tail) serves agentic rollouts: each task's plan has ``--turns`` shell steps, the model calls a
``bash`` tool per step, and the tool waits a seeded lognormal time of median ``--tool-wait``
seconds before it answers. A trainer on ``Driver.groups()`` takes ``--groups`` groups of
``--samples`` per step, trains ``--train`` seconds (a sleep standing in for its GPU work) and
updates the weights after every step (``Driver.paused`` + ``reload_weights``). Modes, each on a
fresh fleet and driver:

  synchronous   ``max_staleness=0, batch_groups=B``: a step's groups are generated, then the
                fleet waits while the trainer trains and updates (fixed in-flight, sticky routing)
  one-step-off  ``max_staleness=1``: the next step's groups generate while the trainer trains;
                an update waits for the calls in flight (``interrupt=False``; fixed, sticky)
  ours          ``max_staleness=--k`` with ``interrupt=True`` (calls in flight stop at the
                update and continue under the new weights), ``max_in_flight="auto"`` and
                bounded-load affinity routing

Per mode: fleet utilisation (busy sequence slots / capacity, the capacity model's running batch
sampled every ``--sample`` s over the run), generated tokens/s (the servers' counters), trainer
steps/s and the speedup over synchronous on it, the trainer's idle share (time waiting for
groups / wall), the staleness of every sample trained on (the version at training minus its
first call's version), mean in-flight rollouts and waiting requests. A plot over time
(utilisation, in-flight, queue per mode) is written beside the table (``--plot``; skipped with a
note if matplotlib is missing).

    python benchmarks/bench_fleet.py            # 4 servers x 64 slots, 8 steps of 8 groups x 8
    python benchmarks/bench_fleet.py --quick    # 2 servers x 16 slots, 4 steps of 8 groups x 4, train 4 s

The servers, the driver, the tools and the trainer share this process and its 2 cores: the
fleet's clock is the capacity model's steps, which stretch when the process is busy, so compare
modes within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    OpenAIModel,
    RolloutLimits,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    TaskData,
    Toolset,
    Trace,
    decode_trace,
    reload_weights,
    reward,
    tool,
)
from rollout_ray._simulated.config import CapacityConfig

MODES = ("synchronous", "one-step-off", "ours")


class Shell(Toolset):
    """A ``bash`` tool that takes a while, as an agent's test run or build does."""

    name = "shell"

    @tool
    async def bash(self, command: str) -> str:
        """Run a shell command."""
        # The tool's own latency, seeded by its command so every mode sees the same waits.
        rng = random.Random(command)
        await asyncio.sleep(min(rng.lognormvariate(0.0, 0.8) * TOOL_WAIT[0], 20 * TOOL_WAIT[0]))
        return f"ok: {command}"


TOOL_WAIT = [0.5]
"""Median seconds of a tool call (set from ``--tool-wait``; a list so the tool reads it late)."""


class AgentData(TaskData):
    pass


class Agent(Task):
    data_type = AgentData

    @classmethod
    def toolsets(cls, config: object) -> list[Toolset]:
        return [Shell()]

    @reward
    def finished(self, task: AgentData, trace: Trace) -> float:
        return float(trace.last_reply.strip().endswith("done"))


def tasks(n: int, turns: int) -> list[Agent]:
    out = []
    for idx in range(n):
        plan = "\n".join(f"RUN: make step-{idx}-{t}" for t in range(turns))
        out.append(Agent({"idx": idx, "prompt": f"Task {idx}: carry out the plan.\n{plan}\nANSWER: done"}))
    return out


@dataclass
class Outcome:
    mode: str
    steps: int = 0
    wall: float = 0.0
    idle: float = 0.0
    tokens: int = 0
    leaked: int = 0
    """Task errors nobody retrieved (the teardown's cancelled reads)."""
    staleness: Counter[int] = field(default_factory=Counter)
    series: list[tuple[float, float, int, int]] = field(default_factory=list)
    """(seconds, utilisation, rollouts in flight, requests waiting) every ``--sample`` s."""

    @property
    def utilisation(self) -> float:
        return sum(u for _, u, _, _ in self.series) / max(len(self.series), 1)


def first_versions(samples: Any) -> list[int]:
    return [
        min((c.policy for c in decode_trace(blob).calls if c.policy is not None), default=0)
        for blob in samples.column("trace").to_pylist()
    ]


def config_of(mode: str, args: argparse.Namespace) -> tuple[EvalConfig, dict[str, Any], str]:
    fixed = args.groups * args.samples  # one step's rollouts: what a synchronous step needs
    common: dict[str, Any] = {
        "samples_per_task": args.samples,
        "batch_groups": args.groups,
        "limits": RolloutLimits(max_turns=args.turns + 2),
        "sampling": {"temperature": 1.0},
    }
    if mode == "synchronous":
        return EvalConfig(max_in_flight=fixed, max_staleness=0, **common), {"interrupt": False}, "sticky"
    if mode == "one-step-off":
        return EvalConfig(max_in_flight=2 * fixed, max_staleness=1, **common), {"interrupt": False}, "sticky"
    return EvalConfig(max_in_flight="auto", max_staleness=args.k, **common), {"interrupt": True}, "affinity"


async def run(mode: str, args: argparse.Namespace) -> Outcome:
    out = Outcome(mode)
    # Generations cut by the final cancel leave reader tasks whose error nobody retrieves
    # (rollout_ray/_serving/token_in.py): counted here rather than printed as tracebacks.
    asyncio.get_running_loop().set_exception_handler(lambda _loop, _ctx: out.__setattr__("leaked", out.leaked + 1))
    config, pause, routing = config_of(mode, args)
    capacity = CapacityConfig(
        max_batch=args.batch,
        kv_blocks=args.kv_blocks,
        step_base=args.step_base,
        step_per_seq=args.step_per_seq,
        gen_median=args.gen_median,
        gen_sigma=args.gen_sigma,
    )
    served = SimulatedModelConfig(capacity=capacity, max_completion_tokens=args.max_tokens, scale_out=True)
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(SimulatedModelServer(served)) for _ in range(args.servers)]
        model = await stack.enter_async_context(
            OpenAIModel([s.base_url or "" for s in servers], name="simulated", token_capture="vllm", routing=routing)
        )
        executor = await stack.enter_async_context(LocalExecutor(runtime="local"))
        driver = Driver(
            tasks(args.steps * args.groups * 2, args.turns), ChatHarness(), model, executor=executor, config=config
        )
        slots = args.servers * args.batch
        started = time.monotonic()
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                scheds = [s.batcher.scheduler for s in servers if s.batcher is not None]
                out.series.append(
                    (
                        time.monotonic() - started,
                        sum(len(x.running) for x in scheds) / slots,
                        driver.progress.in_flight,
                        sum(len(x.waiting) for x in scheds),
                    )
                )
                try:
                    await asyncio.wait_for(done.wait(), args.sample)
                except TimeoutError:
                    pass

        sampler = asyncio.create_task(sample())
        groups = 0
        asked = time.monotonic()
        stream = driver.groups()
        async for group in stream:
            out.idle += time.monotonic() - asked
            groups += 1
            out.staleness.update(driver.policy_version - v for v in first_versions(group.samples))
            if groups % args.groups == 0:
                await asyncio.sleep(args.train)  # the trainer's GPU step, simulated
                version = driver.policy_version + 1
                async with driver.paused(version=version, **pause):
                    await reload_weights(model, f"/checkpoints/step-{version}", version)
                out.steps += 1
                if out.steps == args.steps:
                    break
            asked = time.monotonic()
        out.wall = time.monotonic() - started
        done.set()
        await sampler
        await stream.aclose()  # what is still in flight is cancelled
        out.tokens = sum(s.batcher.scheduler.counters.generation_tokens for s in servers if s.batcher is not None)
    return out


def plot(outcomes: list[Outcome], path: Path) -> str:
    try:
        import matplotlib
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(outcomes), 1, figsize=(10, 3 * len(outcomes)), squeeze=False)
    for ax, o in zip(axes[:, 0], outcomes, strict=True):
        t = [s[0] for s in o.series]
        ax.plot(t, [100 * s[1] for s in o.series], label="utilisation %")
        ax.plot(t, [s[2] for s in o.series], label="rollouts in flight")
        ax.plot(t, [s[3] for s in o.series], label="requests waiting")
        ax.set_title(f"{o.mode}: utilisation {o.utilisation:.0%}")
        ax.set_xlabel("seconds")
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64, help="sequence slots per server (max_batch)")
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--step-base", type=float, default=0.02, help="seconds of a decode step")
    p.add_argument("--step-per-seq", type=float, default=0.0002, help="seconds a step grows per sequence")
    p.add_argument("--gen-median", type=int, default=80, help="median tokens of an answer")
    p.add_argument("--gen-sigma", type=float, default=1.0, help="lognormal sigma of answer lengths (the tail)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--turns", type=int, default=3, help="tool calls per rollout")
    p.add_argument("--tool-wait", type=float, default=0.5, help="median seconds of a tool call")
    p.add_argument("--steps", type=int, default=8, help="trainer steps")
    p.add_argument("--groups", type=int, default=8, help="groups per trainer step (batch_groups)")
    p.add_argument("--samples", type=int, default=8, help="samples per task")
    p.add_argument("--train", type=float, default=2.0, help="seconds a trainer step takes")
    p.add_argument("--k", type=int, default=2, help="max_staleness of ours")
    p.add_argument("--sample", type=float, default=0.25, help="seconds between utilisation samples")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--plot", default=str(Path(__file__).with_name("bench_fleet.png")))
    p.add_argument("--quick", action="store_true", help="2 servers x 16 slots, 4 steps of 8 groups x 4, train 4 s")
    if p.parse_known_args(argv)[0].quick:  # smaller defaults; a flag given still wins
        p.set_defaults(servers=2, batch=16, steps=4, groups=8, samples=4, train=4.0)
    args = p.parse_args(argv)
    TOOL_WAIT[0] = args.tool_wait
    print(
        f"{args.servers} servers x {args.batch} slots; {args.steps} steps of {args.groups} groups x {args.samples} "
        f"samples, {args.turns} tool calls each (median {args.tool_wait} s), answers median {args.gen_median} "
        f"tokens sigma {args.gen_sigma}; train {args.train} s a step; ours: max_staleness {args.k}"
    )
    outcomes = []
    for mode in args.modes.split(","):
        outcomes.append(asyncio.run(run(mode, args)))
        o = outcomes[-1]
        print(
            f"  {mode}: {o.steps} steps in {o.wall:.1f} s ({o.leaked} unretrieved task errors at teardown)", flush=True
        )
    base = next((o for o in outcomes if o.mode == "synchronous"), outcomes[0])
    base_rate = base.steps / base.wall
    print(
        f"{'mode':<14}{'util':>6}{'tok/s':>8}{'steps/s':>9}{'speedup':>9}{'idle':>7}{'in-flight':>10}"
        f"{'waiting':>9}  staleness 0/1/2/>2 (mean)"
    )
    for o in outcomes:
        total = sum(o.staleness.values()) or 1
        shares = " / ".join(f"{o.staleness[s] / total:.0%}" for s in range(3))
        over = sum(n for s, n in o.staleness.items() if s > 2) / total
        mean = sum(s * n for s, n in o.staleness.items()) / total
        n = max(len(o.series), 1)
        print(
            f"{o.mode:<14}{o.utilisation:>6.0%}{o.tokens / o.wall:>8.0f}{o.steps / o.wall:>9.3f}"
            f"{o.steps / o.wall / base_rate:>8.1f}x{o.idle / o.wall:>7.0%}{sum(s[2] for s in o.series) / n:>10.0f}"
            f"{sum(s[3] for s in o.series) / n:>9.1f}  {shares} / {over:.0%} ({mean:.2f})"
        )
    for o in outcomes:
        print(
            f"{o.mode}: utilisation {o.utilisation * 100:.0f} %, {o.steps / o.wall / base_rate:.1f}x over synchronous"
        )
    print(plot(outcomes, Path(args.plot)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
