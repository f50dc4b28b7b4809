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
(utilisation, in-flight, queue per mode, the trainer's training and weight updates shaded) is
written as an SVG with ``--plot PATH`` (``_svg_plot``: no plotting library).

    python benchmarks/bench_fleet.py            # 4 servers x 64 slots, 8 steps of 32 groups x 8
    python benchmarks/bench_fleet.py --quick    # 2 servers x 16 slots, 4 steps of 8 groups x 4
    python benchmarks/bench_fleet.py --quick --train-sweep 2,6,13.4,20,28   # speedup per trainer step time
    python benchmarks/bench_fleet.py --quick --plot docs/img/bench_fleet.svg

A step's batch is one fleet's worth of rollouts (groups x samples = servers x slots), and the
trainer's step time defaults to the balanced point: the seconds one step's rollouts take to
generate with every slot busy (``balanced_train``), as a real run is tuned (the batch to the
fleet) so that neither the trainer nor the fleet waits. A synchronous step costs generation +
training, an asynchronous one about the larger of the two, so that is where async gains most;
``--train-sweep`` measures the speedup on either side of it. The trainer's seconds are the
fleet's: on a loaded machine the capacity model's steps take longer than they say (the table's
``clock``: wall seconds per fleet second), and the trainer's sleep is stretched alike, so the
ratio of training to generation is the configured one. The modes run one after the other, and
the machine's load differs between them: ``on clock`` is the speedup in the fleet's seconds
(steps per fleet second), the fair comparison when their ``clock`` differs.

The servers, the driver, the tools and the trainer share this process and its 2 cores: the
fleet's clock is the capacity model's steps, which stretch when the process is busy, so compare
modes within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from contextlib import AsyncExitStack
from pathlib import Path
from statistics import NormalDist
from typing import Any

from _fleet_report import Outcome, plot, table  # benchmarks/ is the script's directory

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


def first_versions(samples: Any) -> list[int]:
    return [
        min((c.policy for c in decode_trace(blob).calls if c.policy is not None), default=0)
        for blob in samples.column("trace").to_pylist()
    ]


def mean_answer(args: argparse.Namespace) -> float:
    """Mean tokens of an answer: the lognormal's mean below ``--max-tokens`` (E[min(X, cap)]),
    plus ~15 tokens of the plan's message (a tool call or the final answer)."""
    mu, sigma, cap = math.log(args.gen_median), args.gen_sigma, args.max_tokens
    if sigma == 0:
        return min(args.gen_median, cap) + 15
    phi = NormalDist().cdf
    below = math.exp(mu + sigma**2 / 2) * phi((math.log(cap) - mu - sigma**2) / sigma)
    return below + cap * (1 - phi((math.log(cap) - mu) / sigma)) + 15


def balanced_train(args: argparse.Namespace) -> float:
    """Seconds one step's rollouts take to generate with every slot of the fleet busy: the
    trainer step time at which generation and training balance (the estimate; ``--train-sweep``
    measures where the speedup peaks)."""
    tokens = args.groups * args.samples * (args.turns + 1) * mean_answer(args)
    per_second = args.servers * args.batch / (args.step_base + args.step_per_seq * args.batch)
    return tokens / per_second


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
        phase = ["wait"]

        async def sample() -> None:
            before: list[tuple[float, float] | None] = [None] * len(servers)
            while not done.is_set():
                scheds = [s.batcher.scheduler for s in servers if s.batcher is not None]
                now = time.monotonic()
                for i, x in enumerate(scheds):  # the fleet's clock, over intervals an engine ran throughout
                    last, before[i] = before[i], (now, x.counters.busy_seconds) if x.running else None
                    if last is not None and x.running:
                        out.clock[0] += x.counters.busy_seconds - last[1]
                        out.clock[1] += now - last[0]
                out.series.append(
                    (
                        time.monotonic() - started,
                        sum(len(x.running) for x in scheds) / slots,
                        driver.progress.in_flight,
                        sum(len(x.waiting) for x in scheds),
                        phase[0],
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
                phase[0] = "train"
                # The trainer's GPU step, on the fleet's clock: this loaded process stretches the
                # fleet's steps, and a trainer on wall seconds would look faster than its fleet.
                await asyncio.sleep(args.train * out.stretch)
                phase[0], updating = "update", time.monotonic()
                version = driver.policy_version + 1
                async with driver.paused(version=version, **pause):
                    await reload_weights(model, f"/checkpoints/step-{version}", version)
                out.update += time.monotonic() - updating
                out.steps += 1
                out.step_ends.append(time.monotonic() - started)
                if out.steps == args.steps:
                    break
            phase[0], asked = "wait", time.monotonic()
        out.wall = time.monotonic() - started
        done.set()
        await sampler
        await stream.aclose()  # what is still in flight is cancelled
        out.tokens = sum(s.batcher.scheduler.counters.generation_tokens for s in servers if s.batcher is not None)
    return out


def compare(modes: list[str], args: argparse.Namespace) -> list[Outcome]:
    outcomes = []
    for mode in modes:
        outcomes.append(asyncio.run(run(mode, args)))
        o = outcomes[-1]
        print(f"  {mode}: {o.steps} steps in {o.wall:.1f} s ({o.leaked} unretrieved task errors)", flush=True)
    return outcomes


def sweep(times: list[float], modes: list[str], args: argparse.Namespace) -> None:
    """The same fleet, rollouts and rules at each trainer step time ``T``: where does async pay most?

    A synchronous step is generation + T, an asynchronous one about max(generation, T): the
    speedup peaks where T meets ours' generation time per step (the balanced point)."""
    rows = []
    for t in times:
        args.train = t
        print(f"train {t:g} s a step:", flush=True)
        outcomes = compare(modes, args)
        print("\n".join(table(outcomes)), flush=True)
        rows.append((t, outcomes))
    print("\nsweep over the trainer's step time (s/step = wall / trainer steps; idle = trainer waiting for groups)")
    head = "".join(f"{m + ' util':>18}{'s/step':>8}{'idle':>6}" for m in modes)
    print(f"{'T s':>6}{head}{'speedup':>9}{'steady':>8}")
    for t, outcomes in rows:
        base = next((o for o in outcomes if o.mode == "synchronous"), outcomes[0])
        ours = next((o for o in outcomes if o.mode == "ours"), outcomes[-1])
        cells = "".join(
            f"{o.utilisation:>18.0%}{o.wall / max(o.steps, 1):>8.1f}{o.idle / o.wall:>6.0%}" for o in outcomes
        )
        print(f"{t:>6g}{cells}{ours.rate / base.rate:>8.1f}x{ours.steady / base.steady:>7.1f}x")


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
    p.add_argument("--groups", type=int, default=32, help="groups per trainer step (batch_groups)")
    p.add_argument("--samples", type=int, default=8, help="samples per task")
    p.add_argument(
        "--train",
        type=float,
        default=None,
        help="seconds a trainer step takes, on the fleet's clock (default: the balanced point, one step's "
        "generation on the busy fleet)",
    )
    p.add_argument("--k", type=int, default=2, help="max_staleness of ours")
    p.add_argument("--sample", type=float, default=0.25, help="seconds between utilisation samples")
    p.add_argument("--modes", default="", help=f"comma-separated, of {','.join(MODES)} (default: all)")
    p.add_argument("--plot", default="", metavar="PATH", help="write the series as an SVG there")
    p.add_argument(
        "--train-sweep",
        default="",
        metavar="T1,T2,...",
        help="run the modes (default synchronous,ours) at each trainer step time and tabulate the speedup",
    )
    p.add_argument("--quick", action="store_true", help="2 servers x 16 slots, 4 steps of 8 groups x 4")
    if p.parse_known_args(argv)[0].quick:  # smaller defaults; a flag given still wins
        p.set_defaults(servers=2, batch=16, steps=4, groups=8, samples=4)
    args = p.parse_args(argv)
    TOOL_WAIT[0] = args.tool_wait
    balanced = balanced_train(args)
    print(
        f"balanced point: one step's generation ({args.groups * args.samples} rollouts x {args.turns + 1} answers "
        f"of ~{mean_answer(args):.0f} tokens) with every slot busy takes {balanced:.1f} s; a real run "
        "is tuned near it (batch size vs fleet size), where async gains most: synchronous pays generation + "
        "training a step, async about the larger of the two"
    )
    if args.train is None:
        args.train = round(balanced, 1)
    print(
        f"{args.servers} servers x {args.batch} slots; {args.steps} steps of {args.groups} groups x {args.samples} "
        f"samples, {args.turns} tool calls each (median {args.tool_wait} s), answers median {args.gen_median} "
        f"tokens sigma {args.gen_sigma}; train {args.train} s a step; ours: max_staleness {args.k}"
    )
    if args.train_sweep:
        modes = args.modes.split(",") if args.modes else ["synchronous", "ours"]
        sweep([float(t) for t in args.train_sweep.split(",")], modes, args)
        return 0
    outcomes = compare(args.modes.split(",") if args.modes else list(MODES), args)
    print("\n".join(table(outcomes)))
    base = next((o for o in outcomes if o.mode == "synchronous"), outcomes[0])
    for o in outcomes:
        print(f"{o.mode}: utilisation {o.utilisation * 100:.0f} %, {o.rate / base.rate:.1f}x over synchronous")
    if args.plot:
        caption = (
            f"bench_fleet.py: {args.servers} servers x {args.batch} slots, {args.groups} groups x {args.samples} "
            f"a step, train {args.train:g} s"
        )
        print(plot(outcomes, Path(args.plot), caption))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
