#!/usr/bin/env python
"""What does one rollout cost, in every process of the system, against the floor of a bare
HTTP client loop?

The workload of issue 11: arithmetic rollouts against an OpenAI-compatible model at a fixed
latency (the built-in ``SimulatedModelServer``, ttft = latency, in its own child process:
benchmarks/_cost_model.py), single turn (1 model call) and one calculator tool call then the
answer (2 model calls), groups of 1 and of 8 samples per task (N counts rollouts), C in
flight. Per kind and group size, one row per executor, each in its own process
(benchmarks/_cost_worker.py), measured from outside by this script through /proc:

- floor: a bare aiohttp client loop making the same model calls at concurrency C (the tool
  executed locally between the calls); nothing of rollout_ray imported;
- local: ``Driver`` + ``LocalExecutor`` over examples/arith.py / examples/calc_tool.py;
- ray: ``Driver`` + ``RayExecutor(actors=A, capacity=ceil(C / A))`` on a private local Ray
  started by the worker (ray.init timed alone);
- eval: ``rollout-ray eval <taskset> --samples g --limit N/g --model-url URL --max-in-flight C
  --out TMP`` as a subprocess with the CLI's own defaults for everything else (its rollout
  actors: one per CPU, 2 on the 2-core machine measured, and no cap per actor, unless
  --eval-pool). The taskset is examples/arith.py (examples/calc_tool.py for the tool kind) copied into a
  temporary directory with ``tasks()`` defaulting to N/g tasks (the examples make 50).

floor, local and ray run a warm-up of --warmup rollouts first in the same process (not
measured), then the measured run; the window is exactly that run (the worker stops at its
start and end until this script has read the CPU counters of every process). eval is
measured whole: from the command's start to its exit, start-up, Ray and shutdown included.

Per row: wall, the ideal ceil(N / C) x latency x calls per rollout, rollouts/s, CPU-ms per
rollout summed over every process of the system (the row's process tree, the model server,
and processes that left the tree: this script is their child subreaper, so detached ones —
the runtimes' guardians, Ray workers orphaned at shutdown — stay attributable) and split by
process kind, peak resident memory of all of them (sampled every --sample-interval s), the
model server's peak of concurrent requests, failures. Cold start: seconds from the command's
start to the first model request (the model server stamps it), ray.init alone, executor start
to first model request.

    python benchmarks/bench_cost.py --quick       # N=300, C=64: a few minutes
    python benchmarks/bench_cost.py               # N=1000, C=256, latency 0.09 s, all rows
    python benchmarks/bench_cost.py --scale       # ray only: N=20,000, C=10,000, latency 5 s
    python benchmarks/bench_cost.py --scale --n 2000 --concurrency 2000
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_driver
from _proc import PAGE, TICK, stat_fields  # benchmarks/ is the script's directory
from bench_driver import MiB, kind_of, loadavg, machine_busy, raise_nofile, source_version, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = {"single": ROOT / "examples" / "arith.py", "tool": ROOT / "examples" / "calc_tool.py"}
CALLS = {"single": 1, "tool": 2}
GROUPS = [
    "driver",
    "model server",
    "rollout actors",
    "node services actor",
    "runtime actors",
    "raylet+gcs+other ray",
    "other",
    "not sampled",
]
EVAL_DEFAULT_POOL = "2 x no cap"  # rollout-ray eval's --actors / --capacity defaults today
NOT_SAMPLED = "not sampled"
DEBUG = bool(os.environ.get("BENCH_COST_DEBUG"))


# -- processes ------------------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Orphaned descendants (double-forked guardians, Ray workers outliving their raylet) are
    reparented to this process instead of init, so their CPU stays measurable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


@dataclass
class Proc:
    ppid: int
    state: str
    self_cpu: float  # utime + stime, s
    full_cpu: float  # + cutime + cstime (children it reaped)
    rss: int  # bytes


def read_procs() -> dict[int, Proc]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = stat_fields(int(entry))
            if f is not None:
                utime, stime, cutime, cstime = (int(x) for x in f[11:15])
                out[int(entry)] = Proc(
                    int(f[1]),
                    f[0].decode(),
                    (utime + stime) / TICK,
                    (utime + stime + cutime + cstime) / TICK,
                    int(f[21]) * PAGE,
                )
    return out


def ray_owned(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return False
    return bool(argv) and (argv[0].startswith("ray::") or any("/ray/" in a for a in argv[:3]))


def actor_name(pid: int) -> str | None:
    """The actor class a Ray worker hosts, from the ``:actor_name:`` line Ray writes at the top
    of the worker's stdout log (its proctitle reads ``ray::IDLE`` between calls)."""
    try:
        path = os.readlink(f"/proc/{pid}/fd/1")
        if not path.endswith(".out"):
            return None
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    names = re.findall(rb":actor_name:(\S+)", head)
    return "ray::" + names[-1].decode(errors="replace") if names else None


def group_of(name: str, role: str | None, ray: bool) -> str:
    if role:
        return role
    if "RolloutActor" in name:
        return "rollout actors"
    if any(s in name for s in ("NodeService", "Interception", "ToolService")):
        return "node services actor"
    if "RuntimeHost" in name or "RuntimeActor" in name:
        return "runtime actors"
    if ray or name.startswith("ray::") or name in ("raylet", "gcs_server"):
        return "raylet+gcs+other ray"
    return "other"


Snapshot = tuple[dict[int, tuple[float, float]], float, float]


@dataclass
class Member:
    """A process of the row: seen in its tree, or reparented to this script during it."""

    name: str = "?"
    role: str | None = None
    ray: bool = False
    ppid: int = 0  # last seen
    self_cpu: float = 0.0  # utime + stime, last seen (exact if it was seen as a zombie)
    full_cpu: float = 0.0  # + cutime + cstime
    reaped_here: bool = False  # this script reaped it (an orphan)
    alive: bool = True
    zombie_seen: bool = False
    rss_peak: int = 0

    @property
    def group(self) -> str:
        return group_of(self.name, self.role, self.ray)


class Tracker:
    """Samples, every ``interval`` s in a thread, the processes of the current row (the tree of
    its root, plus processes reparented to this script during it) and the model server: CPU
    counters, resident memory (peaks per phase, per kind, per name), the driver's RSS; reaps
    orphans reparented to this script (their rusage is their final CPU)."""

    def __init__(self, model_pid: int, interval: float) -> None:
        self.model_pid, self.interval = model_pid, interval
        self.me = os.getpid()
        self.lock = threading.Lock()
        self.popen: set[int] = {model_pid}
        self.seen_before: set[int] = set()  # members of earlier rows
        self.root: int | None = None
        self.members: dict[int, Member] = {}
        self.phase = "whole"
        self.peak: dict[str, int] = defaultdict(int)
        self.rss_samples: list[tuple[str, dict[int, int]]] = []
        self.driver_series: list[tuple[float, int, int]] = []  # (time, driver RSS, total RSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cost-tracker", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - never let the sampler die silently
                print(f"  !! tracker: {type(e).__name__}: {e}", file=sys.stderr)

    # -- rows --

    def begin(self, root: int, role: str) -> None:
        with self.lock:
            self.seen_before |= set(self.members)
            self.root = root
            self.popen.add(root)
            self.members = {root: Member(role=role)}
            self.phase = "whole"
            self.peak = defaultdict(int)
            self.rss_samples = []
            self.driver_series = []
            bench_driver._KINDS.clear()

    def set_phase(self, phase: str) -> None:
        with self.lock:
            self.phase = phase

    def root_exited(self, final: Proc | None) -> None:
        """The root is a zombie (not reaped yet): its /proc/PID/stat holds its final CPU."""
        with self.lock:
            m = self.members.get(self.root)  # type: ignore[arg-type]
            if m is not None and final is not None:
                m.self_cpu, m.full_cpu = max(m.self_cpu, final.self_cpu), max(m.full_cpu, final.full_cpu)
                m.zombie_seen = True

    def tick(self) -> None:
        procs = read_procs()
        with self.lock:
            self._reap(procs)
            if self.root is None:
                return
            children: dict[int, list[int]] = defaultdict(list)
            for pid, p in procs.items():
                children[p.ppid].append(pid)
            # Reparented to this script during the row (not the model, not an earlier row's).
            todo = [self.root] + [
                pid for pid in children.get(self.me, ()) if pid not in self.popen and pid not in self.seen_before
            ]
            tree: set[int] = set()
            while todo:
                pid = todo.pop()
                if pid in procs and pid not in tree:
                    tree.add(pid)
                    todo.extend(children.get(pid, ()))
            for pid in tree:
                if pid not in self.members:
                    self.members[pid] = Member(ray=ray_owned(pid))
            total = 0
            rss: dict[int, int] = {}
            driver_rss = 0
            for pid, m in self.members.items():
                p = procs.get(pid)
                if p is None or not m.alive:
                    m.alive = False
                    continue
                m.self_cpu, m.full_cpu = max(m.self_cpu, p.self_cpu), max(m.full_cpu, p.full_cpu)
                if p.state == "Z":
                    m.zombie_seen = True  # its final CPU
                    continue
                m.ppid = p.ppid
                if m.role is None and (m.name == "?" or "IDLE" in m.name or "starting" in m.name):
                    m.name = kind_of(pid)
                    if "IDLE" in m.name or "starting" in m.name:
                        m.name = actor_name(pid) or m.name
                m.rss_peak = max(m.rss_peak, p.rss)
                total += p.rss
                rss[pid] = p.rss
                if pid == self.root:
                    driver_rss = p.rss
            model = procs.get(self.model_pid)
            if model is not None:
                total += model.rss
                rss[self.model_pid] = model.rss
            for phase in {"whole", self.phase}:
                self.peak[phase] = max(self.peak[phase], total)
            self.rss_samples.append((self.phase, rss))
            self.driver_series.append((time.time(), driver_rss, total))

    def group_peaks(self, phase: str) -> dict[str, int]:
        """Each process kind's own peak RSS (of the sum over its processes) in ``phase``, by
        the processes' last names (an actor's proctitle reads ray::IDLE between calls)."""
        with self.lock:
            peaks: dict[str, int] = defaultdict(int)
            for ph, rss in self.rss_samples:
                if phase != "whole" and ph != phase:
                    continue
                by: dict[str, int] = defaultdict(int)
                for pid, v in rss.items():
                    m = self.members.get(pid)
                    by["model server" if pid == self.model_pid else m.group if m else "other"] += v
                for g, v in by.items():
                    peaks[g] = max(peaks[g], v)
            return dict(peaks)

    def _reap(self, procs: dict[int, Proc]) -> None:
        """Reap every zombie child of this script that no Popen owns (orphans reparented here),
        after taking its final CPU from its stat."""
        for pid, p in procs.items():
            if p.ppid == self.me and p.state == "Z" and pid not in self.popen:
                if self.root is not None and pid not in self.seen_before:
                    m = self.members.setdefault(pid, Member(name=f"orphan {pid}"))  # born and orphaned between samples
                    m.self_cpu, m.full_cpu = max(m.self_cpu, p.self_cpu), max(m.full_cpu, p.full_cpu)
                    m.zombie_seen = m.reaped_here = True
                    m.alive = False
                try:
                    os.wait4(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def snapshot(self) -> Snapshot:
        """({pid: (own CPU, CPU of unseen children)} of the row's processes, model CPU, machine
        busy), now.

        Own CPU: utime + stime, last seen (a process that exits loses at most its last sample
        interval, none if it was seen as a zombie). Unseen children: what the process's
        cutime + cstime holds beyond the processes of the row it reaped — children born and
        gone between two samples (counted only where the parent waits for its children)."""
        self.tick()
        with self.lock:
            reaped: dict[int, float] = defaultdict(float)
            for m in self.members.values():
                if not m.alive and not m.reaped_here:
                    reaped[m.ppid] += m.full_cpu
            cpu = {
                pid: (m.self_cpu, max(0.0, m.full_cpu - m.self_cpu - reaped.get(pid, 0.0)))
                for pid, m in self.members.items()
            }
        f = stat_fields(self.model_pid)
        model = sum(int(x) for x in f[11:15]) / TICK if f is not None else 0.0
        return cpu, model, machine_busy()

    def leftovers(self) -> list[tuple[int, str]]:
        procs = read_procs()
        with self.lock:
            return [
                (pid, m.name)
                for pid, m in self.members.items()
                if pid in procs and procs[pid].state != "Z" and pid != self.root
            ]


def cpu_delta(
    tracker: Tracker, before: Snapshot, after: Snapshot
) -> tuple[float, dict[str, float], dict[str, float], float]:
    """(total CPU s, by kind, by process name, machine busy s) between two snapshots: every
    process's own CPU, by kind; children born and gone between samples as "not sampled"."""
    b_cpu, b_model, b_busy = before
    a_cpu, a_model, a_busy = after
    by_group: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    by_group["model server"] += a_model - b_model
    by_name["model server (_cost_model.py)"] += a_model - b_model
    with tracker.lock:
        members = dict(tracker.members)
    for pid, (own, unseen) in a_cpu.items():
        own0, unseen0 = b_cpu.get(pid, (0.0, 0.0))
        m = members[pid]
        by_group[m.group] += own - own0
        by_name[m.name if m.role is None else m.role] += own - own0
        by_group[NOT_SAMPLED] += unseen - unseen0
        if DEBUG and (own - own0 > 0.005 or abs(unseen - unseen0) > 0.005):
            print(
                f"    DEBUG {pid} {m.name!r} role={m.role} ppid={m.ppid} alive={m.alive} zombie_seen={m.zombie_seen} "
                f"reaped_here={m.reaped_here} own {own0:.2f}->{own:.2f} unseen {unseen0:.2f}->{unseen:.2f}",
                file=sys.stderr,
            )
    return sum(by_group.values()), dict(by_group), dict(by_name), a_busy - b_busy


# -- the model server -----------------------------------------------------------------------------


class ModelServer:
    def __init__(self, latency: float) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_cost_model.py"),
                "--ttft",
                str(latency),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"serving at (\S+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"model server did not start: {line!r}")
        self.url = match.group(1)
        self._base = self.url.removesuffix("/v1")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self._base + "/bench/stats", timeout=30) as r:
            return json.load(r)

    def reset(self) -> None:
        req = urllib.request.Request(self._base + "/bench/reset", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- rows -----------------------------------------------------------------------------------------


@dataclass
class Row:
    kind: str
    group: int
    executor: str
    n: int
    """Rollouts: tasks x group, tasks = ceil(requested N / group)."""
    n_requested: int
    concurrency: int
    latency: float
    pool: str = ""
    load: str = ""
    wall: float = 0.0
    cpu_s: float = 0.0
    by_group: dict[str, float] = field(default_factory=dict)
    by_name: dict[str, float] = field(default_factory=dict)
    other_cores: float = 0.0
    peak_window: int = 0
    peak_whole: int = 0
    group_peak: dict[str, int] = field(default_factory=dict)
    failed: int | None = None
    reward: float | None = None
    model_peak_in_flight: int = 0
    model_requests: int = 0
    # cold
    cmd_to_first_call: float | None = None
    ray_init: float | None = None
    executor_to_first_call: float | None = None
    cmd_wall: float = 0.0
    cmd_cpu: float = 0.0
    drive_span: float | None = None
    warm_wall: float | None = None
    leftovers: list[tuple[int, str]] = field(default_factory=list)
    driver_series: list[tuple[float, int, int]] = field(default_factory=list)
    progress: list[tuple[int, int, float, int]] = field(default_factory=list)  # (done, in flight, t, driver RSS)
    t_start: float = 0.0  # time.time() at the measured run's start
    notes: list[str] = field(default_factory=list)
    cmd: str = ""
    error: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind} g={self.group} {self.executor}"

    @property
    def calls(self) -> int:
        return CALLS[self.kind]

    @property
    def ideal(self) -> float:
        return math.ceil(self.n / self.concurrency) * self.latency * self.calls

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s * 1000 / self.n if self.n else float("nan")


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a private local Ray
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_root(pid: int) -> tuple[int, Proc | None]:
    """Wait for the row's root to exit; read its final CPU from its zombie's stat, then reap it:
    (wait status, its last stat)."""
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            info = None
        if info is not None:
            break
        time.sleep(0.05)
    final = read_procs().get(pid)
    _, status = os.waitpid(pid, 0)
    return status, final


def run_row(
    tracker: Tracker,
    model: ModelServer,
    row: Row,
    argv: list[str],
    role: str,
    *,
    marks: bool,
    timeout: float,
    cwd: str | None = None,
) -> dict[str, Any]:
    """Run one row's command; returns the worker's result (or {} for eval)."""
    row.load = loadavg()
    model.reset()
    log = tempfile.NamedTemporaryFile(prefix="bench_cost_", suffix=".log", delete=False)
    t_cmd = time.time()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if marks else subprocess.DEVNULL,
        stdout=subprocess.PIPE if marks else log,
        stderr=log,
        text=True,
        env=child_env(),
        cwd=cwd,
    )
    tracker.begin(proc.pid, role)
    t0 = time.perf_counter()
    start = tracker.snapshot()
    stamps: dict[str, float] = {}
    result: dict[str, Any] = {}
    window: dict[str, Any] = {}

    def kill_all() -> None:
        print(f"  !! {row.label}: still running after {timeout:.0f} s; killing it and its processes", file=sys.stderr)
        spy = Path(sys.executable).with_name("py-spy")
        if spy.exists():  # where it hung
            dump = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True)
            print("    " + (dump.stdout + dump.stderr).replace("\n", "\n    "), file=sys.stderr)
        for pid, _ in tracker.leftovers() + [(proc.pid, "root")]:
            try:
                os.kill(pid, 9)
            except OSError:
                pass

    timer = threading.Timer(timeout, kill_all)
    timer.daemon = True
    timer.start()
    try:
        if marks:
            assert proc.stdout is not None and proc.stdin is not None
            for line in proc.stdout:
                if line.startswith("@@T "):
                    _, name, t = line.split()
                    stamps[name] = float(t)
                elif line.startswith("@@PROG "):
                    done, in_flight, _failed, t = line.split()[1:5]
                    row.progress.append((int(done), int(in_flight), float(t), rss_of(proc.pid)))
                elif line.startswith("@@MARK "):
                    name = line.split()[1]
                    if name == "start":
                        cold = model.stats()
                        window["cold_first"] = cold.get("first")
                        model.reset()
                        window["before"] = tracker.snapshot()
                        tracker.set_phase("window")
                        row.t_start = time.time()
                    elif name == "end":
                        window["after"] = tracker.snapshot()
                        tracker.set_phase("whole")
                        window["stats"] = model.stats()
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                elif line.startswith("@@RESULT "):
                    result = json.loads(line[len("@@RESULT ") :])
                else:
                    sys.stderr.write(f"  [{row.label}] {line}")
        status, root_final = wait_root(proc.pid)
    finally:
        timer.cancel()
    row.cmd_wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    tracker.root_exited(root_final)
    # Let processes of the row that outlive its root end (and be reaped) before the final count.
    for _ in range(50):
        if not tracker.leftovers():
            break
        time.sleep(0.1)
    end = tracker.snapshot()
    row.group_peak = tracker.group_peaks("window" if marks else "whole")
    row.leftovers = tracker.leftovers()
    row.cmd_cpu = cpu_delta(tracker, start, end)[0]
    with tracker.lock:
        row.peak_whole = tracker.peak["whole"]
        row.peak_window = tracker.peak.get("window", 0)
        row.driver_series = list(tracker.driver_series)
    if proc.returncode != 0 or (marks and not result):
        log.seek(0)
        tail = log.read().decode(errors="replace").splitlines()[-15:]
        row.error = f"exit {proc.returncode}"
        print(f"  !! {row.label}: exit {proc.returncode}; log {log.name}:\n    " + "\n    ".join(tail), file=sys.stderr)
    else:
        os.unlink(log.name)
    if marks and "before" in window and "after" in window:
        row.cpu_s, row.by_group, row.by_name, busy = cpu_delta(tracker, window["before"], window["after"])
        row.wall = result.get("wall", 0.0)
        stats = window["stats"]
        first = window["cold_first"]
        if first is not None:
            row.cmd_to_first_call = first - t_cmd
            if "executor_start" in stamps:
                row.executor_to_first_call = first - stamps["executor_start"]
    elif marks:  # the worker died or was killed before its run ended
        row.error = row.error or "no measured run"
        stats = model.stats()
        busy = 0.0
    else:  # eval: the whole command
        row.cpu_s, row.by_group, row.by_name, busy = row.cmd_cpu, *cpu_delta(tracker, start, end)[1:]
        row.wall = row.cmd_wall
        row.peak_window = row.peak_whole
        stats = model.stats()
        if stats.get("first") is not None:
            row.cmd_to_first_call = stats["first"] - t_cmd
            row.drive_span = stats["last"] - stats["first"] + row.latency
    row.other_cores = max(0.0, busy - row.cpu_s) / row.wall if row.wall else 0.0
    row.model_peak_in_flight = stats.get("peak_in_flight", 0)
    row.model_requests = stats.get("requests", 0)
    if result:
        row.failed, row.reward = result.get("failed"), result.get("reward")
        row.ray_init = result.get("ray_init_s")
        row.warm_wall = result.get("warm_wall")
        row.pool = result.get("pool", row.pool)
        if result.get("warm_failed"):
            row.notes.append(f"warm-up: {result['warm_failed']} failed")
            for error, count in result.get("warm_errors") or []:
                row.notes.append(f"{count}x {error}")
        if result.get("failed"):
            for error, count in result.get("errors") or []:
                row.notes.append(f"run: {count}x {error}")
        if result.get("status") not in (None, "completed"):
            row.notes.append(f"run {result.get('status')}: {result.get('reason')}")
        if result.get("n") and result["n"] != row.n:
            row.notes.append(f"ran N={result['n']}")
    return result


def worker_row(
    tracker: Tracker, model: ModelServer, args: argparse.Namespace, kind: str, group: int, executor: str, n: int
) -> Row:
    c = args.concurrency
    capacity = math.ceil(c / args.actors)
    row = Row(kind, group, executor, math.ceil(n / group) * group, n, c, args.latency)
    spec = {
        "executor": executor,
        "kind": kind,
        "group": group,
        "n": n,
        "concurrency": c,
        "url": model.url,
        "warmup": args.warmup,
        "actors": args.actors,
        "capacity": capacity,
    }
    timeout = args.row_timeout or max(300.0, 60 * row.ideal + 240)
    run_row(
        tracker,
        model,
        row,
        [sys.executable, str(HERE / "_cost_worker.py"), json.dumps(spec)],
        "driver",
        marks=True,
        timeout=timeout,
    )
    return row


def eval_taskset(kind: str, tasks: int, folder: str) -> str:
    """The example's file, with tasks() making ``tasks`` tasks by default (the examples make 50,
    and ``--limit`` only cuts)."""
    src = EXAMPLES[kind].read_text()
    path = os.path.join(folder, EXAMPLES[kind].name)
    with open(path, "w") as f:
        f.write(
            src + f"\n\n_example_tasks = tasks\n\n\ndef tasks(n: int = {tasks}, seed: int | None = None):\n"
            f"    return _example_tasks(n) if seed is None else _example_tasks(n, seed)\n"
        )
    return path


def eval_row(tracker: Tracker, model: ModelServer, args: argparse.Namespace, kind: str, group: int, n: int) -> Row:
    import pyarrow.parquet as pq

    c = args.concurrency
    tasks = math.ceil(n / group)
    row = Row(kind, group, "eval", tasks * group, n, c, args.latency, pool=EVAL_DEFAULT_POOL + " (default)")
    folder = tempfile.mkdtemp(prefix="bench_cost_eval_")
    try:
        taskset = eval_taskset(kind, tasks, folder)
        cli = Path(sys.executable).with_name("rollout-ray")
        head = [str(cli)] if cli.exists() else [sys.executable, "-m", "rollout_ray"]
        argv = [
            *head,
            "eval",
            taskset,
            "--samples",
            str(group),
            "--limit",
            str(tasks),
            "--model-url",
            model.url,
            "--max-in-flight",
            str(c),
            "--out",
            os.path.join(folder, "run"),
        ]
        if args.eval_pool:
            actors, capacity = args.eval_pool.split("x")
            argv += ["--actors", actors.strip(), "--capacity", capacity.strip()]
            row.pool = f"{actors.strip()} x {capacity.strip()}"
        row.cmd = "rollout-ray " + " ".join(argv[len(head) :]).replace(folder, "$TMP")
        timeout = args.row_timeout or max(300.0, 60 * row.ideal + 240)
        run_row(tracker, model, row, argv, "driver", marks=False, timeout=timeout, cwd=folder)
        try:
            shards = sorted(p for p in Path(folder, "run").rglob("*.parquet") if p.parent.name == "shards")
            t = pq.ParquetDataset([str(s) for s in shards]).read(columns=["ok", "reward"]) if shards else None
            if t is not None:
                ok = t.column("ok").to_pylist()
                row.failed = sum(1 for v in ok if not v) + (row.n - len(ok))
                rewards = t.column("reward").to_pylist()
                row.reward = sum(r or 0.0 for r in rewards) / max(1, len(rewards))
            else:
                row.failed = row.n
        except Exception as e:  # noqa: BLE001 - the row records why the run could not be read
            row.notes.append(f"could not read the run: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return row


# -- printing -------------------------------------------------------------------------------------


def f2(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def print_main(rows: list[Row], floor: dict[tuple[str, int], Row]) -> None:
    out = []
    for r in rows:
        if r.error and not r.wall:
            out.append(
                [r.kind, r.group, r.executor, r.pool, r.n, r.concurrency, r.load, f"FAILED ({r.error})"] + ["-"] * 11
            )
            continue
        fl = floor.get((r.kind, r.group))
        x_floor = f"{r.cpu_ms / fl.cpu_ms:.1f}x" if fl and fl.cpu_ms and r is not fl else ("1.0x" if r is fl else "-")
        out.append(
            [
                r.kind,
                r.group,
                r.executor,
                r.pool,
                r.n,
                r.concurrency,
                r.load,
                f"{r.wall:.2f}",
                f"{r.ideal:.2f}",
                f"{r.wall / r.ideal:.1f}x" if r.ideal else "-",
                f"{r.n / r.wall:.0f}" if r.wall else "-",
                f"{r.n / r.ideal:.0f}",
                f"{r.cpu_ms:.2f}",
                x_floor,
                f"{r.peak_window / MiB:.0f}",
                r.model_peak_in_flight,
                "-" if r.failed is None else r.failed,
                f2(r.reward),
                f"{r.other_cores:.2f}",
            ]
        )
    print(
        table(
            [
                "kind",
                "g",
                "executor",
                "actors x cap",
                "N",
                "C",
                "load before (1/5/15 min)",
                "wall s",
                "ideal s",
                "x ideal",
                "rollouts/s",
                "ideal/s",
                "CPU-ms/rollout",
                "x floor",
                "peak MiB",
                "model peak in flight",
                "failed",
                "reward",
                "other cores",
            ],
            out,
        )
    )


def print_breakdown(rows: list[Row], floor: dict[tuple[str, int], Row]) -> None:
    for kind in dict.fromkeys(r.kind for r in rows):
        sub = [r for r in rows if r.kind == kind]
        print(f"\nCPU-ms per rollout by process kind, {kind} (measured window; eval: the whole command):\n")
        body = [
            [g] + [f"{r.by_group.get(g, 0.0) * 1000 / r.n:.2f}" for r in sub]
            for g in GROUPS
            if any(abs(r.by_group.get(g, 0.0)) * 1000 / r.n >= 0.005 for r in sub)
        ]
        body.append(["total"] + [f"{r.cpu_ms:.2f}" for r in sub])
        xs = []
        for r in sub:
            fl = floor.get((r.kind, r.group))
            xs.append(f"{r.cpu_ms / fl.cpu_ms:.1f}x" if fl and fl.cpu_ms else "-")
        body.append(["x floor"] + xs)
        print(table(["process kind"] + [f"g={r.group} {r.executor}" for r in sub], body))
        names = sorted({k for r in sub for k in r.by_name}, key=lambda k: -max(r.by_name.get(k, 0) / r.n for r in sub))
        names = [k for k in names if max(abs(r.by_name.get(k, 0.0)) * 1000 / r.n for r in sub) >= 0.01]
        print(f"\nCPU-ms per rollout by process, {kind} (each name summed over its processes):\n")
        print(
            table(
                ["process"] + [f"g={r.group} {r.executor}" for r in sub],
                [[k] + [f"{r.by_name.get(k, 0.0) * 1000 / r.n:.2f}" for r in sub] for k in names],
            )
        )


def print_memory(rows: list[Row]) -> None:
    groups = [g for g in GROUPS if any(r.group_peak.get(g, 0) >= MiB for r in rows)]
    print(
        "\nPeak resident MiB by process kind (each kind's own peak over the measured window; eval: whole command),"
        " and the peak of the sum:\n"
    )
    print(
        table(
            ["process kind"] + [f"{r.kind} g={r.group} {r.executor}" for r in rows],
            [[g] + [f"{r.group_peak.get(g, 0) / MiB:.0f}" for r in rows] for g in groups]
            + [["total (peak of the sum)"] + [f"{r.peak_window / MiB:.0f}" for r in rows]],
        )
    )


def print_cold(rows: list[Row]) -> None:
    print("\nCold start and the whole command (start-up, warm-up, measured run and shutdown; eval has no warm-up):\n")
    body = []
    for r in rows:
        body.append(
            [
                r.kind,
                r.group,
                r.executor,
                f2(r.cmd_to_first_call),
                f2(r.ray_init),
                f2(r.executor_to_first_call),
                f2(r.warm_wall),
                f2(r.drive_span),
                f"{r.cmd_wall:.2f}",
                f"{r.cmd_cpu:.2f}",
                f"{r.peak_whole / MiB:.0f}",
                len(r.leftovers),
                "; ".join(r.notes + ([r.error] if r.error else [])),
            ]
        )
    print(
        table(
            [
                "kind",
                "g",
                "executor",
                "command start -> first model call s",
                "ray.init s",
                "executor start -> first model call s",
                "warm-up run s",
                "eval: first..last model call s",
                "command wall s",
                "command CPU s (all processes)",
                "peak MiB (whole command)",
                "processes left after exit",
                "notes",
            ],
            body,
        )
    )
    for r in rows:
        if r.cmd:
            print(f"{r.kind} g={r.group} {r.executor}: {r.cmd}")


def print_targets(rows: list[Row]) -> None:
    print("\nIssue 11 targets (this run):\n")
    out = []

    def status(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for r in rows:
        if r.error and not r.wall:
            out.append([f"{r.label}: the row did not finish", r.error, "MISSED"])
            continue
        if r.executor == "ray":
            limit = 2.0 if r.kind == "single" else 3.5
            out.append(
                [
                    f"ray warm {r.kind} g={r.group}: CPU-ms/rollout <= {limit}",
                    f"{r.cpu_ms:.2f}",
                    status(r.cpu_ms <= limit),
                ]
            )
            if r.kind == "single":
                out.append(
                    [
                        f"ray warm single g={r.group}: >= 800 rollouts/s",
                        f"{r.n / r.wall:.0f}",
                        status(r.n / r.wall >= 800),
                    ]
                )
        if r.executor == "local" and r.kind == "single":
            out.append([f"local single g={r.group}: CPU-ms/rollout <= 1.5", f"{r.cpu_ms:.2f}", status(r.cpu_ms <= 1.5)])
        if r.executor == "eval" and r.kind == "single" and r.cmd_to_first_call is not None:
            bound = 2 * (r.ideal + r.cmd_to_first_call)
            out.append(
                [
                    f"eval single g={r.group} N={r.n}: wall <= 2 x (ideal + cold start) = {bound:.2f} s",
                    f"{r.wall:.2f}",
                    status(r.wall <= bound),
                ]
            )
            out.append(
                [
                    f"eval single g={r.group}: cold start <= 4 s",
                    f"{r.cmd_to_first_call:.2f}",
                    status(r.cmd_to_first_call <= 4),
                ]
            )
    print(table(["target", "measured", ""], out))


def print_scale(rows: list[Row]) -> None:
    for r in rows:
        print(
            f"\nScale, {r.label}: N={r.n}, C={r.concurrency}, latency {r.latency:g} s, pool {r.pool}: "
            f"failed {r.failed}, model peak in flight {r.model_peak_in_flight}, peak memory of the whole system "
            f"{r.peak_whole / 2**30:.2f} GiB (measured run {r.peak_window / 2**30:.2f} GiB; target <= 6 GiB: "
            f"{'met' if r.peak_whole <= 6 * 2**30 and r.failed == 0 else 'MISSED'}), wall {r.wall:.1f} s = "
            f"{r.wall / r.ideal:.2f}x the ideal {r.ideal:.0f} s\n"
        )
        if r.progress:
            t0 = r.t_start or r.progress[0][2]
            picks, step = [], max(1, r.n // 10)
            nxt = 0
            for done, inflight, t, rss in r.progress:
                if done >= nxt or (done, inflight, t, rss) == r.progress[-1]:
                    picks.append([done, inflight, f"{t - t0:.1f}", f"{rss / MiB:.0f}"])
                    nxt = (done // step + 1) * step
            print("Driver memory during the measured run (at the driver's progress reports; t from the run's start):\n")
            print(table(["done", "in flight", "t s", "driver RSS MiB"], picks))
            rss = [p[3] for p in r.progress]
            print(
                f"\ndriver RSS: first report {rss[0] / MiB:.0f} MiB, max {max(rss) / MiB:.0f} MiB, "
                f"last {rss[-1] / MiB:.0f} MiB"
            )


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--n", default=None, help="rollouts per row, comma list (default 1000)")
    p.add_argument("--concurrency", type=int, default=None, help="C: rollouts in flight (default 256)")
    p.add_argument("--latency", type=float, default=None, help="model seconds per call (ttft; default 0.09)")
    p.add_argument("--groups", default=None, help="samples per task, comma list (default 1,8)")
    p.add_argument("--kinds", default=None, help="single,tool")
    p.add_argument("--executors", default=None, help="floor,local,ray,eval")
    p.add_argument("--actors", type=int, default=2, help="RayExecutor actors (capacity = ceil(C / actors))")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up rollouts before each measured run (floor, local, ray; default 300)",
    )
    p.add_argument(
        "--eval-pool",
        default=None,
        help="e.g. '2x128': pass --actors/--capacity to rollout-ray eval "
        "(default: the CLI's own defaults, an actor per CPU, no cap per actor)",
    )
    p.add_argument("--sample-interval", type=float, default=0.25, help="seconds between /proc samples")
    p.add_argument("--row-timeout", type=float, default=None, help="seconds before a row is killed")
    p.add_argument("--quick", action="store_true", help="N=300, C=64")
    p.add_argument(
        "--scale",
        action="store_true",
        help="10,000 in flight: ray only, single, g=1, latency 5 s, N=20,000, C=10,000 "
        "(--n / --concurrency / --latency override)",
    )
    args = p.parse_args(argv)
    if args.scale:
        d = {
            "n": "20000",
            "concurrency": 10000,
            "latency": 5.0,
            "groups": "1",
            "kinds": "single",
            "executors": "ray",
            "warmup": 300,
        }
    elif args.quick:
        d = {
            "n": "300",
            "concurrency": 64,
            "latency": 0.09,
            "groups": "1,8",
            "kinds": "single,tool",
            "executors": "floor,local,ray,eval",
            "warmup": 128,
        }
    else:
        d = {
            "n": "1000",
            "concurrency": 256,
            "latency": 0.09,
            "groups": "1,8",
            "kinds": "single,tool",
            "executors": "floor,local,ray,eval",
            "warmup": 300,
        }
    for k, v in d.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    ns = [int(x) for x in str(args.n).split(",") if x.strip()]
    groups = [int(x) for x in str(args.groups).split(",") if x.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]

    nofile = raise_nofile()
    subreaper = become_subreaper()
    import ray

    print(f"# bench_cost.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    import rollout_ray

    where = Path(rollout_ray.__file__).resolve().parent.parent
    print(
        f"rollout_ray: {source_version()}"
        if where == ROOT
        else f"rollout_ray: imported from {where} (PYTHONPATH), not from this checkout ({ROOT})"
    )
    print(
        f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * PAGE / 2**30:.1f} GiB; Python "
        f"{platform.python_version()}, Ray {ray.__version__}; RLIMIT_NOFILE {nofile[0]}; child subreaper "
        f"{'on' if subreaper else 'OFF (orphans not measured)'}; load average at start {loadavg()}"
    )
    print(
        f"model: benchmarks/_cost_model.py (SimulatedModelServer), ttft {args.latency:g} s, own process; "
        f"C={args.concurrency}; RayExecutor(actors={args.actors}, capacity={math.ceil(args.concurrency / args.actors)}); "
        f"warm-up {args.warmup} rollouts (floor, local, ray)\n"
    )

    model = ModelServer(args.latency)
    tracker = Tracker(model.proc.pid, args.sample_interval)
    rows: list[Row] = []
    try:
        for n in ns:
            for kind in kinds:
                for group in groups:
                    for ex in executors:
                        print(f"  {kind} g={group} {ex} N={n}: load {loadavg()} ...", file=sys.stderr, flush=True)
                        if ex == "eval":
                            row = eval_row(tracker, model, args, kind, group, n)
                        else:
                            row = worker_row(tracker, model, args, kind, group, ex, n)
                        rows.append(row)
                        print(
                            f"    wall {row.wall:.2f} s, {row.cpu_ms:.2f} CPU-ms/rollout, failed {row.failed}, "
                            f"command {row.cmd_wall:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        tracker.close()
        model.stop()

    floor = {(r.kind, r.group): r for r in rows if r.executor == "floor"}
    for n in ns:
        sub = [r for r in rows if r.n_requested == n]
        if len(ns) > 1:
            print(f"\n## N = {n}\n")
        print_main(sub, floor)
        print(
            "\nx ideal: wall / (ceil(N / C) x latency x model calls per rollout); CPU-ms/rollout: every process of "
            "the system (this row's tree, the model server, orphans) over the measured window (eval: the whole "
            "command, start-up and shutdown included); x floor: against the floor row of the same kind and g; "
            "peak MiB: resident memory of all of them, summed, sampled every "
            f"{args.sample_interval:g} s; model peak in flight: most concurrent requests at the model server; "
            "other cores: CPU of the rest of the machine during the row (above ~0.1: the machine was busy)."
        )
        print_breakdown(sub, floor)
        print_memory(sub)
        print_cold(sub)
        if args.scale:
            print_scale(sub)
        else:
            print_targets(sub)
    print(f"\nload average at end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
