"""A sandbox's own mount namespace: its mounts out of every other sandbox's way.

Every exec copies the mount table of the namespace bwrap starts from. Were each sandbox's
mounts (disk limit, image overlay, kit, binds) made in the host's namespace, that table would
grow with every live sandbox, and so would every exec's cost (~3.4 s at 1,000 live). Instead
each sandbox has a namespace of its own, held by one tiny process (``cat`` reading a pipe,
carrying the host's marker), made private from the host's right away: its table is the
host's few mounts plus the sandbox's own, however many others live.

* its mounts are made inside it by a child forked from the process's one mounter server
  (``mounter.py``, ``_Server`` below; ``run``): a Python running several threads cannot make
  or enter a mount namespace itself, and a Python started per sandbox cost ~25 ms a start;
* each exec enters it (``enter_args``: ``nsenter --mount=... -- bwrap ...``);
* the host reaches the files under its mounts through the holder's root (``path``:
  ``/proc/PID/root/<path>``): what the host's namespace shows there is the empty directory
  beneath;
* ``close`` kills the holder (by its pidfd: never a reused pid) and waits for its end: the namespace and every mount in it go at once, nothing is
  unmounted one by one. If the host dies, its guardian kills the holder by its marker (or the
  holder reads the end of its pipe), with the same effect.
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
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import SandboxError

_MOUNTER = os.path.join(os.path.dirname(__file__), "mounter.py")
Op = Sequence[Any]
"""``[name, *args]``: one of ``mounter.py``'s operations."""


@functools.cache
def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise SandboxError(f"an image or disk-limited sandbox needs `{name}` (Debian: apt-get install util-linux "
                           f"coreutils); install it or pass disk_limit=None without an image")
    return found


def _outcome(outcome: int, what: str) -> None:
    """Read the mounter child's one-line outcome from descriptor ``outcome`` (closing it);
    raise ``OSError`` as the mount did."""
    with open(outcome, "rb") as f:
        line = f.read().split(b"\n", 1)[0]  # to its end: a holder's comes when it is ``cat``
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
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", _MOUNTER, "serve"], stdin=theirs, env={},
                                         start_new_session=True)  # the host's Ctrl-C is the host's to handle
        self.sock, self.owner, self.lock = ours, os.getpid(), threading.Lock()

    def ask(self, request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Send ``request`` with ``fds``; returns the child's ``(pid, pidfd)``."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            data, got, _flags, _addr = socket.recv_fds(self.sock, 4096, 1)
        answer = json.loads(data) if data else {"errno": 0, "error": "the mounter server exited"}
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


def _start(mode: str, ops: Sequence[Op], env: Mapping[str, str], pid: int = 0) -> tuple[int, int, int | None]:
    """Fork a mounter child for ``mode``; returns ``(pid, pidfd, the pipe's write end)``
    once it said its outcome (``OSError`` if it failed: it ended then)."""
    outcome_r, outcome_w = os.pipe()
    pipe_r, pipe_w = os.pipe() if mode == "hold" else (None, None)
    try:
        child, pidfd = _ask({"mode": mode, "ops": list(ops), "env": dict(env), "cat": _tool("cat"), "pid": pid},
                            [outcome_w] if pipe_r is None else [outcome_w, pipe_r])
    except BaseException:
        for fd in (outcome_r, pipe_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (outcome_w, pipe_r):
            if fd is not None:
                os.close(fd)
    try:
        _outcome(outcome_r, "making the sandbox's mount namespace" if mode == "hold"
                 else "mounting in the sandbox's namespace")
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _ended(pidfd, None)
        os.close(pidfd)
        if pipe_w is not None:
            os.close(pipe_w)
        raise
    return child, pidfd, pipe_w


class MountNamespace:
    """A new mount namespace with ``ops`` run in it (``env``: the holder's environment, the
    host's marker). Raises ``OSError`` when an op fails (nothing is left then)."""

    def __init__(self, ops: Sequence[Op], env: Mapping[str, str]) -> None:
        self._enter = [_tool("nsenter")]
        self.pid, self._pidfd, self._pipe = _start("hold", ops, env)

    def path(self, path: str) -> str:
        """``path`` (absolute) as the host reaches it in this namespace."""
        return f"/proc/{self.pid}/root{path}"

    def enter_args(self) -> list[str]:
        """The prefix that runs a program in this namespace."""
        return [*self._enter, f"--mount=/proc/{self.pid}/ns/mnt", "--"]

    def alive(self) -> bool:
        return self._pidfd is not None and not _ended(self._pidfd, 0)

    def run(self, ops: Sequence[Op]) -> None:
        """Run ``ops`` in this namespace. Raises ``OSError`` (what they mounted undone)."""
        _child, pidfd, _ = _start("enter", ops, {}, self.pid)
        try:
            _ended(pidfd, None)  # its outcome said; its end is near
        finally:
            os.close(pidfd)

    def close(self) -> None:
        """Kill the holder and wait for its end: every mount of the namespace is gone (idempotent)."""
        if self._pipe is not None:
            os.close(self._pipe)  # the holder's cue to go, should the kill not reach it
            self._pipe = None
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            _ended(self._pidfd, None)
            os.close(self._pidfd)
            self._pidfd = None


def is_mount(path: str) -> bool:
    """``os.path.ismount`` for a path through ``/proc/PID/root``, which ``ismount`` would
    resolve (``realpath``) to the host's namespace: a directory whose parent, as the kernel
    walks ``..``, is on another filesystem or is itself."""
    try:
        st, parent = os.lstat(path), os.lstat(os.path.join(path, ".."))
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_dev != parent.st_dev or st.st_ino == parent.st_ino)
