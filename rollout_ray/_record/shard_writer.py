"""Writing a run's shards: ``ShardWriter`` buffers tables and writes each ``rows_per_shard``
rows as one Parquet shard, under the crash-safety contract of ``store.py`` (a file under a
final name is always complete: written aside, fsynced, renamed, the folder fsynced:
``RunFiles.replacing``); ``write_shard`` is the Parquet layout of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO, Self

import pyarrow as pa
import pyarrow.parquet as pq

from .arrow import check_schema
from .run_layout import SAMPLES, RunLayout, shard_index, shard_name, shard_names

__all__ = ["ROW_GROUP_BYTES", "ROW_GROUP_ROWS", "ShardWriter", "ShardWriterStatistics", "write_shard"]


@dataclass(frozen=True)
class ShardWriterStatistics:
    """What a ``ShardWriter`` has written so far (this writer only, not earlier shards)."""

    shards: int
    """Shards written."""
    rows: int
    """Rows written to shards."""
    bytes: int
    """Bytes of the shards written."""
    buffered_rows: int
    """Rows waiting for the next shard."""


class ShardWriter:
    """Buffers tables and writes them as shards of ``rows_per_shard`` rows.

    ``part`` is the run's folder they go to (``run_layout``): ``SAMPLES`` (trace tables, one
    row per rollout, checked against ``TRACE_SCHEMA``) or ``GROUPS`` (one row per finalized
    group). A shard
    holds exactly ``rows_per_shard`` rows except the ones ``flush()`` or ``close()`` write
    from a smaller buffer. Numbering continues after the folder's existing shards.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str] | RunLayout, *, rows_per_shard: int = 10_000, part: str = SAMPLES
    ) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"`rows_per_shard` must be >= 1, got {rows_per_shard}")
        self._part = part
        self._layout = RunLayout.of(run_dir)
        with self._layout.open(create=True) as run, run.folder(part, create=True) as folder:
            existing = shard_names(folder.names())
        self._rows_per_shard = rows_per_shard
        self._next_index = shard_index(existing[-1]) + 1 if existing else 0
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._shards = self._rows = self._bytes = 0
        self._closed = False

    def write(self, table: pa.Table) -> None:
        """Buffer ``table``; write a shard each time ``rows_per_shard`` rows are buffered.

        Raises:
            SchemaMismatch: ``table`` is not a trace table.
            RuntimeError: the writer is closed.
        """
        self._check_open()
        if self._part == SAMPLES:
            check_schema(table)
        if table.num_rows == 0:
            return
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        while self._buffered_rows >= self._rows_per_shard:
            pending = pa.concat_tables(self._buffer, promote_options="permissive")
            self._write_shard(pending.slice(0, self._rows_per_shard))
            rest = pending.slice(self._rows_per_shard)
            self._buffer = [rest] if rest.num_rows else []
            self._buffered_rows = rest.num_rows

    def flush(self) -> None:
        """Write whatever is buffered as one shard (nothing if the buffer is empty)."""
        self._check_open()
        if self._buffered_rows:
            self._write_shard(pa.concat_tables(self._buffer, promote_options="permissive"))
            self._buffer = []
            self._buffered_rows = 0

    def close(self) -> None:
        """Flush and close; idempotent."""
        if not self._closed:
            self.flush()
            self._closed = True

    def statistics(self) -> ShardWriterStatistics:
        return ShardWriterStatistics(self._shards, self._rows, self._bytes, self._buffered_rows)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Buffered rows are whole rollouts even when the block failed: keep them.
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ShardWriter is closed; open a new one to append to the run")

    def _write_shard(self, table: pa.Table) -> None:
        name = shard_name(self._next_index)
        with self._layout.open() as run, run.folder(self._part) as folder:
            with folder.replacing(name) as f:
                write_shard(table, f)
            size = folder.stat(name).st_size
        self._next_index += 1
        self._shards += 1
        self._rows += table.num_rows
        self._bytes += size


ROW_GROUP_ROWS = 1_000
"""Rows of a shard's row group at most."""
ROW_GROUP_BYTES = 16 << 20
"""Bytes of a row group (in memory, before encoding) at most, unless one row is larger."""


def write_shard(table: pa.Table, sink: BinaryIO) -> None:
    """Write ``table`` as one shard's Parquet to ``sink``."""
    # Row groups of 1,000 rows and at most ~16 MiB: reading one rollout's trace (the viewer)
    # decodes its row group's traces up to it, and pyarrow reads no single row, so the bound
    # on that cost is the row group's bytes (0.5 MiB traces: 32 rows, not 1,000). Pages are
    # closed every 16 rows at most: a trace can be large, and Parquet checks a page's size
    # once per write batch (1,024 rows by default), so a shard written from one large chunk
    # built a whole column chunk in one page (the writer's transient peak was 3x the shard's
    # traces; +1 us per row).
    rows = ROW_GROUP_ROWS
    if table.num_rows and table.nbytes > ROW_GROUP_BYTES:
        rows = max(1, min(rows, ROW_GROUP_BYTES * table.num_rows // table.nbytes))
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True, row_group_size=rows, write_batch_size=16)
