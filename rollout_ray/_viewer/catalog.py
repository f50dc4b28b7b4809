"""Which runs the viewer shows: the directories it was given, and the runs under them.

A run directory (``RunLayout.holds_run``) is a run; any other directory is searched for runs a few
levels down (a directory of runs, or of sweeps). A run's id is its path relative to the
directory given (or the run directory's own name), so ids are stable across rescans.

A directory given is the user's choice (it may be a link to a directory of runs); below it,
no link is followed: a link to a run elsewhere is neither listed nor served, and every run
is opened from the directory given down, without following a link (``RunLayout.within``).
A run directory given that is itself a link is refused, as everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .._errors import CorruptRun
from .._record.run_layout import MANIFEST, RunLayout
from .._record.store import read_manifest, shard_files

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
    root: Path | None = None
    """The directory given that holds it (None: the run directory was given)."""

    @property
    def layout(self) -> RunLayout:
        """The run's layout, opened from ``root`` down without following a link."""
        return RunLayout(self.path, within=self.root)


def is_run(path: Path) -> bool:
    return RunLayout(path).holds_run()


def find_runs(paths: list[Path]) -> dict[str, RunEntry]:
    """Every run of ``paths`` by id, in the order given and then by name.

    Raises:
        NotARunDirectory: a path does not exist, holds no run, or is a run reached through a link.
    """
    runs: dict[str, RunEntry] = {}
    for root in paths:
        if not root.is_dir():
            raise NotARunDirectory(f"{root}: no such directory")
        try:
            given = is_run(root)
        except CorruptRun as e:  # a run directory given through a link
            raise NotARunDirectory(str(e)) from None
        found = [root] if given else _runs_under(root, MAX_DEPTH)
        if not found:
            raise NotARunDirectory(
                f"{root} is not a run directory (no {MANIFEST}) and holds no runs within {MAX_DEPTH} levels"
            )
        for run in found:
            name = run.name if run == root else run.relative_to(root).as_posix()
            run_id, n = name, 2
            while run_id in runs:  # two directories given with runs of the same name
                run_id, n = f"{name}~{n}", n + 1
            runs[run_id] = RunEntry(run_id, run, None if run == root else root)
    return runs


def _runs_under(directory: Path, depth: int) -> list[Path]:
    if depth <= 0:
        return []
    try:
        with os.scandir(directory) as entries:
            children = sorted(
                directory / e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
            )
    except PermissionError:
        return []
    found: list[Path] = []
    for child in children:
        # A run's own folders (shards/) are not searched: runs do not nest.
        found += [child] if _holds_run(child) else _runs_under(child, depth - 1)
    return found


def _holds_run(directory: Path) -> bool:
    try:
        return is_run(directory)
    except CorruptRun:  # it became a link since it was listed
        return False


_KEYS_CACHE: dict[tuple[str, int, int], pa.Table] = {}
_ROWS_CACHE: dict[tuple[tuple[str, int, int], ...], int] = {}


SIMULATED_SERVER = "the built-in simulated model server"


def model_shown(record: object) -> dict[str, str | None] | None:
    """The manifest's model as people read it: its ``name`` and where it is ``served``.

    ``eval`` and ``sweep`` record ``{"url", "name"}`` or ``{"simulated": config}``
    (``_cli/drive.open_model``); a program's ``Driver(manifest_config=...)`` may record a
    bare name. None: the run records no model."""
    if record is None:
        return None
    if not isinstance(record, dict):
        return {"name": str(record), "served": None}
    simulated = record.get("simulated")
    if isinstance(simulated, dict):
        return {"name": _text(simulated.get("model_name")) or "simulated", "served": SIMULATED_SERVER}
    return {"name": _text(record.get("name")), "served": _text(record.get("url"))}


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def describe(entry: RunEntry) -> dict[str, object]:
    """What the runs list shows of a run: manifest facts, and its rollouts as ``read_run``
    counts them (the latest row of each ``(group_id, sample_idx)``: a rollout redone on resume
    is one)."""
    out: dict[str, object] = {"id": entry.id, "path": str(entry.path)}
    try:
        manifest = read_manifest(entry.layout)
    except (OSError, ValueError) as exc:
        out["error"] = f"unreadable manifest: {exc}"
        return out
    config = manifest.config
    out |= {
        "run_id": manifest.run_id,
        "created": manifest.created,
        "taskset": config.get("taskset"),
        "model": model_shown(config.get("model")),
    }
    try:
        keys = _read_keys(entry)
    except (OSError, ValueError) as exc:  # a link where a shard is, a folder gone
        out["error"] = str(exc)
        return out
    if keys not in _ROWS_CACHE:
        table = pa.concat_tables([_NO_KEYS, *(_KEYS_CACHE[k] for k in keys)], promote_options="permissive")
        _ROWS_CACHE[keys] = table.group_by(["group_id", "sample_idx"]).aggregate([]).num_rows
    out |= {"rollouts": _ROWS_CACHE[keys], "shards": len(keys)}
    return out


def _read_keys(entry: RunEntry) -> tuple[tuple[str, int, int], ...]:
    """Each shard's identity, its ``(group_id, sample_idx)`` rows read once into the cache."""
    keys = []
    for folder, name in shard_files(entry.layout):
        # Shards are never rewritten, so (name, mtime, size) identifies one.
        st = folder.stat(name)
        key = (str(folder.path / name), st.st_mtime_ns, st.st_size)
        if key not in _KEYS_CACHE:
            with folder.arrow_reader(name) as f:
                _KEYS_CACHE[key] = _shard_keys(f)
        keys.append(key)
    return tuple(keys)


def _shard_keys(source: pa.NativeFile) -> pa.Table:
    """The shard's ``(group_id, sample_idx)`` rows."""
    try:
        return pq.read_table(source, columns=["group_id", "sample_idx"])
    except (pa.ArrowException, OSError, ValueError):
        return _NO_KEYS  # a damaged shard: opening the run says why


_NO_KEYS = pa.table({"group_id": pa.array([], pa.string()), "sample_idx": pa.array([], pa.int32())})
