#!/usr/bin/env python
"""What the lifecycle itself costs per rollout: no network, no Ray, no driver.

    python benchmarks/bench_lifecycle.py            # 2,000 rollouts at once, best of 5
    python benchmarks/bench_lifecycle.py --n 500 --reps 9

The quick loop for lifecycle levers (issue 11): ``RolloutHost.run`` over examples/arith.py
specs with ``ChatHarness`` against an in-process ``ScriptedModel`` answering at once, the
owned runtime the rollout actor's (``owned_runtime``: a ``LazyRuntime`` over a
``RemoteRuntime``, never provisioned: an in-process chat needs no box). Each repetition runs all N at once on one event loop; the best CPU time of
the repetitions is kept (the slower ones are the machine's noise, not the code's).

Rows: ``plain asyncio`` calls the same model once per rollout with the same opening messages
and nothing else (the floor of an in-process rollout); ``lifecycle`` is the whole rollout
(open, setup, one turn through the session, close, scoring, the trace encoded as an actor
returns it). The ratio column is against plain asyncio. A network rollout adds its HTTP call
(~0.4 CPU-ms for aiohttp in the client here) and, on Ray, the actor call and the driver's
side (benchmarks/bench_cost.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollout_ray import ChatHarness, Runtime  # noqa: E402
from rollout_ray._cli.taskset_loader import import_taskset  # noqa: E402
from rollout_ray._core.interception import LocalInterception  # noqa: E402
from rollout_ray._hosting.gc_tuning import tune_for_rollouts  # noqa: E402
from rollout_ray._hosting.rollout_host import RolloutHost  # noqa: E402
from rollout_ray._hosting.spec import RolloutSpec  # noqa: E402
from rollout_ray._ray.remote_runtime import owned_runtime  # noqa: E402
from rollout_ray._ray.wire import trace_to_wire  # noqa: E402
from rollout_ray._record.messages import Request, Response, UserMessage  # noqa: E402
from rollout_ray.testing import ScriptedModel  # noqa: E402


def _no_actor() -> None:
    raise AssertionError("an in-process chat rollout provisioned a box")


def _runtime(name: str) -> Runtime:
    return owned_runtime(name, "local", _no_actor)


class Answers(ScriptedModel):
    """``ScriptedModel`` answering "4" at once, without keeping every request (a log that grew
    over the repetitions would weigh on the garbage collector)."""

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        response = await super().complete(request, model=model, sampling=sampling)
        self.requests.clear()
        return response


async def measure(n: int, reps: int) -> dict[str, float]:
    tasks = import_taskset(str(ROOT / "examples" / "arith.py")).tasks(n)
    model = Answers(default="4")
    harness = ChatHarness()
    host = RolloutHost(n, interception=LocalInterception(), runtime_factory=_runtime)
    specs = [RolloutSpec(t, harness, model) for t in tasks]
    requests = [Request([UserMessage(t.data.prompt)]) for t in tasks]

    async def plain() -> None:
        await asyncio.gather(*(model.complete(r, model=None, sampling={}) for r in requests))

    async def one(spec: RolloutSpec) -> bytes:
        return trace_to_wire(await host.run(spec))  # as a rollout actor hands it back

    async def lifecycle() -> None:
        await asyncio.gather(*(one(s) for s in specs))

    await lifecycle()  # warm: imports, hook and signature caches
    tune_for_rollouts()  # as a rollout actor runs
    best: dict[str, float] = {}
    for name, run in (("plain asyncio", plain), ("lifecycle", lifecycle)):
        times = []
        for _ in range(reps):
            t0 = time.process_time()
            await run()
            times.append(time.process_time() - t0)
        best[name] = min(times) / n
    gc.enable()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="rollouts at once per repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions; the best is kept")
    args = parser.parse_args()
    best = asyncio.run(measure(args.n, args.reps))
    floor = best["plain asyncio"]
    print(f"\nIn-process rollouts, {args.n} at once, best of {args.reps} (CPU us per rollout):\n")
    print("| row | CPU us/rollout | x plain asyncio |")
    print("|---|---:|---:|")
    for name, cost in best.items():
        print(f"| {name} | {1e6 * cost:.0f} | {cost / floor:.1f} |")


if __name__ == "__main__":
    main()
