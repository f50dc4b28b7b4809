"""ImageLease: one runtime's hold on an image of the node's cache (``image_cache.py``).

The hold is a shared ``flock`` on the image's ``image.json``, kept by an open descriptor: the
cache's eviction takes that lock exclusively without waiting, so an image held is never
evicted, and the kernel drops the hold when the process dies, however it dies.
"""

from __future__ import annotations

import os

from .image import ImageConfig


class ImageLease:
    """An unpacked image a runtime runs over; not evicted until ``release`` (or process exit)."""

    def __init__(self, key: str, rootfs: str, config: ImageConfig, size: int, fd: int) -> None:
        self.key = key
        self.rootfs = rootfs
        self.config = config
        self.bytes = size
        self.unpacked = False
        """Whether this lease's call unpacked the image (else it was in the cache)."""
        self._fd: int | None = fd

    @property
    def fd(self) -> int | None:
        """The descriptor holding the lease's lock (``None`` once released)."""
        return self._fd

    def release(self) -> None:
        """Let the image be evicted again (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # drops the shared lock
            self._fd = None
