#!/usr/bin/env python
"""How fast does ``rollout-ray view`` open a large run, and page, filter, sort and open rollouts,
and how much memory does it hold?

A synthetic run directory of N rollouts (a tool-using trace like ``bench_driver``'s template:
system, user, a tool-calling turn, the tool's result and an answer; 1 in 7 failed with an error
and a traceback; 10,000 rows per shard, stored as the driver stores them, with the task's data
as ``data_<field>`` columns) is served by the real ``rollout-ray view`` command in a process of
its own on a free loopback port and queried over HTTP by an aiohttp client, in the order a user
clicks: open the run (``/api/run``: builds the scalar index) and its first page, then filters,
sorts, a deep page, one rollout (its trace read from its shard), its group and the plot. Each
step is timed cold (first request) and warm (the same request again), with the viewer's
resident memory after it and the response's size. The OS page cache is warm: the run was
just written.

    python benchmarks/bench_viewer.py                       # N = 100,000, 2 kB of text each
    python benchmarks/bench_viewer.py --text-bytes 20000    # long conversations
    python benchmarks/bench_viewer.py --rows 240 --prompt-bytes 262144 --text-bytes 0  # 256 KiB prompts
    python benchmarks/bench_viewer.py --rows 1000 --text-bytes 524288  # 0.5 MiB traces, one row group
    python benchmarks/bench_viewer.py --rows 10000 --keep /tmp/run10k
    PYTHONPATH=../other-checkout python benchmarks/bench_viewer.py ...  # measure another version
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import pyarrow as pa

import rollout_ray
from rollout_ray._driver.run_dir import with_filter_columns
from rollout_ray._errors import ToolsetError
from rollout_ray._record.arrow import RolloutRecord, records_to_table
from rollout_ray._record.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, Usage, UserMessage
from rollout_ray._record.store import Manifest, ShardWriter, write_manifest
from rollout_ray._record.trace import (
    AgentInfo,
    AgentSpan,
    ErrorRecord,
    MessageNode,
    ModelCall,
    Reward,
    TimeSpan,
    TimeSplit,
    Timing,
    ToolCallRecord,
    Trace,
    TraceTask,
)

SAMPLES = 4
T0 = 1_750_000_000.0


def _error() -> ErrorRecord:
    try:
        raise ToolsetError("tool 'add' crashed")
    except ToolsetError as exc:
        return ErrorRecord.from_exception(exc)


def template() -> Trace:
    nodes = [
        MessageNode(None, SystemMessage("You add numbers with the calculator."), timestamp=T0 + 0.004),
        MessageNode(0, UserMessage("Depot A has 237 pallets, depot B has 682. Total?"), timestamp=T0 + 0.004),
        MessageNode(
            1,
            AssistantMessage(
                content="I'll add 237 and 682 with the calculator.",
                tool_calls=[ToolCall("call_0", "add", '{"a": 237, "b": 682}')],
            ),
            sampled=True,
            timestamp=T0 + 1.0,
        ),
        MessageNode(2, ToolMessage("call_0", "919", name="add"), timestamp=T0 + 1.01),
        MessageNode(
            3, AssistantMessage(content="The two depots hold 919 pallets.\n919"), sampled=True, timestamp=T0 + 2.0
        ),
    ]
    calls = [
        ModelCall(
            node=2,
            model="simulated",
            finish_reason="tool_calls",
            usage=Usage(214, 61),
            time=TimeSpan(T0 + 0.006, T0 + 1.0),
        ),
        ModelCall(
            node=4, model="simulated", finish_reason="stop", usage=Usage(291, 14), time=TimeSpan(T0 + 1.01, T0 + 2.0)
        ),
    ]
    return Trace(
        task=TraceTask(type="Calc", key="0" * 64, hash="0" * 64, idx=0, data={"answer": 919}),
        agent=AgentInfo(harness="chat", model="simulated"),
        nodes=nodes,
        calls=calls,
        rewards={"correct": Reward(1.0), "format": Reward(1.0, 0.1)},
        metrics={"tool_calls": 1.0},
        is_completed=True,
        ok=True,
        stop_condition="agent_completed",
        timing=Timing(
            start=T0,
            boot=TimeSpan(T0, T0 + 0.002),
            setup=TimeSpan(T0 + 0.002, T0 + 0.004),
            agent=AgentSpan(T0 + 0.004, T0 + 2.0, model=TimeSplit(1.98), harness=TimeSplit(0.016)),
            finalize=TimeSpan(T0 + 2.0, T0 + 2.001),
            scoring=TimeSpan(T0 + 2.001, T0 + 2.002),
        ),
        tool_calls=[ToolCallRecord("calc", "add", '{"a":237,"b":682}', True, duration=0.003)],
    )


def _words(rng: random.Random, vocabulary: list[str], n_bytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_bytes:
        words.append(rng.choice(vocabulary))
        size += len(words[-1]) + 1
    return " ".join(words)


def synthetic_run(run_dir: Path, n: int, text_bytes: int, prompt_bytes: int = 0) -> None:
    """Write ``n`` rollouts: groups of 4, 1 in 7 failed, rewards varied, 10,000 rows a shard.

    Each rollout's reasoning and answer hold ``text_bytes`` of random words, so the shards
    compress like real conversations rather than like copies of one template. With
    ``prompt_bytes``, each task (group) has a prompt of that many bytes of random words, in
    its data (so in the ``data_prompt`` column) and as the user's message.
    """
    tpl, error, rng = template(), _error(), random.Random(0)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(2000)]
    replace = msgspec.structs.replace
    turn, answer = tpl.nodes[2], tpl.nodes[4]
    write_manifest(run_dir, Manifest(run_id="bench-viewer", config={"taskset": "synthetic", "model": "simulated"}))
    with ShardWriter(run_dir, rows_per_shard=10_000) as writer:
        for start in range(0, n, 5_000):
            records = []
            prompt = ""
            for i in range(start, min(n, start + 5_000)):
                group, broken = i // SAMPLES, i % 7 == 3
                if prompt_bytes and (i % SAMPLES == 0 or not prompt):
                    prompt = _words(rng, vocabulary, prompt_bytes)
                data = {**tpl.task.data, "prompt": prompt} if prompt_bytes else tpl.task.data
                question = replace(tpl.nodes[1], message=UserMessage(prompt)) if prompt_bytes else tpl.nodes[1]
                trace = replace(
                    tpl,
                    id=hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).hexdigest(),
                    task=replace(tpl.task, type=("Calc", "Arith", "Depot")[group % 3], idx=group, data=data),
                    nodes=[
                        tpl.nodes[0],
                        question,
                        replace(
                            turn,
                            message=replace(turn.message, reasoning_content=_words(rng, vocabulary, text_bytes // 2)),
                        ),
                        tpl.nodes[3],
                        replace(
                            answer, message=AssistantMessage(content=_words(rng, vocabulary, text_bytes // 2) + "\n919")
                        ),
                    ],
                    rewards={} if broken else {"correct": Reward(float(i % 3 != 0)), "format": Reward(1.0, 0.1)},
                    ok=not broken,
                    stop_condition="error" if broken else "agent_completed",
                    errors=[error] if broken else [],
                    timing=replace(tpl.timing, start=T0 + i * 0.01),
                )
                records.append(RolloutRecord(trace, "bench-viewer", f"g{group:06d}", i % SAMPLES))
            writer.write(with_filter_columns(records_to_table(records), {}))


STEPS = [
    ("open: run overview (builds the index)", "api/run", {}),
    ("first page (50 rows)", "api/rollouts", {"limit": "50"}),
    ("filter ok=false", "api/rollouts", {"ok": "false", "limit": "50"}),
    (
        "filter error + task + reward range",
        "api/rollouts",
        {"error": "ToolsetError", "task": "calc", "reward_min": "0", "reward_max": "0.5", "limit": "50"},
    ),
    ("sort by reward desc", "api/rollouts", {"sort": "reward", "order": "desc", "limit": "50"}),
    (
        "sort + filter, page 100",
        "api/rollouts",
        {"sort": "agent_s", "order": "desc", "ok": "true", "offset": "5000", "limit": "50"},
    ),
    ("one rollout (trace from its shard)", "api/rollout", {"id": "{last}"}),
    ("its group (advantages by finalize)", "api/siblings", {"id": "{last}"}),
    ("runs list (shard footers)", "api/runs", {}),
    ("plot (matplotlib, all rows)", "api/plot.png", {}),
]


def status_mib(pid: int, field: str) -> float:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


Row = tuple[str, float, float, str, int, float, float]
"""(step, cold s, warm s, result, response bytes, viewer RSS MiB after it, its peak RSS so far)."""


def serve(run_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """``rollout-ray view RUN_DIR`` in a process of its own; its page's URL."""
    # The viewer imports the rollout_ray this script imported (the current directory, first on
    # a ``-m`` process's path, could hold another checkout).
    package = str(Path(rollout_ray.__file__).parents[1])
    path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray", "view", str(run_dir.resolve()), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=run_dir.parent,
        env={**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " at http" not in line:
        proc.kill()
        raise SystemExit(f"the viewer did not start: {line!r}")
    return proc, line.split(" at ", 1)[1].split()[0]


async def measure(run_dir: Path, url: str, pid: int) -> list[Row]:
    out = []
    async with aiohttp.ClientSession() as session:
        last: str | None = None
        for label, path, params in STEPS:
            query = {"run": run_dir.name, **{k: (last or "") if v == "{last}" else v for k, v in params.items()}}
            times, note = [], ""
            for _ in range(2):
                t = time.perf_counter()
                async with session.get(url + path, params=query) as response:
                    body = await response.read()
                    assert response.status == 200, body[:300]
                times.append(time.perf_counter() - t)
            if path == "api/rollouts":
                page = msgspec.json.decode(body)
                note = f"{page['matched']:,} match"
                last = page["rows"][-1]["rollout_id"] if page["rows"] else last
            elif path == "api/run":
                note = f"{msgspec.json.decode(body)['rollouts']:,} rollouts"
            out.append((label, times[0], times[1], note, len(body), status_mib(pid, "VmRSS"), status_mib(pid, "VmHWM")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="rollouts in the synthetic run (default 100,000)")
    p.add_argument(
        "--text-bytes",
        type=int,
        default=2_000,
        help="random text per rollout, in its reasoning and answer (default 2,000)",
    )
    p.add_argument(
        "--prompt-bytes",
        type=int,
        default=0,
        help="a prompt of this many bytes per task, in its data and user message (default none)",
    )
    p.add_argument("--keep", type=Path, help="write the run here and keep it (reused if it exists)")
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-viewer-"))
    run_dir = args.keep or base / "run"
    try:
        if not (run_dir / "manifest.json").exists():
            t = time.perf_counter()
            synthetic_run(run_dir, args.rows, args.text_bytes, args.prompt_bytes)
            size = sum(f.stat().st_size for f in (run_dir / "shards").iterdir())
            print(
                f"wrote {args.rows:,} rollouts in {time.perf_counter() - t:.1f} s: {size / 2**20:.0f} MiB of "
                f"Parquet in {len(list((run_dir / 'shards').iterdir()))} shards"
            )
        proc, url = serve(run_dir)
        try:
            started = status_mib(proc.pid, "VmRSS")
            rows = asyncio.run(measure(run_dir, url, proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            assert proc.stdout is not None
            proc.stdout.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    prompts = f", a {args.prompt_bytes:,}-byte prompt per task" if args.prompt_bytes else ""
    print(
        f"\nViewer over {args.rows:,} rollouts ({args.text_bytes:,} bytes of text each{prompts}); "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, pyarrow {pa.__version__}"
    )
    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  {'cold s':>7}  {'warm s':>7}  {'bytes':>11}  {'RSS MiB':>7}  {'peak':>5}  result")
    print(f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 11}  {'-' * 7}  {'-' * 5}  {'-' * 20}")
    for label, cold, warm, note, size, rss, peak in rows:
        print(f"{label:<{width}}  {cold:7.3f}  {warm:7.3f}  {size:11,}  {rss:7.0f}  {peak:5.0f}  {note}")
    opened = rows[0][1] + rows[1][1]
    print(f"\nopen + first page: {opened:.2f} s (target < 2 s)")
    print(
        f"viewer RSS (MiB): {started:.0f} started, {rows[1][5]:.0f} after the first page, "
        f"{max(r[5] for r in rows[:-1]):.0f} at most before the plot, peak {rows[-2][6]:.0f} before the plot"
    )
    print(f"first page: {rows[1][4]:,} bytes")
    at = next(i for i, r in enumerate(rows) if r[0].startswith("one rollout"))
    print(
        f"opening one rollout: RSS {rows[at - 1][5]:.0f} -> {rows[at][5]:.0f} MiB "
        f"({rows[at][5] - rows[at - 1][5]:+.0f}), peak {rows[at - 1][6]:.0f} -> {rows[at][6]:.0f} MiB "
        f"({rows[at][6] - rows[at - 1][6]:+.0f}) for a {rows[at][4]:,}-byte answer"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
