#!/usr/bin/env python
"""CPU per rollout by process for one executor, with an optional py-spy profile of one process:
the quick loop behind each lever measured in README.md's bench_cost section.

    python benchmarks/profile_rollout_cost.py 3000                 # ray, 1 actor
    ACTORS=2 python benchmarks/profile_rollout_cost.py 3000 driver  # + py-spy of the driver
    python benchmarks/profile_rollout_cost.py 3000 --local          # LocalExecutor, GC time too
    python benchmarks/profile_rollout_cost.py 3000 --tool           # calc_tool.py: one tool call

examples/arith.py tasks (--tool: examples/calc_tool.py, a calculator call then the answer),
ChatHarness, the simulated model at 0.09 s in a child process, 256 in flight; a warm-up run of
300, then N measured. Prints CPU-ms per rollout of the driver, the
model and each Ray process of this run (found by name under /proc, so run it alone), and, with
--local, the time spent in garbage collection (gc.callbacks), by generation. With a process
name, py-spy (installed separately) records it to /tmp/<name>.txt in raw format.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY_PROCESSES = ("_RolloutActor", "RuntimeHost", "_NodeServiceActor", "gcs_server", "raylet")


def cpu_of(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ray_processes() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv0 = open(f"/proc/{entry}/cmdline").read().split("\0")[0]
            except OSError:
                continue
            for name in RAY_PROCESSES:
                if name in argv0:
                    found.setdefault(name, []).append(int(entry))
    return found


async def main(n: int, profile: str | None, local: bool) -> None:
    from rollout_ray import ChatHarness, Driver, EvalConfig, LocalExecutor, OpenAIModel, RayExecutor
    from rollout_ray._cli.taskset_loader import import_taskset

    server = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", "serve-model", "--port", "0", "--ttft", "0.09"],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = server.stdout.readline().split()[-1]  # type: ignore[union-attr]
    try:
        example = "calc_tool.py" if "--tool" in sys.argv else "arith.py"
        tasks = import_taskset(str(ROOT / "examples" / example)).tasks(n + 300)
        model = OpenAIModel(url, name="simulated")
        executor = LocalExecutor() if local else RayExecutor(actors=int(os.environ.get("ACTORS", "1")))
        async with executor:
            config = EvalConfig(max_in_flight=256)
            await Driver(
                tasks[n:], ChatHarness(), model, executor=executor, config=config, run_dir=tempfile.mkdtemp()
            ).arun()
            pids = {"driver": [os.getpid()], "model": [server.pid], **({} if local else ray_processes())}
            before = {k: sum(cpu_of(p) for p in v) for k, v in pids.items()}
            collecting = [0.0]
            started: list[float] = []
            by_generation: dict[int, list[float]] = {}  # generation: [collections, seconds]

            def on_gc(phase: str, info: dict) -> None:
                if phase == "start":
                    started.append(time.perf_counter())
                elif started:
                    took = time.perf_counter() - started.pop()
                    collecting[0] += took
                    seen = by_generation.setdefault(info["generation"], [0, 0.0])
                    seen[0] += 1
                    seen[1] += took

            gc.callbacks.append(on_gc)
            spy = None
            if profile:
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "-p",
                        str(pids[profile][0]),
                        "-o",
                        f"/tmp/{profile}.txt",
                        "-f",
                        "raw",
                        "-r",
                        "200",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            t0 = time.monotonic()
            result = await Driver(
                tasks[:n], ChatHarness(), model, executor=executor, config=config, run_dir=tempfile.mkdtemp()
            ).arun()
            wall = time.monotonic() - t0
            gc.callbacks.remove(on_gc)
            if spy is not None:
                spy.send_signal(2)
                spy.wait()
            after = {k: sum(cpu_of(p) for p in v) for k, v in pids.items()}
        await model.aclose()
        ok = sum(result.samples["ok"].to_pylist())
        print(f"n={n} wall={wall:.2f}s rate={n / wall:.0f}/s ok={ok}")
        for name in pids:
            print(f"  {name:16s} {1000 * (after[name] - before[name]) / n:.2f} CPU-ms/rollout")
        print(f"  {'total':16s} {1000 * sum(after[k] - before[k] for k in pids) / n:.2f}")
        print(f"  driver GC       {1000 * collecting[0] / n:.3f} ms/rollout")
        for generation, (count, seconds) in sorted(by_generation.items()):
            print(f"    generation {generation}: {count} collections, {1000 * seconds / max(1, count):.1f} ms each")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(int(args[0]) if args else 3000, args[1] if len(args) > 1 else None, "--local" in sys.argv))
