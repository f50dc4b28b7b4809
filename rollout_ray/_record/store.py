"""A run directory: Parquet shards of trace tables plus a manifest.

Layout::

    <run_dir>/manifest.json
    <run_dir>/shards/part-00000.parquet
    <run_dir>/shards/part-00001.parquet
    ...

Crash-safety contract: a file under a final name is always complete. Every shard (and the
manifest) is written to ``<name>.tmp``, fsynced, ``os.replace``d to its final name, and the
directory fsynced, so a crash loses at most the rows still buffered or being written and
leaves at worst a ``*.tmp`` leftover, which readers ignore. A shard is never rewritten; a
resumed run appends shards numbered after the existing ones and skips the
``(group_id, sample_idx)`` pairs of ``done_keys``. A final shard that is nevertheless
unreadable (disk corruption, a copy cut short) makes ``read_run`` raise ``CorruptShard``
rather than return partial data.

One ``ShardWriter`` per run directory at a time; it is not thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from .._errors import CorruptShard
from .arrow import ARROW_SCHEMA_VERSION, TRACE_SCHEMA, check_schema

MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "shards"
_SHARD_RE = re.compile(r"^part-(\d+)\.parquet$")

# WARNING: the manifest evolves by appending fields with defaults at the end of Manifest,
# never by retyping or reordering. Bump only for an incompatible change.
MANIFEST_VERSION = 1


def runtime_versions() -> dict[str, str]:
    """Versions of rollout_ray, Python, pyarrow, msgspec and (if installed) ray.

    ray's version comes from its distribution metadata, which never imports ray.
    """
    versions = {
        "rollout_ray": _dist_version("rollout_ray") or "dev",
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "msgspec": msgspec.__version__,
    }
    ray_version = _dist_version("ray")
    if ray_version is not None:
        versions["ray"] = ray_version
    return versions


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class Manifest(msgspec.Struct, kw_only=True):
    """What a run was: its id, when it started, its config and the software that ran it."""

    run_id: str
    """The run's id, also in every row's ``run_id`` column."""
    created: float = msgspec.field(default_factory=time.time)
    """Epoch seconds when the manifest was made."""
    schema_version: int = ARROW_SCHEMA_VERSION
    """The ``ARROW_SCHEMA_VERSION`` of the shards."""
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    """Whatever configuration the caller records (JSON-encodable)."""
    versions: dict[str, str] = msgspec.field(default_factory=runtime_versions)
    """Package versions, from ``runtime_versions()``."""
    version: int = MANIFEST_VERSION
    """The manifest format's own version."""


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


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Atomically write ``<run_dir>/manifest.json`` (creating ``run_dir``); return its path."""
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST_NAME
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(directory)
    return path


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read ``<run_dir>/manifest.json``.

    Raises:
        FileNotFoundError: the run has no manifest.
        msgspec.ValidationError: the manifest is malformed.
    """
    data = (Path(run_dir) / MANIFEST_NAME).read_bytes()
    return msgspec.json.decode(data, type=Manifest)


class ShardWriter:
    """Buffers trace tables and writes them as shards of ``rows_per_shard`` rows.

    A shard holds exactly ``rows_per_shard`` rows except the ones ``flush()`` or ``close()``
    write from a smaller buffer. Numbering continues after the run's existing shards.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, rows_per_shard: int = 10_000) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"`rows_per_shard` must be >= 1, got {rows_per_shard}")
        self._dir = Path(run_dir) / SHARDS_DIR
        self._dir.mkdir(parents=True, exist_ok=True)
        self._rows_per_shard = rows_per_shard
        existing = _shard_paths(self._dir)
        self._next_index = _shard_index(existing[-1]) + 1 if existing else 0
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
        check_schema(table)
        if table.num_rows == 0:
            return
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        while self._buffered_rows >= self._rows_per_shard:
            pending = pa.concat_tables(self._buffer)
            self._write_shard(pending.slice(0, self._rows_per_shard))
            rest = pending.slice(self._rows_per_shard)
            self._buffer = [rest] if rest.num_rows else []
            self._buffered_rows = rest.num_rows

    def flush(self) -> None:
        """Write whatever is buffered as one shard (nothing if the buffer is empty)."""
        self._check_open()
        if self._buffered_rows:
            self._write_shard(pa.concat_tables(self._buffer))
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
        path = self._dir / f"part-{self._next_index:05d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(self._dir)
        self._next_index += 1
        self._shards += 1
        self._rows += table.num_rows
        self._bytes += path.stat().st_size


def shard_paths(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The run's final shards in write order (``*.tmp`` leftovers excluded).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
    """
    directory = Path(run_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"run directory {directory} does not exist")
    return _shard_paths(directory / SHARDS_DIR)


def iter_shards(
    run_dir: str | os.PathLike[str], columns: Sequence[str] | None = None
) -> Iterator[tuple[Path, pa.Table]]:
    """Yield ``(path, table)`` for each shard in write order, reading one at a time.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptShard: a shard cannot be read (raised when the iteration reaches it).
        SchemaMismatch: a shard lacks a requested column or has a newer schema version.
    """
    for path in shard_paths(run_dir):
        yield path, _read_shard(path, columns)


def read_run(run_dir: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
    """Read every shard of the run into one table (all of ``TRACE_SCHEMA`` by default).

    Either every shard is read or an exception is raised: never partial data.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptShard: a shard cannot be read; the run needs repair.
        SchemaMismatch: a shard lacks a requested column or has a newer schema version.
    """
    tables = [table for _, table in iter_shards(run_dir, columns)]
    if not tables:
        names = TRACE_SCHEMA.names if columns is None else list(columns)
        return TRACE_SCHEMA.empty_table().select(names)
    return pa.concat_tables(tables)


def done_keys(run_dir: str | os.PathLike[str]) -> set[tuple[str, int]]:
    """The ``(group_id, sample_idx)`` pairs already stored; reads only those two columns.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptShard: a shard cannot be read; the run needs repair.
    """
    keys: set[tuple[str, int]] = set()
    for _, table in iter_shards(run_dir, ("group_id", "sample_idx")):
        keys.update(
            zip(table.column("group_id").to_pylist(), table.column("sample_idx").to_pylist())
        )
    return keys


def _read_shard(path: Path, columns: Sequence[str] | None) -> pa.Table:
    with _unreadable_is_corrupt(path):
        shard = pq.ParquetFile(path, page_checksum_verification=True)
    with shard:
        with _unreadable_is_corrupt(path):
            schema = shard.schema_arrow
        # Checked before reading, so a missing column is a SchemaMismatch, not a CorruptShard.
        check_schema(schema, columns)
        with _unreadable_is_corrupt(path):
            return shard.read(columns=None if columns is None else list(columns))


@contextmanager
def _unreadable_is_corrupt(path: Path) -> Iterator[None]:
    # A damaged footer can surface as ArrowInvalid, OSError or even UnicodeDecodeError; a
    # vanished file is not damage.
    try:
        yield
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptShard(path, f"{type(exc).__name__}: {exc}") from exc


def _shard_paths(shards_dir: Path) -> list[Path]:
    if not shards_dir.is_dir():
        return []
    found = [p for p in shards_dir.iterdir() if _SHARD_RE.match(p.name)]
    return sorted(found, key=_shard_index)


def _shard_index(path: Path) -> int:
    match = _SHARD_RE.match(path.name)
    assert match is not None, path
    return int(match.group(1))


def _fsync(path: Path) -> None:
    """fsync a file, or a directory: a rename is durable only once its entry is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
