"""A sandbox's disk limit: its base directory (work dir, ``/tmp``, ...) on a sized tmpfs.

Mounted by the runtime (root, or ``CAP_SYS_ADMIN``, is needed) in its own mount namespace
(``mount_ns.py``; ``mount_tmpfs`` here is the probe of that right), so its programs can fill
it but never the host's filesystem. Its pages live in memory and are charged to the
memory cgroup of whoever wrote them: a sandboxed program's writes count against the sandbox's
``memory_limit`` too, the runtime's own ``write`` against the host process's. Gone with the
namespace at stop, or as a dead host's descriptors of that namespace close.
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile

from .guardian import unmount

MS_NOSUID = 2
MS_NODEV = 4
PAGE = os.sysconf("SC_PAGE_SIZE")


def mount_tmpfs(path: str, size: int) -> None:
    """Mount a tmpfs of ``size`` bytes (and one inode per page, at least 1024) on ``path``,
    mode 0700. Raises ``OSError``."""
    libc = ctypes.CDLL(None, use_errno=True)
    inodes = max(1024, size // PAGE)
    options = f"size={size},nr_inodes={inodes},mode=0700".encode()
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def full(path: str) -> bool:
    """Whether the filesystem of ``path`` has no block or no inode left."""
    st = os.statvfs(path)
    return st.f_bavail == 0 or st.f_favail == 0


@functools.cache
def mount_unavailable() -> str | None:
    """Why this process cannot mount a tmpfs, or ``None`` if it can."""
    probe = tempfile.mkdtemp(prefix="rollout-ray-mount-probe-")
    try:
        mount_tmpfs(probe, 1 << 20)
    except OSError as e:
        os.rmdir(probe)
        return f"cannot mount a tmpfs for the disk limit ({e.strerror}); pass disk_limit=None"
    unmount(probe)
    os.rmdir(probe)
    return None
