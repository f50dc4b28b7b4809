"""Makes a sandbox's mounts in the sandbox's own mount namespace (``mount_ns.py``).

Run as a plain script (``python -I -S mounter.py MODE OPS``; standard library only, like
``guardian.py``), because a process can enter another mount namespace only while it runs one
thread, which the host's Python never does:

* ``hold CAT``: make a new mount namespace (private: nothing mounted here reaches the host's,
  nothing of later host mounts arrives), run ``OPS`` in it, print the outcome, then become
  ``CAT`` reading the host's pipe: the namespace's holder. It lives until the host closes
  the pipe, kills it or dies; with it go every mount of the namespace, at once.
* ``enter PID``: enter the namespace PID holds, run ``OPS``, print the outcome, exit.

``OPS`` is a JSON list of ``[name, *args]`` (the ``_OPS`` below), run in order; the outcome one
JSON line: ``{"ok": true}`` or ``{"errno": N, "error": "...", "path": "..."}`` (what ``enter``
mounted before the failure is unmounted; a holder's failure takes its namespace with it).
"""

import contextlib
import ctypes
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from typing import Any

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, path: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _check(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), target)


def _opened(paths: list[str], fds: list[int]) -> list[str]:
    """Directories as a mount option names them: by this process's descriptors, so the
    sandbox's mount table shows no host path (and no ',' or ':' of a path breaks the options)."""
    named: list[str] = []
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
    fds: list[int] = []
    try:
        named = _opened([*lowers, *([upper, work] if upper and work else [])], fds)  # both or neither
        if upper:
            options = (f"lowerdir={':'.join(named[:-2])},upperdir={named[-2]},workdir={named[-1]},"
                       f"index=off,metacopy=off")
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


_OPS: dict[str, Callable[..., list[str]]] = {"tmpfs": tmpfs, "mkdir": mkdir, "clear": clear, "overlay": overlay,
                                             "pin": pin, "bind": bind, "umount": umount}


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


def main() -> None:
    mode, arg, ops = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        if mode == "hold":
            _check(_libc.unshare(CLONE_NEWNS), "unshare")
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
        else:
            fd = os.open(f"/proc/{int(arg)}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            _check(_libc.setns(fd, CLONE_NEWNS), f"/proc/{arg}/ns/mnt")
            os.close(fd)
        run(ops)
    except OSError as e:
        print(json.dumps({"errno": e.errno or 0, "error": e.strerror or str(e), "path": e.filename}), flush=True)
        sys.exit(1)
    print(json.dumps({"ok": True}), flush=True)
    if mode == "hold":
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        os.execv(arg, [arg])  # noqa: S606 - cat: reads the host's pipe until the host closes it


if __name__ == "__main__":
    main()
