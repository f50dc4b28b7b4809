"""Guardian of a runtime host: cleans up after the host process, however it died.

Run as a plain script (``python guardian.py ROOT TOKEN``), not as a module of the package, so
it starts in milliseconds; it imports only the standard library. It detaches (double fork),
prints its pid, and blocks reading its standard input, a socket from the host (``keeper.py``);
when the host exits — normally, by an exception, or by SIGKILL — the kernel closes the
socket, and the guardian, within ``BUDGET`` seconds:

1. kills every process in the host's cgroups, listed one directory a line in
   ``ROOT/.cgroups`` (``CGROUPS_FILE``), and removes them with their children (each
   runtime's cgroup), deepest first;
2. kills every process carrying ``ROLLOUT_RAY_HOST=TOKEN`` in its environment (every program
   of every runtime the host ran inherits it, even after ``setsid``; the cgroups also find
   those that cleared their environment);
   (The sandboxes' mount namespaces, ``mount_ns.py``, were held by the host's descriptors:
   the kernel closed them, and their mounts went, as the host died);
3. unmounts every mount point left under ROOT in its own namespace, deepest first and
   lazily, so a busy mount cannot keep it from
4. removing ROOT, the directory holding those runtimes' directories;
5. letting go of the leases the host handed it (``hold``): copies of the lock descriptors of
   the cached images and snapshots the host's sandboxes were mounted over. A lease's lock
   lives as long as any copy of its descriptor, so the host's death does not drop it while a
   layer is still mounted: no eviction can remove a layer before step 3 unmounted it. Then it
   removes the snapshots and unfinished snapshot builds no one else holds (``reap_snapshot``).

Over the socket the host sends ``hold ID [STORE ENTRY]`` with a descriptor attached, and ``drop
ID`` when it lets that lease go itself (answered ``dropped`` once the copy is closed).

The helpers are shared with the runtimes, which import this file as a module.
"""

import contextlib
import fcntl
import os
import shutil
import signal
import socket
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


# -- snapshots: removed by whoever lets go of them last ----------------------------------------


def _locked_at_once(path: str) -> int | None:
    """A descriptor of ``path`` locked exclusively, or ``None`` if someone holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def reap_snapshot(store: str, entry_name: str) -> bool:
    """Remove snapshot ``entry_name`` (``<hex>.<generation>``) of the snapshot store at
    ``store`` if no one holds it (its owner's lock and its users' leases all free), and any
    build of its setup ``<hex>`` no one is making. Returns whether the snapshot was removed."""
    hex_key = entry_name.split(".")[0]
    building = _locked_at_once(os.path.join(store, "locks", f"{hex_key}.lock"))
    if building is not None:
        try:
            builds = os.path.join(store, "build")
            for name in os.listdir(builds) if os.path.isdir(builds) else ():
                if name.startswith(f"{hex_key}-"):
                    shutil.rmtree(os.path.join(builds, name), ignore_errors=True)
        finally:
            os.close(building)
    entry = os.path.join(store, "entries", entry_name)
    held = []
    try:
        for name in ("owner", "snapshot.json"):
            fd = _locked_at_once(os.path.join(entry, name))
            if fd is None:
                return False
            held.append(fd)
        trash = os.path.join(store, "trash", f"{entry_name}-{os.urandom(4).hex()}")
        try:
            os.makedirs(os.path.dirname(trash), 0o700, exist_ok=True)
            os.rename(entry, trash)  # while locked: a lease taken meanwhile finds it gone
        except OSError:
            return False
    finally:
        for fd in held:
            os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _serve(channel: socket.socket) -> dict[str, tuple[int, list[str]]]:
    """Keep what the host hands over until it goes (EOF); returns what is still held."""
    held: dict[str, tuple[int, list[str]]] = {}
    room = socket.CMSG_SPACE(4)
    while True:
        try:
            message, ancillary, _, _ = channel.recvmsg(4096, room)
        except InterruptedError:
            continue
        except OSError:
            break
        if not message:
            break
        fds = [
            int.from_bytes(data[:4], sys.byteorder)
            for level, kind, data in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
        ]
        words = message.decode(errors="replace").split()
        if words[:1] == ["hold"] and len(words) >= 2 and fds:
            held[words[1]] = (fds[0], words[2:4])
        elif words[:1] == ["drop"] and len(words) == 2:
            if words[1] in held:
                os.close(held.pop(words[1])[0])
            channel.send(b"dropped")  # the host's lock may be the last one now: it reaps
        else:
            for fd in fds:
                os.close(fd)
    return held


def let_go(held: dict[str, tuple[int, list[str]]]) -> None:
    """Close the held leases, then remove the snapshots no one holds any more."""
    for fd, _ in held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    for _, where in held.values():
        if len(where) == 2:
            with contextlib.suppress(OSError):
                reap_snapshot(*where)


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
    held = _serve(socket.socket(fileno=0))
    clean(root, token)
    let_go(held)  # only now: every layer they lease is unmounted


if __name__ == "__main__":
    main()
