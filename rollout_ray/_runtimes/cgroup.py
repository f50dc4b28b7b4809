"""Cgroups of the runtimes: a child cgroup per controller, with or without a limit, killed and
removed at stop; and a runtime host's parent cgroups, which its guardian can find.

RLIMIT_NPROC is not enforced for root, so a ``SandboxRuntime`` bounds process counts and
memory with its own cgroups (v1, or v2 when the controllers are delegated to us). Both kinds
of runtime also *track* their processes by cgroup where one is writable: a process cannot
leave its cgroup by ``setsid`` or by clearing its environment, so ``stop()`` finds every
process the runtime started in the cgroup's ``cgroup.procs``, and once the cgroup is removed,
a program still being spawned cannot join it and never runs (``JOIN_CGROUPS`` exits 125).

A ``RuntimeHost`` makes one parent cgroup per controller (``HostCgroups``) holding its
runtimes' cgroups, and lists the parents in its root directory, so its guardian can kill
and remove them all when the host dies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterable, Mapping
from typing import ClassVar

from .._errors import SandboxError
from .guardian import CGROUPS_FILE, kill_cgroups

KILL_BUDGET = 2.0
"""Seconds a kill keeps finding and killing survivors before giving up."""
JOIN_FAILED = 125
"""Exit code of a program whose wrapper could not join the runtime's cgroups (the runtime was
stopped while it was being spawned): the program never ran."""

# Puts itself in the runtime's cgroups (given as the files to write, up to "--"), then becomes
# the program: every process of the exec is counted from its first fork. "0" is the writer
# itself: in a v1 "tasks" file it moves just this (single-threaded) shell, which spares the
# kernel's global threadgroup lock — moving a whole process waits for an RCU grace period,
# ~10 ms per exec here.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo 0 2>/dev/null >"$1" || exit 125; shift; done; shift; exec "$@"'
TRACKING = ("pids", "")
"""Hierarchies that can track a runtime's processes without a limit, in order of preference:
the pids controller, else the v2 unified hierarchy with no controller (``""``)."""

Parent = tuple[str, str]
"""``(cgroup directory, "v1" | "v2")``."""


def _mounts() -> dict[str, str]:
    """Mount point of each v1 controller, and of the v2 hierarchy under ``""``."""
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
    return mounts


@functools.cache
def cgroup_parent(controller: str) -> Parent | None:
    """``(directory of this process's cgroup, "v1"|"v2")`` where ``controller`` can get a
    writable child cgroup, or ``None``. ``""``: the v2 hierarchy, with no controller.
    Cached: a process does not change cgroups (nor a machine its hierarchies) under us."""
    mounts = _mounts()
    with open("/proc/self/cgroup") as f:
        own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f)
    paths = {c: p for names, p in own.items() for c in names.split(",")}
    if controller and controller in mounts and controller in paths:
        found = (os.path.join(mounts[controller], paths[controller].lstrip("/")), "v1")
    elif "" in mounts and "" in paths:
        found = (os.path.join(mounts[""], paths[""].lstrip("/")), "v2")
        if controller and not _enable(found[0], controller):
            return None  # not delegated to us (or our cgroup holds processes)
    else:
        return None
    return found if os.access(found[0], os.W_OK) else None


def tracking_controller() -> str | None:
    """The hierarchy that can track processes here (see ``TRACKING``), or ``None``."""
    return next((c for c in TRACKING if cgroup_parent(c) is not None), None)


def _enable(directory: str, controller: str) -> bool:
    """Enable ``controller`` for the children of the v2 cgroup ``directory``."""
    try:
        with open(os.path.join(directory, "cgroup.subtree_control"), "r+") as f:
            if controller not in f.read().split():
                f.write(f"+{controller}")
    except OSError:
        return False
    return True


class Cgroups:
    """One child cgroup per controller (one shared directory under v2), under this process's
    own cgroups or under ``parents`` (a host's).

    ``limits`` maps a controller to its limit, or to ``None`` to only track processes
    (``""``: the v2 hierarchy with no controller).
    """

    LIMIT_FILES: ClassVar[dict[tuple[str, str], str]] = {
        ("pids", "v1"): "pids.max",
        ("pids", "v2"): "pids.max",
        ("memory", "v1"): "memory.limit_in_bytes",
        ("memory", "v2"): "memory.max",
    }

    def __init__(
        self, name: str, limits: Mapping[str, int | None], parents: Mapping[str, Parent] | None = None
    ) -> None:
        self.dirs: list[str] = []
        self._join: dict[str, str] = {}
        try:
            for controller, value in limits.items():
                parent = (parents or {}).get(controller) or cgroup_parent(controller)
                if parent is None:
                    raise SandboxError(
                        f"no writable cgroup for the {controller} controller; pass "
                        f"{controller}_limit=None to run without that limit"
                    )
                path = os.path.join(parent[0], name)
                if path not in self.dirs:
                    os.mkdir(path)
                    self.dirs.append(path)
                    self._join[path] = os.path.join(path, "tasks" if parent[1] == "v1" else "cgroup.procs")
                if value is not None:
                    self._limit(path, controller, parent[1], value)
        except BaseException as e:
            self.remove()
            if isinstance(e, OSError):
                raise SandboxError(f"cannot create the cgroups of runtime {name!r}: {e}") from e
            raise

    def _limit(self, path: str, controller: str, version: str, value: int) -> None:
        with open(os.path.join(path, self.LIMIT_FILES[controller, version]), "w") as f:
            f.write(str(value))
        if controller == "memory":  # no swapping around the limit
            for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                with contextlib.suppress(OSError), open(os.path.join(path, swap), "w") as f:
                    f.write(str(value) if swap.startswith("memory.memsw") else "0")

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    @property
    def join_files(self) -> list[str]:
        """What ``JOIN_CGROUPS`` writes to (v1: ``tasks``; v2: ``cgroup.procs``)."""
        return [self._join[d] for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError), open(path) as f:
                found.update(int(p) for p in f.read().split())
        return found

    def kill(self, budget: float = KILL_BUDGET) -> bool:
        """SIGKILL every process in the cgroups until none is left (``budget`` s at most), and
        keep the cgroups; returns whether they are empty."""
        deadline = time.monotonic() + budget  # real time: processes die in real time
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)  # killed processes leave their cgroup within microseconds to ms
        return True

    def remove(self, budget: float = KILL_BUDGET) -> None:
        """SIGKILL every process in the cgroups and remove them (``budget`` s at most; 0: one
        pass that does not wait): once removed, a spawning program cannot join them."""
        self.dirs = kill_cgroups(self.dirs, budget)


class HostCgroups:
    """A runtime host's parent cgroup per controller it can get (best effort: none on a
    machine without writable cgroups), listed in ``ROOT/.cgroups`` for the guardian."""

    def __init__(self, name: str, controllers: Iterable[str | None], root: str) -> None:
        self.parents: dict[str, Parent] = {}
        self.dirs: list[str] = []
        self._name, self._root = name, root
        self._asked: set[str | None] = set()
        self._listed = False
        self.ensure(controllers)

    def ensure(self, controllers: Iterable[str | None]) -> dict[str, Parent]:
        """Add the parents of ``controllers`` the host lacks (a host running a second kind of
        runtime needs its controllers too); returns the host's parents."""
        wanted = [c for c in controllers if c not in self._asked]
        if not wanted and self._listed:
            return self.parents
        for controller in wanted:
            self._asked.add(controller)
            parent = None if controller is None else cgroup_parent(controller)
            if controller is None or parent is None:
                continue
            path = os.path.join(parent[0], self._name)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError:
                continue
            if parent[1] == "v2" and controller:
                _enable(path, controller)
            self.parents[controller] = (path, parent[1])
        self.dirs = sorted({p for p, _ in self.parents.values()})
        with open(os.path.join(self._root, CGROUPS_FILE), "w") as f:  # the guardian's list
            f.writelines(f"{d}\n" for d in self.dirs)
        self._listed = True
        return self.parents

    def remove(self) -> None:
        """Kill what is left in the host's cgroups and remove them with their children."""
        self.dirs = kill_cgroups(self.dirs, KILL_BUDGET)
