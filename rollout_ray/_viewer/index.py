"""A run's scalar index: what the rollout table's queries run on (``table_query.py``).

Laziness: the index holds only the scalar columns of the shards (no ``messages``, no
``trace``, and not the reward / metric maps), read shard by shard, plus where each row lives
(``_shard``, ``_row``). It is keyed by every shard's (name, mtime, size): a request on an
unchanged run reuses it, and since shards are only ever appended, a run still being written
costs only its new shards. It shows what ``read_run`` returns: the latest row of each
``(group_id, sample_idx)``, with the latest score version's columns (a rescore's), and never a
shard of another run. Sorting, filtering and paging
run with ``pyarrow.compute`` over this index; one rollout's ``trace`` is read from its shard
when its page is opened (``detail.read_trace``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._errors import CorruptRun
from .._record.arrow import SCALAR_COLUMNS, TRACE_SCHEMA, check_schema
from .._record.run_files import RunFiles
from .._record.run_layout import SAMPLES, RunLayout
from .._record.score_versions import ScoreVersion, latest_version, read_version
from .._record.store import read_manifest, shard_files, unreadable_is_corrupt

INDEX_COLUMNS: tuple[str, ...] = tuple(
    c for c in SCALAR_COLUMNS if c not in ("rewards", "reward_weights", "metrics", "task_hash")
)
"""The stored columns the index reads. The maps and the task hash (a fifth of the index's
memory, never filtered on) are read from the trace, on the rollout's page."""

LONG_CELL = 256
"""A stored text column (a task's data field) whose cells hold more bytes than this on average
is left out of the index: the index holds every row, and a page would send it for each. The
rollout's page shows the task's data in full, from its trace."""

ShardKey = tuple[str, int, int]


@dataclass(frozen=True)
class RunIndex:
    """The scalar rows of a run, and which shard state they were read from."""

    layout: RunLayout
    keys: tuple[ShardKey, ...]
    """(name, mtime_ns, size) of each shard, in write order."""
    stored: pa.Table
    """Every stored row: ``INDEX_COLUMNS`` + stored extras + ``_shard``, ``_row``."""
    table: pa.Table
    """The rows a reader sees (``read_run``'s): the latest of each ``(group_id, sample_idx)``,
    a redone rollout superseding the earlier one, in write order; plus ``_pos``, the row's
    position in this table."""
    complete: frozenset[str]
    """Stored extra columns (e.g. ``advantage``) present in every shard."""
    long: frozenset[str] = frozenset()
    """Stored extra text columns left out of the index: their cells are long (``LONG_CELL``)."""
    scores: ScoreVersion | None = None
    """The latest score version a rescore wrote (``None``: the shards' own scores), which
    ``table`` shows on the rows it scored (``_record/score_versions``)."""

    @property
    def extras(self) -> list[str]:
        return [c for c in self.table.column_names if c not in INDEX_COLUMNS and not c.startswith("_")]

    def shard_name(self, shard: int) -> str:
        return self.keys[shard][0]

    def locate(self, rollout_id: str) -> int | None:
        """The index row of ``rollout_id`` (its first, should a retry reuse an id), or None."""
        found = pc.index(self.table["rollout_id"], rollout_id).as_py()
        return None if found < 0 else found


def shard_keys(layout: RunLayout) -> tuple[ShardKey, ...]:
    keys = []
    for folder, name in shard_files(layout):
        st = folder.stat(name)
        keys.append((name, st.st_mtime_ns, st.st_size))
    return tuple(keys)


def build_index(layout: RunLayout, previous: RunIndex | None = None) -> RunIndex:
    """The run's index, reusing ``previous`` when the shards are unchanged or only appended to.

    Raises:
        FileNotFoundError: the run directory does not exist.
        CorruptRun: a shard cannot be read, holds rows of another run than the manifest's, or
            is a link (as is the run directory).
        SchemaMismatch: a shard lacks a scalar column or has a newer schema version.
    """
    keys = shard_keys(layout)
    number = latest_version(layout.root)
    same_scores = previous is not None and (previous.scores.number if previous.scores else 1) == number
    if previous is not None and previous.keys == keys and same_scores:
        return previous
    parts: list[pa.Table] = []
    complete: set[str] | None = None
    long: set[str] = set()
    start = 0
    if previous is not None and previous.keys and keys[: len(previous.keys)] == previous.keys:
        parts, complete, start = [previous.stored], set(previous.complete), len(previous.keys)
        long = set(previous.long)
    run_id = read_manifest(layout).run_id if layout.holds_run() else None
    if start < len(keys):
        with layout.open() as run, run.folder(SAMPLES) as folder:
            for shard in range(start, len(keys)):
                table, long_here = read_scalars(folder, keys[shard][0], run_id)
                long |= long_here
                extras = {c for c in table.column_names if c not in INDEX_COLUMNS} | long_here
                complete = extras if complete is None else complete & extras
                n = table.num_rows
                table = table.append_column("_shard", pa.array(np.full(n, shard, np.int32)))
                parts.append(table.append_column("_row", pa.array(np.arange(n, dtype=np.int32))))
    if not parts:
        parts = [
            TRACE_SCHEMA.empty_table()
            .select(list(INDEX_COLUMNS))
            .append_column("_shard", pa.array([], pa.int32()))
            .append_column("_row", pa.array([], pa.int32()))
        ]
    # Old shards lack columns a newer writer appended: those come back null. A column long
    # in one shard is left out of all: a column is in the index whole, or not at all.
    stored = pa.concat_tables(parts, promote_options="permissive")
    stored = stored.select(
        [c for c in stored.column_names if not c.startswith("_") and c not in long] + ["_shard", "_row"]
    )
    table = _latest_per_key(stored)
    version = previous.scores if previous is not None and same_scores else read_version(layout.root, number)
    if version is not None:  # the rows of the shards it saw, its scalar columns
        scalars = [f.name for f in version.samples.schema if _is_scalar(f.type)]
        table = version.overlay(table, table["_shard"].to_numpy() < version.shards, scalars)
    table = table.append_column("_pos", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return RunIndex(layout, keys, stored, table, frozenset((complete or set()) - long), frozenset(long), version)


def _latest_per_key(stored: pa.Table) -> pa.Table:
    """The last stored row of each ``(group_id, sample_idx)``, in write order."""
    numbered = pa.table(
        {
            "group_id": stored["group_id"],
            "sample_idx": stored["sample_idx"],
            "row": pa.array(np.arange(stored.num_rows, dtype=np.int64)),
        }
    )
    last = numbered.group_by(["group_id", "sample_idx"]).aggregate([("row", "max")])
    if last.num_rows == stored.num_rows:
        return stored  # nothing was redone
    return stored.take(pa.array(np.sort(last["row_max"].to_numpy())))


def read_scalars(folder: RunFiles, name: str, run_id: str | None = None) -> tuple[pa.Table, set[str]]:
    """Shard ``name``'s ``INDEX_COLUMNS`` and stored extra scalar columns (never the
    conversation), and the names of the extra text columns left out because they are long.

    Raises:
        CorruptRun: unreadable, a link, or rows of another run than ``run_id`` (when given).
        SchemaMismatch: a scalar column is missing, or the schema version is newer.
    """
    path = folder.path / name
    with folder.arrow_reader(name) as f:
        with unreadable_is_corrupt(path):
            footer = pq.read_metadata(f)
            schema = footer.schema.to_arrow_schema()
        check_schema(schema, INDEX_COLUMNS)
        stored = [field for field in schema if field.name not in TRACE_SCHEMA.names and _is_scalar(field.type)]
        text = [field.name for field in stored if pa.types.is_string(field.type)]
        long = _long_in_footer(footer, text)
        # Text is read dictionary-encoded: one long value repeated on every row (a shared
        # instruction) costs its size once while its cells' total size is measured.
        with (
            unreadable_is_corrupt(path),
            pq.ParquetFile(
                f, metadata=footer, page_checksum_verification=True, read_dictionary=[c for c in text if c not in long]
            ) as shard,
        ):
            table = shard.read(columns=[*INDEX_COLUMNS, *(c.name for c in stored if c.name not in long)])
    for column in text:
        if column not in long:
            table = _decoded_if_short(table, column, long)
    # As read_run does: rows of two runs in one directory are refused, never mixed.
    found = set(pc.unique(table["run_id"]).to_pylist()) if run_id is not None and table.num_rows else set()
    if found - {run_id}:
        raise CorruptRun.shard(
            path, f"it holds rows of run {', '.join(sorted(map(str, found - {run_id})))}, not of this run ({run_id})"
        )
    return table, long


def _long_in_footer(footer: pq.FileMetaData, names: list[str]) -> set[str]:
    """The columns of ``names`` whose stored data (before compression) is long per row."""
    if not names or not footer.num_rows:
        return set()
    leaf = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
    size = dict.fromkeys(names, 0)
    for group in map(footer.row_group, range(footer.num_row_groups)):
        for name in names:
            size[name] += group.column(leaf[name]).total_uncompressed_size
    return {name for name in names if size[name] > LONG_CELL * footer.num_rows}


def _decoded_if_short(table: pa.Table, name: str, long: set[str]) -> pa.Table:
    """``table`` with the dictionary-encoded text column ``name`` decoded, or without it
    (added to ``long``) when its cells are long on average."""
    column = table[name]
    total = sum(
        pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py() or 0 for chunk in column.chunks
    )
    if total > LONG_CELL * table.num_rows:
        long.add(name)
        return table.drop_columns([name])
    return table.set_column(table.column_names.index(name), name, column.cast(pa.string()))


def _is_scalar(type_: pa.DataType) -> bool:
    t = pa.types
    return t.is_integer(type_) or t.is_floating(type_) or t.is_boolean(type_) or t.is_string(type_)  # type: ignore[no-any-return]
