"""A program as a host process: its output captured within caps as it arrives, and its whole
tree killed — found by its process group and by the marker variable every descendant inherits
(``/proc`` scans: even after ``setsid`` or a double fork) — when it times out or is cancelled.

What ``LocalRuntime`` (and the sandbox on it) runs each exec with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from typing import Any, cast

from .._core.runtime import PipedProgram
from .cgroup import KILL_BUDGET
from .guardian import pids_with_marker

EXEC_MARKER = "ROLLOUT_RAY_EXEC"
EXIT_GRACE = 0.5
"""Seconds exec keeps reading after the program exited, for descendants still holding its
pipes; then it stops reading (a descendant writing to them later gets SIGPIPE)."""


async def kill_marked(key: str, value: str, pgid: int | None = None) -> None:
    """SIGKILL process group ``pgid`` and every process marked ``key=value`` until none is
    left, or ``KILL_BUDGET`` seconds passed."""
    deadline = time.monotonic() + KILL_BUDGET  # real time: processes die in real time
    while True:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        # In a thread: a host running many rollouts has many /proc entries to read.
        pids = await asyncio.to_thread(pids_with_marker, key, value)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        # Killed processes keep their environ until they finish exiting: scan again.
        if not pids or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.01)


class Capture(asyncio.SubprocessProtocol):
    """Keeps the first ``cap`` bytes of stdout and stderr; drops the rest as it arrives, so
    the program never blocks on a full pipe."""

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 0)
        self.data = {1: bytearray(), 2: bytearray()}
        self.truncated = {1: False, 2: False}
        loop = asyncio.get_running_loop()
        self.exited = loop.create_future()
        self.closed = loop.create_future()  # exited and every pipe closed
        self.cut_short = False
        """``stop()`` found the program running: it was killed, whatever exit code is reported."""

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        buf = self.data[fd]
        room = self.cap - len(buf)
        if len(data) > room:
            self.truncated[fd] = True
            data = data[:room]
        buf += data

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def settle(self, exit_timeout: float | None = None) -> None:
        """Wait for the program to exit, then up to ``EXIT_GRACE`` for its pipes to close."""
        # asyncio.wait never cancels the futures it waits on.
        await asyncio.wait([self.exited], timeout=exit_timeout)
        await asyncio.wait([self.closed], timeout=EXIT_GRACE)


async def wait_program(
    transport: asyncio.SubprocessTransport,
    proto: Capture,
    token: str,
    timeout: float | None,
    stdin: bytes | None,
) -> bool:
    """Feed ``stdin``, wait for the program; on timeout or cancellation kill its tree.
    Returns whether it timed out."""
    if stdin is not None:
        pipe = cast(asyncio.WriteTransport, transport.get_pipe_transport(0))  # stdin is a pipe: asked for
        pipe.write(stdin)
        pipe.close()  # flushes, then signals EOF
    try:
        async with asyncio.timeout(timeout):
            await proto.settle()
    except TimeoutError:
        await asyncio.shield(kill_exec(proto, token, transport.get_pid()))
        return True
    except asyncio.CancelledError:
        # Shielded: a second cancel must not leave part of the tree alive.
        await asyncio.shield(kill_exec(proto, token, transport.get_pid()))
        raise
    return False


async def abandon_spawn(spawn: asyncio.Future[Any], token: str) -> None:
    """A spawn whose caller was cancelled: let it finish, then kill the exec's tree (asyncio
    would kill only the direct child, then wait forever on pipes its children hold)."""
    try:
        transport, proto = await spawn
    except Exception:  # noqa: BLE001 - nothing was started (the caller sees its cancellation)
        return
    try:
        await kill_exec(proto, token, transport.get_pid())
    finally:
        transport.close()


async def kill_exec(proto: Capture, token: str, pgid: int) -> None:
    """Kill one exec's tree, reap its program and collect what its pipes still hold."""
    await kill_marked(EXEC_MARKER, token, pgid)
    await proto.settle(exit_timeout=KILL_BUDGET)


async def open_piped(command: list[str], env: Mapping[str, str], cwd: str, limit: int, token: str) -> PipedProgram:
    """A program held open, its stdin and stdout piped (``Runtime.open_program``), in its own
    session; its kill ends every process marked with its exec ``token``.

    Raises:
        OSError: it could not be started.
    """
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        limit=limit,
        start_new_session=True,
    )
    return PipedProgram(process, lambda: kill_marked(EXEC_MARKER, token, process.pid))
