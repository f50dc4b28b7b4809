"""What does a weight update cost the fleet, with and without interrupting generation?

Long generations on the simulated model (its own processes, vLLM's scale-out routes: token in,
token out), a driver keeping ``--rollouts`` in flight on the LocalExecutor, and a trainer that
every ``--every`` seconds runs a weight update of ``--update`` seconds inside
``Driver.paused(version=v + 1, interrupt=...)``. Per scenario, over its updates:

* pause reached: seconds from asking for the pause to the last generation stopped at the
  servers (no generation request in flight). Without interrupt the trainer must wait for the
  calls in flight to finish before it changes the weights (``reload_weights`` waits for them:
  vLLM's ``/pause?mode=wait``); with interrupt they are stopped;
* trainer blocked: seconds from asking for the pause to the resume (the update included);
* fleet idle: per update, the seconds of generation capacity lost, summed over the slots and
  divided by their number (a slot is idle while its rollout has no generation at a server);
* tokens kept / thrown away: completion tokens in the stored traces, and tokens the servers
  sampled that no trace holds (an aborted generation's tail that was never read);
* continued calls: calls interrupted and continued (their tokens hold two versions).

A scenario is a row of ``SCENARIOS``: a name, the driver's ``EvalConfig`` fields and the
pause's arguments, so rows can be added (staleness by admission, say).

    python benchmarks/bench_interrupt.py                       # 32 rollouts × up to 1,000 tokens
    python benchmarks/bench_interrupt.py --rollouts 16 --quick # a smoke run

The issue's setting (128 rollouts of 4,000 tokens at 2 ms a token: 64k tokens/s) is ~8×
what the simulated model produces on this 2-core machine (~8k tokens/s with logprobs); the
default scales it down to 32 rollouts of 250 to 1,000 tokens at 4 ms a token (at most 8k
tokens/s) over four server processes, keeping its shape: generations (1 to 4 s) about as long
as the time between updates (5 s), an update of 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from rollout_ray import ChatHarness, Driver, EvalConfig, LocalExecutor, OpenAIModel, Task, reload_weights
from rollout_ray._record.trace import decode_trace


@dataclass(frozen=True)
class Scenario:
    name: str
    pause: dict[str, Any]
    """``Driver.paused`` arguments beside the version."""
    config: dict[str, Any] = field(default_factory=dict)
    """``EvalConfig`` fields beside ``max_in_flight`` and ``sampling``."""


SCENARIOS = [
    Scenario("interrupt=False", {"interrupt": False}),
    Scenario("interrupt=True", {"interrupt": True}),
    # Drop-and-rerun staleness: what an update overtook is thrown away and run again (an
    # interrupted rollout holds tokens of the old version; at max_staleness=0 it is stale).
    # Without interrupt nothing is: a rollout here makes one call, which ends before the bump.
    Scenario("drop-and-rerun (max_staleness=0)", {"interrupt": True}, {"max_staleness": 0}),
]


class Long(Task):
    """One long reply per rollout (the simulated model's preamble), scored by nothing."""


# -- the servers ------------------------------------------------------------------------------


async def _serve(per_token: float, tokens: int) -> None:
    """One simulated model with a ``GET /bench/stats`` route (tokens it sampled); prints its port."""
    from aiohttp import web

    from rollout_ray import SimulatedModelConfig, SimulatedModelServer

    class Counted(SimulatedModelServer):
        def _app(self) -> web.Application:
            app = super()._app()

            async def stats(request: web.Request) -> web.Response:
                return web.json_response({"tokens": self.stats.tokens, "aborted": self.stats.aborted})

            app.router.add_get("/bench/stats", stats)
            return app

    config = SimulatedModelConfig(
        ttft=0.01, per_token=per_token, preamble_tokens=tokens - 2, max_completion_tokens=tokens + 8, scale_out=True
    )
    async with Counted(config) as server:
        assert server.base_url is not None
        print(server.base_url.rsplit(":", 1)[1].removesuffix("/v1"), flush=True)
        await asyncio.Event().wait()


class Servers:
    """``count`` simulated models, each in its own process, the k-th answering with
    ``tokens * k / count`` tokens: generations of several lengths, as agents' are, so that the
    rollouts do not all start and end together."""

    def __init__(self, count: int, per_token: float, tokens: int) -> None:
        lengths = [max(4, tokens * (k + 1) // count) for k in range(count)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--serve", str(per_token), str(n)], stdout=subprocess.PIPE, text=True
            )
            for n in lengths
        ]
        self.urls = [f"http://127.0.0.1:{int(p.stdout.readline())}/v1" for p in self.procs]  # type: ignore[union-attr]

    async def sampled(self) -> int:
        async with aiohttp.ClientSession() as http:
            total = 0
            for url in self.urls:
                async with http.get(url.removesuffix("/v1") + "/bench/stats") as resp:
                    total += (await resp.json())["tokens"]
            return total

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


# -- one scenario -----------------------------------------------------------------------------


@dataclass
class Update:
    reached: float
    blocked: float
    idle: float


@dataclass
class Row:
    scenario: str
    updates: list[Update]
    kept: int
    thrown: int
    continued: int
    calls: int
    rerun: int
    two_versions: int
    rollouts: int
    wall: float


class Sampler:
    """Generation requests in flight from this process, sampled every ``step`` seconds."""

    def __init__(self, model: OpenAIModel, step: float = 0.002) -> None:
        self.model, self.step = model, step
        self.points: list[tuple[float, int]] = []
        self._task = asyncio.ensure_future(self._run())

    def now(self) -> int:
        return sum(s.inflight for s in self.model.pool.servers)

    async def _run(self) -> None:
        while True:
            self.points.append((time.monotonic(), self.now()))
            await asyncio.sleep(self.step)

    async def drained(self) -> float:
        while self.now():
            await asyncio.sleep(self.step / 2)
        return time.monotonic()

    def idle(self, start: float, end: float, slots: int) -> float:
        """Slot-seconds without a generation between ``start`` and ``end``, per slot."""
        inside = [(t, n) for t, n in self.points if start <= t <= end]
        total = sum((slots - n) * (t1 - t0) for (t0, n), (t1, _) in zip(inside, inside[1:]))
        return total / slots

    def stop(self) -> None:
        self._task.cancel()


async def scenario(s: Scenario, urls: list[str], args: argparse.Namespace, servers: Servers) -> Row:
    before = await servers.sampled()
    model = OpenAIModel(urls, name="simulated", token_capture="vllm", timeout=120, stream=args.stream)
    await reload_weights(model, "/checkpoints/step-0", 0)  # the servers are shared: each scenario starts at 0
    generation = args.tokens * args.per_token
    total = args.rollouts * max(2, round((args.updates * args.every + generation) / generation))
    config = EvalConfig(max_in_flight=args.rollouts, sampling={"temperature": 1.0}, **s.config)
    tasks = [Long({"idx": i, "prompt": f"What is {i} + 1?"}) for i in range(total)]
    updates: list[Update] = []
    async with LocalExecutor(runtime="local") as executor:
        driver = Driver(tasks, ChatHarness(retries=0), model, executor=executor, config=config)
        started = time.monotonic()
        sampler = Sampler(model)
        running = asyncio.ensure_future(driver.arun())
        for v in range(1, args.updates + 1):
            await asyncio.sleep(args.every)
            asked = time.monotonic()
            async with driver.paused(version=v, **s.pause):
                reached = await sampler.drained()  # without interrupt: the calls in flight finish
                await asyncio.sleep(args.update)  # the weights travel
                await reload_weights(model, f"/checkpoints/step-{v}", v)
            resumed = time.monotonic()
            updates.append(Update(reached - asked, resumed - asked, sampler.idle(asked, resumed, args.rollouts)))
        result = await running
        wall = time.monotonic() - started
        sampler.stop()
    await model.aclose()
    calls = [c for blob in result.samples["trace"].to_pylist() for c in decode_trace(blob).calls]
    kept = sum(len(ids) for seqs in result.samples["input_ids"].to_pylist() for ids in seqs or ()) - sum(
        mask.count(0) for masks in result.samples["loss_mask"].to_pylist() for mask in masks or ()
    )
    spans = zip(result.samples["policy_min"].to_pylist(), result.samples["policy_max"].to_pylist())
    return Row(
        s.name,
        updates,
        kept,
        await servers.sampled() - before - kept,
        sum(c.interrupts > 0 for c in calls),
        len(calls),
        result.stale,
        sum(lo != hi for lo, hi in spans),
        result.samples.num_rows,
        wall,
    )


def table(rows: list[Row]) -> str:
    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.2f} (max {max(values):.2f})" if values else "-"

    header = [
        "scenario",
        "pause reached s",
        "trainer blocked s",
        "fleet idle s / update",
        "tokens kept",
        "thrown away",
        "calls continued",
        "rollouts re-run",
        "rollouts of 2 versions",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [
            r.scenario,
            mean([u.reached for u in r.updates]),
            mean([u.blocked for u in r.updates]),
            mean([u.idle for u in r.updates]),
            f"{r.kept:,}",
            f"{r.thrown:,}",
            f"{r.continued} of {r.calls}",
            f"{r.rerun}",
            f"{r.two_versions} of {r.rollouts}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def measure(args: argparse.Namespace) -> list[Row]:
    servers = Servers(args.servers, args.per_token, args.tokens)
    try:
        return [await scenario(s, servers.urls, args, servers) for s in SCENARIOS]
    finally:
        servers.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32, help="rollouts in flight")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per generation")
    parser.add_argument("--per-token", type=float, default=0.004, help="seconds per token")
    parser.add_argument(
        "--servers",
        type=int,
        default=4,
        help="simulated-model processes; the k-th answers with tokens * k / servers tokens",
    )
    parser.add_argument("--stream", action="store_true", help="stream the generations (SSE) from the servers")
    parser.add_argument("--updates", type=int, default=3, help="weight updates per scenario")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between updates")
    parser.add_argument("--update", type=float, default=1.0, help="seconds a weight update takes")
    parser.add_argument("--quick", action="store_true", help="250-token generations, 2 updates every 1.5 s")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(float(args.serve[0]), int(args.serve[1])))
        return
    if args.quick:
        args.tokens, args.updates, args.every, args.update = 250, 2, 1.5, 0.3
    rows = asyncio.run(measure(args))
    print(
        f"{args.rollouts} rollouts in flight, generations of up to {args.tokens} tokens at "
        f"{args.per_token * 1000:g} ms/token ({args.rollouts / args.per_token:,.0f} tokens/s asked at most) on "
        f"{args.servers} simulated-model processes{' (SSE)' if args.stream else ''}; "
        f"an update of {args.update:g} s every {args.every:g} s, {args.updates} per scenario; cpus={os.cpu_count()}"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
