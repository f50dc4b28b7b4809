#!/usr/bin/env python
"""How many bytes does a stored rollout with token data take, and in which columns?

Rollouts of 1 and 3 turns go through a real ``RolloutSession`` against an in-process model
that answers like vLLM with token capture: a 200-token first prompt, 1,000-token completions
(ids drawn from a 151,000-id vocabulary, ending with EOS), 30 new prompt ids per later turn
(the user message and the generation prompt), one float32 logprob per completion id (vLLM
computes them in float32). The same rollouts are written without token data too (capture
off). Each set is written as the run store writes it (``ShardWriter``: zstd, 1,000-row row
groups) and measured per row: the shard's bytes, each column's compressed bytes, and the
CPU time to read the shard back into traces (``pq.read_table`` + ``table_to_traces``, best of 5).

    python benchmarks/bench_token_storage.py            # 200 rollouts per row
    python benchmarks/bench_token_storage.py --rows 50
"""

from __future__ import annotations

import argparse
import random
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rollout_ray import AssistantMessage, Request, Response, RolloutSession, Trace, TraceTask, UserMessage
from rollout_ray._core.model import Model
from rollout_ray._record.arrow import ARROW_SCHEMA_VERSION, RolloutRecord, records_to_table, table_to_traces
from rollout_ray._record.store import ShardWriter
from rollout_ray.testing import run_virtual

VOCAB = 151_000
EOS = 2
FIRST_PROMPT = 200
COMPLETION = 1000
NEW_PER_TURN = 30
COLUMNS = ("trace", "input_ids", "loss_mask", "logprobs", "messages")


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


class VllmLike(Model):
    """Answers each call with fresh random completion ids and float32 logprobs; its prompt is
    the previous prompt + completion + ``NEW_PER_TURN`` ids (the prefix property holds)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sequence: list[int] = [self.rng.randrange(VOCAB) for _ in range(FIRST_PROMPT)]

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        rng = self.rng
        prompt = list(self.sequence)
        ids = [rng.randrange(VOCAB) for _ in range(COMPLETION - 1)] + [EOS]
        logprobs = [_float32(-rng.expovariate(2.0)) for _ in ids]
        self.sequence = prompt + ids + [rng.randrange(VOCAB) for _ in range(NEW_PER_TURN)]
        text = " ".join(f"w{i % 997}" for i in ids[:-1])
        return Response(AssistantMessage(text), prompt_token_ids=prompt, token_ids=ids, token_logprobs=logprobs)


def rollout(seed: int, turns: int, capture: bool) -> Trace:
    model = VllmLike(seed)
    session = RolloutSession(Trace(task=TraceTask(type="bench", data={"seed": seed})), model)
    messages: list[Any] = [UserMessage("Tell me a long story.")]
    for _ in range(turns):
        reply = run_virtual(session.chat(Request(list(messages)))).message
        messages += [reply, UserMessage("Go on.")]
    if not capture:
        for node in session.trace.nodes:
            node.token_ids = node.logprobs = None
        for call in session.trace.calls:
            call.prompt_ids, call.prompt_shared = None, 0
    return session.trace


def measure(traces: list[Trace], out: Path) -> dict[str, float]:
    """Bytes per row: the whole shard, and each column's compressed column chunks."""
    writer = ShardWriter(out)
    writer.write(records_to_table([RolloutRecord(t, "bench", f"g{i}", 0) for i, t in enumerate(traces)]))
    writer.close()
    (shard,) = (out / "shards").iterdir()
    meta = pq.ParquetFile(shard).metadata
    sizes = dict.fromkeys(COLUMNS, 0)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema.split(".")[0]
            if name in sizes:
                sizes[name] += chunk.total_compressed_size
    rows = len(traces)
    assert table_to_traces(pq.read_table(shard)) == traces  # the store stays lossless
    read = min(_seconds(lambda: table_to_traces(pq.read_table(shard))) for _ in range(5))
    return {"row": shard.stat().st_size / rows, **{k: v / rows for k, v in sizes.items()}, "read_us": 1e6 * read / rows}


def _seconds(fn: Any) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="rollouts per row of the table")
    args = parser.parse_args()
    print(
        f"schema version {ARROW_SCHEMA_VERSION}; {args.rows} rollouts per row; bytes per stored rollout "
        f"(zstd); {COMPLETION}-token completions"
    )
    header = (
        f"{'turns':>5}  {'capture':7}  {'row B':>8}  "
        + "  ".join(f"{c + ' B':>11}" for c in COLUMNS)
        + f"  {'read CPU µs':>8}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for turns in (1, 3):
            measured = {}
            for capture in (False, True):
                traces = [rollout(seed, turns, capture) for seed in range(args.rows)]
                measured[capture] = m = measure(traces, Path(tmp) / f"{turns}-{capture}")
                print(
                    f"{turns:>5}  {'on' if capture else 'off':7}  {m['row']:8.0f}  "
                    + "  ".join(f"{m[c]:11.0f}" for c in COLUMNS)
                    + f"  {m['read_us']:8.0f}"
                )
            more = (measured[True]["row"] - measured[False]["row"]) / turns
            print(f"{'':>5}  capture adds {more:,.0f} B per turn")


if __name__ == "__main__":
    main()
