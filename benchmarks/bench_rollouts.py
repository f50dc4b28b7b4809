#!/usr/bin/env python
"""What does running rollouts as Ray actors cost, against the ideal and against the same
core in plain asyncio?

N single-turn and N tool (one tool call, so two model calls) rollouts against the simulated
model at a fixed latency, run four ways, all rows from one run:

* ``ideal``: ceil(N / concurrency) x model calls per rollout x latency (computed).
* ``asyncio``: the ``Rollout`` core in this one process: ``HTTPInterception`` + ``ToolServer``
  + ``ChatHarness`` + ``OpenAIModel`` -> simulated model, concurrency C via a semaphore, the
  default ``LocalRuntime``.
* ``ray K=1``: M actors of capacity 1 (concurrency is capped at M).
* ``ray packed``: a few actors of capacity K = C / actors.

Plus the proxy's added latency per model call (sequential requests straight to the simulated
model vs through an ``HTTPInterception``).

    python benchmarks/bench_rollouts.py --quick     # N=100, C=50, latency 0.2 s
    python benchmarks/bench_rollouts.py             # N=1000, C=250, latency 0.5 s
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from _proc import PAGE, TICK, stat_fields  # benchmarks/ is the script's directory

from rollout_ray import (
    ChatHarness,
    HTTPInterception,
    LocalRuntime,
    OpenAIModel,
    Rollout,
    RolloutSpec,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    ToolServer,
    Toolset,
    Trace,
    reward,
    tool,
)

PROMPT = "What is 17 + 25?"
ANSWER = "42"
CALLS = {"single": 1, "tool": 2}  # model calls (= turns) per rollout of each kind


# -- the tasks --------------------------------------------------------------------------------


class Calculator(Toolset):
    """Runs in the tool server's process: no ``runtime.exec``, so no subprocess per call."""

    name = "calc"

    @tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class SingleTurn(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == ANSWER)


class WithTool(SingleTurn):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Calculator()]


def make_task(kind: str, idx: int) -> Task:
    cls = WithTool if kind == "tool" else SingleTurn
    return cls({"idx": idx, "prompt": PROMPT})


def check(trace: Trace, kind: str) -> str | None:
    """None if the trace is what a correct rollout of ``kind`` gives, else why not."""
    problems = []
    if not trace.ok:
        problems.append("not ok")
    if trace.num_turns != CALLS[kind]:
        problems.append(f"num_turns={trace.num_turns} (expected {CALLS[kind]})")
    if trace.reward != 1.0:
        problems.append(f"reward={trace.reward} (last_reply={trace.last_reply!r})")
    if not problems:
        return None
    errors = "; ".join(f"{e.type}: {e.message}" for e in trace.errors)
    return ", ".join(problems) + (f" | errors: {errors}" if errors else "") + f" | stop={trace.stop_condition}"


# -- the process tree: memory and CPU from /proc ---------------------------------------------


def tree_pids(root: int, extra: Iterable[int] = ()) -> list[int]:
    """``root`` and all its descendants (by ppid), plus ``extra`` pids that are alive."""
    children: dict[int, list[int]] = defaultdict(list)
    alive = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is not None:
            alive.add(int(entry))
            children[int(fields[1])].append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    seen = set(found)
    found.extend(p for p in extra if p in alive and p not in seen)
    return found


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of VmRSS (resident pages of /proc/PID/statm)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime + cutime + cstime of each pid: its own CPU and its reaped children's."""
    ticks = 0
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            ticks += sum(int(x) for x in fields[11:15])
    return ticks / TICK


def process_kind(pid: int) -> str:
    """A short name for what a process is: Ray's proctitle (``ray::RuntimeHost``), the Ray
    binary or script, the guardian, or ``driver``."""
    if pid == os.getpid():
        return "driver (this script)"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):
        return argv[0].split()[0].split(".")[0]
    if any(a.endswith("_guardian.py") for a in argv):
        return "runtime guardian"
    scripts = [a for a in argv[1:3] if a.endswith(".py")]
    name = os.path.basename(scripts[0] if scripts else argv[0])
    return {"default_worker.py": "ray worker (starting)"}.get(name, name)


def breakdown(pids: Iterable[int]) -> dict[str, tuple[int, float]]:
    """``{kind: (processes, MiB RSS)}``, largest first."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for pid in pids:
        entry = out[process_kind(pid)]
        entry[0] += 1
        entry[1] += rss_bytes([pid]) / 2**20
    return {k: (int(v[0]), v[1]) for k, v in sorted(out.items(), key=lambda kv: -kv[1][1])}


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


class TreeMonitor:
    """Peak RSS of the process tree, sampled every ``interval`` s in a thread.

    The tree (a /proc walk) is rebuilt every ``refresh`` s; RSS is read every sample. The
    thread's own CPU time is measured so it can be taken out of the CPU figures.
    """

    def __init__(self, extra: Iterable[int] = (), interval: float = 0.05, refresh: float = 0.5) -> None:
        self.extra = list(extra)
        self.interval, self.refresh = interval, refresh
        self.peak = 0
        self.samples = 0
        self.thread_cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)

    def pids(self) -> list[int]:
        return tree_pids(os.getpid(), self.extra)

    def _run(self) -> None:
        started = time.thread_time()
        pids, built = self.pids(), time.monotonic()
        while True:
            if time.monotonic() - built >= self.refresh:
                pids, built = self.pids(), time.monotonic()
            self.peak = max(self.peak, rss_bytes(pids))
            self.samples += 1
            if self._stop.wait(self.interval):
                break
        self.thread_cpu = time.thread_time() - started

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    mode: str
    kind: str
    n: int
    concurrency: int
    wall: float | None = None
    peak_mib: float | None = None
    base_mib: float | None = None
    cpu_ms: float | None = None
    failed: int | None = None
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None
    idle_ms_per_s: float | None = None
    """CPU the tree burns while no rollout runs (ms per second), measured just before."""
    sampler_ms: float | None = None
    others_cores: float | None = None
    """Mean cores used by processes outside the tree (other work on the machine) during the row."""
    spans: dict[str, float] = field(default_factory=dict)
    """Mean seconds per rollout: driver-observed latency and the trace's timing spans."""


def ideal_wall(n: int, concurrency: int, kind: str, latency: float) -> float:
    return math.ceil(n / concurrency) * CALLS[kind] * latency


IDLE_PROBE = 2.0
"""Seconds of idleness over which the tree's background CPU is measured before each row."""


async def measure(
    mode: str,
    kind: str,
    n: int,
    concurrency: int,
    extra_pids: Iterable[int],
    run: Callable[[], Awaitable[tuple[list[Any], list[float]]]],
) -> Row:
    """Run ``run()`` under the monitors; it returns one Trace (or exception) per rollout and
    the latency of each as the driver saw it."""
    row = Row(mode, kind, n, concurrency)
    extra = list(extra_pids)
    pids = tree_pids(os.getpid(), extra)
    row.base_mib = rss_bytes(pids) / 2**20
    idle0 = cpu_seconds(pids)
    await asyncio.sleep(IDLE_PROBE)
    row.idle_ms_per_s = (cpu_seconds(pids) - idle0) * 1000 / IDLE_PROBE
    with TreeMonitor(extra) as monitor:
        cpu0, busy0 = cpu_seconds(pids), machine_busy_seconds()
        t0 = time.perf_counter()
        results, latencies = await run()
        row.wall = time.perf_counter() - t0
        cpu1, busy1 = cpu_seconds(tree_pids(os.getpid(), extra)), machine_busy_seconds()
    row.others_cores = max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / row.wall
    row.peak_mib = monitor.peak / 2**20
    row.cpu_ms = (cpu1 - cpu0 - monitor.thread_cpu) * 1000 / n
    row.sampler_ms = monitor.thread_cpu * 1000
    for result in results:
        if isinstance(result, BaseException):
            row.errors.append(f"{type(result).__name__}: {result}")
        else:
            problem = check(result, kind)
            if problem is not None:
                row.errors.append(problem)
    row.failed = len(row.errors)
    row.spans = mean_spans(results, latencies)
    return row


SPANS = ("latency", "boot", "setup", "model", "harness", "finalize+scoring", "rest")


def mean_spans(results: list[Any], latencies: list[float]) -> dict[str, float]:
    """Mean seconds per rollout of each timing span, over the rollouts that returned a trace.

    ``harness`` is the agent span minus its model calls (it also holds unregistering the
    proxy session and the tools, which close runs inside the agent span); ``rest`` is the
    driver-observed latency minus every span: dispatch, building the rollout, the runtime's
    teardown, moving the trace.
    """
    sums = dict.fromkeys(SPANS, 0.0)
    count = 0
    for result, latency in zip(results, latencies):
        if isinstance(result, BaseException) or result is None:
            continue
        t = result.timing
        spans = {
            "latency": latency,
            "boot": t.boot.duration,
            "setup": t.setup.duration,
            "model": t.agent.model.duration,
            "harness": t.agent.harness.duration,
            "finalize+scoring": t.finalize.duration + t.scoring.duration,
        }
        spans["rest"] = latency - sum(v for k, v in spans.items() if k != "latency")
        for k, v in spans.items():
            sums[k] += v
        count += 1
    return {k: v / count for k, v in sums.items()} if count else {}


# -- asyncio: the core in this one process ----------------------------------------------------


class AsyncioRunner:
    """The Rollout core in-process: one proxy, one tool server, one model pool, a semaphore."""

    def __init__(self, model_url: str) -> None:
        self.model_url = model_url

    async def __aenter__(self) -> Self:
        self.interception = HTTPInterception()
        await self.interception.start()
        self.tools = ToolServer()
        await self.tools.start()
        self.model = OpenAIModel(self.model_url, name="simulated")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.model.aclose()
        await self.tools.stop()
        await self.interception.stop()

    async def run(self, kind: str, n: int, concurrency: int, first: int = 0) -> tuple[list[Any], list[float]]:
        room = asyncio.Semaphore(concurrency)
        latencies = [0.0] * n

        async def one(i: int) -> Trace:
            async with room:
                t0 = time.perf_counter()
                try:
                    rollout = Rollout(
                        make_task(kind, first + i),
                        ChatHarness(),
                        model=self.model,
                        interception=self.interception,
                        tool_server=self.tools.serve,
                        runtime_factory=LocalRuntime,
                    )
                    return await rollout.run()
                finally:
                    latencies[i] = time.perf_counter() - t0

        results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        return results, latencies


# -- Ray: rollout actors ----------------------------------------------------------------------


class RayRunner:
    """``actors`` RolloutActors of capacity ``capacity``; the driver keeps every slot busy."""

    def __init__(self, model_url: str, actors: int, capacity: int) -> None:
        self.model_url = model_url
        self.count, self.capacity = actors, capacity
        self.handles: list[Any] = []
        self.guardians: list[int] = []
        self.created_s = self.warm_s = 0.0
        self.warm_errors: list[str] = []

    def spec(self, kind: str, idx: int) -> RolloutSpec:
        return RolloutSpec(make_task(kind, idx), ChatHarness(), OpenAIModel(self.model_url, name="simulated"))

    async def start(self) -> None:
        """Create the actors (timed until each answers), then one warm-up rollout each."""
        from rollout_ray import RolloutActor

        t0 = time.perf_counter()
        self.handles = [RolloutActor.create(capacity=self.capacity) for _ in range(self.count)]
        await asyncio.gather(*(h.node_id() for h in self.handles))
        # Each actor's RuntimeActor starts a guardian that detaches (double fork): it is not a
        # descendant of this process, so its pid is added to the tree explicitly.
        runtime_actors = await asyncio.gather(*(h.actor.runtime_actor.remote() for h in self.handles))
        self.guardians = list(await asyncio.gather(*(r.guardian_pid.remote() for r in runtime_actors)))
        self.created_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        traces = await asyncio.gather(
            *(h.run(self.spec("tool", -1 - i)) for i, h in enumerate(self.handles)), return_exceptions=True
        )
        self.warm_s = time.perf_counter() - t0
        for t in traces:
            problem = f"{type(t).__name__}: {t}" if isinstance(t, BaseException) else check(t, "tool")
            if problem:
                self.warm_errors.append(problem)

    async def run(self, kind: str, n: int) -> tuple[list[Any], list[float]]:
        results: list[Any] = [None] * n
        latencies = [0.0] * n
        todo = iter(range(n))

        async def slot(handle: Any) -> None:
            for i in todo:  # a shared iterator: each index is taken by exactly one slot
                t0 = time.perf_counter()
                try:
                    results[i] = await handle.run(self.spec(kind, i))
                except Exception as e:  # noqa: BLE001 - a failed rollout is data here
                    results[i] = e
                latencies[i] = time.perf_counter() - t0

        await asyncio.gather(*(slot(h) for h in self.handles for _ in range(self.capacity)))
        return results, latencies

    async def close(self) -> None:
        await asyncio.gather(*(h.aclose() for h in self.handles), return_exceptions=True)


# -- the proxy's added latency ----------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def proxy_latency(requests: int, warmup: int) -> dict[str, list[float]]:
    """Sequential requests straight to the simulated model (ttft=0) vs through the proxy.

    Through the proxy, each request goes to a freshly registered ``RolloutSession`` (of a
    ``Rollout`` built for the single-turn task) whose model is ``OpenAIModel(simulated)``, so
    its trace never grows beyond one turn; registering is outside the timed request.
    """
    body = {"model": "simulated", "messages": [{"role": "user", "content": PROMPT}]}
    out: dict[str, list[float]] = {"direct": [], "proxy": []}
    async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
        model = OpenAIModel(server.base_url, name="simulated")  # type: ignore[arg-type]
        interception = HTTPInterception()
        await interception.start()
        try:
            async with aiohttp.ClientSession() as http:

                async def once(url: str, headers: dict[str, str]) -> float:
                    t0 = time.perf_counter()
                    async with http.post(url, json=body, headers=headers) as resp:
                        raw = await resp.read()
                    elapsed = time.perf_counter() - t0
                    if resp.status != 200:
                        raise RuntimeError(f"{url} answered {resp.status}: {raw[:200]!r}")
                    return elapsed

                direct_url = f"{server.base_url}/chat/completions"
                for i in range(warmup + requests):
                    elapsed = await once(direct_url, {})
                    if i >= warmup:
                        out["direct"].append(elapsed)
                proxy_url = f"{interception.base_url}/v1/chat/completions"
                for i in range(warmup + requests):
                    rollout = Rollout(make_task("single", i), ChatHarness(), model=model, runtime_factory=LocalRuntime)
                    async with interception.serve(rollout.session) as slot:
                        elapsed = await once(proxy_url, {"Authorization": f"Bearer {slot.model_secret}"})
                    if i >= warmup:
                        out["proxy"].append(elapsed)
        finally:
            await interception.stop()
            await model.aclose()
    return out


# -- output ------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    """Columns after the first ``left`` are right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    right = [i >= left for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# -- main --------------------------------------------------------------------------------------


def provenance() -> str:
    """The measured code: git commit, modified files under rollout_ray/, a hash of its sources."""
    import hashlib
    import pathlib
    import subprocess

    import rollout_ray

    package = pathlib.Path(rollout_ray.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    try:

        def git(*argv: str) -> str:
            return subprocess.run(
                ["git", *argv], check=False, cwd=package.parent, capture_output=True, text=True, timeout=10
            ).stdout.strip()

        head = git("rev-parse", "--short", "HEAD") or "?"
        dirty = len(git("status", "--porcelain", "--", package.name).splitlines())
        where = f"commit {head}, {dirty} file(s) under {package.name}/ differ from it"
    except (OSError, subprocess.SubprocessError):
        where = "no git"
    return f"{where}, sources sha256 {digest.hexdigest()[:12]}"


def raise_fd_limit(needed: int) -> tuple[int, int, str | None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError) as e:
        return soft, hard, f"could not raise the fd soft limit to {target}: {e}"
    if soft != resource.RLIM_INFINITY and soft < needed:
        return soft, hard, f"fd limit {soft} is below the ~{needed} this concurrency needs"
    return soft, hard, None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=1000, help="rollouts per row (default 1000)")
    p.add_argument("--concurrency", type=int, default=250, help="concurrent rollouts C (default 250)")
    p.add_argument("--latency", type=float, default=0.5, help="simulated model ttft, seconds (default 0.5)")
    p.add_argument("--actors", type=int, default=2, help="actors of the packed row (default 2)")
    p.add_argument("--k1-actors", type=int, default=16, help="actors of capacity 1 (default 16)")
    p.add_argument("--kinds", default="single,tool", help="comma-separated: single, tool")
    p.add_argument("--skip-ray", action="store_true", help="only the asyncio rows")
    p.add_argument("--skip-k1", action="store_true", help="no K=1 rows (they take minutes)")
    p.add_argument("--quick", action="store_true", help="N=100, concurrency 50, latency 0.2 (sanity run)")
    p.add_argument("--proxy-requests", type=int, default=300, help="sequential requests per path (default 300)")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.concurrency, args.latency = 100, 50, 0.2
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in args.kinds if k not in CALLS]
    if bad:
        p.error(f"unknown kinds {bad}; choose from {sorted(CALLS)}")
    if min(args.n, args.concurrency, args.actors, args.k1_actors) < 1:
        p.error("--n, --concurrency, --actors and --k1-actors must be >= 1")
    return args


def fit_concurrency_to_fd_limit(args: argparse.Namespace, notes: list[str]) -> None:
    """Raise the fd limit, and lower ``args.concurrency`` if the limit is still too low for it."""
    # Per concurrent rollout: harness->proxy and harness->tools (both ends), proxy->model
    # (both ends); plus Ray's own. A generous estimate.
    soft, hard, problem = raise_fd_limit(needed=8 * args.concurrency + 1024)
    notes.append(f"fd limit: soft {soft}, hard {hard}" + (f" -- WARNING: {problem}" if problem else ""))
    if problem and "below" in problem:
        fit = max(1, (soft - 1024) // 8)
        notes.append(f"WARNING: concurrency lowered from {args.concurrency} to {fit} to fit the fd limit")
        args.concurrency = fit


async def note_machine_busy(notes: list[str]) -> None:
    """Note how many cores other processes use before the run, and warn if that is a lot."""
    busy0, t0 = machine_busy_seconds(), time.perf_counter()
    await asyncio.sleep(1.0)
    others = (machine_busy_seconds() - busy0) / (time.perf_counter() - t0)  # this script sleeps meanwhile
    notes.append(f"machine busy before the run (other processes): {others:.2f} cores of {os.cpu_count()}")
    if others > 0.2:
        print(f"WARNING: other processes already use {others:.2f} cores; wall times will be disturbed", flush=True)


async def run_asyncio_rows(url: str, args: argparse.Namespace, rows: list[Row]) -> None:
    """One asyncio row per kind, each after a warm-up."""
    n, c = args.n, args.concurrency
    async with AsyncioRunner(url) as runner:
        for kind in args.kinds:
            await runner.run(kind, min(c, 32), min(c, 32), first=-1000)  # warm-up
            rows.append(await measure("asyncio", kind, n, c, (), functools.partial(runner.run, kind, n, c)))
            print(f"asyncio {kind}: {rows[-1].wall:.2f}s", flush=True)


async def run_ray_rows(
    url: str,
    args: argparse.Namespace,
    per_actor: int,
    rows: list[Row],
    trees: dict[str, dict[str, tuple[int, float]]],
    notes: list[str],
) -> None:
    """Start a local Ray, run the packed and (unless skipped) K=1 rows, shut Ray down."""
    import ray

    from rollout_ray import shutdown_node_services

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    notes.append(f"ray.init: {time.perf_counter() - t0:.1f}s, {ray.cluster_resources().get('CPU', 0):g} CPUs")
    try:
        modes = [("ray packed", args.actors, per_actor)] + ([] if args.skip_k1 else [("ray K=1", args.k1_actors, 1)])
        for mode, actors, capacity in modes:
            await run_ray_mode(url, args, mode, actors, capacity, rows, trees, notes)
    finally:
        await shutdown_node_services()
        ray.shutdown()


async def run_ray_mode(
    url: str,
    args: argparse.Namespace,
    mode: str,
    actors: int,
    capacity: int,
    rows: list[Row],
    trees: dict[str, dict[str, tuple[int, float]]],
    notes: list[str],
) -> None:
    """The rows of one Ray mode on its own actors; if they fail, its missing rows are marked skipped."""
    n = args.n
    ray_runner = RayRunner(url, actors, capacity)
    try:
        await ray_runner.start()
        notes.append(
            f"{mode}: {actors} actors x capacity {capacity}: creation {ray_runner.created_s:.1f}s, "
            f"warm-up (one tool rollout each) {ray_runner.warm_s:.1f}s -- excluded from wall"
            + (f"; warm-up FAILED: {ray_runner.warm_errors[:3]}" if ray_runner.warm_errors else "")
        )
        trees[mode] = breakdown(tree_pids(os.getpid(), ray_runner.guardians))
        for kind in args.kinds:
            rows.append(
                await measure(
                    mode, kind, n, actors * capacity, ray_runner.guardians, functools.partial(ray_runner.run, kind, n)
                )
            )
            print(f"{mode} {kind}: {rows[-1].wall:.2f}s", flush=True)
    except Exception as e:  # noqa: BLE001 - e.g. out of processes or fds
        traceback.print_exc()
        for kind in args.kinds:
            if not any(r.mode == mode and r.kind == kind for r in rows):
                rows.append(Row(mode, kind, n, actors * capacity, skipped=f"{type(e).__name__}: {e}"))
    finally:
        await ray_runner.close()


def print_rollouts_table(args: argparse.Namespace, rows: list[Row]) -> None:
    """The main table: the ideal rows and each mode's row, per kind."""
    n, c, latency = args.n, args.concurrency, args.latency
    print()
    print(
        f"Rollouts: N={n}, simulated model latency (ttft) {latency:g}s, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
        + (f", Ray {__import__('ray').__version__}" if not args.skip_ray else "")
    )
    headers = [
        "mode",
        "kind",
        "N",
        "conc",
        "wall s",
        "rollouts/s",
        "x ideal",
        "x asyncio",
        "peak MiB",
        "CPU-ms/rollout",
        "failed",
    ]
    out: list[list[str]] = []
    for kind in args.kinds:
        base = next((r for r in rows if r.mode == "asyncio" and r.kind == kind), None)
        concurrencies = [c] + ([args.k1_actors] if not (args.skip_ray or args.skip_k1) and args.k1_actors != c else [])
        for conc in concurrencies:
            ideal = ideal_wall(n, conc, kind, latency)
            out.append(
                [
                    "ideal",
                    kind,
                    str(n),
                    str(conc),
                    f"{ideal:.2f}",
                    f"{n / ideal:.1f}",
                    "1.00",
                    fmt(ideal / base.wall if base and base.wall else None, ".2f") if conc == c else "-",
                    "-",
                    "-",
                    "-",
                ]
            )
        for mode in ("asyncio", "ray K=1", "ray packed"):
            r = next((r for r in rows if r.mode == mode and r.kind == kind), None)
            if r is None:
                continue
            if r.skipped or r.wall is None:
                out.append([mode, kind, str(n), str(r.concurrency), "skipped", "-", "-", "-", "-", "-", "-"])
                continue
            ideal = ideal_wall(n, r.concurrency, kind, latency)
            vs = r.wall / base.wall if base and base.wall else None
            out.append(
                [
                    mode,
                    kind,
                    str(n),
                    str(r.concurrency),
                    f"{r.wall:.2f}",
                    f"{n / r.wall:.1f}",
                    f"{r.wall / ideal:.2f}",
                    fmt(vs, ".2f"),
                    f"{r.peak_mib:.0f}",
                    f"{r.cpu_ms:.1f}",
                    str(r.failed),
                ]
            )
    print(table(headers, out))


def print_legend(args: argparse.Namespace, rows: list[Row]) -> None:
    """What the table's columns mean, with each row's baseline, idle CPU and disturbance."""
    c = args.concurrency
    print()
    print("x ideal: wall / ideal at the row's own concurrency. x asyncio: wall / the asyncio row of the same")
    print(f"  kind (concurrency {c}).")
    if not args.skip_ray:
        print(
            f"ray K=1: concurrency is capped by the number of actors M={args.k1_actors} (one rollout each), not C={c};"
        )
        print("  its x asyncio compares against asyncio at C, its x ideal against the ideal at M.")
    print("peak MiB: peak of the sum of VmRSS over this process and all its descendants (Ray's gcs, raylet,")
    print("  workers), plus the runtime hosts' detached guardians, sampled every 50 ms; shared pages are")
    print(
        "  counted once per process. Tree RSS at row start: "
        + ", ".join(f"{r.mode}/{r.kind} {r.base_mib:.0f}" for r in rows if r.base_mib is not None)
        + " MiB."
    )
    print("CPU-ms/rollout: utime+stime(+cutime+cstime of reaped children) of that tree from /proc, after")
    print("  minus before, over N, minus the sampler thread's own CPU. It misses short-lived children reaped")
    print("  outside the tree (and processes that exit mid-row unreaped by the tree); resolution 10 ms/process.")
    print(
        f"  Idle tree CPU (ms per s, over {IDLE_PROBE:g}s before the row) / sampler thread CPU (ms, whole row): "
        + ", ".join(
            f"{r.mode}/{r.kind} {r.idle_ms_per_s:.0f} / {r.sampler_ms:.0f}" for r in rows if r.idle_ms_per_s is not None
        )
        + "."
    )
    print(
        "Other processes on the machine (not this benchmark) used, in cores of "
        f"{os.cpu_count()}, during each row: "
        + ", ".join(f"{r.mode}/{r.kind} {r.others_cores:.2f}" for r in rows if r.others_cores is not None)
        + " -- above ~0.1 the walls are disturbed."
    )


def print_failures(failed: list[Row]) -> None:
    """Skipped rows, and the first five errors of each failed row."""
    for r in failed:
        if r.skipped:
            print(f"SKIPPED {r.mode}/{r.kind}: {r.skipped}")
        for e in r.errors[:5]:
            print(f"FAILED {r.mode}/{r.kind}: {e}")
        if len(r.errors) > 5:
            print(f"  ... and {len(r.errors) - 5} more")


def print_spans(rows: list[Row]) -> None:
    """Where a rollout's time goes, per row that has timing spans."""
    timed = [r for r in rows if r.spans]
    if not timed:
        return
    print()
    print("Where a rollout's time goes: mean ms per rollout (latency as the driver saw it; the rest are")
    print("the trace's timing spans; harness = agent span - model calls, and includes unregistering the")
    print("session and tools; rest = latency - all spans: dispatch, building the rollout, runtime teardown,")
    print("moving the trace)")
    print(
        table(["mode", "kind", *SPANS], [[r.mode, r.kind, *(f"{r.spans[k] * 1e3:.1f}" for k in SPANS)] for r in timed])
    )


def print_process_trees(trees: dict[str, dict[str, tuple[int, float]]]) -> None:
    """Processes and MiB per process kind that each Ray mode starts from."""
    if not trees:
        return
    print()
    print("Process tree after actor creation and warm-up (processes, MiB RSS) -- what each Ray row starts from")
    kinds = list(dict.fromkeys(k for tree in trees.values() for k in tree))
    print(
        table(
            ["process", *trees],
            [[k, *(f"{t[k][0]} / {t[k][1]:.0f}" if k in t else "-" for t in trees.values())] for k in kinds]
            + [
                [
                    "total",
                    *(f"{sum(v[0] for v in t.values())} / {sum(v[1] for v in t.values()):.0f}" for t in trees.values()),
                ]
            ],
            left=1,
        )
    )


def print_proxy_latency(requests: int, lat: dict[str, list[float]]) -> None:
    """p50, p99 and mean of a model call direct and through the proxy, and the difference."""
    print()
    print(
        f"Proxy added latency per model call: {requests} sequential requests after 30 warm-up, simulated model ttft=0"
    )
    d, p = lat["direct"], lat["proxy"]
    lat_rows = [
        [
            "direct to simulated model",
            f"{pct(d, 0.5) * 1e3:.2f}",
            f"{pct(d, 0.99) * 1e3:.2f}",
            f"{statistics.fmean(d) * 1e3:.2f}",
        ],
        [
            "through HTTPInterception",
            f"{pct(p, 0.5) * 1e3:.2f}",
            f"{pct(p, 0.99) * 1e3:.2f}",
            f"{statistics.fmean(p) * 1e3:.2f}",
        ],
        [
            "added by the proxy",
            f"{(pct(p, 0.5) - pct(d, 0.5)) * 1e3:.2f}",
            f"{(pct(p, 0.99) - pct(d, 0.99)) * 1e3:.2f}",
            f"{(statistics.fmean(p) - statistics.fmean(d)) * 1e3:.2f}",
        ],
    ]
    print(table(["path", "p50 ms", "p99 ms", "mean ms"], lat_rows, left=1))


async def main(args: argparse.Namespace) -> int:
    notes: list[str] = []
    fit_concurrency_to_fd_limit(args, notes)
    n, c, latency = args.n, args.concurrency, args.latency
    per_actor = math.ceil(c / args.actors)
    rows: list[Row] = []
    trees: dict[str, dict[str, tuple[int, float]]] = {}
    print(
        f"bench_rollouts: N={n} C={c} latency={latency}s kinds={','.join(args.kinds)} "
        f"packed={args.actors}x{per_actor} K=1 actors={args.k1_actors}",
        flush=True,
    )

    code_before = provenance()
    await note_machine_busy(notes)

    # 1. the proxy's added latency (before anything else loads the machine)
    lat = await proxy_latency(args.proxy_requests, warmup=30)
    print("proxy latency measured", flush=True)

    async with SimulatedModelServer(SimulatedModelConfig(ttft=latency)) as server:
        url = server.base_url
        assert url is not None
        # 2. asyncio rows (before ray.init, so the process tree is this process alone)
        await run_asyncio_rows(url, args, rows)
        # 3. Ray rows
        if not args.skip_ray:
            await run_ray_rows(url, args, per_actor, rows, trees, notes)

    code_after = provenance()
    if code_after == code_before:
        notes.append(f"rollout_ray measured: {code_before}")
    else:
        notes.append(f"WARNING: rollout_ray CHANGED during the run: {code_before} -> {code_after}")

    print_rollouts_table(args, rows)
    print_legend(args, rows)
    for note in notes:
        print("note: " + note)
    failed = [r for r in rows if r.errors or r.skipped]
    print_failures(failed)
    print_spans(rows)
    print_process_trees(trees)
    print_proxy_latency(args.proxy_requests, lat)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
