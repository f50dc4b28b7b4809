"""Running Podman's client: whether this machine can, which OCI runtime, one command's outcome.

Every podman command the ``podman`` provider runs goes through ``podman()`` (bounded by a
timeout, its client killed when cancelled), so that a hung Podman fails one runtime with a
reason instead of holding its host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
from collections.abc import Mapping

CALL_TIMEOUT = 120.0
"""Seconds a podman command other than an exec or a load (``LOAD_TIMEOUT``) may take."""
LOAD_TIMEOUT = 3600.0


def podman_unavailable() -> str | None:
    """Why this machine cannot run the podman provider, or ``None``."""
    if shutil.which("podman") is None:
        return "the podman runtime needs podman: apt-get install podman (and runc on cgroup v1 or hybrid hosts)"
    if catatonit() is None:
        return "the podman runtime needs catatonit (Debian's catatonit package, which podman recommends)"
    if shutil.which("nsenter") is None:  # serves a container's routes in its network namespace
        return "the podman runtime needs nsenter (Debian's util-linux package)"
    return None


def catatonit() -> str | None:
    """The host's static ``catatonit`` (each container's first process), or ``None``."""
    for path in ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit"):
        if os.path.exists(path):
            return os.path.realpath(path)
    return None


def oci_runtime() -> list[str]:
    """crun refuses hybrid cgroup hierarchies (v1 with a v2 mount); runc runs there."""
    chosen = os.environ.get("ROLLOUT_RAY_PODMAN_OCI_RUNTIME")
    if chosen:
        return ["--runtime", chosen]
    unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    return ["--runtime", "runc"] if not unified and shutil.which("runc") else []


def ulimit(name: str, which: int, wanted: int) -> str:
    """``wanted``, within this process's hard limit: an OCI runtime may not raise it."""
    hard = resource.getrlimit(which)[1]
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    return f"{name}={value}:{value}"


async def podman(
    *args: str, stdin: bytes | None = None, timeout: float = CALL_TIMEOUT, cwd: str | None = None
) -> tuple[int, bytes, str]:
    """Run ``podman args`` in ``cwd`` (a container's conmon, which ``start`` spawns, writes an
    ``oom`` file in it when the container's memory limit kills a program): its exit code,
    stdout and stderr (the end of it)."""
    proc = await asyncio.create_subprocess_exec(
        "podman",
        *args,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(stdin)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out, err.decode(errors="replace").strip()[-500:]


def exec_command(
    container: str, argv: list[str], variables: Mapping[str, str], workdir: str, interactive: bool
) -> tuple[list[str], dict[str, str]]:
    """The ``podman exec`` command line and the podman client's environment.

    Values go through the client's environment with only ``--env NAME`` on the command line:
    a command line is readable by every user of the host (``ps``), and an exec's variables
    carry secrets (``OPENAI_API_KEY``)."""
    command = [
        "podman",
        "exec",
        *(["-i"] if interactive else []),
        "--workdir",
        workdir,
        *(a for k in variables for a in ("--env", k)),
        container,
        *argv,
    ]
    return command, {**os.environ, **variables}
