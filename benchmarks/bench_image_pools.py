#!/usr/bin/env python
"""How fast is a sandbox over an image ready, cold, from the warm pool, from a group's setup
snapshot; what does an idle one hold; and do N of them at once leave anything behind? (issue 23)

One ``RuntimeHost`` of sandboxes (what a runtime actor runs), the python image the tests build
from Debian's packages (``tests/runtimes/image_rig``), its cache warm. "Ready" is the time from
asking for a runtime to the end of its first ``true``:

* cold: a new sandbox started (directories, overlay, cgroups, under the node's start cap);
* warm pool: the host was told images are coming (``prepare``) and filled its pool; the rollout
  takes a started, checked member (each take waits for the refill, as rollouts arriving slower
  than one start would);
* group snapshot: a setup (``--setup-seconds`` of sleep, then 10 MB in 200 files) ran once in a
  first sandbox and was frozen; each other sample starts and stands on it (``claim_setup``).
  For comparison, cold plus the setup is what each sample pays without it.

Memory: ``--idle`` sandboxes started and left idle; the PSS of every process they hold, and the
fall of the machine's ``MemAvailable`` (noisy on a shared machine), divided by their number.

Scale: ``--concurrent`` sandboxes started at once (under the node's cap), all alive together,
each running one program (``--exec-parallel`` at a time), then all stopped and the host shut down; then nothing may be left:
no process with the host's marker, no mount under its root, no root, no cgroup, no snapshot.

Exec against live sandboxes (``--exec-vs-live``): exec p50 with 1, 100, ... image sandboxes
alive on the host; each mounts in its own namespace, so it should stay flat (issue 32 §1).

    python benchmarks/bench_image_pools.py --samples 30 --idle 100 --concurrent 1000
    python benchmarks/bench_image_pools.py --exec-vs-live 1,100,300,1000 --samples 30
    python benchmarks/bench_image_pools.py --only-concurrent --concurrent 1000 --execs-each 20
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runtimes")]

import image_rig  # noqa: E402

from rollout_ray._runtimes import image_cache  # noqa: E402
from rollout_ray._runtimes.guardian import HOST_MARKER, mounts_under, pids_with_marker  # noqa: E402
from rollout_ray._runtimes.host import RuntimeHost  # noqa: E402

SETUP = "sleep {s}; mkdir -p /work/repo && for i in $(seq 200); do head -c 51200 /dev/urandom > /work/repo/f$i; done"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def ready(host: RuntimeHost, name: str, image: str) -> float:
    """Seconds from asking for runtime ``name`` to the end of its first ``true``."""
    t0 = time.perf_counter()
    await host.create_started(name, owner="bench", image=image)
    HANDED_OUT.append(time.perf_counter() - t0)
    result = await host.exec(name, ["true"])
    assert result.exit_code == 0, result.stderr
    return time.perf_counter() - t0


HANDED_OUT: list[float] = []
"""Seconds of each ``create_started`` alone (cleared per kind)."""


async def bench_cold(image: str, n: int) -> list[float]:
    host = RuntimeHost(kind="sandbox")
    try:
        out = []
        for i in range(n):
            out.append(await ready(host, f"cold-{i}", image))
            await host.stop(f"cold-{i}")
        return out
    finally:
        await host.shutdown()


async def bench_warm(image: str, n: int) -> tuple[list[float], dict[str, object]]:
    host = RuntimeHost(kind="sandbox")
    try:
        out = []
        for i in range(n):
            await host.prepare({image: n - i})
            await host.pool.settled()
            out.append(await ready(host, f"warm-{i}", image))
            await host.stop(f"warm-{i}")
        return out, host.statistics()["pool"][image]
    finally:
        await host.shutdown()


async def bench_snapshot(image: str, n: int, setup_seconds: float) -> tuple[float, list[float]]:
    """(seconds of the first sample: start, setup, freeze; ready times of the others)."""
    host = RuntimeHost(kind="sandbox")
    key = f"bench-{os.getpid()}-{time.time_ns()}"
    try:
        t0 = time.perf_counter()
        runtime = host.new_runtime("first", owner="bench", image=image)
        await runtime.start()
        assert await runtime.claim_setup(key) is None
        done = await runtime.exec(["sh", "-c", SETUP.format(s=setup_seconds)])
        assert done.exit_code == 0, done.stderr
        assert await runtime.freeze_setup() is not None
        first = time.perf_counter() - t0
        out = []
        for i in range(n):
            t1 = time.perf_counter()
            rt = host.new_runtime(f"sample-{i}", owner="bench", image=image)
            await rt.start()
            assert await rt.claim_setup(key) is not None
            look = await rt.exec(["sh", "-c", "ls /work/repo | wc -l"])
            assert look.stdout.strip() == "200", look
            out.append(time.perf_counter() - t1)
            await host.stop(rt.name)
        return first, out
    finally:
        await host.shutdown()


def meminfo() -> dict[str, int]:
    with open("/proc/meminfo") as f:
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}


def pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except OSError:
            continue
    return total


async def bench_idle(image: str, n: int) -> tuple[float, float, float, int]:
    """(PSS, MemAvailable fall, kernel slab and shmem growth: per idle sandbox; processes)."""
    host = RuntimeHost(kind="sandbox")
    try:
        before = meminfo()
        for i in range(n):
            await ready(host, f"idle-{i}", image)
        after = meminfo()
        procs = pids_with_marker(HOST_MARKER, host.token)
        kernel = sum(after[k] - before[k] for k in ("Slab", "Shmem"))
        return pss(procs) / n, (before["MemAvailable"] - after["MemAvailable"]) / n, kernel / n, len(procs)
    finally:
        await host.shutdown()


async def bench_concurrent(image: str, n: int, parallel: int, execs_each: int = 1) -> dict[str, object]:
    host = RuntimeHost(kind="sandbox")
    root, cgroups, token = host.root, list(host._cgroups.dirs), host.token
    t0 = time.perf_counter()
    names = [f"c-{i}" for i in range(n)]
    try:
        infos = await asyncio.gather(*(host.create_started(name, owner="bench", image=image) for name in names))
        started = time.perf_counter() - t0
        assert len({info.id for info in infos}) == n
        alive = len(host.names())
        # All alive at once; their programs a few at a time (a thousand at once is a thousand
        # processes on 2 cores, shared).
        room = asyncio.Semaphore(parallel)
        took: list[float] = []

        async def one(name: str) -> Any:
            async with room:
                t = time.perf_counter()
                result = await host.exec(name, ["sh", "-c", "echo $$ > /work/pid; cat /work/pid"])
                took.append(time.perf_counter() - t)
                return result

        async def rollout(name: str) -> list[Any]:  # its execs one after another, as an agent's
            return [await one(name) for _ in range(execs_each)]

        results = [r for rs in await asyncio.gather(*(rollout(name) for name in names)) for r in rs]
        execs = time.perf_counter() - t0 - started
        assert all(r.exit_code == 0 for r in results)
        t1 = time.perf_counter()
        await asyncio.gather(*(host.stop(name) for name in names))
        stopped = time.perf_counter() - t1
    finally:
        await host.shutdown()
    total = time.perf_counter() - t0
    return {
        "n": n,
        "execs_each": execs_each,
        "alive_at_once": alive,
        "start_s": round(started, 2),
        "exec_s": round(execs, 2),
        "exec_p50_ms": round(1000 * percentile(took, 0.5)),
        "exec_p99_ms": round(1000 * percentile(took, 0.99)),
        "stop_s": round(stopped, 2),
        "total_s": round(total, 2),
        "left_processes": len(pids_with_marker(HOST_MARKER, token)),
        "left_mounts": len(mounts_under(root)),
        "left_root": os.path.exists(root),
        "left_cgroups": sum(os.path.isdir(d) for d in cgroups),
        "left_snapshots": len(os.listdir(image_cache.default_image_cache().snapshots._dir("entries"))),
    }


async def bench_exec_vs_live(image: str, counts: list[int], samples: int) -> list[dict[str, object]]:
    """Exec cost against the number of live image sandboxes on the host (issue 32 §1): for
    each count, that many started and left alive (or, below the last count, the others
    stopped), then ``samples`` execs of ``true``, one at a time, in the first one. Each sandbox mounts in its own namespace (``mount_ns.py``):
    the table an exec copies does not grow with the others."""
    host = RuntimeHost(kind="sandbox")
    rows: list[dict[str, object]] = []
    try:
        live: list[str] = []
        made = itertools.count()
        for count in counts:
            t0 = time.perf_counter()
            while len(live) < count:
                batch = [f"live-{next(made)}" for _ in range(min(count - len(live), 50))]
                await asyncio.gather(*(host.create_started(n, owner="bench", image=image) for n in batch))
                live += batch
            if len(live) > count:  # a count below the last: the others stopped (is it load, or the count?)
                await asyncio.gather(*(host.stop(n) for n in live[count:]))
                del live[count:]
            started = time.perf_counter() - t0
            took = []
            for _ in range(samples):
                t = time.perf_counter()
                result = await host.exec(live[0], ["true"])
                took.append(time.perf_counter() - t)
                assert result.exit_code == 0, result.stderr
            with open("/proc/self/mountinfo") as f:
                host_mounts = sum(1 for _ in f)
            rows.append(
                {
                    "live": count,
                    "exec_p50_ms": round(1000 * percentile(took, 0.5), 1),
                    "exec_p99_ms": round(1000 * percentile(took, 0.99), 1),
                    "host_mounts": host_mounts,
                    "start_more_s": round(started, 1),
                    "load": round(os.getloadavg()[0], 1),
                }
            )
            print(f"  {rows[-1]}", flush=True)
    finally:
        await host.shutdown()
    base = float(rows[0]["exec_p50_ms"])  # type: ignore[arg-type]
    for row in rows:
        row["vs_first"] = round(float(row["exec_p50_ms"]) / base, 2)  # type: ignore[arg-type]
    return rows


def line(label: str, values: list[float]) -> str:
    return f"{label:<34} {1000 * percentile(values, 0.5):9.1f} {1000 * percentile(values, 0.99):9.1f} {len(values):5d}"


def source_version() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


async def main(args: argparse.Namespace) -> None:
    if image_rig.IMAGE_REASON is not None:
        sys.exit(f"no image sandbox here: {image_rig.IMAGE_REASON}")
    image = image_rig.python_image()
    os.environ["ROLLOUT_RAY_IMAGE_CACHE"] = image_rig.shared_cache().root
    image_cache.default_image_cache.cache_clear()
    await bench_cold(image, 1)  # the image unpacked (once per machine), the caches warm
    print(
        f"# {platform.python_version()}, {os.cpu_count()} CPUs, commit {source_version()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    if args.exec_vs_live:
        counts = [int(c) for c in args.exec_vs_live.split(",")]
        rows = await bench_exec_vs_live(image, counts, args.samples)
        print(f"{'live':>6} {'exec p50 ms':>12} {'p99 ms':>9} {'vs first':>9} {'host mounts':>12} {'load':>6}")
        for r in rows:
            print(
                f"{r['live']:>6} {r['exec_p50_ms']:>12} {r['exec_p99_ms']:>9} {r['vs_first']:>9} "
                f"{r['host_mounts']:>12} {r['load']:>6}"
            )
        return
    if args.only_concurrent:
        print(f"concurrent: {await bench_concurrent(image, args.concurrent, args.exec_parallel, args.execs_each)}")
        return
    HANDED_OUT.clear()
    cold = await bench_cold(image, args.samples)
    cold_started = HANDED_OUT[:]
    HANDED_OUT.clear()
    warm, pool = await bench_warm(image, args.samples)
    warm_started = HANDED_OUT[:]
    first, snap = await bench_snapshot(image, args.samples, args.setup_seconds)
    setup_alone = first - percentile(cold, 0.5)
    print(f"{'ready (ms)':<34} {'p50':>9} {'p99':>9} {'n':>5}")
    print(line("cold", cold))
    print(line("warm pool", warm))
    print(line("  cold: create_started alone", cold_started))
    print(line("  warm pool: create_started alone", warm_started))
    print(line("group snapshot", snap))
    print(line("cold + setup (no snapshot)", [c + setup_alone for c in cold]))
    print(f"first sample (start, setup, freeze): {first * 1000:.0f} ms; pool: {pool}")
    per_pss, per_avail, per_kernel, procs = await bench_idle(image, args.idle)
    print(
        f"idle: {args.idle} sandboxes, {procs} processes: PSS {per_pss / 2**20:.2f} MiB each; "
        f"kernel slab + shmem grew {per_kernel / 2**20:.3f} MiB each; "
        f"MemAvailable fell {per_avail / 2**20:.2f} MiB each"
    )
    print(f"concurrent: {await bench_concurrent(image, args.concurrent, args.exec_parallel, args.execs_each)}")
    print(f"load at end {os.getloadavg()[0]:.1f}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30, help="sandboxes per latency kind")
    parser.add_argument("--setup-seconds", type=float, default=2.0, help="the group setup's sleep")
    parser.add_argument("--idle", type=int, default=100, help="idle sandboxes measured for memory")
    parser.add_argument("--concurrent", type=int, default=1000, help="sandboxes alive at once in the scale run")
    parser.add_argument("--only-concurrent", action="store_true", help="the scale run alone")
    parser.add_argument("--exec-parallel", type=int, default=8, help="programs running at once in the scale run")
    parser.add_argument("--execs-each", type=int, default=1, help="programs each sandbox runs in the scale run")
    parser.add_argument(
        "--exec-vs-live",
        default="",
        metavar="N,N,...",
        help="only: exec p50 with N live sandboxes, for each N (e.g. 1,100,300,1000)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
