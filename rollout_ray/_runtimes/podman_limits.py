"""What a Podman container is held to: its users (a user namespace) and its limits.

``confinement(budget)`` is the ``podman create`` arguments for both: users mapped away from
the host's (``userns_args``), a pids, a memory (no swap) and, when the task names one, a CPU
limit (``TaskData.resources``), and bounded open files and processes.
"""

from __future__ import annotations

import os
import resource

from .._core.limits import TaskResources
from .podman_cli import ulimit

PIDS_LIMIT = 4096
MEMORY_LIMIT = 8 << 30
"""Bytes of memory a container's programs may use together when its task names none."""
NOFILE = 65536
USERNS_BASE = 1_500_000_000
"""The host uid (and gid) a container's root is, run as root: far above any user's or
subordinate range's (``useradd`` gives from 100000), so no host user owns what it writes."""
USERNS_SIZE = 65536
"""Container uids mapped (0..65535: every user an image's packages create)."""


def userns_args() -> list[str]:
    """As root: every container's users mapped onto ``USERNS_BASE``.. (see the module doc).

    One range for every container, not one each (``--userns=auto``): Podman copies an image's
    layers with their owners shifted once per range, so one range keeps a start cheap; the
    containers stay apart by their PID, mount and network namespaces. Rootless: nothing to add
    (Podman's own user namespace, the invoking user as root)."""
    if os.geteuid() != 0:
        return []
    spec = f"0:{USERNS_BASE}:{USERNS_SIZE}"
    return ["--uidmap", spec, "--gidmap", spec]


def limit_args(budget: TaskResources | None) -> list[str]:
    """Podman's limits for a task's ``budget``: memory without swap (else a program over its
    memory pages out instead of being stopped), the cores when it names them."""
    memory = (budget.memory_bytes if budget is not None else None) or MEMORY_LIMIT
    cpus = ["--cpus", f"{budget.cpu:g}"] if budget is not None and budget.cpu is not None else []
    return ["--memory", str(memory), "--memory-swap", str(memory), *cpus]


def confinement(budget: TaskResources | None) -> list[str]:
    """Every ``podman create`` argument of a container's users and limits."""
    return [
        *userns_args(),
        "--pids-limit",
        str(PIDS_LIMIT),
        *limit_args(budget),
        "--ulimit",
        ulimit("nofile", resource.RLIMIT_NOFILE, NOFILE),
        "--ulimit",
        ulimit("nproc", resource.RLIMIT_NPROC, PIDS_LIMIT),
    ]
