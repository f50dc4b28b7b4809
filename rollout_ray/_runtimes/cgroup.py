"""Cgroups for a sandbox: a child cgroup per controller with its limit, killed and removed at stop.

Used by ``SandboxRuntime``: RLIMIT_NPROC is not enforced for root, so process counts and
memory are bounded by the runtime's own cgroups (v1, or v2 when the controllers are
delegated to us), which also find every process of the runtime at stop, whatever it did to
its environment or session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping

from .._errors import SandboxError
from .local import KILL_BUDGET

# Puts itself in the runtime's cgroups (given as paths up to "--"), then becomes bwrap: every
# process of the exec is counted from its first fork.
JOIN_CGROUPS = ('while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; '
                 'shift; exec "$@"')


def cgroup_parent(controller: str) -> tuple[str, str] | None:
    """``(directory of this process's cgroup, "v1"|"v2")`` where ``controller`` can get a
    writable child cgroup, or ``None``."""
    mounts: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, tail = line.partition(" - ")
            fstype, _, opts = tail.split()[:3]
            point = fields.split()[4]
            if fstype == "cgroup2":
                mounts.setdefault("", point)
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    mounts.setdefault(opt, point)
    with open("/proc/self/cgroup") as f:
        own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f)
    paths = {c: p for names, p in own.items() for c in names.split(",")}
    if controller in mounts and controller in paths:
        found = (os.path.join(mounts[controller], paths[controller].lstrip("/")), "v1")
    elif "" in mounts and "" in paths:
        found = (os.path.join(mounts[""], paths[""].lstrip("/")), "v2")
        try:
            with open(os.path.join(found[0], "cgroup.subtree_control"), "r+") as f:
                if controller not in f.read().split():
                    f.write(f"+{controller}")
        except OSError:  # not delegated to us (or our cgroup holds processes)
            return None
    else:
        return None
    return found if os.access(found[0], os.W_OK) else None


class Cgroups:
    """One child cgroup per controller (one shared directory under v2)."""

    LIMIT_FILES = {("pids", "v1"): "pids.max", ("pids", "v2"): "pids.max",
                   ("memory", "v1"): "memory.limit_in_bytes", ("memory", "v2"): "memory.max"}

    def __init__(self, name: str, limits: Mapping[str, int]) -> None:
        self.dirs: list[str] = []
        try:
            for controller, value in limits.items():
                parent = cgroup_parent(controller)
                if parent is None:
                    raise SandboxError(
                        f"no writable cgroup for the {controller} controller; pass "
                        f"{controller}_limit=None to run without that limit"
                    )
                path = os.path.join(parent[0], name)
                if path not in self.dirs:
                    os.mkdir(path)
                    self.dirs.append(path)
                with open(os.path.join(path, self.LIMIT_FILES[controller, parent[1]]), "w") as f:
                    f.write(str(value))
                if controller == "memory":  # no swapping around the limit
                    for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                        with contextlib.suppress(OSError), open(os.path.join(path, swap), "w") as f:
                            f.write(str(value) if swap.startswith("memory.memsw") else "0")
        except BaseException as e:
            self.remove()
            if isinstance(e, OSError):
                raise SandboxError(f"cannot create the cgroups of sandbox {name!r}: {e}") from e
            raise

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError), open(path) as f:
                found.update(int(p) for p in f.read().split())
        return found

    def remove(self) -> None:
        """SIGKILL every process in the cgroups and remove them (``KILL_BUDGET`` s at most)."""
        deadline = time.monotonic() + KILL_BUDGET  # real time: processes die in real time
        while self.dirs and time.monotonic() < deadline:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for d in list(self.dirs):
                with contextlib.suppress(OSError):  # busy until its last process has exited
                    os.rmdir(d)
                if not os.path.exists(d):
                    self.dirs.remove(d)
            if self.dirs:
                time.sleep(0.01)
