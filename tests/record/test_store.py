"""The run directory: crash-safe Parquet shards, the manifest, resume keys."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from rollout_ray import Trace, TraceTask
from rollout_ray._errors import CorruptRun
from rollout_ray._record.arrow import (
    ARROW_SCHEMA_VERSION,
    TRACE_SCHEMA,
    RolloutRecord,
    SchemaMismatch,
    records_to_table,
    table_to_traces,
)
from rollout_ray._record.store import (
    Manifest,
    ShardWriter,
    ShardWriterStatistics,
    done_keys,
    iter_shards,
    read_manifest,
    read_run,
    runtime_versions,
    write_manifest,
)


def batch(start: int, n: int) -> pa.Table:
    """Rows ``start .. start+n-1``: rollout id ``t<i>``, group ``g<i // 2>``, sample ``i % 2``."""
    return records_to_table(
        [
            RolloutRecord(Trace(task=TraceTask("T", idx=i), id=f"t{i}"), "run", f"g{i // 2}", i % 2)
            for i in range(start, start + n)
        ]
    )


def shard_names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "shards").iterdir())


def write_batches(run: Path, sizes: list[int], rows_per_shard: int, start: int = 0) -> ShardWriter:
    with ShardWriter(run, rows_per_shard=rows_per_shard) as writer:
        for n in sizes:
            writer.write(batch(start, n))
            start += n
    return writer


def test_batches_become_full_shards_and_read_back_in_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    writer = write_batches(run, [4, 5, 4], rows_per_shard=4)
    assert shard_names(run) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
        "part-00003.parquet",
    ]
    sizes = [p.stat().st_size for p in sorted((run / "shards").iterdir())]
    assert writer.statistics() == ShardWriterStatistics(shards=4, rows=13, bytes=sum(sizes), buffered_rows=0)
    table = read_run(run)
    assert table.column("rollout_id").to_pylist() == [f"t{i}" for i in range(13)]
    assert [t.task.idx for t in table_to_traces(table)] == list(range(13))
    assert [(p.name, t.num_rows) for p, t in iter_shards(run)] == [
        ("part-00000.parquet", 4),
        ("part-00001.parquet", 4),
        ("part-00002.parquet", 4),
        ("part-00003.parquet", 1),
    ]


def test_write_buffers_until_a_shard_is_full(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, rows_per_shard=4)
    writer.write(batch(0, 3))
    assert writer.statistics() == ShardWriterStatistics(0, 0, 0, buffered_rows=3)
    assert shard_names(tmp_path) == []
    writer.flush()
    assert shard_names(tmp_path) == ["part-00000.parquet"]
    writer.close()
    writer.close()
    assert writer.statistics().shards == 1
    pattern = r"^ShardWriter is closed; open a new one to append to the run$"
    with pytest.raises(RuntimeError, match=pattern):
        writer.write(batch(3, 1))


def test_column_selection_reads_only_those_columns(tmp_path: Path) -> None:
    write_batches(tmp_path, [3, 2], rows_per_shard=2)
    table = read_run(tmp_path, columns=["group_id", "reward"])
    assert table.column_names == ["group_id", "reward"]
    assert table.to_pydict() == {"group_id": ["g0", "g0", "g1", "g1", "g2"], "reward": [0.0] * 5}


def test_a_truncated_shard_is_corrupt_and_nothing_is_returned(tmp_path: Path) -> None:
    write_batches(tmp_path, [6], rows_per_shard=2)
    bad = tmp_path / "shards" / "part-00001.parquet"
    os.truncate(bad, bad.stat().st_size // 2)
    pattern = (
        rf"^shard {bad} is truncated or corrupt \(.+\); the run needs repair: move the file "
        r"aside and resume the run to redo its rollouts$"
    )
    with pytest.raises(CorruptRun, match=pattern) as err:
        read_run(tmp_path)
    assert err.value.path == bad
    assert isinstance(err.value, ValueError)
    with pytest.raises(CorruptRun, match=pattern):
        done_keys(tmp_path)


def test_a_leftover_tmp_is_ignored_and_overwritten(tmp_path: Path) -> None:
    write_batches(tmp_path, [4], rows_per_shard=2)
    leftover = tmp_path / "shards" / "part-00002.parquet.tmp"
    leftover.write_bytes(b"half a shard")
    assert read_run(tmp_path).num_rows == 4
    write_batches(tmp_path, [1], rows_per_shard=2, start=4)
    assert shard_names(tmp_path) == [f"part-0000{i}.parquet" for i in range(3)]
    assert read_run(tmp_path).num_rows == 5


def test_numbering_continues_after_existing_shards(tmp_path: Path) -> None:
    write_batches(tmp_path, [4], rows_per_shard=2)
    with ShardWriter(tmp_path, rows_per_shard=2) as writer:
        writer.write(batch(4, 3))
    assert shard_names(tmp_path) == [f"part-{i:05d}.parquet" for i in range(4)]
    assert read_run(tmp_path).column("rollout_id").to_pylist() == [f"t{i}" for i in range(7)]


def test_done_keys_are_the_stored_group_sample_pairs(tmp_path: Path) -> None:
    assert done_keys(tmp_path) == set()
    write_batches(tmp_path, [5], rows_per_shard=2)
    assert done_keys(tmp_path) == {("g0", 0), ("g0", 1), ("g1", 0), ("g1", 1), ("g2", 0)}


def test_an_empty_run_reads_as_an_empty_table(tmp_path: Path) -> None:
    assert read_run(tmp_path).schema.equals(TRACE_SCHEMA)
    assert read_run(tmp_path, columns=["run_id"]).column_names == ["run_id"]
    with pytest.raises(FileNotFoundError, match=r"^run directory .*missing does not exist$"):
        read_run(tmp_path / "missing")


def test_only_trace_tables_are_written_and_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^`rows_per_shard` must be >= 1, got 0$"):
        ShardWriter(tmp_path, rows_per_shard=0)
    with ShardWriter(tmp_path) as writer, pytest.raises(SchemaMismatch, match=r"'trace'"):
        writer.write(batch(0, 1).drop_columns(["trace"]))
    write_batches(tmp_path, [1], rows_per_shard=1)
    pattern = r"^trace table has no column 'nope' \(expected any type\)$"
    with pytest.raises(SchemaMismatch, match=pattern):
        read_run(tmp_path, columns=["nope"])


def test_manifest_round_trips(tmp_path: Path) -> None:
    manifest = Manifest(run_id="run-7", config={"model": "m", "n": [1, 2]}, created=1700000000.5)
    path = write_manifest(tmp_path / "run", manifest)
    assert path == tmp_path / "run" / "manifest.json"
    assert os.listdir(tmp_path / "run") == ["manifest.json"]
    assert read_manifest(tmp_path / "run") == manifest
    assert json.loads(path.read_text())["config"] == {"model": "m", "n": [1, 2]}
    assert (manifest.schema_version, manifest.version) == (ARROW_SCHEMA_VERSION, 1)


def test_manifest_records_versions_without_importing_ray() -> None:
    ray_was_imported = "ray" in sys.modules
    versions = runtime_versions()
    assert ("ray" in sys.modules) == ray_was_imported
    assert versions["pyarrow"] == pa.__version__
    assert versions["msgspec"] == msgspec.__version__
    assert versions["rollout_ray"] == importlib.metadata.version("rollout_ray")
    assert set(versions) <= {"rollout_ray", "python", "pyarrow", "msgspec", "ray"}
    assert {"rollout_ray", "python", "pyarrow", "msgspec"} <= set(versions)
    assert Manifest(run_id="r").versions == versions
