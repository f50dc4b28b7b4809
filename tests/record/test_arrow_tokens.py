"""The token columns of the trace table (schema version 2, ids stored once since 3): round trip,
nulls, old shards, readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from token_rig import REPLIES, TemplateModel, tool_rollout

from rollout_ray import Trace, TraceTask
from rollout_ray._errors import SchemaMismatch
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
from rollout_ray._record.trace import decode_trace, encode_trace


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


def written_by(version: int, rows: list[RolloutRecord]) -> pa.Table:
    """A table as schema ``version`` (1 or 2) wrote it: each blob holds its trace's ids;
    version 1 has no token columns."""
    table = records_to_table(rows)
    blobs = pa.array([encode_trace(r.trace) for r in rows], pa.binary())
    table = table.set_column(table.column_names.index("trace"), "trace", blobs)
    table = table.drop_columns(["attempts", *VERSION_4])  # appended in versions 3 and 4
    if version == 1:
        table = table.drop_columns([c for c in TOKEN_COLUMNS if c not in VERSION_4])
    return table.replace_schema_metadata({b"rollout_ray.schema_version": str(version).encode()})


VERSION_4 = ("token_policy", "policy_min", "policy_max")
"""The columns schema version 4 appended: each id's policy version, the rollout's range."""

VERSION_5 = ("branches", "branch_reasons")
"""The columns schema version 5 appended: how many branches and why."""


def written_by_3(rows: list[RolloutRecord]) -> pa.Table:
    """A table as schema version 3 wrote it: the ids in the token columns only, no versions."""
    table = records_to_table(rows).drop_columns(list(VERSION_4 + VERSION_5))
    return table.replace_schema_metadata({b"rollout_ray.schema_version": b"3"})


def test_a_version_3_shard_is_read_beside_a_version_4_one_with_null_versions(tmp_path: Path) -> None:
    old, new, plain = records()
    writer = ShardWriter(tmp_path, rows_per_shard=1)
    writer.write(written_by_3([RolloutRecord(old.trace, "run", "old", 0)]))
    writer.write(records_to_table([new, plain]))
    writer.close()
    table = read_run(tmp_path)
    assert table.column("group_id").to_pylist() == ["old", "g1", "g2"]
    assert table.column("token_policy").to_pylist()[0] is None and table.column("policy_min").to_pylist()[0] is None
    assert len(table.column("token_policy").to_pylist()[1]) == 3  # the new shard's, one per sequence
    assert table_to_traces(table)[0] == old.trace  # its ids come back from its token columns
    only = ShardWriter(tmp_path / "v3")
    only.write(written_by_3([old]))
    only.close()
    assert read_run(tmp_path / "v3").column_names == [n for n in TRACE_SCHEMA.names if n not in VERSION_4 + VERSION_5]


def old_shard(rows: list[RolloutRecord]) -> pa.Table:
    return written_by(1, rows)


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
    assert read_run(only_old).column_names == [
        n for n in TRACE_SCHEMA.names if n not in (*TOKEN_COLUMNS, "attempts", *VERSION_4)
    ]


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
    rows = duckdb.sql(
        f"SELECT len(input_ids), sum(list_sum(loss_mask[1])) FROM '{path}' GROUP BY ALL ORDER BY 1 NULLS LAST"
    ).fetchall()
    assert [r[0] for r in rows] == [1, 3, None]


def float32_rollout() -> Trace:
    """A tool rollout whose logprobs are float32 numbers, as a server's are."""
    trace = tool_rollout(TemplateModel(REPLIES))
    for node in trace.nodes:
        if node.logprobs is not None:
            node.logprobs = np.asarray(node.logprobs, np.float32).tolist()
    return trace


def test_a_rows_blob_leaves_its_ids_to_the_token_columns_and_reads_back_whole(tmp_path: Path) -> None:
    trace = float32_rollout()
    ids = [i for n in trace.nodes for i in n.token_ids or ()] + [i for c in trace.calls for i in c.prompt_ids or ()]
    table = pq.read_table(write(records_to_table([RolloutRecord(trace, "run", "g", 0)]), tmp_path / "t.parquet"))
    blob = table.column("trace")[0].as_py()
    stored = decode_trace(blob)
    assert all(n.token_ids is None and n.logprobs is None for n in stored.nodes)
    assert all(c.prompt_ids is None for c in stored.calls)
    assert [c.stored_ids for c in stored.calls] == [
        (len(c.prompt_ids), len(trace.nodes[c.node].token_ids)) for c in trace.calls
    ]
    assert len(encode_trace(trace)) - len(blob) >= 4 * len(ids)  # an id takes 1-5 bytes, a logprob 9
    assert table_to_traces(table) == [trace]  # ids and float32 logprobs put back, exactly
    (sequence,) = table.column("input_ids")[0].as_py()
    assert sequence == token_sequences(trace)[0].input_ids


def test_logprobs_float32_cannot_hold_stay_in_the_blob_so_the_trace_reads_back_exactly() -> None:
    trace = tool_rollout(TemplateModel(REPLIES))  # logprobs like -(1 + k / 100): not float32 numbers
    table = records_to_table([RolloutRecord(trace, "run", "g", 0)])
    stored = decode_trace(table.column("trace")[0].as_py())
    assert all(n.token_ids is None for n in stored.nodes)
    assert [n.logprobs for n in stored.nodes if n.sampled] == [n.logprobs for n in trace.nodes if n.sampled]
    assert table_to_traces(table) == [trace]


def test_the_trace_column_alone_of_a_version_3_table_is_refused_with_what_to_read() -> None:
    table = records_to_table([RolloutRecord(float32_rollout(), "run", "g", 0)])
    with pytest.raises(
        SchemaMismatch,
        match=r"^the traces keep their token ids in the token columns: read "
        r"'input_ids' and 'logprobs' with 'trace'$",
    ):
        table_to_traces(table.select(["trace"]))
    nulled = table.set_column(
        table.column_names.index("input_ids"), "input_ids", pa.nulls(1, TRACE_SCHEMA.field("input_ids").type)
    )
    with pytest.raises(
        SchemaMismatch,
        match=r"^row 0: trace \w+ left its token ids to its token columns, "
        r"which are null$",
    ):
        table_to_traces(nulled)


def test_version_2_shards_with_ids_in_their_blobs_read_beside_version_3_ones(tmp_path: Path) -> None:
    old, drifted, plain = records()
    writer = ShardWriter(tmp_path, rows_per_shard=1)
    writer.write(written_by(2, [RolloutRecord(old.trace, "run", "old", 0)]))
    writer.write(records_to_table([drifted, plain]))
    writer.close()
    blobs = [pq.read_table(p).column("trace")[0].as_py() for p in sorted((tmp_path / "shards").iterdir())]
    assert decode_trace(blobs[0]).nodes[2].token_ids is not None  # version 2: the blob's own ids
    assert decode_trace(blobs[1]).nodes[2].token_ids is None  # version 3: the columns'
    table = read_run(tmp_path)
    assert table_to_traces(table) == [old.trace, drifted.trace, plain.trace]
    assert [len(v or ()) for v in table.column("input_ids").to_pylist()] == [1, 3, 0]


def test_branches_and_drift_put_each_turns_ids_back_from_the_sequence_that_holds_it() -> None:
    trace = tool_rollout(TemplateModel(REPLIES, drift=True))
    fork = next(i for i, n in enumerate(trace.nodes) if n.sampled)  # a second reply to the first prompt
    call = trace.calls[0]
    trace.nodes.append(msgspec.structs.replace(trace.nodes[fork], token_ids=[5, 6, 2], logprobs=[-0.5, -1.5, -0.25]))
    trace.calls.append(msgspec.structs.replace(call, node=len(trace.nodes) - 1, prompt_ids=list(call.prompt_ids)))
    assert trace.num_branches == 2 and len(token_sequences(trace)) == 4 and trace.token_drift == [1, 2]
    table = records_to_table([RolloutRecord(trace, "run", "g", 0)])
    assert decode_trace(table.column("trace")[0].as_py()).nodes[-1].token_ids is None
    assert table_to_traces(table) == [trace]
