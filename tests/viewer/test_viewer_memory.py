"""The viewer's memory does not grow with what a run's rows hold (issue 21 §4): long task data is
left out of the index and of every page (the rollout's page has it whole), long cells are cut
in the table, and opening one rollout reads a bounded part of its shard, whatever its size."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from viewer_runs import get, rollout_id, serve_requests, write_run

from rollout_ray._record.messages import AssistantMessage
from rollout_ray._record.store import ROW_GROUP_BYTES
from rollout_ray._record.trace import Trace
from rollout_ray._viewer.server import Viewer

pytestmark = pytest.mark.faults

KIB, MIB = 1 << 10, 1 << 20


def text(seed: int, size: int) -> str:
    return random.Random(seed).randbytes(size // 2).hex()


def with_data(**fields: Any) -> Any:
    def shape(i: int, trace: Trace) -> Trace:
        data = {**trace.task.data, **{k: v(i) if callable(v) else v for k, v in fields.items()}}
        return msgspec.structs.replace(trace, task=msgspec.structs.replace(trace.task, data=data))

    return shape


def page_bytes(viewer: Viewer, run: str, **params: Any) -> int:
    ((status, body),) = serve_requests(
        viewer, f"/api/rollouts?run={run}&limit=500" + "".join(f"&{k}={v}" for k, v in params.items())
    )
    assert status == 200
    return len(msgspec.json.encode(body))


def test_long_task_data_stays_out_of_the_index_and_the_pages(tmp_path: Path, report: Any) -> None:
    n, prompt = 40, 256 * KIB  # a prompt per task (group of 4), as the red team's
    run = write_run(tmp_path / "prompts", n, shape=with_data(prompt=lambda i: text(i // 4, prompt)))
    started = time.monotonic()
    viewer = Viewer([run])
    overview = get(viewer, "/api/run", run="prompts")
    index = viewer._indexes["prompts"]
    shown = page_bytes(viewer, "prompts")
    whole = get(viewer, "/api/rollout", run="prompts", id=rollout_id(5))["task"]["data"]["prompt"]
    assert index.table.nbytes < 256 * KIB and shown < 256 * KIB, (index.table.nbytes, shown)
    assert overview["long_columns"] == ["data_prompt"] and "data_prompt" not in overview["extras"]
    assert "data_answer" in overview["extras"]  # short task data stays: it sorts the table
    assert whole == text(1, prompt)
    report(
        "21§4 viewer: long task data",
        f"{n} rollouts, 256 KiB prompt each ({n * prompt // MIB} MiB)",
        f"index {index.table.nbytes // KIB} KiB, page of {n}: {shown // KIB} KiB",
        "prompt whole on the rollout's page",
        time.monotonic() - started,
    )


def test_one_long_value_on_every_row_is_measured_as_it_is_held(tmp_path: Path) -> None:
    run = write_run(tmp_path / "shared", 40, shape=with_data(instruction=text(0, 8 * KIB)))
    viewer = Viewer([run])
    assert page_bytes(viewer, "shared") < 64 * KIB
    assert get(viewer, "/api/run", run="shared")["long_columns"] == ["data_instruction"]


def test_a_long_cell_of_a_short_column_is_cut_in_the_table(tmp_path: Path) -> None:
    run = write_run(tmp_path / "notes", 40, shape=with_data(note=lambda i: text(i, 2_000) if i == 7 else "ok"))
    viewer = Viewer([run])
    notes = [row["data_note"] for row in get(viewer, "/api/rollouts", run="notes", limit=50)["rows"]]
    assert notes[7] == text(7, 2_000)[:300] + "…" and set(notes) - {notes[7]} == {"ok"}
    assert get(viewer, "/api/run", run="notes")["long_columns"] == []
    assert get(viewer, "/api/rollout", run="notes", id=rollout_id(7))["task"]["data"]["note"] == text(7, 2_000)


@contextmanager
def arrow_peak() -> Iterator[pa.MemoryPool]:
    """A fresh default Arrow pool while the block runs: its ``max_memory()`` is the block's peak."""
    pool, before = pa.proxy_memory_pool(pa.default_memory_pool()), pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield pool
    finally:
        pa.set_memory_pool(before)


def test_opening_one_large_rollout_reads_a_bounded_part_of_its_shard(tmp_path: Path, report: Any) -> None:
    n, size = 128, MIB // 2  # 0.5 MiB traces, 64 MiB in one shard

    def large(i: int, trace: Trace) -> Trace:
        answer = msgspec.structs.replace(trace.nodes[-1], message=AssistantMessage(content=text(i, size)))
        return msgspec.structs.replace(trace, nodes=[*trace.nodes[:-1], answer])

    run = write_run(tmp_path / "large", n, shape=large)
    (shard,) = (run / "shards").iterdir()
    groups = [pq.ParquetFile(shard).metadata.row_group(g) for g in range(pq.ParquetFile(shard).num_row_groups)]
    viewer = Viewer([run])
    get(viewer, "/api/run", run="large")  # the index, built before the peak is measured
    started = time.monotonic()
    with arrow_peak() as pool:
        opened = get(viewer, "/api/rollout", run="large", id=rollout_id(n - 2))
    seconds = time.monotonic() - started
    assert opened["messages"][-1]["text"] == text(n - 2, size)
    assert pool.max_memory() < 3 * ROW_GROUP_BYTES, pool.max_memory()
    assert max(g.total_byte_size for g in groups) <= ROW_GROUP_BYTES * 1.1 and len(groups) >= 4
    report(
        "21§4 viewer: open one 0.5 MiB rollout",
        f"{n} × 0.5 MiB traces in one shard",
        f"Arrow peak {pool.max_memory() / MIB:.0f} MiB; row groups of {groups[0].num_rows} rows",
        f"shard {shard.stat().st_size // MIB} MiB, not read whole",
        seconds,
    )
