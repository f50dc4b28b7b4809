#!/usr/bin/env python
"""What does one exec cost in each runtime kind, and what does a runtime's start+stop cost?

For each kind (``LocalRuntime``, ``SandboxRuntime`` with its default limits), one runtime at a
time in this process, nothing else in flight:

* start+stop: ``--cycles`` runtimes each started, used by one ``true`` (so stop has a program
  to clean up after, as in a rollout) and stopped; the wall time of start + stop (the ``true``
  excluded);
* exec: on one started runtime, ``--execs`` sequential execs of ``true`` and of
  ``python3 -c pass`` (the system interpreter by absolute path, the same in both kinds, so the
  row measures the runtime and not a PATH lookup or a pyenv shim), after 5 warm-up execs.

Per row: median and p95 wall milliseconds per operation, CPU milliseconds per operation of this
process and its waited-for descendants (``getrusage`` ``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``), and
CPU milliseconds per operation of the whole machine (``/proc/stat``, all but idle and iowait).
The rusage column misses what bwrap's PID namespace runs: bwrap exits without reaping the
namespace's init, so the program's own CPU is never added to ``RUSAGE_CHILDREN``; the machine
column has it (and any other load: run it on a quiet machine).

    python benchmarks/bench_sandbox.py                      # 200 execs, 20 start/stop cycles
    python benchmarks/bench_sandbox.py --execs 50 --cycles 5 --kinds sandbox
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollout_ray import LocalRuntime, SandboxRuntime  # noqa: E402
from rollout_ray._runtimes.sandbox import sandbox_unavailable  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else (shutil.which("python3") or "python3")
KINDS: dict[str, Callable[[str], LocalRuntime]] = {
    "local": lambda root: LocalRuntime(root=root),
    "sandbox": lambda root: SandboxRuntime(root=root),
}


@dataclass
class Row:
    kind: str
    what: str
    n: int
    median_ms: float
    p95_ms: float
    cpu_ms: float
    machine_ms: float


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its waited-for descendants."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def machine_seconds() -> float:
    """CPU seconds the whole machine spent busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def timed(n: int, op: Callable[[], Awaitable[float]]) -> tuple[list[float], float, float]:
    """Run ``op`` ``n`` times; its own wall seconds each, and the CPU seconds of all ``n``
    (this process tree's, the machine's)."""
    cpu0, machine0 = cpu_seconds(), machine_seconds()
    walls = [await op() for _ in range(n)]
    return walls, cpu_seconds() - cpu0, machine_seconds() - machine0


def row(kind: str, what: str, walls: list[float], cpu: float, machine: float) -> Row:
    return Row(
        kind,
        what,
        len(walls),
        statistics.median(walls) * 1e3,
        p95(walls) * 1e3,
        cpu * 1e3 / len(walls),
        machine * 1e3 / len(walls),
    )


async def bench_cycles(kind: str, root: str, cycles: int) -> Row:
    async def cycle() -> float:
        rt = KINDS[kind](root)
        t0 = time.perf_counter()
        await rt.start()
        t1 = time.perf_counter()
        result = await rt.exec(["true"])
        assert result.exit_code == 0, result.stderr
        t2 = time.perf_counter()
        await rt.stop()
        return (t1 - t0) + (time.perf_counter() - t2)

    return row(kind, "start+stop", *await timed(cycles, cycle))


async def bench_execs(kind: str, root: str, execs: int) -> list[Row]:
    rows = []
    rt = KINDS[kind](root)
    await rt.start()
    try:
        for what, argv in (("exec true", ["true"]), ("exec python3 -c pass", [PYTHON, "-c", "pass"])):
            for _ in range(5):  # warm-up: page cache, first-use costs
                await rt.exec(argv)

            async def one(argv: list[str] = argv) -> float:
                t0 = time.perf_counter()
                result = await rt.exec(argv)
                assert result.exit_code == 0, result.stderr
                return time.perf_counter() - t0

            rows.append(row(kind, what, *await timed(execs, one)))
    finally:
        await rt.stop()
    return rows


def table(rows: list[Row]) -> str:
    head = ("kind", "operation", "n", "median ms", "p95 ms", "CPU-ms/op (rusage)", "machine CPU-ms/op")
    cells = [head] + [
        (r.kind, r.what, str(r.n), f"{r.median_ms:.2f}", f"{r.p95_ms:.2f}", f"{r.cpu_ms:.2f}", f"{r.machine_ms:.2f}")
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cell, widths))) for cell in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def source_version() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + (" + working tree" if git("status", "--porcelain", "--untracked-files=no") else "")


async def main(args: argparse.Namespace) -> None:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as root:
        for kind in args.kinds:
            if kind == "sandbox" and (reason := sandbox_unavailable()) is not None:
                print(f"sandbox skipped: {reason}", file=sys.stderr)
                continue
            rows.append(await bench_cycles(kind, root, args.cycles))
            rows.extend(await bench_execs(kind, root, args.execs))
    print(
        f"Runtimes: {args.execs} execs, {args.cycles} start/stop cycles, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {PYTHON}, source {source_version()}"
    )
    print(table(rows))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=200, help="execs per program and kind")
    parser.add_argument("--cycles", type=int, default=20, help="start/stop cycles per kind")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
