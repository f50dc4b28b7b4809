"""The layout of a run directory: every file and folder name in it, in one place.

::

    <run>/manifest.json                    the run's id, settings and versions (manifest.py)
    <run>/.lock                            held by the one process writing the run (RunLock)
    <run>/shards/part-00000.parquet ...    one row per rollout, in write order (store.py)
    <run>/groups/part-00000.parquet ...    one row per finalized group
    <run>/report.png                       ``rollout-ray report``'s plot, by default
    <run>/scores/v2/ ...                   a rescore's scores (score_versions.py; below)
    <run>/control.json                     a live driver's control endpoint and token (0600)
    <run>/status.json                      a live driver's status, refreshed every few seconds
    <any of them>.tmp                      being written; renamed to its name once complete

A directory is a run directory when it holds a manifest. Whatever reads or writes a run asks
a ``RunLayout`` where each part is, and spells no name itself; it opens them through
``RunLayout.open`` (``run_files``: relative to the directory's descriptor, following no link).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .run_files import RunFiles

MANIFEST = "manifest.json"
LOCK = ".lock"
SAMPLES = "shards"
"""The folder of the trace tables' shards (one row per rollout)."""
GROUPS = "groups"
"""The folder of the finalized groups' shards (one row per group)."""
REPORT_PLOT = "report.png"
CONTROL = "control.json"
"""A live driver's control endpoint and its token (``_driver/control``), readable by its owner only."""
STATUS = "status.json"
"""A live driver's status for outside monitors, replaced whole every few seconds."""
_SHARD = re.compile(r"^part-(\d+)\.parquet$")


@dataclass(frozen=True)
class RunLayout:
    """Where each part of the run directory ``root`` is; ``open`` is the way in.

    ``within``: a directory above ``root`` chosen by the caller (the viewer's root), below
    which no directory on the way to ``root`` may be a link either.
    """

    root: Path
    within: Path | None = None

    @classmethod
    def of(cls, run_dir: str | os.PathLike[str] | RunLayout) -> RunLayout:
        return run_dir if isinstance(run_dir, RunLayout) else cls(Path(run_dir))

    def open(self, *, create: bool = False) -> RunFiles:
        """The run directory, open (see ``RunFiles.open``); close it after use.

        Raises:
            FileNotFoundError: it does not exist (and ``create`` is off).
            CorruptRun: it is a link, or not a directory.
        """
        return RunFiles.open(self.root, create=create, within=self.within)

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def report_plot(self) -> Path:
        return self.root / REPORT_PLOT

    @property
    def control(self) -> Path:
        return self.root / CONTROL

    @property
    def status(self) -> Path:
        return self.root / STATUS

    def folder(self, part: str = SAMPLES) -> Path:
        """The folder of ``part``'s shards: ``SAMPLES`` or ``GROUPS``."""
        return self.root / part

    def shard(self, index: int, part: str = SAMPLES) -> Path:
        """The ``index``-th shard of ``part`` (numbered from 0, in write order)."""
        return self.folder(part) / shard_name(index)

    def shards(self, part: str = SAMPLES) -> list[Path]:
        """``part``'s final shards in write order (leftovers being written excluded).

        Raises:
            CorruptRun: the run directory or the folder is a link, or not a directory.
        """
        try:
            with self.open() as run, run.folder(part) as folder:
                return [folder.path / name for name in shard_names(folder.names())]
        except FileNotFoundError:
            return []

    def holds_run(self) -> bool:
        """Whether it is a run directory: it holds a manifest (whatever that is: a planted
        link makes it one too, so that opening it says what is wrong rather than starting a
        new run over it)."""
        try:
            with self.open() as run:
                return run.exists(MANIFEST)
        except (FileNotFoundError, NotADirectoryError):
            return False


def shard_name(index: int) -> str:
    """The file name of the ``index``-th shard of a folder."""
    return f"part-{index:05d}.parquet"


def shard_names(names: Iterable[str]) -> list[str]:
    """The final shards among a folder's ``names``, in write order."""
    return sorted((n for n in names if _SHARD.match(n)), key=shard_index)


def shard_index(path: str | Path) -> int:
    """A shard's number, from its name."""
    match = _SHARD.match(Path(path).name)
    assert match is not None, path
    return int(match.group(1))


# -- score versions (``rollout-ray rescore``; read by score_versions.py) -----------------------
#
#     <run>/scores/v<n>/samples.parquet     the score columns of every row it scored, by key
#     <run>/scores/v<n>/groups.parquet      the groups finalized again with them
#     <run>/scores/v<n>/version.json        what made it: when, the taskset, how many rows
#     <run>/scores/v<n>.tmp/                being written; renamed to v<n> once complete
#
# Version 1 is what the shards hold; a rescore adds version n + 1 and never changes another.

SCORES = "scores"
"""The folder of the score versions a rescore added."""
SCORE_SAMPLES = "samples.parquet"
SCORE_GROUPS = "groups.parquet"
SCORE_INFO = "version.json"
_VERSION = re.compile(r"^v(\d+)$")


def score_version(layout: RunLayout, number: int) -> Path:
    """The folder of score version ``number`` (>= 2) of the run ``layout`` describes."""
    return layout.root / SCORES / f"v{number}"


def score_versions(layout: RunLayout) -> list[int]:
    """The numbers of the complete score versions a rescore added, in order (none: ``[]``)."""
    folder = layout.root / SCORES
    if not folder.is_dir():
        return []
    found = (_VERSION.match(p.name) for p in folder.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)
