"""Guardian of a runtime host: cleans up after the host process, however it died.

Run as a plain script (``python guardian.py ROOT TOKEN``), not as a module of the package, so
it starts in milliseconds; it imports only the standard library. It detaches (double fork),
prints its pid, and blocks reading its standard input, a pipe from the host; when the host
exits — normally, by an exception, or by SIGKILL — the kernel closes the pipe, and the
guardian, within ``BUDGET`` seconds:

1. kills every process in the host's cgroups, listed one directory a line in
   ``ROOT/.cgroups`` (``CGROUPS_FILE``), and removes them with their children (each
   runtime's cgroup), deepest first;
2. kills every process carrying ``ROLLOUT_RAY_HOST=TOKEN`` in its environment (every program
   of every runtime the host ran inherits it, even after ``setsid``; the cgroups also find
   those that cleared their environment);
3. unmounts every mount point under ROOT (a sandbox's disk-limit tmpfs), deepest first and
   lazily, so a busy mount cannot keep it from
4. removing ROOT, the directory holding those runtimes' directories.

The helpers are shared with the runtimes, which import this file as a module.
"""

import contextlib
import os
import shutil
import signal
import sys
import time

HOST_MARKER = "ROLLOUT_RAY_HOST"
CGROUPS_FILE = ".cgroups"
"""Name, in a host's root, of the file listing the host's parent cgroups."""
BUDGET = 5.0
"""Seconds the guardian keeps killing before it removes what it can."""
MNT_DETACH = 2


def pids_with_marker(key: str, value: str) -> list[int]:
    """Pids (not ours) whose initial environment holds ``key=value``; zombies have none."""
    needle = f"{key}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # vanished, or not ours to read
            continue
    return found


def _cgroup_pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _subtree(path: str) -> list[str]:
    """``path`` and the cgroups below it, deepest first."""
    return [d for d, _, _ in os.walk(path, topdown=False)]


def kill_cgroups(dirs: list[str], budget: float) -> list[str]:
    """SIGKILL every process in the cgroups ``dirs`` and their children, and remove them all,
    deepest first, until none is left or ``budget`` seconds passed; returns those left."""
    deadline = time.monotonic() + budget  # real time: processes die in real time
    left = [d for d in dirs if os.path.isdir(d)]
    while left:
        for top in left:
            for d in _subtree(top):
                with contextlib.suppress(OSError), open(os.path.join(d, "cgroup.kill"), "w") as f:
                    f.write("1")  # v2: kills the subtree at once, forks included
                for pid in _cgroup_pids(d):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):  # busy until its last process has exited
                    os.rmdir(d)
        left = [d for d in left if os.path.isdir(d)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.002)  # killed processes leave their cgroup within microseconds to ms
    return left


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")


def mounts_under(root: str) -> list[str]:
    """Mount points at or under ``root`` in this mount namespace, deepest first."""
    root = os.path.realpath(root)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == root or point.startswith(root.rstrip("/") + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount(path: str) -> None:
    """Detach the mount at ``path`` (lazily: a file still open in it keeps its pages alive,
    not the mount point). Raises ``OSError``."""
    import ctypes  # here: the guardian's start stays fast

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def unmount_under(root: str) -> None:
    for point in mounts_under(root):
        with contextlib.suppress(OSError):
            unmount(point)


def clean(root: str, token: str, budget: float = BUDGET) -> None:
    deadline = time.monotonic() + budget
    try:
        with open(os.path.join(root, CGROUPS_FILE)) as f:
            cgroups = [line.strip() for line in f if line.strip()]
    except OSError:  # the host removed them itself, or never had any
        cgroups = []
    kill_cgroups(cgroups, budget)
    while True:
        pids = pids_with_marker(HOST_MARKER, token)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.01)  # killed processes keep their environ until they finish exiting
    if os.path.isdir(root):
        unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    root, token = sys.argv[1], sys.argv[2]
    # Detach: Ray kills a worker's direct children when the worker dies, which would take
    # the guardian down with the host it guards. The grandchild is nobody's direct child.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host's Ctrl-C is not ours to obey
    sys.stdout.write(f"{os.getpid()}\n")
    sys.stdout.flush()
    sys.stdout.close()
    while sys.stdin.buffer.read(65536):
        pass
    clean(root, token)


if __name__ == "__main__":
    main()
