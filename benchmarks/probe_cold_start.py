#!/usr/bin/env python
"""Where does `rollout-ray eval`'s cold start go? Phase times of one eval, from the command's
start: the CLI imported, Ray's start (`init_ray`), the rollout actors answering (`ready`), the
driver's start and the first model call (at the built-in simulated model, which this
process serves).

    python benchmarks/probe_cold_start.py 3          # 3 evals, each in its own process

Each eval runs examples/arith.py (--limit 200) on a fresh private local Ray against the
built-in simulated model; the phases are marked by wrapping the functions named above in the
child process (the command is `rollout_ray._cli.main.main`, as the `rollout-ray` script runs
it). Run it alone: the machine's other load lands in the numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
T0 = time.monotonic()
marks = {}
def mark(name):
    marks.setdefault(name, round(time.monotonic() - T0, 3))
from rollout_ray._cli import main as cli
mark("cli imported")
import rollout_ray._ray.ray_executor as executor
import rollout_ray._ray.head as head
import rollout_ray._driver.driver as driver
import rollout_ray._simulated.model_server as simulated
start_ray = head.init_ray
def init_ray(*args, **kwargs):
    mark("ray.init start"); start_ray(*args, **kwargs); mark("ray.init end")
executor.init_ray = head.init_ray = init_ray
ready = executor.RayExecutor.ready
async def actors_ready(self, *args, **kwargs):
    answer = await ready(self, *args, **kwargs); mark("actors ready"); return answer
executor.RayExecutor.ready = actors_ready
arun = driver.Driver.arun
async def driven(self, *args, **kwargs):
    mark("driver start"); return await arun(self, *args, **kwargs)
driver.Driver.arun = driven
chat = simulated.SimulatedModelServer._chat  # the built-in model serves from this process
async def first_call(self, *args, **kwargs):
    mark("first model call"); return await chat(self, *args, **kwargs)
simulated.SimulatedModelServer._chat = first_call
code = cli.main(["eval", sys.argv[1], "--limit", "200", "--out", sys.argv[2]])
print("@@" + json.dumps({"code": code, **marks}))
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(ROOT / "examples" / "arith.py"), str(Path(out) / "run")],
                capture_output=True,
                text=True,
                timeout=300,
            )
        line = next((l for l in done.stdout.splitlines() if l.startswith("@@")), None)
        if line is None:
            sys.exit(f"eval failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        rows.append(json.loads(line[2:]))
    phases = ["cli imported", "ray.init start", "ray.init end", "actors ready", "driver start", "first model call"]
    print("seconds from the command's start, one eval per row (examples/arith.py --limit 200):\n")
    print("| " + " | ".join(phases) + " | ray.init | actors |")
    print("|" + "---:|" * (len(phases) + 2))
    for r in rows:
        print(
            "| "
            + " | ".join(f"{r.get(p, float('nan')):.2f}" for p in phases)
            + f" | {r['ray.init end'] - r['ray.init start']:.2f} | {r['actors ready'] - r['ray.init end']:.2f} |"
        )


if __name__ == "__main__":
    main()
