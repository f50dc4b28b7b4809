#!/usr/bin/env python
"""How do rollouts/s and memory grow with concurrency, on one node and on a 3-node cluster,
and where (and why) does it saturate?

For each topology and each concurrency C (rollouts in flight): ``Driver`` over
``examples/arith.py`` tasks x 4 samples against the simulated model (``rollout-ray serve-model``
in a child process, ttft = latency), max_in_flight = C, on a fresh ``RayExecutor`` of
``actors`` rollout actors with capacity ceil(C / actors), warmed up by one run of C rollouts
(excluded from the wall), then N = max(per_slot x C, min_n) rollouts measured.

Topologies:
  one      Ray started by this script (``ray.init(address="local")``, loopback), so its gcs,
           raylet and workers are this script's descendants; 2 rollout actors.
  cluster  the simulated 3-node cluster of ``cluster/local_cluster.py`` (head + 2 workers,
           token auth, 1 logical CPU each), started by this script in a temporary directory
           and always stopped at the end (only its own processes: the script's ``stop``);
           3 rollout actors, one pinned per node (custom resource ``node_<name>``), since
           ``SPREAD`` does not reliably spread zero-CPU actors (cluster/README.md). Its
           processes are not this script's descendants: they are found as ``stop`` finds
           them (``local_cluster.cluster_pids``: the cluster's id in their environment, its
           temp dir on their command line, or descent from its ``ray start`` PIDs).

Per row: wall, ideal = ceil(N / C) x latency, ratio, rollouts/s, CPU-ms per rollout of the
whole tree (this script, the simulated model, Ray), peak resident memory of the tree (sampled)
in total and per process kind, failures, the busiest process kind and process, and the cores
used by the tree and by the whole machine. Finally, per topology, the saturation point (the
first C after which rollouts/s grows by less than 10%) and its cause.

    python benchmarks/bench_scale.py --quick               # C=64,256; latency 0.2 s; one node (~1 min)
    python benchmarks/bench_scale.py --quick --cluster     # the same on both topologies
    python benchmarks/bench_scale.py                       # C=64,256,1000,2000; latency 1 s; both
    python benchmarks/bench_scale.py --topology cluster --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import inspect
import itertools
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench_driver sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (loopback) before ray is imported.
import bench_driver as bd
from bench_driver import (
    ARITH,
    PAGE,
    SAMPLES_PER_TASK,
    Row,
    RssSampler,
    kind_of,
    loadavg,
    machine_busy,
    measure,
    raise_nofile,
    rss_by_kind,
    source_version,
    start_model,
    stop_model,
    table,
    tree_cpu,
)

ROOT = bd.ROOT
CLUSTER_SCRIPT = ROOT / "cluster" / "local_cluster.py"
NCPU = os.cpu_count() or 1
DRIVER = "driver (this script)"


def load_local_cluster() -> Any:
    """cluster/local_cluster.py as a module (its state files and ``cluster_pids``)."""
    spec = importlib.util.spec_from_file_location("local_cluster", CLUSTER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- sampling the whole tree's memory ---------------------------------------------------------


class TreeSampler(RssSampler):
    """Every ``interval`` s: VmRSS of every process of the tree (``roots`` and descendants),
    per kind. Keeps the first sample, the peak of the total, the peak per kind, and the CPU
    its own thread used (subtracted from the driver's CPU)."""

    def __init__(self, roots: list[int] | None, interval: float) -> None:
        super().__init__(interval)
        self.roots = roots
        self.start_total = 0.0
        self.peak_total = 0.0
        self.peak_kind: dict[str, float] = {}
        self.thread_cpu = 0.0

    def _run(self) -> None:
        t0 = time.thread_time()
        first = True
        while True:
            kinds = rss_by_kind(tree_cpu(self.roots))
            total = sum(kinds.values())
            if first:
                self.start_total, first = total, False
            self.peak_total = max(self.peak_total, total)
            for k, v in kinds.items():
                self.peak_kind[k] = max(self.peak_kind.get(k, 0.0), v)
            self.thread_cpu = time.thread_time() - t0
            if self._stop.wait(self.interval):
                self.thread_cpu = time.thread_time() - t0
                return


# -- rows ---------------------------------------------------------------------------------------


@dataclass
class ScaleRow:
    topology: str
    actors: int
    capacity: int
    row: Row
    mib_start: float = 0.0
    mib_peak: float = 0.0
    peak_kind: dict[str, float] = field(default_factory=dict)
    sampler_cpu: float = 0.0
    tree_raw_cpu: float = 0.0
    """CPU seconds of the tree during the row including the sampler thread."""

    @property
    def c(self) -> int:
        return self.row.concurrency

    @property
    def rate(self) -> float:
        return self.row.n / self.row.wall

    @property
    def tree_cores(self) -> float:
        """Cores used by the benchmark's tree (without the sampler thread)."""
        return self.row.cpu_s / self.row.wall

    @property
    def machine_cores(self) -> float:
        """Cores used on the whole machine during the row (tree + sampler + everything else)."""
        return (self.tree_raw_cpu / self.row.wall) + self.row.others_cores

    def busiest_kind(self) -> tuple[str, float]:
        kind = max(self.row.by_kind, key=lambda k: self.row.by_kind[k])
        return kind, self.row.by_kind[kind] / self.row.wall

    def busiest_process(self) -> tuple[int, float]:
        pid = max(self.row.by_pid, key=lambda p: self.row.by_pid[p])
        return pid, self.row.by_pid[pid] / self.row.wall


def cause(r: ScaleRow) -> str:
    """Why a row runs at the rate it does, from where its CPU went."""
    kind, kind_cores = r.busiest_kind()
    pid, pid_cores = r.busiest_process()
    share = r.row.by_kind[kind] / r.row.cpu_s if r.row.cpu_s else 0.0
    failed = f"; {r.row.failed} of {r.row.n} rollouts failed" if r.row.failed else ""
    if r.machine_cores >= 0.85 * NCPU:
        other = (
            f", {r.row.others_cores:.1f} of them by other processes on the machine" if r.row.others_cores >= 0.1 else ""
        )
        return (
            f"CPU: {r.machine_cores:.1f} of {NCPU} cores busy{other}; {kind} uses "
            f"{share:.0%} of the benchmark's CPU ({kind_cores:.2f} cores){failed}"
        )
    if pid_cores >= 0.85:
        return (
            f"one process: {kind_of(pid)} (pid {pid}) at {pid_cores:.2f} cores -- its one "
            f"thread/event loop is full -- while only {r.machine_cores:.1f} of {NCPU} cores are busy{failed}"
        )
    ratio = r.row.wall / r.row.ideal
    if ratio <= 1.3:
        return (
            f"latency: {ratio:.2f}x the ideal, only {r.machine_cores:.1f} of {NCPU} cores busy "
            f"(busiest: {kind}, {kind_cores:.2f} cores){failed}"
        )
    return (
        f"not CPU: only {r.machine_cores:.1f} of {NCPU} cores busy and no process above 0.85 core "
        f"(busiest: {kind}, {kind_cores:.2f} cores); look at the ratio, failures, connection "
        f"or concurrency limits{failed}"
    )


def saturation(rows: list[ScaleRow], growth: float) -> str:
    rows = sorted(rows, key=lambda r: r.c)
    if len(rows) < 2:
        r = rows[0]
        return (
            f"only one C ({r.c}): no saturation point; at it {r.rate:.0f} rollouts/s "
            f"({r.row.wall / r.row.ideal:.2f}x ideal); {cause(r)}"
        )
    for prev, cur in itertools.pairwise(rows):
        gain = cur.rate / prev.rate - 1
        if gain <= growth:
            return (
                f"saturates at C={prev.c}: {prev.rate:.0f} rollouts/s, then {cur.rate:.0f} at "
                f"C={cur.c} ({gain:+.0%}, not more than +{growth:.0%}). Cause (at C={cur.c}): {cause(cur)}"
            )
    last, before = rows[-1], rows[-2]
    return (
        f"no saturation up to C={last.c}: rollouts/s still grew {last.rate / before.rate - 1:+.0%} "
        f"from C={before.c} to C={last.c} ({last.rate:.0f}/s, {last.row.wall / last.row.ideal:.2f}x ideal). "
        f"At C={last.c}: {cause(last)}"
    )


# -- one topology -------------------------------------------------------------------------------


def n_for(c: int, per_slot: int, min_n: int) -> int:
    n = max(per_slot * c, min_n)
    return math.ceil(n / SAMPLES_PER_TASK) * SAMPLES_PER_TASK


def make_executor(actors: int, capacity: int, options: list[dict[str, Any]] | None) -> Any:
    from rollout_ray._ray.ray_executor import RayExecutor
    from rollout_ray._ray.rollout_client import RolloutActor

    if options is None:
        return RayExecutor(actors=actors, capacity=capacity)
    if "actor_options" in inspect.signature(RayExecutor).parameters:
        return RayExecutor(actors=actors, capacity=capacity, actor_options=options)

    class PlacedRayExecutor(RayExecutor):  # a RayExecutor without actor_options: SPREAD only
        def __init__(self) -> None:
            super().__init__(actors=actors, capacity=capacity)
            self._placement = [dict(o) for o in options]

        def _new_actor(self, *_: Any) -> Any:
            opts = self._placement.pop(0) if self._placement else {"scheduling_strategy": "SPREAD"}
            return RolloutActor.create(capacity=self.capacity, **opts)

    return PlacedRayExecutor()


async def actor_nodes(executor: Any) -> list[str]:
    """The node (its ``node_<name>`` resource, or its id) each rollout actor runs on."""
    import ray

    names = {}
    for node in ray.nodes():
        tags = [k.removeprefix("node_") for k in node.get("Resources", {}) if k.startswith("node_")]
        names[node["NodeID"]] = tags[0] if tags else node["NodeID"][:8]
    ids = await asyncio.gather(*(a.node_id() for a in executor._pool if a is not None))
    return [names.get(i, i[:8]) for i in ids]


async def run_topology(
    label: str,
    cs: list[int],
    actors: int,
    options: list[dict[str, Any]] | None,
    roots_fn: Any,
    module: Any,
    model: Any,
    args: argparse.Namespace,
    notes: list[str],
) -> list[ScaleRow]:
    out: list[ScaleRow] = []
    for c in cs:
        capacity = math.ceil(c / actors)
        n = n_for(c, args.per_slot, args.min_n)
        executor = make_executor(actors, capacity, options)
        t0 = time.perf_counter()
        await executor.start()
        try:
            warm = await measure("warm-up", executor, module, model, c, c, args.latency, 0.0, roots=roots_fn)
            placed = await actor_nodes(executor)
            notes.append(
                f"{label} C={c}: {actors} actors x capacity {capacity} on nodes {placed}; creation + "
                f"warm-up ({c} rollouts, {warm.failed} failed) {time.perf_counter() - t0:.1f}s -- excluded from wall"
            )
            if options is not None and len(set(placed)) < min(actors, len(options)):
                print(f"  !! {label} C={c}: actors on {placed}, not one per node", file=sys.stderr)
            gc.collect()
            # The roots of the tree are fixed for the row: new processes (workers) descend from them.
            roots = roots_fn()
            # Idle background of the tree, before the sampler starts (so it excludes the sampler).
            c0 = tree_cpu(roots)
            await asyncio.sleep(args.idle_probe)
            idle = (sum(tree_cpu(roots).values()) - sum(c0.values())) / args.idle_probe
            with TreeSampler(roots, args.sample_interval) as sampler:
                row = await measure(
                    label, executor, module, model, n, c, args.latency, 0.0, roots=lambda roots=roots: roots
                )
        finally:
            await executor.stop()
        row.idle_cores = idle
        r = ScaleRow(
            label,
            actors,
            capacity,
            row,
            sampler.start_total,
            sampler.peak_total,
            dict(sampler.peak_kind),
            sampler.thread_cpu,
            row.cpu_s,
        )
        # The sampler thread runs in this process: take its CPU off the driver's.
        me = os.getpid()
        spent = min(sampler.thread_cpu, row.by_pid.get(me, 0.0))
        row.by_pid[me] = row.by_pid.get(me, 0.0) - spent
        row.by_kind[DRIVER] = row.by_kind.get(DRIVER, 0.0) - spent
        row.cpu_s -= spent
        out.append(r)
        kind, cores = r.busiest_kind()
        print(
            f"  {label} C={c} N={n}: {row.wall:.2f}s, {r.rate:.0f}/s, {row.failed} failed, "
            f"peak {r.mib_peak:.0f} MiB, busiest {kind} {cores:.2f} cores, machine {r.machine_cores:.2f} cores",
            file=sys.stderr,
        )
    return out


# -- the cluster --------------------------------------------------------------------------------


def cluster_subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    # bench_driver sets this to 0 (loopback) for the one-node Ray; with it `ray start` refuses
    # worker nodes. Nothing may point the cluster's client elsewhere either.
    for name in (
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
    ):
        env.pop(name, None)
    return env


def refresh_ray_auth() -> None:
    """Make this process see RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH as they are now: Ray reads them
    into its config when it is imported and caches the token, so re-read both (as Ray itself
    does when ``ray.init`` turns token auth on: ``Config.initialize``)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def start_cluster(lc: Any, d: Path, cpus: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_SCRIPT), "start", "--dir", str(d), "--cpus", str(cpus)],
        env=cluster_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    state = lc.load_state(d)
    if proc.returncode != 0 or state is None or not state.get("address"):
        raise RuntimeError(f"local cluster did not start (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    state["_start_s"] = time.perf_counter() - t0
    return state


def stop_cluster(lc: Any, d: Path) -> str:
    """The cluster script's own ``stop`` (only this cluster's processes), then a check."""
    t0 = time.perf_counter()
    state = lc.load_state(d)
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_SCRIPT), "stop", "--dir", str(d), "--grace", "10"],
        env=cluster_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    left = lc.cluster_pids(state) if state else []
    msg = f"local cluster stopped in {time.perf_counter() - t0:.1f}s (exit {proc.returncode})"
    if left:
        msg += f"; STILL RUNNING: {left}"
    if proc.returncode != 0:
        msg += f": {proc.stdout.strip()} {proc.stderr.strip()}"
    print(f"  {msg}", file=sys.stderr)
    if state and not left:
        temp_root = Path(state["temp_root"])
        if not temp_root.is_relative_to(d):
            shutil.rmtree(temp_root, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
    return msg


# -- main ---------------------------------------------------------------------------------------


async def run_one_node(
    args: argparse.Namespace, cs: list[int], module: Any, model: Any, notes: list[str]
) -> list[ScaleRow]:
    """The one-node rows, on a local Ray started here and shut down after."""
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    notes.append(
        f"one node: ray.init (local Ray, this script's descendants) {time.perf_counter() - t0:.1f}s, "
        f"{ray.cluster_resources().get('CPU', 0):g} logical CPUs"
    )
    try:
        return await run_topology("one node", cs, args.actors, None, lambda: None, module, model, args, notes)
    finally:
        ray.shutdown()


def join_cluster(lc: Any, state: dict[str, Any], d: Path, args: argparse.Namespace, notes: list[str]) -> None:
    """Name the node supervisors, point this process's Ray auth at the cluster and connect the driver to it."""
    import ray

    for node in state["nodes"].values():
        bd._KINDS[node["pid"]] = "ray start (node supervisor)"
    os.environ.update(lc.client_env(state))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    refresh_ray_auth()
    host = state["address"].rsplit(":", 1)[0]
    t0 = time.perf_counter()
    # The nodes registered with the machine's routable IP; this driver must say it
    # is on that node (bench_driver made Ray default to loopback).
    ray.init(address=state["address"], _node_ip_address=host, log_to_driver=False)
    notes.append(
        f"3-node cluster: local_cluster.py start {state['_start_s']:.1f}s (dir {d}, "
        f"{args.cluster_cpus} logical CPU per node, token auth {'on' if state['auth'] else 'off'}), "
        f"ray.init {time.perf_counter() - t0:.1f}s, "
        f"{len(lc.cluster_pids(state))} cluster processes at start"
    )


async def run_cluster(
    args: argparse.Namespace, cs: list[int], module: Any, model: Any, notes: list[str]
) -> list[ScaleRow]:
    """The 3-node rows, on a local cluster started here, always stopped after (and the auth env restored)."""
    import ray

    lc = load_local_cluster()
    d = Path(tempfile.mkdtemp(prefix="bsc-"))  # short: Ray's socket paths live under it
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    try:
        state = start_cluster(lc, d, args.cluster_cpus)
        join_cluster(lc, state, d, args, notes)
        nodes = list(state["nodes"])
        if args.placement == "pinned":
            options = [{"resources": {f"node_{nodes[i % len(nodes)]}": 0.001}} for i in range(args.cluster_actors)]
        else:
            options = None
        me = os.getpid()
        try:
            return await run_topology(
                "3 nodes",
                cs,
                args.cluster_actors,
                options,
                lambda: [me, *lc.cluster_pids(state)],
                module,
                model,
                args,
                notes,
            )
        finally:
            ray.shutdown()
    finally:
        notes.append(stop_cluster(lc, d))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        refresh_ray_auth()


async def bench(args: argparse.Namespace, cs: list[int], topologies: list[str]) -> tuple[list[ScaleRow], list[str]]:
    import ray

    from rollout_ray import OpenAIModel
    from rollout_ray._cli.taskset_loader import import_taskset

    module = import_taskset(str(ARITH))
    ray.cloudpickle.register_pickle_by_value(module)  # as rollout-ray eval does
    rows: list[ScaleRow] = []
    notes: list[str] = []
    proc, url = start_model(args.latency)
    model = OpenAIModel(url, name="simulated")
    try:
        if "one" in topologies:
            rows += await run_one_node(args, cs, module, model, notes)
        if "cluster" in topologies:
            rows += await run_cluster(args, cs, module, model, notes)
    finally:
        await model.aclose()
        stop_model(proc)
    return rows, notes


def print_rows(rows: list[ScaleRow], args: argparse.Namespace) -> None:
    """The table, a row per (topology, C), and how to read it."""
    print(
        f"\n## Rollouts/s and memory vs concurrency: examples/arith.py x {SAMPLES_PER_TASK} samples, "
        f"simulated model ttft={args.latency:g} s, N = max({args.per_slot} x C, {args.min_n})\n"
    )
    body = []
    for r in rows:
        kind, kind_cores = r.busiest_kind()
        pid, pid_cores = r.busiest_process()
        share = r.row.by_kind[kind] / r.row.cpu_s if r.row.cpu_s else 0.0
        body.append(
            [
                r.topology,
                r.c,
                f"{r.actors} x {r.capacity}",
                r.row.n,
                f"{r.row.wall:.2f}",
                f"{r.row.ideal:.2f}",
                f"{r.row.wall / r.row.ideal:.2f}x",
                f"{r.rate:.0f}",
                f"{r.row.cpu_s * 1000 / r.row.n:.1f}",
                r.row.failed,
                f"{r.mib_start:.0f} / {r.mib_peak:.0f}",
                f"{kind} {kind_cores:.2f} ({share:.0%})",
                f"{kind_of(pid)} {pid_cores:.2f}",
                f"{r.tree_cores:.2f}",
                f"{r.row.others_cores:.2f}",
                f"{r.machine_cores:.2f} / {NCPU}",
            ]
        )
    print(
        table(
            [
                "topology",
                "C",
                "actors x cap",
                "N",
                "wall s",
                "ideal s",
                "ratio",
                "rollouts/s",
                "CPU-ms/rollout",
                "failed",
                "tree MiB start / peak",
                "busiest kind: cores (share)",
                "busiest process: cores",
                "tree cores",
                "other cores",
                "machine cores / of",
            ],
            body,
        )
    )
    print(f"""
How to read it: one row per (topology, C), each on fresh rollout actors warmed up by one run of C
  rollouts. ideal = ceil(N / C) x latency (no overhead at all); ratio = wall / ideal; 1.00x means
  the row is latency-bound, and once the ratio grows with C the extra rollouts in flight only queue.
  CPU-ms/rollout: CPU (utime + stime, /proc) of the whole tree -- this script, the simulated model,
  and Ray's processes (one node: this script's descendants; 3 nodes: the cluster's processes, found
  as local_cluster.py finds them) -- during Driver.arun, over N, minus the memory sampler's thread.
  tree MiB: sum of VmRSS over the tree at the row's start and its peak (sampled every
  {args.sample_interval:g} s; shared pages counted once per process).
  busiest kind: the process kind using most CPU during the row, in cores, and its share of the
  tree's CPU; busiest process: the single process using most (near 1.00 = its one thread is full).
  tree / other / machine cores: CPU used during the row by the tree, by everything else on the
  machine, and in total (incl. the sampler thread) against the machine's {NCPU} cores; other
  cores above ~0.1 mean the walls were disturbed by other work.""")


def print_by_kind(rows: list[ScaleRow]) -> None:
    """CPU per rollout and peak resident memory per process kind, a column per row."""
    kinds = sorted(
        {k for r in rows for k in r.row.by_kind}, key=lambda k: -max(r.row.by_kind.get(k, 0.0) / r.row.n for r in rows)
    )
    kinds = [k for k in kinds if max(r.row.by_kind.get(k, 0.0) * 1000 / r.row.n for r in rows) >= 0.005]
    cols = [f"{'1n' if r.topology == 'one node' else '3n'} C={r.c}" for r in rows]
    print("\nCPU-ms per rollout by process kind (1n = one node, 3n = 3-node cluster):\n")
    print(
        table(
            ["process"] + cols,
            [[k] + [f"{r.row.by_kind.get(k, 0.0) * 1000 / r.row.n:.2f}" for r in rows] for k in kinds]
            + [["total"] + [f"{r.row.cpu_s * 1000 / r.row.n:.1f}" for r in rows]],
        )
    )

    kinds = sorted({k for r in rows for k in r.peak_kind}, key=lambda k: -max(r.peak_kind.get(k, 0.0) for r in rows))
    kinds = [k for k in kinds if max(r.peak_kind.get(k, 0.0) for r in rows) >= 1]
    print(
        "\nPeak resident memory (MiB) by process kind during each row (each kind's own peak, summed over "
        "its processes; the total line is the peak of the whole tree's sum):\n"
    )
    print(
        table(
            ["process"] + cols,
            [[k] + [f"{r.peak_kind.get(k, 0.0):.0f}" for r in rows] for k in kinds]
            + [["total (peak of the sum)"] + [f"{r.mib_peak:.0f}" for r in rows]],
        )
    )


def report(rows: list[ScaleRow], notes: list[str], args: argparse.Namespace) -> None:
    print_rows(rows, args)
    print_by_kind(rows)

    print(
        "\nbackground: tree CPU while idle just before each row (cores) / the sampler thread's CPU "
        "during the row (ms): "
        + ", ".join(
            f"{'1n' if r.topology == 'one node' else '3n'} C={r.c} {r.row.idle_cores:.2f} / {r.sampler_cpu * 1000:.0f}"
            for r in rows
        )
    )
    for note in notes:
        print(f"note: {note}")

    print(f"\n## Saturation (first C after which rollouts/s grows by no more than {args.saturation_growth:.0%})\n")
    for topo in dict.fromkeys(r.topology for r in rows):
        print(f"{topo}: {saturation([r for r in rows if r.topology == topo], args.saturation_growth)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--concurrency", default="64,256,1000,2000", help="rollouts in flight, C (comma list)")
    p.add_argument("--latency", type=float, default=1.0, help="simulated model ttft, seconds (default 1)")
    p.add_argument("--min-n", type=int, default=500, help="N = max(per_slot x C, min_n) (default 500)")
    p.add_argument("--per-slot", type=int, default=2, help="N = max(per_slot x C, min_n) (default 2)")
    p.add_argument(
        "--topology",
        choices=("one", "cluster", "both"),
        default=None,
        help="one node, the simulated 3-node cluster, or both (default both; --quick: one)",
    )
    p.add_argument("--actors", type=int, default=2, help="rollout actors on one node (default 2)")
    p.add_argument("--cluster-actors", type=int, default=3, help="rollout actors on the cluster (default 3)")
    p.add_argument("--cluster-cpus", type=int, default=1, help="logical CPUs per cluster node (default 1)")
    p.add_argument(
        "--placement",
        choices=("pinned", "spread"),
        default="pinned",
        help="cluster actors: pinned round-robin to the nodes (default) or RayExecutor's SPREAD",
    )
    p.add_argument(
        "--saturation-growth",
        type=float,
        default=0.10,
        help="saturated once rollouts/s grows by no more than this fraction (default 0.10)",
    )
    p.add_argument("--sample-interval", type=float, default=0.25, help="memory sampling period, s")
    p.add_argument("--idle-probe", type=float, default=1.0, help="seconds of idle CPU probe before each row")
    p.add_argument(
        "--quick", action="store_true", help="C=64,256; latency 0.2; min-n 200; one node only unless --cluster"
    )
    p.add_argument("--cluster", action="store_true", help="with --quick: both topologies")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.latency, args.min_n = "64,256", 0.2, 200
        args.topology = args.topology or ("both" if args.cluster else "one")
    elif args.cluster and args.topology is None:
        args.topology = "both"
    args.topology = args.topology or "both"
    topologies = ["one", "cluster"] if args.topology == "both" else [args.topology]
    cs = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})

    # SIGTERM (a CI timeout, kill PID) becomes Ctrl-C: asyncio.run cancels the run, and the
    # finally blocks stop the executor, Ray, the model and the cluster.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    nofile = raise_nofile()
    import ray

    busy0, t0 = machine_busy(), time.monotonic()
    time.sleep(2.0)
    busy = (machine_busy() - busy0) / (time.monotonic() - t0)
    print(f"# bench_scale.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"rollout_ray: {source_version()}")
    print(
        f"machine: {NCPU} cores, {os.sysconf('SC_PHYS_PAGES') * PAGE / 2**30:.1f} GiB; Python "
        f"{platform.python_version()}, Ray {ray.__version__}; RLIMIT_NOFILE {nofile[0]}; load average at start "
        f"{loadavg()}; busy before the run (other processes): {busy:.2f} cores of {NCPU}"
    )
    print(
        f"run: topologies {', '.join(topologies)}; C = {', '.join(map(str, cs))}; latency {args.latency:g} s; "
        f"actors: one node {args.actors}, cluster {args.cluster_actors} ({args.placement})"
    )
    rows, notes = asyncio.run(bench(args, cs, topologies))
    report(rows, notes, args)
    print(f"\nload average at end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
