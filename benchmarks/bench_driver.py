#!/usr/bin/env python
"""How fast does the driver turn rollouts into Parquet, and how close does a whole eval come to
the ideal for its model latency and concurrency?

1. Arrow + Parquet: T synthetic traces (a realistic tool-using rollout: 6 messages, 2 model
   calls with usage, 1 tool call record, rewards, metrics, timing), converted with
   ``records_to_table`` in batches of 1,000, written by a ``ShardWriter`` (10,000 rows per
   shard) into a temporary run directory, then read back with ``read_run`` (scalar columns,
   then all columns) and decoded with ``table_to_traces``. Traces/s per step, MB on disk, and
   this process's peak RSS during conversion + write (VmHWM, reset just before the step).
2. End to end: ``Driver`` over ``examples/arith.py`` tasks x 4 samples against the simulated
   model (``rollout-ray serve-model`` in a child process, ttft = latency), max_in_flight = C,
   on a ``RayExecutor(actors=2, capacity=C/2)`` created once (Ray started by this script, so
   its gcs / raylet / workers are descendants of it) and on a ``LocalExecutor`` (plain
   asyncio, no Ray). Shards go to a temporary run directory, as ``rollout-ray eval`` does.
   Per N: wall time (``Driver.arun``), the ideal ceil(N / C) x latency, the ratio, rollouts/s,
   CPU-ms per rollout of the whole process tree (/proc utime + stime of this process and every
   descendant, before vs after, split by process kind), failures, and the driver process's
   VmRSS sampled every 100 ms (peak and at the end).

    python benchmarks/bench_driver.py --quick    # 10,000 traces; N=100,300, C=64, latency 0.2 s
    python benchmarks/bench_driver.py            # 100,000 traces; N=500,2000, C=256, latency 1 s
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import math
import os
import platform
import random
import re
import resource
import shutil
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

# Loopback only: on Linux Ray binds its gcs, raylet and workers to the node's routable address
# unless this is off (then it uses 127.0.0.1). Set before ray is imported (read at import).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import msgspec
import pyarrow as pa
from _proc import PAGE, TICK, stat_fields  # benchmarks/ is the script's directory

from rollout_ray._record.arrow import (
    SCALAR_COLUMNS,
    RolloutRecord,
    records_to_table,
    table_to_traces,
)
from rollout_ray._record.messages import (
    AssistantMessage,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from rollout_ray._record.store import ShardWriter, read_run, shard_paths
from rollout_ray._record.trace import (
    AgentInfo,
    AgentSpan,
    MessageNode,
    ModelCall,
    Reward,
    RuntimeInfo,
    TimeSpan,
    TimeSplit,
    Timing,
    ToolCallRecord,
    Trace,
    TraceTask,
)

ROOT = Path(__file__).resolve().parent.parent
ARITH = ROOT / "examples" / "arith.py"
SAMPLES_PER_TASK = 4
MiB = 2**20


def raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table, columns padded so it also reads as plain text."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


# -- /proc: memory and CPU --------------------------------------------------------------------


def status_kib(field_name: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: ``5`` > clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def tree_cpu(roots: Iterable[int] | None = None) -> dict[int, float]:
    """{pid: CPU seconds} for this process (or ``roots``) and every descendant: utime + stime,
    plus cutime + cstime (the CPU of children that exited and were reaped inside the tree)."""
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None:
                children[int(fields[1])].append(int(entry))
                cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / TICK
    out: dict[int, float] = {}
    todo = [os.getpid()] if roots is None else list(roots)
    while todo:
        pid = todo.pop()
        if pid in cpu and pid not in out:
            out[pid] = cpu[pid]
            todo.extend(children.get(pid, ()))
    return out


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TICK


_KINDS = {}


def kind_of(pid: int) -> str:
    """What a process of the tree is: Ray's proctitle, the Ray binary or script, ..."""
    if pid == os.getpid():
        return "driver (this script)"
    if pid in _KINDS:
        return _KINDS[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):
        name = argv[0].split()[0].split(".")[0]
        kind = {"ray::_RolloutActorImpl": "ray::RolloutActor"}.get(name, name)
    elif "serve-model" in argv:
        kind = "simulated model (child)"
    else:
        scripts = [a for a in argv[1:4] if a.endswith(".py")]
        kind = os.path.basename(scripts[0] if scripts else argv[0])
        kind = {"default_worker.py": "ray worker (starting)"}.get(kind, kind)
    if kind not in ("ray worker (starting)", "ray::IDLE"):  # these become actors later
        _KINDS[pid] = kind
    return kind


def rss_by_kind(pids: Iterable[int]) -> dict[str, float]:
    """MiB resident (VmRSS) per process kind."""
    rss: dict[str, float] = defaultdict(float)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                rss[kind_of(pid)] += int(f.read().split()[1]) * PAGE / MiB
        except (OSError, IndexError, ValueError):
            pass
    return dict(rss)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class RssSampler:
    """VmRSS of this process every ``interval`` s in a thread: peak and last."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak = self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.last = status_kib("VmRSS") * 1024
            self.peak = max(self.peak, self.last)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- 1. Arrow + Parquet -----------------------------------------------------------------------

SYSTEM = (
    "You are a careful assistant that solves arithmetic problems. Use the calculator tool for "
    "every addition, multiplication or subtraction with more than one digit, then answer with "
    "the number only on the last line. Do not explain unless asked. If the tool fails, say so "
    "and retry once with the same arguments. Never invent a tool result."
)
CONTEXT = (
    "Context: the figures below come from a warehouse inventory report. Pallets are counted "
    "in whole units; partial pallets are rounded up before they are added. Two depots report "
    "separately each morning and the totals are reconciled at noon by the shift lead, who "
    "checks them against the delivery notes and the outgoing manifests of the previous day. "
    "A discrepancy of more than two pallets is escalated to the regional office."
)
REASONING = (
    "The question asks for the sum of the two depot counts. Both are three-digit numbers, so "
    "the instructions say to use the calculator rather than add them by hand."
)
CALC_TOOL = Tool(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


def template_trace() -> Trace:
    """One realistic closed trace: system + 2 user messages, a tool-calling assistant turn,
    the tool result and the final answer (6 messages, 2 sampled), 2 model calls with usage, 1
    tool call record, 2 rewards, 2 metrics, every timing span."""
    t = 1_750_000_000.0
    a, b = 237, 682
    nodes = [
        MessageNode(None, SystemMessage(SYSTEM), timestamp=t + 0.004),
        MessageNode(0, UserMessage(CONTEXT), timestamp=t + 0.004),
        MessageNode(1, UserMessage(f"Depot A has {a} pallets, depot B has {b}. Total?"), timestamp=t + 0.004),
        MessageNode(
            2,
            AssistantMessage(
                content=f"I'll add {a} and {b} with the calculator.",
                reasoning_content=REASONING,
                tool_calls=[ToolCall("call_0", "add", f'{{"a": {a}, "b": {b}}}')],
            ),
            sampled=True,
            timestamp=t + 1.012,
        ),
        MessageNode(3, ToolMessage("call_0", str(a + b), name="add"), timestamp=t + 1.016),
        MessageNode(
            4,
            AssistantMessage(content=f"The two depots hold {a + b} pallets.\n{a + b}"),
            sampled=True,
            timestamp=t + 2.021,
        ),
    ]
    calls = [
        ModelCall(
            node=3,
            model="simulated",
            endpoint="/chat/completions",
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=214, completion_tokens=61),
            time=TimeSpan(t + 0.006, t + 1.012),
        ),
        ModelCall(
            node=5,
            model="simulated",
            endpoint="/chat/completions",
            finish_reason="stop",
            usage=Usage(prompt_tokens=291, completion_tokens=14),
            time=TimeSpan(t + 1.017, t + 2.021),
        ),
    ]
    return Trace(
        id=uuid.uuid4().hex,
        task=TraceTask(
            type="Calc",
            key="0" * 64,
            hash="0" * 64,
            idx=0,
            data={"idx": 0, "name": None, "prompt": "", "system_prompt": SYSTEM, "timeout": None, "answer": a + b},
        ),
        agent=AgentInfo(
            harness="chat", model="simulated", runtime=RuntimeInfo(id="local-0", type="local", name="rt-0")
        ),
        tools=[CALC_TOOL],
        nodes=nodes,
        calls=calls,
        rewards={"correct": Reward(1.0), "format": Reward(1.0, 0.1)},
        metrics={"tool_calls": 1.0, "reply_chars": 37.0},
        is_completed=True,
        ok=True,
        stop_condition="agent_completed",
        timing=Timing(
            start=t,
            boot=TimeSpan(t + 0.0001, t + 0.0015),
            setup=TimeSpan(t + 0.0015, t + 0.004),
            agent=AgentSpan(t + 0.004, t + 2.023, model=TimeSplit(2.010), harness=TimeSplit(0.009)),
            finalize=TimeSpan(t + 2.023, t + 2.0231),
            scoring=TimeSpan(t + 2.0231, t + 2.024),
        ),
        tool_calls=[ToolCallRecord("calc", "add", f'{{"a":{a},"b":{b}}}', True, duration=0.0034)],
    )


def _vocabulary(size: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(size)]


def synthetic_records(n: int) -> list[RolloutRecord]:
    """``n`` records copied from the template: a new id, task, question, tool result, answer,
    reward and start time each, and ~45 words of model text drawn from a 2,000-word vocabulary
    (so the Parquet columns compress about as model text does, not as n identical copies)."""
    replace = msgspec.structs.replace
    tpl = template_trace()
    words = _vocabulary()
    rng = random.Random(1)
    run_id = uuid.uuid4().hex
    sys_node, ctx_node, q_node, call_node, tool_node, ans_node = tpl.nodes
    out = []
    for i in range(n):
        a, b = 100 + (i * 7919) % 900, 100 + (i * 104729) % 900
        digest = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).hexdigest()
        group, sample = divmod(i, SAMPLES_PER_TASK)
        correct = float(i % 5 != 0)
        trace = replace(
            tpl,
            id=uuid.uuid4().hex,
            task=replace(
                tpl.task, key=digest, hash=digest, idx=group, data={**tpl.task.data, "idx": group, "answer": a + b}
            ),
            nodes=[
                sys_node,
                ctx_node,
                replace(q_node, message=UserMessage(f"Depot A has {a} pallets, depot B has {b}. Total?")),
                replace(
                    call_node,
                    message=replace(
                        call_node.message,
                        content=f"I'll add {a} and {b} with the calculator.",
                        reasoning_content=" ".join(rng.choices(words, k=30)),
                        tool_calls=[ToolCall("call_0", "add", f'{{"a": {a}, "b": {b}}}')],
                    ),
                ),
                replace(tool_node, message=ToolMessage("call_0", str(a + b), name="add")),
                replace(
                    ans_node,
                    message=AssistantMessage(
                        content=" ".join(rng.choices(words, k=15))
                        + f"\nThe two depots hold {a + b + (correct == 0)} pallets.\n{a + b + (correct == 0)}"
                    ),
                ),
            ],
            rewards={"correct": Reward(correct), "format": Reward(1.0, 0.1)},
            timing=replace(tpl.timing, start=tpl.timing.start + i * 0.01),
            tool_calls=[replace(tpl.tool_calls[0], arguments=f'{{"a":{a},"b":{b}}}')],
        )
        out.append(RolloutRecord(trace, run_id, f"{group}-{digest[:16]}", sample))
    return out


def make_records(n: int) -> list[RolloutRecord]:
    """``n`` synthetic records, with a line describing their template and what making them cost."""
    gc.collect()
    rss0 = status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    records = synthetic_records(n)
    gen_s = time.perf_counter() - t0
    tpl = records[0].trace
    trace_bytes = len(msgspec.msgpack.encode(tpl))
    print(
        f"template trace: {len(tpl.nodes)} messages, {len(tpl.calls)} model calls, "
        f"{len(tpl.tool_calls)} tool call, {len(tpl.rewards)} rewards, {len(tpl.metrics)} metrics, "
        f"{trace_bytes:,} bytes as msgpack; {n:,} copies made in {gen_s:.2f} s "
        f"(RSS {rss0 / MiB:.0f} -> {status_kib('VmRSS') / 1024:.0f} MiB)\n"
    )
    return records


def convert_and_write(
    records: list[RolloutRecord], run_dir: str, batch: int, rows_per_shard: int
) -> tuple[list[list[Any]], int, bool]:
    """Convert and write ``records`` in batches, timed: the table rows, RSS at the start, whether VmHWM was reset."""
    n = len(records)
    gc.collect()
    base = status_kib("VmRSS") * 1024
    hwm_ok = reset_peak_rss()
    convert_s = write_s = 0.0
    arrow_bytes = 0
    with RssSampler(0.05) as sampler:
        writer = ShardWriter(run_dir, rows_per_shard=rows_per_shard)
        for start in range(0, n, batch):
            t0 = time.perf_counter()
            tbl = records_to_table(records[start : start + batch])
            t1 = time.perf_counter()
            writer.write(tbl)
            t2 = time.perf_counter()
            convert_s += t1 - t0
            write_s += t2 - t1
            arrow_bytes += tbl.nbytes
            del tbl
        t0 = time.perf_counter()
        writer.close()
        write_s += time.perf_counter() - t0
    peak = status_kib("VmHWM") * 1024 if hwm_ok else sampler.peak
    stats = writer.statistics()
    disk = sum(p.stat().st_size for p in shard_paths(run_dir))
    assert stats.rows == n, stats
    step_mem = f"{peak / MiB:.0f} (+{(peak - base) / MiB:.0f})"
    rows = [
        [
            "records_to_table (batches of 1,000)",
            f"{convert_s:.2f}",
            f"{n / convert_s:,.0f}",
            f"{arrow_bytes / MiB:.0f} MiB Arrow",
            "",
        ],
        [
            f"ShardWriter.write+close ({stats.shards} shards, fsync)",
            f"{write_s:.2f}",
            f"{n / write_s:,.0f}",
            f"{disk / MiB:.1f} MiB on disk",
            "",
        ],
        [
            "convert + write",
            f"{convert_s + write_s:.2f}",
            f"{n / (convert_s + write_s):,.0f}",
            f"{disk / n:,.0f} B/trace on disk",
            step_mem,
        ],
    ]
    return rows, base, hwm_ok


def read_back(run_dir: str, n: int) -> list[list[Any]]:
    """Read the run back (scalar columns, then all) and decode its traces, timing each step."""
    rows: list[list[Any]] = []
    t0 = time.perf_counter()
    scalars = read_run(run_dir, columns=SCALAR_COLUMNS)
    s = time.perf_counter() - t0
    assert scalars.num_rows == n
    rows.append(
        [
            f"read_run scalar columns ({len(SCALAR_COLUMNS)})",
            f"{s:.2f}",
            f"{n / s:,.0f}",
            f"{scalars.nbytes / MiB:.0f} MiB Arrow",
            "",
        ]
    )
    del scalars
    t0 = time.perf_counter()
    whole = read_run(run_dir)
    s = time.perf_counter() - t0
    rows.append(
        [
            f"read_run all columns ({whole.num_columns})",
            f"{s:.2f}",
            f"{n / s:,.0f}",
            f"{whole.nbytes / MiB:.0f} MiB Arrow",
            "",
        ]
    )
    t0 = time.perf_counter()
    traces = table_to_traces(whole)
    s = time.perf_counter() - t0
    assert len(traces) == n and traces[0].num_turns == 2
    rows.append(["table_to_traces (decode the trace column)", f"{s:.2f}", f"{n / s:,.0f}", "", ""])
    del traces, whole
    return rows


def bench_arrow(n: int, batch: int = 1000, rows_per_shard: int = 10_000) -> None:
    print(
        f"\n## 1. Arrow + Parquet: {n:,} traces, records_to_table in batches of {batch:,}, "
        f"ShardWriter rows_per_shard={rows_per_shard:,}\n"
    )
    records = make_records(n)
    run_dir = tempfile.mkdtemp(prefix="bench_driver_arrow_")
    try:
        rows, base, hwm_ok = convert_and_write(records, run_dir, batch, rows_per_shard)
        del records
        gc.collect()
        rows += read_back(run_dir, n)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(table(["step", "seconds", "traces/s", "size", "peak RSS MiB (+ over start)"], rows))
    print(
        f"\npeak RSS = this process's VmHWM during conversion + write ({'reset just before it' if hwm_ok else 'sampled every 50 ms'}); "
        f"at its start the process held {base / MiB:.0f} MiB, the {n:,} synthetic records included."
    )


# -- 2. End to end ----------------------------------------------------------------------------


@dataclass
class Row:
    executor: str
    n: int
    concurrency: int
    latency: float
    wall: float = 0.0
    cpu_s: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)
    by_pid: dict[int, float] = field(default_factory=dict)
    """CPU seconds per process of the tree during the row."""
    others_cores: float = 0.0
    idle_cores: float = 0.0
    failed: int = 0
    done: int = 0
    correct: float = 0.0
    rss_start: int = 0
    rss_stored: int = 0
    """Driver VmRSS when the last rollout was stored (before ``arun`` reads the run back)."""
    rss_peak: int = 0
    rss_end: int = 0
    spans: dict[str, float] = field(default_factory=dict)
    rss_by_kind: dict[str, float] = field(default_factory=dict)
    """MiB resident per process kind of the tree at the end of the row."""

    @property
    def ideal(self) -> float:
        return math.ceil(self.n / self.concurrency) * self.latency


def start_model(latency: float) -> tuple[subprocess.Popen[str], str]:
    """``rollout-ray serve-model`` on 127.0.0.1, a free port, ttft = latency (a child process,
    standing in for the inference server; its CPU is shown on its own line)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "serve-model",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ttft",
            str(latency),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"serving at (\S+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"simulated model did not start: {line!r}")
    return proc, match.group(1)


async def measure(
    label: str,
    executor: Any,
    module: Any,
    model: Any,
    n: int,
    concurrency: int,
    latency: float,
    idle_probe: float = 1.0,
    roots: Callable[[], Iterable[int]] | None = None,
) -> Row:
    """One Driver run. ``roots``: the processes whose trees are measured (default: this one)."""
    from rollout_ray import Driver, EvalConfig

    def cpu_now() -> dict[int, float]:
        return tree_cpu(None if roots is None else roots())

    row = Row(label, n, concurrency, latency)
    tasks = module.tasks(math.ceil(n / SAMPLES_PER_TASK))
    config = EvalConfig(samples_per_task=SAMPLES_PER_TASK, max_in_flight=concurrency)
    run_dir = tempfile.mkdtemp(prefix="bench_driver_run_")
    gc.collect()
    # Background CPU of the tree while nothing runs (Ray's gcs, raylet, idle workers).
    if idle_probe > 0:
        c0 = cpu_now()
        await asyncio.sleep(idle_probe)
        row.idle_cores = (sum(cpu_now().values()) - sum(c0.values())) / idle_probe
    try:

        def on_progress(progress: Any) -> None:
            # Called at most every 0.5 s, and once more when the last rollout is stored.
            row.rss_stored = status_kib("VmRSS") * 1024

        driver = Driver(
            tasks,
            module.harness(),
            model,
            executor=executor,
            config=config,
            run_dir=os.path.join(run_dir, "run"),
            on_progress=on_progress,
        )
        row.rss_start = status_kib("VmRSS") * 1024
        with RssSampler(0.1) as sampler:
            before, busy0 = cpu_now(), machine_busy()
            t0 = time.perf_counter()
            result = await driver.arun()
            row.wall = time.perf_counter() - t0
            after, busy1 = cpu_now(), machine_busy()
            row.rss_end = status_kib("VmRSS") * 1024
        row.rss_peak = max(sampler.peak, row.rss_end)
        samples = result.samples  # read from the run directory when asked for: before it goes
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    by_kind: dict[str, float] = defaultdict(float)
    for pid, cpu in after.items():
        by_kind[kind_of(pid)] += cpu - before.get(pid, 0.0)
    row.by_kind = dict(by_kind)
    row.by_pid = {pid: cpu - before.get(pid, 0.0) for pid, cpu in after.items()}
    row.rss_by_kind = rss_by_kind(after)
    row.cpu_s = sum(by_kind.values())
    row.others_cores = max(0.0, (busy1 - busy0) - row.cpu_s) / row.wall
    row.failed, row.done = driver.progress.failed, driver.progress.done
    if samples.num_rows:
        row.correct = sum(samples.column("reward").to_pylist()) / samples.num_rows
        for name in ("boot_s", "setup_s", "agent_s", "agent_model_s", "agent_harness_s", "finalize_s", "scoring_s"):
            values = samples.column(name).to_pylist()
            row.spans[name] = sum(values) / len(values)
    if result.status != "completed":
        print(f"  !! {label} N={n}: run {result.status}: {result.reason}", file=sys.stderr)
    return row


def stop_model(proc: subprocess.Popen[str]) -> None:
    """End the simulated model's process: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def load_arith(by_reference: bool) -> Any:
    """examples/arith.py, importable by Ray's workers (``by_reference``) or registered to pickle by value."""
    import ray

    from rollout_ray._cli.taskset_loader import import_taskset

    if by_reference:
        # The taskset importable everywhere (as an installed package would be): its classes are
        # pickled by reference. Ray's processes inherit PYTHONPATH from this one.
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ARITH.parent), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(ARITH.parent))
        import importlib

        return importlib.import_module(ARITH.stem)
    module = import_taskset(str(ARITH))
    ray.cloudpickle.register_pickle_by_value(module)  # as rollout-ray eval does
    return module


async def run_ray_rows(
    label: str, ns: list[int], concurrency: int, latency: float, actors: int, capacity: int, module: Any, model: Any
) -> tuple[list[Row], list[list[Any]]]:
    """Start Ray and one RayExecutor, warm it up, run a row per N, stop both: the rows and the startup times."""
    import ray

    from rollout_ray._ray.ray_executor import RayExecutor

    rows: list[Row] = []
    startup: list[list[Any]] = []
    # Ray started here (so its processes are our descendants), executor made once.
    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    startup.append(["ray.init (local cluster)", f"{time.perf_counter() - t0:.2f}"])
    executor = RayExecutor(actors=actors, capacity=capacity)
    t0 = time.perf_counter()
    await executor.start()
    warm = await measure("ray warm-up", executor, module, model, concurrency, concurrency, latency, 0.0)
    startup.append(
        [
            f"RayExecutor.start + warm-up run of {concurrency} rollouts (actors created)",
            f"{time.perf_counter() - t0:.2f}",
        ]
    )
    if warm.failed:
        print(f"  !! warm-up: {warm.failed} failed", file=sys.stderr)
    pids = await asyncio.gather(*(a.actor.pid.remote() for a in executor._pool if a is not None))
    print(f"driver pid {os.getpid()}, rollout actor pids {pids}", file=sys.stderr)
    try:
        for n in ns:
            rows.append(await measure(label, executor, module, model, n, concurrency, latency))
            print(f"  {label} N={n}: {rows[-1].wall:.2f} s", file=sys.stderr)
    finally:
        t0 = time.perf_counter()
        await executor.stop()
        ray.shutdown()
        startup.append(["RayExecutor.stop + ray.shutdown", f"{time.perf_counter() - t0:.2f}"])
    return rows, startup


async def run_local_rows(url: str, ns: list[int], concurrency: int, latency: float, module: Any) -> list[Row]:
    """The same driver on a LocalExecutor (plain asyncio, no Ray): a warm-up, then a row per N."""
    from rollout_ray import LocalExecutor, OpenAIModel

    rows: list[Row] = []
    local_model = OpenAIModel(url, name="simulated")
    async with LocalExecutor() as local:
        await measure("local warm-up", local, module, local_model, concurrency, concurrency, latency, 0.0)
        for n in ns:
            rows.append(await measure("local", local, module, local_model, n, concurrency, latency))
            print(f"  local N={n}: {rows[-1].wall:.2f} s", file=sys.stderr)
    await local_model.aclose()
    return rows


def print_e2e_rows(rows: list[Row]) -> None:
    """The end-to-end table, a row per executor and N, and what its RSS and cores columns mean."""
    print(
        table(
            [
                "executor",
                "N",
                "C",
                "latency s",
                "wall s",
                "ideal s",
                "ratio",
                "rollouts/s",
                "ideal/s",
                "CPU-ms/rollout",
                "failed",
                "reward",
                "driver RSS MiB start/stored/peak/end",
                "bg cores",
                "other cores",
            ],
            [
                [
                    r.executor,
                    r.n,
                    r.concurrency,
                    f"{r.latency:g}",
                    f"{r.wall:.2f}",
                    f"{r.ideal:.2f}",
                    f"{r.wall / r.ideal:.2f}x",
                    f"{r.n / r.wall:.0f}",
                    f"{r.n / r.ideal:.0f}",
                    f"{r.cpu_s * 1000 / r.n:.1f}",
                    r.failed,
                    f"{r.correct:.2f}",
                    f"{r.rss_start / MiB:.0f} / {r.rss_stored / MiB:.0f} / {r.rss_peak / MiB:.0f} / {r.rss_end / MiB:.0f}",
                    f"{r.idle_cores:.2f}",
                    f"{r.others_cores:.2f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        "\ndriver RSS: VmRSS of this process (sampled every 100 ms) at the row's start, when its last rollout "
        "was stored, its peak, and at the end of Driver.arun (which then reads the whole run back and "
        "finalizes it)."
    )
    print(
        "bg cores: CPU of the tree while idle, just before the row (Ray's own background); "
        "other cores: CPU used by processes outside the tree during the row (other work on the machine)."
    )


def print_e2e_breakdowns(rows: list[Row]) -> None:
    """Per row: CPU per rollout by process kind, mean timing spans, resident memory by process kind."""
    kinds = sorted({k for r in rows for k in r.by_kind}, key=lambda k: -max(r.by_kind.get(k, 0) / r.n for r in rows))
    print("\nCPU-ms per rollout by process kind (the tree: this script, its simulated-model child, Ray):\n")
    print(
        table(
            ["process"] + [f"{r.executor} N={r.n}" for r in rows],
            [[k] + [f"{r.by_kind.get(k, 0.0) * 1000 / r.n:.2f}" for r in rows] for k in kinds]
            + [["total"] + [f"{r.cpu_s * 1000 / r.n:.1f}" for r in rows]],
        )
    )

    names = ("boot_s", "setup_s", "agent_s", "agent_model_s", "agent_harness_s", "finalize_s", "scoring_s")
    print("\nMean seconds per rollout, from the traces' timing spans (agent = model + harness):\n")
    print(
        table(
            ["executor", "N"] + [n.removesuffix("_s") for n in names],
            [[r.executor, r.n] + [f"{r.spans.get(n, 0.0):.3f}" for n in names] for r in rows],
        )
    )
    kinds = [
        k
        for k in sorted(
            {k for r in rows for k in r.rss_by_kind}, key=lambda k: -max(r.rss_by_kind.get(k, 0) for r in rows)
        )
        if max(r.rss_by_kind.get(k, 0) for r in rows) >= 1
    ]
    print("\nResident memory (MiB) by process kind at the end of each row (Ray actors live across rows):\n")
    print(
        table(
            ["process"] + [f"{r.executor} N={r.n}" for r in rows],
            [[k] + [f"{r.rss_by_kind.get(k, 0.0):.0f}" for r in rows] for k in kinds],
        )
    )


async def bench_e2e(
    ns: list[int], concurrency: int, latency: float, actors: int, skip_local: bool, by_reference: bool
) -> None:
    from rollout_ray import OpenAIModel

    capacity = math.ceil(concurrency / actors)
    print(
        f"\n## 2. End to end: examples/arith.py tasks x {SAMPLES_PER_TASK} samples, simulated model "
        f"ttft={latency:g} s, max_in_flight C={concurrency}, RayExecutor(actors={actors}, "
        f"capacity={capacity})\n"
    )
    module = load_arith(by_reference)
    ray_label = "ray (by ref)" if by_reference else "ray"
    proc, url = start_model(latency)
    try:
        model = OpenAIModel(url, name="simulated")
        rows, startup = await run_ray_rows(ray_label, ns, concurrency, latency, actors, capacity, module, model)
        if not skip_local:
            rows += await run_local_rows(url, ns, concurrency, latency, module)
    finally:
        stop_model(proc)

    print_e2e_rows(rows)
    print_e2e_breakdowns(rows)
    print("\nstartup (not in any wall time above):\n")
    print(table(["step", "seconds"], startup))


# -- main -------------------------------------------------------------------------------------


def source_version() -> str:
    """The git commit measured, and whether rollout_ray/ differs from it."""
    try:

        def run(*a: str) -> str:
            return subprocess.run(
                ["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True
            ).stdout.strip()

        dirty = run("status", "--porcelain", "--", "rollout_ray")
        return f"commit {run('rev-parse', '--short', 'HEAD')}" + (
            f", {len(dirty.splitlines())} file(s) under rollout_ray/ differ from it" if dirty else ", clean"
        )
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", default="500,2000", help="rollouts per end-to-end row (comma list)")
    p.add_argument("--concurrency", type=int, default=256, help="max_in_flight C (RayExecutor capacity C/actors)")
    p.add_argument("--latency", type=float, default=1.0, help="simulated model ttft, seconds")
    p.add_argument("--actors", type=int, default=2, help="rollout actors")
    p.add_argument("--traces", type=int, default=100_000, help="synthetic traces for the Arrow step")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--skip-arrow", action="store_true")
    p.add_argument("--skip-local", action="store_true", help="no LocalExecutor rows")
    p.add_argument(
        "--taskset-by-reference",
        action="store_true",
        help="make examples/ importable by Ray's workers, so task classes are pickled by "
        "reference instead of by value (rollout-ray eval pickles a taskset file by value)",
    )
    p.add_argument("--quick", action="store_true", help="traces 10,000; n 100,300; concurrency 64; latency 0.2")
    args = p.parse_args(argv)
    if args.quick:
        args.traces, args.n, args.concurrency, args.latency = 10_000, "100,300", 64, 0.2
    ns = [int(x) for x in args.n.split(",") if x.strip()]

    nofile = raise_nofile()
    import ray

    print(f"# bench_driver.py {' '.join(sys.argv[1:])}")
    print(f"rollout_ray: {source_version()}")
    print(
        f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * PAGE / 2**30:.1f} GiB; "
        f"Python {platform.python_version()}, Ray {ray.__version__}, pyarrow {pa.__version__}, "
        f"msgspec {msgspec.__version__}; RLIMIT_NOFILE {nofile[0]}; "
        f"load average at start {loadavg()}"
    )
    # End to end first, so the driver's memory is not inflated by the Arrow step's heap.
    if not args.skip_e2e:
        asyncio.run(
            bench_e2e(ns, args.concurrency, args.latency, args.actors, args.skip_local, args.taskset_by_reference)
        )
    if not args.skip_arrow:
        bench_arrow(args.traces)
    print(f"\nload average at end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
