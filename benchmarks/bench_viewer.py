#!/usr/bin/env python
"""How fast does ``rollout-ray view`` open a large run, and page, filter, sort and open rollouts?

A synthetic run directory of N rollouts (a tool-using trace like ``bench_driver``'s template:
system, user, a tool-calling turn, the tool's result and an answer; 1 in 7 failed with an error
and a traceback; 10,000 rows per shard, as the driver writes) is served by the viewer's real
aiohttp server on a free loopback port and queried over HTTP by an aiohttp client, in the
order a user clicks: open the run (``/api/run``: builds the scalar index) and its first page,
then filters, sorts, a deep page, one rollout (its trace read from its shard), its group and
the plot. Each step is timed cold (first request) and warm (the same request again). The OS
page cache is warm: the run was just written.

    python benchmarks/bench_viewer.py                       # N = 100,000, 2 kB of text each
    python benchmarks/bench_viewer.py --text-bytes 20000    # long conversations
    python benchmarks/bench_viewer.py --rows 10000 --keep /tmp/run10k
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
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import pyarrow as pa

from rollout_ray._cli.summary import plot
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
from rollout_ray._viewer.server import Viewer, start

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
        MessageNode(1, AssistantMessage(content="I'll add 237 and 682 with the calculator.",
                                        tool_calls=[ToolCall("call_0", "add", '{"a": 237, "b": 682}')]),
                    sampled=True, timestamp=T0 + 1.0),
        MessageNode(2, ToolMessage("call_0", "919", name="add"), timestamp=T0 + 1.01),
        MessageNode(3, AssistantMessage(content="The two depots hold 919 pallets.\n919"), sampled=True,
                    timestamp=T0 + 2.0),
    ]
    calls = [ModelCall(node=2, model="simulated", finish_reason="tool_calls", usage=Usage(214, 61),
                       time=TimeSpan(T0 + 0.006, T0 + 1.0)),
             ModelCall(node=4, model="simulated", finish_reason="stop", usage=Usage(291, 14),
                       time=TimeSpan(T0 + 1.01, T0 + 2.0))]
    return Trace(
        task=TraceTask(type="Calc", key="0" * 64, hash="0" * 64, idx=0, data={"answer": 919}),
        agent=AgentInfo(harness="chat", model="simulated"), nodes=nodes, calls=calls,
        rewards={"correct": Reward(1.0), "format": Reward(1.0, 0.1)}, metrics={"tool_calls": 1.0},
        is_completed=True, ok=True, stop_condition="agent_completed",
        timing=Timing(start=T0, boot=TimeSpan(T0, T0 + 0.002), setup=TimeSpan(T0 + 0.002, T0 + 0.004),
                      agent=AgentSpan(T0 + 0.004, T0 + 2.0, model=TimeSplit(1.98), harness=TimeSplit(0.016)),
                      finalize=TimeSpan(T0 + 2.0, T0 + 2.001), scoring=TimeSpan(T0 + 2.001, T0 + 2.002)),
        tool_calls=[ToolCallRecord("calc", "add", '{"a":237,"b":682}', True, duration=0.003)],
    )


def _words(rng: random.Random, vocabulary: list[str], n_bytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_bytes:
        words.append(rng.choice(vocabulary))
        size += len(words[-1]) + 1
    return " ".join(words)


def synthetic_run(run_dir: Path, n: int, text_bytes: int) -> None:
    """Write ``n`` rollouts: groups of 4, 1 in 7 failed, rewards varied, 10,000 rows a shard.

    Each rollout's reasoning and answer hold ``text_bytes`` of random words, so the shards
    compress like real conversations rather than like copies of one template.
    """
    tpl, error, rng = template(), _error(), random.Random(0)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(2000)]
    replace = msgspec.structs.replace
    turn, answer = tpl.nodes[2], tpl.nodes[4]
    write_manifest(run_dir, Manifest(run_id="bench-viewer", config={"taskset": "synthetic", "model": "simulated"}))
    with ShardWriter(run_dir, rows_per_shard=10_000) as writer:
        for start in range(0, n, 5_000):
            records = []
            for i in range(start, min(n, start + 5_000)):
                group, broken = i // SAMPLES, i % 7 == 3
                trace = replace(
                    tpl, id=hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).hexdigest(),
                    task=replace(tpl.task, type=("Calc", "Arith", "Depot")[group % 3], idx=group),
                    nodes=[*tpl.nodes[:2],
                           replace(turn, message=replace(turn.message, reasoning_content=_words(
                               rng, vocabulary, text_bytes // 2))), tpl.nodes[3],
                           replace(answer, message=AssistantMessage(
                               content=_words(rng, vocabulary, text_bytes // 2) + "\n919"))],
                    rewards={} if broken else {"correct": Reward(float(i % 3 != 0)), "format": Reward(1.0, 0.1)},
                    ok=not broken, stop_condition="error" if broken else "agent_completed",
                    errors=[error] if broken else [], timing=replace(tpl.timing, start=T0 + i * 0.01))
                records.append(RolloutRecord(trace, "bench-viewer", f"g{group:06d}", i % SAMPLES))
            writer.write(records_to_table(records))


STEPS = [
    ("open: run overview (builds the index)", "api/run", {}),
    ("first page (50 rows)", "api/rollouts", {"limit": "50"}),
    ("filter ok=false", "api/rollouts", {"ok": "false", "limit": "50"}),
    ("filter error + task + reward range", "api/rollouts",
     {"error": "ToolsetError", "task": "calc", "reward_min": "0", "reward_max": "0.5", "limit": "50"}),
    ("sort by reward desc", "api/rollouts", {"sort": "reward", "order": "desc", "limit": "50"}),
    ("sort + filter, page 100", "api/rollouts",
     {"sort": "agent_s", "order": "desc", "ok": "true", "offset": "5000", "limit": "50"}),
    ("one rollout (trace from its shard)", "api/rollout", {"id": "{last}"}),
    ("its group (advantages by finalize)", "api/siblings", {"id": "{last}"}),
    ("runs list (shard footers)", "api/runs", {}),
    ("plot (matplotlib, all rows)", "api/plot.png", {}),
]


async def measure(run_dir: Path) -> list[tuple[str, float, float, str]]:
    runner, url = await start(Viewer([run_dir], plot=plot))
    out = []
    try:
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
                else:
                    note = f"{len(body):,} bytes"
                out.append((label, times[0], times[1], note))
    finally:
        await runner.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="rollouts in the synthetic run (default 100,000)")
    p.add_argument("--text-bytes", type=int, default=2_000,
                   help="random text per rollout, in its reasoning and answer (default 2,000)")
    p.add_argument("--keep", type=Path, help="write the run here and keep it (reused if it exists)")
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-viewer-"))
    run_dir = args.keep or base / "run"
    try:
        if not (run_dir / "manifest.json").exists():
            t = time.perf_counter()
            synthetic_run(run_dir, args.rows, args.text_bytes)
            size = sum(f.stat().st_size for f in (run_dir / "shards").iterdir())
            print(f"wrote {args.rows:,} rollouts in {time.perf_counter() - t:.1f} s: {size / 2**20:.0f} MiB of "
                  f"Parquet in {len(list((run_dir / 'shards').iterdir()))} shards")
        rows = asyncio.run(measure(run_dir))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nViewer over {args.rows:,} rollouts ({args.text_bytes:,} bytes of text each); {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pa.__version__}")
    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  {'cold s':>7}  {'warm s':>7}  result")
    print(f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 20}")
    for label, cold, warm, note in rows:
        print(f"{label:<{width}}  {cold:7.3f}  {warm:7.3f}  {note}")
    opened = rows[0][1] + rows[1][1]
    print(f"\nopen + first page: {opened:.2f} s (target < 2 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
