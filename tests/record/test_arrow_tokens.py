"""The token columns of the trace table (schema version 2): round trip, nulls, old shards, readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from token_rig import REPLIES, TemplateModel, tool_rollout

from rollout_ray import Trace, TraceTask
from rollout_ray._record.arrow import (
    TOKEN_COLUMNS,
    TRACE_SCHEMA,
    RolloutRecord,
    check_schema,
    records_to_table,
    table_to_traces,
)
from rollout_ray._record.store import ShardWriter, read_run
from rollout_ray._record.tokens import token_sequences


def records() -> list[RolloutRecord]:
    """A rollout with tokens, one whose template drifted, and one without ids."""
    traces = [
        tool_rollout(TemplateModel(REPLIES)),
        tool_rollout(TemplateModel(REPLIES, drift=True)),
        Trace(task=TraceTask("T")),
    ]
    return [RolloutRecord(t, "run", f"g{i}", 0) for i, t in enumerate(traces)]


def write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


def test_token_columns_hold_each_rollouts_sequences_and_survive_parquet(tmp_path: Path) -> None:
    rows = records()
    table = pq.read_table(write(records_to_table(rows), tmp_path / "t.parquet"))
    assert table.schema.equals(TRACE_SCHEMA) and table.schema.metadata == TRACE_SCHEMA.metadata
    for record, row in zip(rows, table.select(list(TOKEN_COLUMNS)).to_pylist()):
        sequences = token_sequences(record.trace)
        if not sequences:
            assert row == dict.fromkeys(TOKEN_COLUMNS)
            continue
        assert row["input_ids"] == [s.input_ids for s in sequences]
        assert row["loss_mask"] == [s.loss_mask for s in sequences]
        assert row["token_branch"] == [s.branch for s in sequences]
        assert row["token_drift"] == record.trace.token_drift
        for got, want in zip(row["logprobs"], sequences):
            np.testing.assert_allclose(got, want.logprobs, rtol=1e-6)  # stored as float32
    assert [len(v or ()) for v in table.column("input_ids").to_pylist()] == [1, 3, 0]
    assert table.column("token_drift").to_pylist() == [[], [1, 2], None]
    assert table_to_traces(table) == [r.trace for r in rows]


def test_a_table_without_token_ids_has_null_token_columns_of_the_schemas_types() -> None:
    table = records_to_table([RolloutRecord(Trace(task=TraceTask("T")), "run", "g", i) for i in range(3)])
    for name in TOKEN_COLUMNS:
        assert table.column(name).null_count == 3
        assert table.schema.field(name).type == TRACE_SCHEMA.field(name).type


def test_an_inconsistent_token_record_nulls_its_row_not_the_table(caplog: Any) -> None:
    good, bad, _ = records()
    bad.trace.calls[1].prompt_shared = 10**6
    table = records_to_table([good, bad])
    assert [v is None for v in table.column("input_ids").to_pylist()] == [False, True]
    assert "token columns left null" in caplog.text


def old_shard(rows: list[RolloutRecord]) -> pa.Table:
    """A table as version 1 wrote it: no token columns, version 1 in its metadata."""
    table = records_to_table(rows).drop_columns([*TOKEN_COLUMNS, "attempts"])
    return table.replace_schema_metadata({b"rollout_ray.schema_version": b"1"})


def test_a_version_1_shard_is_still_read_beside_version_2_ones(tmp_path: Path) -> None:
    old, new, plain = records()
    writer = ShardWriter(tmp_path, rows_per_shard=1)
    writer.write(old_shard([RolloutRecord(old.trace, "run", "old", 0)]))  # the writer accepts it
    writer.write(records_to_table([new, plain]))
    writer.close()
    table = read_run(tmp_path)
    assert table.column("group_id").to_pylist() == ["old", "g1", "g2"]
    assert table.column("input_ids").to_pylist()[0] is None  # the old shard has none
    assert len(table.column("input_ids").to_pylist()[1]) == 3
    assert table_to_traces(table)[0] == old.trace
    only_old = tmp_path / "old"
    only = ShardWriter(only_old)
    only.write(old_shard([old]))
    only.close()
    check_schema(pq.read_schema(next((only_old / "shards").iterdir())))
    assert read_run(only_old).column_names == [n for n in TRACE_SCHEMA.names if n not in (*TOKEN_COLUMNS, "attempts")]


def test_token_columns_read_with_pandas(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    path = write(records_to_table(records()), tmp_path / "t.parquet")
    frame = pq.read_table(path, columns=["rollout_id", *TOKEN_COLUMNS]).to_pandas()
    [first] = frame["input_ids"][0]
    assert first.tolist() == token_sequences(records()[0].trace)[0].input_ids
    assert frame["input_ids"].isna().tolist() == [False, False, True]
    assert list(frame["loss_mask"][1][2])[-1] == 1


def test_token_columns_read_with_polars(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars")
    path = write(records_to_table(records()), tmp_path / "t.parquet")
    frame = pl.read_parquet(path, columns=list(TOKEN_COLUMNS))
    assert frame["input_ids"].dtype == pl.List(pl.List(pl.Int32))
    assert frame["input_ids"].list.len().to_list() == [1, 3, None]


def test_token_columns_read_with_duckdb(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = write(records_to_table(records()), tmp_path / "t.parquet")
    rows = duckdb.sql(f"SELECT len(input_ids), sum(list_sum(loss_mask[1])) FROM '{path}' GROUP BY ALL "
                      "ORDER BY 1 NULLS LAST").fetchall()
    assert [r[0] for r in rows] == [1, 3, None]
