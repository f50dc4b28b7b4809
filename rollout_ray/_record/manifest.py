"""A run directory's manifest (the run's id, settings and versions, written atomically) and
``RunLock``, the one writer of a run directory at a time (where each is: ``run_layout``)."""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import platform
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from .._errors import CorruptRun, RunInUse
from .arrow import ARROW_SCHEMA_VERSION
from .run_layout import LOCK, MANIFEST, RunLayout

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


def write_manifest(run_dir: str | os.PathLike[str] | RunLayout, manifest: Manifest) -> Path:
    """Atomically write the manifest of ``run_dir`` (creating ``run_dir``); return its path.

    Raises:
        CorruptRun: ``run_dir``, the manifest or its ``.tmp`` is a link (never written through).
    """
    layout = RunLayout.of(run_dir)
    with layout.open(create=True) as run:
        run.write_bytes(MANIFEST, msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n")
    return layout.manifest


def read_manifest(run_dir: str | os.PathLike[str] | RunLayout) -> Manifest:
    """Read the manifest of ``run_dir``.

    Raises:
        FileNotFoundError: the run has no manifest.
        CorruptRun: the manifest is not valid JSON or not a manifest, or it (or the run
            directory) is a link.
    """
    layout = RunLayout.of(run_dir)
    with layout.open() as run:
        data = run.read_bytes(MANIFEST)
    try:
        return msgspec.json.decode(data, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CorruptRun.manifest(layout.manifest, str(e)) from None


class RunLock:
    """An exclusive lock on a run directory, held by the one process writing it.

    ``flock`` on the run's lock file: the kernel releases it when the holder exits, however
    it exits, so a crashed writer never leaves the run locked. The file is opened without
    following a link and is truncated only once locked, so a planted ``.lock`` is refused.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | RunLayout) -> None:
        self._layout = RunLayout.of(run_dir)
        self.path = self._layout.lock
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises ``RunInUse`` at once if another writer holds it, ``CorruptRun`` if the lock
        file (or the run directory) is a link."""
        with self._layout.open() as run:
            fd = run.lock_file(LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUse(str(self._layout.root), f"pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
