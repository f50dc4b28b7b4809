"""A run directory's data: Parquet shards of trace tables and of finalized groups, plus a
manifest (the layout is ``run_layout``'s).

Crash-safety contract: a file under a final name is always complete. Every shard (and the
manifest) is written to ``<name>.tmp``, fsynced, ``os.replace``d to its final name, and the
directory fsynced, so a crash loses at most the rows still buffered or being written and
leaves at worst a ``*.tmp`` leftover, which readers ignore. A shard is never rewritten; a
resumed run appends shards numbered after the existing ones, and a row it writes again for
a ``(group_id, sample_idx)`` (a rollout redone) supersedes the earlier one: readers see the
latest row of each key. A final shard that is nevertheless unreadable (disk corruption, a
copy cut short) makes ``read_run`` raise ``CorruptRun``, as does one holding rows of another
run, rather than return partial or mixed data.

One writer per run directory at a time: ``RunLock`` makes it so across processes. Shards are
written by ``ShardWriter`` (``shard_writer.py``); this module reads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .._errors import CorruptRun
from .arrow import CONVERSATION_COLUMNS, TRACE_SCHEMA, check_schema, newer_columns
from .manifest import MANIFEST_VERSION as MANIFEST_VERSION
from .manifest import Manifest as Manifest
from .manifest import RunLock as RunLock
from .manifest import read_manifest as read_manifest
from .manifest import runtime_versions as runtime_versions
from .manifest import write_manifest as write_manifest
from .run_files import RunFiles
from .run_layout import GROUPS, SAMPLES, RunLayout, shard_names
from .score_versions import KEY as SCORE_KEY
from .score_versions import read_version
from .shard_writer import ROW_GROUP_BYTES as ROW_GROUP_BYTES
from .shard_writer import ShardWriter as ShardWriter
from .shard_writer import ShardWriterStatistics as ShardWriterStatistics
from .shard_writer import write_shard as write_shard

_SCHEMA_NAMES = frozenset(TRACE_SCHEMA.names)


def shard_paths(run_dir: str | os.PathLike[str] | RunLayout) -> list[Path]:
    """The run's final shards in write order (``*.tmp`` leftovers excluded).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptRun: ``run_dir`` or its shards' folder is a link.
    """
    return [folder.path / name for folder, name in shard_files(run_dir)]


def shard_files(run_dir: str | os.PathLike[str] | RunLayout, part: str = SAMPLES) -> Iterator[tuple[RunFiles, str]]:
    """Each final shard of ``part``, in write order: its folder (open while the iteration is
    at it) and its name.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptRun: ``run_dir`` or the folder is a link.
    """
    layout = RunLayout.of(run_dir)
    try:
        run = layout.open()
    except FileNotFoundError:
        raise FileNotFoundError(f"run directory {layout.root} does not exist") from None
    with run:
        try:
            folder = run.folder(part)
        except FileNotFoundError:
            return
    with folder:
        for name in shard_names(folder.names()):
            yield folder, name


def iter_shards(
    run_dir: str | os.PathLike[str] | RunLayout, columns: Sequence[str] | None = None
) -> Iterator[tuple[Path, pa.Table]]:
    """Yield ``(path, table)`` for each shard in write order, reading one at a time.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptRun: a shard cannot be read (raised when the iteration reaches it), or is a link.
        SchemaMismatch: a shard lacks a requested column or has a newer schema version.
    """
    for folder, name in shard_files(run_dir):
        yield folder.path / name, _read_shard(folder, name, columns)


_KEY = ("run_id", "group_id", "sample_idx")


def read_run(
    run_dir: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    conversation: bool = True,
    scores: int | None = None,
) -> pa.Table:
    """Read the run into one table: the latest row of each ``(group_id, sample_idx)``, in
    write order, with every column (``TRACE_SCHEMA``'s, the group columns the driver adds,
    a judge's) or only ``columns``; ``conversation=False`` leaves out the two large ones
    (``messages``, ``trace``). Shards missing a column another has get nulls there.

    ``scores``: which score version the score columns come from (``score_versions``): the
    latest a rescore wrote (``None``), or ``1``, the scores the rollouts were stored with.

    Either every shard is read or an exception is raised: never partial or mixed data.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptRun: a shard cannot be read (the run needs repair) or holds rows of another
            run, or the run's manifest cannot be read.
        SchemaMismatch: a shard lacks a requested column or has a newer schema version.
        ValueError: the run has no score version ``scores``.
    """
    version = read_version(run_dir, scores)
    if columns is None and not conversation:
        columns = [c for c in _stored_columns(run_dir) if c not in CONVERSATION_COLUMNS]
        columns += [c for c in (version.samples.column_names if version else ()) if c not in columns]
    keys = (*_KEY, *SCORE_KEY) if version else _KEY
    wanted = None if columns is None else [*columns, *(k for k in keys if k not in columns)]
    tables = [table for _, table in _own_shards(run_dir, wanted)]
    if version is not None:  # the rows of the shards it saw; later ones (a resume's) keep theirs
        tables = [version.overlay(t) if i < version.shards else t for i, t in enumerate(tables)]
    if not tables:
        names = TRACE_SCHEMA.names if columns is None else list(columns)
        return TRACE_SCHEMA.empty_table().select(names)
    table = _latest_per_key(_concat(tables))
    if columns is None:
        return table
    for name in columns:  # appended to the schema after every shard was written (else checked above)
        if name not in table.column_names and name in _SCHEMA_NAMES:
            field = TRACE_SCHEMA.field(name)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    check_schema(table, columns)  # a column no shard has
    return table.select(list(columns))


def read_groups(run_dir: str | os.PathLike[str], *, scores: int | None = None) -> pa.Table:
    """The run's finalized groups, one row each (the latest of a group finalized again):
    ``group_id``, ``n`` samples, ``n_valid`` counted (every sample: a failed one counts as
    reward 0), ``n_failed``, ``n_correct``, reward ``mean`` / ``std`` / ``min`` / ``max``,
    ``best_reward``, ``pass_at_<k>`` and ``judge_error`` (the judge's failure on the group, if
    it failed). ``read_run`` has the per-sample side of the same numbers; ``scores`` as there.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        CorruptRun: a groups shard cannot be read.
        ValueError: the run has no score version ``scores``.
    """
    shard_paths(run_dir)  # the run directory must exist (and be no link)
    version = read_version(run_dir, scores)
    if version is not None:
        return version.groups
    tables = [_read_shard(folder, name, None, trace_schema=False) for folder, name in shard_files(run_dir, GROUPS)]
    if not tables:
        return pa.table({})
    table = pa.concat_tables(tables, promote_options="permissive")
    last = {group: row for row, group in enumerate(table.column("group_id").to_pylist())}
    return table if len(last) == table.num_rows else table.take(pa.array(sorted(last.values()), pa.int64()))


def stored_outcomes(run_dir: str | os.PathLike[str]) -> dict[tuple[str, int], tuple[bool, str | None]]:
    """``(group_id, sample_idx) → (ok, error_type)`` of the latest row of each key.

    Raises: as ``read_run``.
    """
    outcomes: dict[tuple[str, int], tuple[bool, str | None]] = {}
    for _, table in _own_shards(run_dir, (*_KEY, "ok", "error_type")):
        keys = zip(table.column("group_id").to_pylist(), table.column("sample_idx").to_pylist())
        outcomes.update(zip(keys, zip(table.column("ok").to_pylist(), table.column("error_type").to_pylist())))
    return outcomes


def done_keys(run_dir: str | os.PathLike[str]) -> set[tuple[str, int]]:
    """The ``(group_id, sample_idx)`` pairs already stored.

    Raises: as ``read_run``.
    """
    return set(stored_outcomes(run_dir))


def _own_shards(run_dir: str | os.PathLike[str], columns: Sequence[str] | None) -> Iterator[tuple[Path, pa.Table]]:
    """``iter_shards``, refusing a shard that holds rows of another run than the manifest's."""
    layout = RunLayout.of(run_dir)
    run_id = read_manifest(layout).run_id if layout.holds_run() else None
    for path, table in iter_shards(run_dir, columns):
        if run_id is not None and table.num_rows and "run_id" in table.column_names:
            found = set(table.column("run_id").unique().to_pylist())
            if found != {run_id}:
                raise CorruptRun.foreign(path, ", ".join(sorted(str(f) for f in found - {run_id})), run_id)
        yield path, table


def _stored_columns(run_dir: str | os.PathLike[str]) -> list[str]:
    """Every column any shard has, in first-seen order (schemas only: no data is read)."""
    names: dict[str, None] = dict.fromkeys(TRACE_SCHEMA.names)
    for folder, name in shard_files(run_dir):
        with folder.arrow_reader(name) as f, unreadable_is_corrupt(folder.path / name):
            names.update(dict.fromkeys(pq.read_schema(f).names))
    return list(names)


def _concat(tables: list[pa.Table]) -> pa.Table:
    """One table of the shards'; a column beyond ``TRACE_SCHEMA`` typed differently by two
    shards (a task data field, int in one and text in another) becomes text in all."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        types: dict[str, set[pa.DataType]] = {}
        for table in tables:
            for field in table.schema:
                if field.name not in _SCHEMA_NAMES and not pa.types.is_null(field.type):
                    types.setdefault(field.name, set()).add(field.type)
        mixed = {name for name, found in types.items() if len(found) > 1}
        if not mixed:
            raise
        tables = [_as_text(table, mixed) for table in tables]
        return pa.concat_tables(tables, promote_options="permissive")


def _as_text(table: pa.Table, names: set[str]) -> pa.Table:
    for name in names & set(table.column_names):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.string()))
    return table


def _latest_per_key(table: pa.Table) -> pa.Table:
    """The last row of each ``(group_id, sample_idx)``, in the order the rows were written."""
    keys = list(zip(table.column("group_id").to_pylist(), table.column("sample_idx").to_pylist()))
    last = {key: row for row, key in enumerate(keys)}
    if len(last) == len(keys):
        return table
    return table.take(pa.array(sorted(last.values()), pa.int64()))


def _read_shard(folder: RunFiles, name: str, columns: Sequence[str] | None, *, trace_schema: bool = True) -> pa.Table:
    """Shard ``name`` of ``folder``: ``columns`` of a trace table (checked against
    ``TRACE_SCHEMA``), or all of another table (``trace_schema=False``: groups)."""
    path = folder.path / name
    with folder.arrow_reader(name) as f:
        with unreadable_is_corrupt(path):
            shard = pq.ParquetFile(f, page_checksum_verification=True)
        with shard:
            if not trace_schema:
                with unreadable_is_corrupt(path):
                    return shard.read()
            with unreadable_is_corrupt(path):
                schema = shard.schema_arrow
            # Checked before reading, so a missing column is a SchemaMismatch, not a CorruptRun.
            # Columns beyond TRACE_SCHEMA (group and judge columns) may be absent from a shard,
            # and so may one appended to TRACE_SCHEMA after the shard's version.
            newer = newer_columns(schema)
            check_schema(
                schema, None if columns is None else [c for c in columns if c in _SCHEMA_NAMES and c not in newer]
            )
            present = None if columns is None else [c for c in columns if c in schema.names]
            with unreadable_is_corrupt(path):
                return shard.read(columns=present)


@contextmanager
def unreadable_is_corrupt(path: Path) -> Iterator[None]:
    """Turn a failure to read a shard into ``CorruptRun`` (a vanished file stays one)."""
    # A damaged footer can surface as ArrowInvalid, OSError or even UnicodeDecodeError; a
    # vanished file is not damage. The viewer reads shards through this too.
    try:
        yield
    except (FileNotFoundError, CorruptRun):
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptRun.shard(path, f"{type(exc).__name__}: {exc}") from exc
