"""The image cache's file locks: ``flock`` on descriptors, the kernel dropping them with their
process however it dies (leases, builds, eviction: ``image_cache.py``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from .._errors import SandboxError

POLL = 0.02
"""Seconds between tries at a lock another process holds: nothing in this one can signal us."""


def lock(fd: int, mode: int, deadline: float, what: str, timeout: float) -> None:
    """``flock(fd, mode)``, polling until ``deadline`` (``timeout`` seconds from the start). Raises
    ``SandboxError`` past it."""
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise SandboxError(f"{what}: still locked by another process after {timeout:g}s") from None
            time.sleep(POLL)


@contextlib.contextmanager
def held(path: str | int) -> Iterator[bool]:
    """Whether ``path`` (or an open descriptor, then closed) could be locked exclusively at
    once (held for the block if so)."""
    fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def still_at(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
