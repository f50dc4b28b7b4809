"""Which runs the viewer shows: the directories it was given, and the runs under them.

A run directory (``RunLayout.holds_run``) is a run; any other directory is searched for runs a few
levels down (a directory of runs, or of sweeps). A run's id is its path relative to the
directory given (or the run directory's own name), so ids are stable across rescans.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .._record.run_layout import MANIFEST, RunLayout
from .._record.store import read_manifest, shard_paths

MAX_DEPTH = 3
"""How deep under a given directory runs are looked for (runs/<sweep>/<point> is 2)."""


class NotARunDirectory(ValueError):
    """A path given to the viewer is neither a run nor a directory holding runs."""


@dataclass(frozen=True)
class RunEntry:
    """One run the viewer can show."""

    id: str
    """Stable id: the path relative to the directory given, ``/``-separated."""
    path: Path
    """The run directory."""


def is_run(path: Path) -> bool:
    return RunLayout(path).holds_run()


def find_runs(paths: list[Path]) -> dict[str, RunEntry]:
    """Every run of ``paths`` by id, in the order given and then by name.

    Raises:
        NotARunDirectory: a path does not exist, or holds no run.
    """
    runs: dict[str, RunEntry] = {}
    for root in paths:
        if not root.is_dir():
            raise NotARunDirectory(f"{root}: no such directory")
        found = [root] if is_run(root) else _runs_under(root, MAX_DEPTH)
        if not found:
            raise NotARunDirectory(
                f"{root} is not a run directory (no {MANIFEST}) and holds no runs "
                f"within {MAX_DEPTH} levels"
            )
        for run in found:
            name = run.name if run == root else run.relative_to(root).as_posix()
            run_id, n = name, 2
            while run_id in runs:  # two directories given with runs of the same name
                run_id, n = f"{name}~{n}", n + 1
            runs[run_id] = RunEntry(run_id, run)
    return runs


def _runs_under(directory: Path, depth: int) -> list[Path]:
    if depth <= 0:
        return []
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    except PermissionError:
        return []
    found: list[Path] = []
    for child in children:
        # A run's own folders (shards/) are not searched: runs do not nest.
        found += [child] if is_run(child) else _runs_under(child, depth - 1)
    return found


_KEYS_CACHE: dict[tuple[str, int, int], pa.Table] = {}
_ROWS_CACHE: dict[tuple[tuple[str, int, int], ...], int] = {}


def describe(entry: RunEntry) -> dict[str, object]:
    """What the runs list shows of a run: manifest facts, and its rollouts as ``read_run``
    counts them (the latest row of each ``(group_id, sample_idx)``: a rollout redone on resume
    is one)."""
    out: dict[str, object] = {"id": entry.id, "path": str(entry.path)}
    try:
        manifest = read_manifest(entry.path)
    except (OSError, ValueError) as exc:
        out["error"] = f"unreadable manifest: {exc}"
        return out
    config = manifest.config
    out |= {"run_id": manifest.run_id, "created": manifest.created,
            "taskset": config.get("taskset"), "model": config.get("model")}
    shards = shard_paths(entry.path)
    ids = tuple(_shard_id(path) for path in shards)
    if ids not in _ROWS_CACHE:
        keys = pa.concat_tables([_NO_KEYS, *map(_shard_keys, ids)], promote_options="permissive")
        _ROWS_CACHE[ids] = keys.group_by(["group_id", "sample_idx"]).aggregate([]).num_rows
    out |= {"rollouts": _ROWS_CACHE[ids], "shards": len(shards)}
    return out


def _shard_id(path: Path) -> tuple[str, int, int]:
    # Shards are never rewritten, so (name, mtime, size) identifies one.
    st = os.stat(path)
    return str(path), st.st_mtime_ns, st.st_size


def _shard_keys(key: tuple[str, int, int]) -> pa.Table:
    """The shard's ``(group_id, sample_idx)`` rows, read once."""
    path = key[0]
    if key not in _KEYS_CACHE:
        try:
            _KEYS_CACHE[key] = pq.read_table(path, columns=["group_id", "sample_idx"])
        except (pa.ArrowException, OSError, ValueError):
            _KEYS_CACHE[key] = _NO_KEYS  # a damaged shard: opening the run says why
    return _KEYS_CACHE[key]


_NO_KEYS = pa.table({"group_id": pa.array([], pa.string()), "sample_idx": pa.array([], pa.int32())})
