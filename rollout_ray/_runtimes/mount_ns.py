"""A sandbox's own mount namespace: its mounts out of every other sandbox's way.

Every exec copies the mount table of the namespace bwrap starts from. Were each sandbox's
mounts (disk limit, image overlay, kit, binds) made in the host's namespace, that table would
grow with every live sandbox, and so would every exec's cost (~3.4 s at 1,000 live). Instead
each sandbox has a namespace of its own, made private from the host's right away: its table
is the host's few mounts plus the sandbox's own, however many others live.

* it is made, and later mounted in (``run``), by a child forked from the process's one
  mounter server (``mounter.py``, ``_Server`` below): a Python running several threads cannot
  make or enter a mount namespace itself, and a Python started per sandbox cost ~25 ms a start;
* the host holds it by two descriptors, of the namespace and of its root: no process holds
  it. (A holder process per sandbox made every exec slower with the number of live ones:
  bwrap's ``pivot_root`` walks every task of the machine, 40 us with 170, 240 us with 1,170.)
* each exec enters it (``enter_args``: ``nsenter --mount=/proc/HOST/fd/N -- bwrap ...``);
* the host reaches the files under its mounts through its root (``path``:
  ``/proc/HOST/fd/N/<path>``): what the host's namespace shows there is the empty directory
  beneath;
* ``close`` closes the descriptors: the namespace and every mount in it go at once (once no
  program runs in it), nothing is unmounted one by one. If the host dies, the kernel closes
  them, with the same effect.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .._errors import SandboxError

_MOUNTER = os.path.join(os.path.dirname(__file__), "mounter.py")
Op = Sequence[Any]
"""``[name, *args]``: one of ``mounter.py``'s operations."""


@functools.cache
def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise SandboxError(
            f"an image or disk-limited sandbox needs `{name}` (Debian: apt-get install util-linux "
            f"coreutils); install it or pass disk_limit=None without an image"
        )
    return found


def _outcome(outcome: int, what: str) -> None:
    """Read the mounter child's one-line outcome from descriptor ``outcome`` (closing it);
    raise ``OSError`` as the mount did."""
    with open(outcome, "rb") as f:
        line = f.read().split(b"\n", 1)[0]  # to its end: the child closes it once done
    try:
        found = json.loads(line) if line else {}
    except ValueError:
        found = {}
    if found.get("ok"):
        return
    if "errno" in found:
        raise OSError(found["errno"], f"{what}: {found['error']}", found.get("path"))
    raise OSError(0, f"{what}: the mounter's child ended without saying why")


class _Server:
    """This process's mounter (``mounter.py serve``): forks a child per request, so no Python
    starts per sandbox. Started on first use, again if it died or this process forked."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(  # noqa: S603 - argv is this interpreter and our own mounter script
                [sys.executable, "-I", "-S", _MOUNTER, "serve"], stdin=theirs.fileno(), env={}, start_new_session=True
            )  # the host's Ctrl-C is the host's to handle
        self.sock, self.owner, self.lock = ours, os.getpid(), threading.Lock()

    def ask(self, request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Send ``request`` with ``fds``; returns the child's ``(pid, pidfd)``."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            data, got, _flags, _addr = socket.recv_fds(self.sock, 4096, 1)
        answer: dict[str, Any] = json.loads(data) if data else {"errno": 0, "error": "the mounter server exited"}
        if "pid" not in answer or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise OSError(answer.get("errno", 0), f"the mounter server could not fork: {answer.get('error')}")
        return answer["pid"], got[0]

    def close(self) -> None:
        self.sock.close()  # its cue to exit
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


_server: _Server | None = None
_server_lock = threading.Lock()


def _ask(request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid() or _server.proc.poll() is not None:
            _server = _Server()
            atexit.register(_server.close)
        server = _server
    return server.ask(request, fds)


def _ended(pidfd: int, timeout: float | None) -> bool:
    """Whether the process of ``pidfd`` ended (within ``timeout`` seconds; ``None``: wait)."""
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    return bool(poll.poll(None if timeout is None else int(timeout * 1000)))


def _start(mode: str, ops: Sequence[Op], arg: int | None = None) -> tuple[int, int]:
    """Fork a mounter child for ``mode`` (``arg``: ``enter``'s namespace descriptor); returns
    ``(pid, pidfd)`` once it said its outcome and closed it (``OSError`` if it failed: it ended
    then). A ``hold`` child then waits for the host's pipe, ``arg``, to close."""
    outcome_r, outcome_w = os.pipe()
    try:
        child, pidfd = _ask({"mode": mode, "ops": list(ops)}, [outcome_w, arg if arg is not None else outcome_w])
    except BaseException:
        os.close(outcome_r)
        raise
    finally:
        os.close(outcome_w)
    try:
        _outcome(
            outcome_r,
            "making the sandbox's mount namespace" if mode == "hold" else "mounting in the sandbox's namespace",
        )
    except BaseException:
        _end(pidfd)
        raise
    return child, pidfd


def _end(pidfd: int) -> None:
    """Kill the process of ``pidfd`` (never a reused pid), wait for its end, close it."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    _ended(pidfd, None)
    os.close(pidfd)


class MountNamespace:
    """A new mount namespace with ``ops`` run in it, held by this process's descriptors.
    Raises ``OSError`` when an op fails (nothing is left then)."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self._enter = [_tool("nsenter")]
        pipe_r, pipe_w = os.pipe()
        try:
            child, pidfd = _start("hold", ops, pipe_r)
        finally:
            os.close(pipe_r)
        try:
            self._ns = os.open(f"/proc/{child}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            self._root = os.open(f"/proc/{child}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            if _ended(pidfd, 0):  # opened a process's, but maybe not the child's: its pid was reused
                os.close(self._ns)
                os.close(self._root)
                raise OSError(0, "making the sandbox's mount namespace: its maker ended before it was held")
        finally:
            os.close(pipe_w)  # the child's cue to go
            _end(pidfd)
        self._me = os.getpid()

    def path(self, path: str) -> str:
        """``path`` (absolute) as the host (and its children) reach it in this namespace."""
        return f"/proc/{self._me}/fd/{self._root}{path}"

    def enter_args(self) -> list[str]:
        """The prefix that runs a program in this namespace."""
        return [*self._enter, f"--mount=/proc/{self._me}/fd/{self._ns}", "--"]

    def alive(self) -> bool:
        return self._ns >= 0

    def run(self, ops: Sequence[Op]) -> None:
        """Run ``ops`` in this namespace. Raises ``OSError`` (what they mounted undone)."""
        _child, pidfd = _start("enter", ops, self._ns)
        _ended(pidfd, None)  # its outcome said; its end is near
        os.close(pidfd)

    def close(self) -> None:
        """Let the namespace go: every mount of it is gone, once no program runs in it (idempotent)."""
        if self._ns >= 0:
            os.close(self._root)
            os.close(self._ns)
            self._ns = self._root = -1


def is_mount(path: str) -> bool:
    """``os.path.ismount`` for a path through ``/proc/PID/root``, which ``ismount`` would
    resolve (``realpath``) to the host's namespace: a directory whose parent, as the kernel
    walks ``..``, is on another filesystem or is itself."""
    try:
        st, parent = os.lstat(path), os.lstat(os.path.join(path, ".."))
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_dev != parent.st_dev or st.st_ino == parent.st_ino)
