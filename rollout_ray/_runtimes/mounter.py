"""Makes a sandbox's mounts in the sandbox's own mount namespace (``mount_ns.py``).

Run as a plain script (``python -I -S mounter.py serve``; standard library only, like
``guardian.py``): one per host process, started once, because a process can make or enter a
mount namespace only while it runs one thread, which the host's Python never does, and a
Python started per sandbox cost ~25 ms of each start (a fork of this one: ~1 ms).

It reads requests from the socket on its standard input (``SOCK_SEQPACKET``: one message, one
request) and answers each with the pid of the child it forked for it and that child's pidfd
attached (the host kills and waits for it by that, so no reused pid is ever signalled). The
request, JSON: ``{"mode": ..., "ops": OPS}``, with the descriptors ``[OUTCOME, ARG]`` attached:

* ``hold``: the child makes a new mount namespace (private: nothing mounted here reaches the
  host's, nothing of later host mounts arrives), runs ``OPS`` in it, writes the outcome to
  ``OUTCOME``, then waits until ``ARG`` (the host's pipe) closes: meanwhile the host opens
  the namespace and its root through ``/proc/PID`` and holds them by descriptor, so no
  process need live to hold it (each live one makes every exec's ``pivot_root`` slower).
* ``enter``: the child enters the namespace ``ARG`` (a descriptor of it) is, runs ``OPS``,
  writes the outcome, exits.

``OPS`` is a JSON list of ``[name, *args]`` (the ``_OPS`` below), run in order; the outcome one
JSON line, then its end: ``{"ok": true}`` or ``{"errno": N, "error": "...", "path": "..."}`` (what ``enter``
mounted before the failure is unmounted; a failed ``hold`` takes its namespace with it).
The server exits when the host's end of its socket closes (the host exited, however).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import signal
import socket
import stat
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # typing costs ~5 ms to import; only mypy needs it (it reads this name as True)
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, path: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def _encode(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_encode(source), _encode(target), _encode(fstype), flags, _encode(data)), target)


def _opened(paths: list[str], fds: list[int]) -> list[str]:
    """Directories as a mount option names them: by this process's descriptors, so the
    sandbox's mount table shows no host path (and no ',' or ':' of a path breaks the options)."""
    named = []
    for path in paths:
        fds.append(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        named.append(f"/proc/self/fd/{fds[-1]}")
    return named


def tmpfs(target: str, size: int, page: int) -> list[str]:
    inodes = max(1024, size // page)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes={inodes},mode=0700")
    return [target]


def mkdir(path: str, mode: int) -> list[str]:
    os.mkdir(path, mode)
    return []


def overlay(target: str, lowers: list[str], upper: str | None, work: str | None, read_only: bool) -> list[str]:
    layers = list(lowers)
    if upper:
        if not work:  # reported to the host as the mount's error, not a crash of the child
            raise OSError(
                errno.EINVAL, "overlay: `upper` needs `work` (on upper's filesystem); pass both or neither", target
            )
        layers += [upper, work]
    fds: list[int] = []
    try:
        named = _opened(layers, fds)
        if upper:
            options = f"lowerdir={':'.join(named[:-2])},upperdir={named[-2]},workdir={named[-1]},index=off,metacopy=off"
        else:
            options = f"lowerdir={':'.join(named)}"
        _mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0), options)
    finally:
        for fd in fds:
            os.close(fd)
    return [target]


def pin(path: str) -> list[str]:
    """A directory at ``path`` for a mount point: right after the overlay is mounted, before
    any program ran, the tree is its layers, so no planted link can be there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    if st is None or not stat.S_ISDIR(st.st_mode):
        os.mkdir(path, 0o755)
    return []


def bind(source: str, target: str, read_only: bool) -> list[str]:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return [target]


def clear(path: str) -> list[str]:
    """Empty directory ``path`` (its own entries removed, no link followed): made anew."""
    shutil.rmtree(path)
    os.mkdir(path, 0o755)
    return []


def umount(target: str) -> list[str]:
    with contextlib.suppress(OSError):  # not mounted (any more): nothing to undo
        _check(_libc.umount2(os.fsencode(target), MNT_DETACH), target)
    return []


_OPS: dict[str, Callable[..., list[str]]] = {
    "tmpfs": tmpfs,
    "mkdir": mkdir,
    "clear": clear,
    "overlay": overlay,
    "pin": pin,
    "bind": bind,
    "umount": umount,
}


def run(ops: list[list[Any]]) -> None:
    """Run ``ops``; on failure unmount what they mounted, last first, and raise."""
    mounted: list[str] = []
    try:
        for name, *args in ops:
            mounted += _OPS[name](*args)
    except BaseException:
        for point in reversed(mounted):
            umount(point)
        raise


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: do the request, write its outcome (then ``hold`` waits)."""
    outcome, arg = fds
    try:
        if request["mode"] == "hold":
            _check(_libc.unshare(CLONE_NEWNS), "unshare")
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
        else:
            _check(_libc.setns(arg, CLONE_NEWNS), "the sandbox's mount namespace")
        run(request["ops"])
    except OSError as e:
        os.write(
            outcome,
            (json.dumps({"errno": e.errno or 0, "error": e.strerror or str(e), "path": e.filename}) + "\n").encode(),
        )
        os._exit(1)
    os.write(outcome, b'{"ok": true}\n')
    os.close(outcome)  # its end: the host reads to it
    if request["mode"] == "hold":
        while os.read(arg, 4096):  # until the host holds the namespace and closes the pipe
            pass
    os._exit(0)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def serve(sock: socket.socket) -> None:
    """Answer requests until the host's end closes; reap children as they end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup descriptor hears it
    watched: list[socket.socket | int] = [sock, wake_r]
    while True:
        ready = select.select(watched, [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap()
        if sock not in ready:
            continue
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 2)
        if not data:
            return  # the host is gone
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    sock.close()
                    _child(json.loads(data), fds)
                finally:
                    os._exit(1)
            pidfd = os.pidfd_open(pid)  # not reaped before this: reaping is this loop's own
            try:
                socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
            finally:
                os.close(pidfd)
        except OSError as e:
            sock.send(json.dumps({"errno": e.errno or 0, "error": e.strerror or str(e)}).encode())
        finally:
            for fd in fds:
                os.close(fd)


def main() -> None:
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: mounter.py serve (the socket on standard input)")
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # so no descriptor a child opens or is sent is 0 before it means it
    os.close(null)
    serve(sock)


if __name__ == "__main__":
    main()
