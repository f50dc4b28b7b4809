#!/usr/bin/env python
"""Is the driver's memory flat in N when the finalizer falls behind the rollouts?

``Driver`` over N tasks x 1 sample on an executor that finishes every rollout at once with a
realistic trace (``bench_driver.template_trace``: 6 messages, 2 model calls, a tool call),
``max_in_flight`` = C, into a temporary run directory (Parquet shards, as ``rollout-ray eval``
writes them), the stream drained as ``arun`` does. Nothing waits on a model, so the driver's
loop is the bottleneck, and finished groups pile up for the finalizer unless admission waits
for it (``EvalConfig.finished_buffer``). At each progress report (every 0.5 s): rollouts done,
the driver's VmRSS, and the groups finished and waiting to be finalized. Printed: those at the
first report, at each quarter of the run and at the last; first → last RSS, the most groups
ever waiting (the finalizer's own count where it keeps one, else the most seen at a report),
wall time and rollouts/s. The run is ``Driver.arun``, so its end counts too: the RSS once it
returned (its ``RunResult`` held), and the peak (VmHWM) over the whole run.

    python benchmarks/bench_driver_memory.py                 # N = 100,000, C = 256
    python benchmarks/bench_driver_memory.py --n 20000
    PYTHONPATH=<another checkout> python benchmarks/bench_driver_memory.py   # that tree's driver
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_driver import source_version, status_kib, table, template_trace

import rollout_ray
from rollout_ray import ChatHarness, Task, Trace
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray._hosting.executor import Executor
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray.testing import ScriptedModel


class Question(Task):
    """A task of its own index only."""


class Instant(Executor):
    """Every rollout finishes at once: a copy of the template trace, for this task."""

    def __init__(self) -> None:
        self.blob = msgspec.msgpack.encode(template_trace())
        self.decoder = msgspec.msgpack.Decoder(Trace)

    async def run(self, spec: RolloutSpec) -> Trace:
        trace = self.decoder.decode(self.blob)
        trace.id, trace.task = uuid.uuid4().hex, spec.task.trace_task()
        return trace


def waiting_groups(driver: Driver) -> int:
    """Groups finished and not yet taken by the finalizer (its queue; the same list before it was bounded)."""
    finalizer = driver._finalizer
    return 0 if finalizer is None else len(finalizer._closed)


async def measure(
    n: int, concurrency: int
) -> tuple[list[tuple[float, int, float, int]], float, int | None, tuple[float, float]]:
    reports: list[tuple[float, int, float, int]] = []  # (seconds, done, RSS MiB, waiting)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-driver-memory-") as root:
        driver: Driver | None = None

        def on_progress(progress: Any) -> None:
            assert driver is not None
            reports.append(
                (time.monotonic() - started, progress.done, status_kib("VmRSS") / 1024, waiting_groups(driver))
            )

        driver = Driver(
            (Question({"idx": i}) for i in range(n)),
            ChatHarness(),
            ScriptedModel(),
            executor=Instant(),
            config=EvalConfig(samples_per_task=1, max_in_flight=concurrency),
            run_dir=str(Path(root) / "run"),
            on_progress=on_progress,
            progress_every=0.5,
        )
        result = await driver.arun()
        wall = time.monotonic() - started
        end = (status_kib("VmRSS") / 1024, status_kib("VmHWM") / 1024)  # the result still held
        assert driver.progress.done == n == result.samples.num_rows, (driver.progress, result.samples.num_rows)
        statistics = getattr(driver._finalizer, "statistics", None)  # a bounded finalizer counts its most
    return reports, wall, statistics().most_waiting if statistics is not None else None, end


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="tasks (one sample each; default 100,000)")
    p.add_argument("--concurrency", type=int, default=256, help="max_in_flight (default 256)")
    args = p.parse_args(argv)
    gc.collect()
    reports, wall, most_waiting, (after, peak) = asyncio.run(measure(args.n, args.concurrency))
    marks = sorted({0, *(len(reports) * q // 4 for q in (1, 2, 3)), len(reports) - 1})
    rows = [[f"{reports[i][0]:.1f}", f"{reports[i][1]:,}", f"{reports[i][2]:.0f}", f"{reports[i][3]:,}"] for i in marks]
    print(
        f"driver of {Path(rollout_ray.__file__).parent.parent} ({source_version()}); N={args.n:,}, "
        f"C={args.concurrency}, finished_buffer={EvalConfig().model_dump().get('finished_buffer', 'none')}"
    )
    print(table(["s", "done", "driver RSS MiB", "groups waiting to be finalized"], rows))
    first, quarter, last = reports[0], reports[marks[1]], reports[-1]
    most = max(r[3] for r in reports) if most_waiting is None else most_waiting
    print(
        f"RSS first report → last: {first[2]:.0f} → {last[2]:.0f} MiB (from a quarter of the run: "
        f"{quarter[2]:.0f} → {last[2]:.0f}); most groups waiting: {most:,}; wall {wall:.1f} s, "
        f"{args.n / wall:,.0f} rollouts/s"
    )
    print(
        f"arun's end: RSS last report → once arun returned: {last[2]:.0f} → {after:.0f} MiB "
        f"({after - last[2]:+.0f}); peak RSS (VmHWM) {peak:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
