"""A node's image cache: each image unpacked once, shared read-only, bounded in bytes.

Under the cache's root (``ROLLOUT_RAY_IMAGE_CACHE``, default ``~/.cache/rollout-ray/images``)::

    v1/images/<hex>/rootfs      the unpacked tree: the read-only lower layer of every sandbox on it
    v1/images/<hex>/image.json  its config, size and source; leases lock it; its mtime is the last lease
    v1/locks/<hex>.lock         held by the process unpacking image <hex>
    v1/build/<hex>-<random>/    an unpacking in progress, renamed to images/<hex> when complete
    v1/trash/                   evicted entries on their way out
    v1/snapshots/               setup snapshots over these images (``snapshot.py``)
    v1/kit/<hex>/               the host Python's files image sandboxes relay routes with (``kit.py``)

* Once per node: the first process needing an image takes its lock, unpacks into a build
  directory and renames it into place; a process needing it meanwhile waits for the lock (up
  to ``UNPACK_TIMEOUT``), then finds it there. A build a dead process left is removed by the
  next one to take that lock (or by an eviction).
* Leases: a runtime running over an image holds a shared ``flock`` on its ``image.json``; the
  kernel drops it when the process dies, however it dies. Eviction takes the lock exclusively
  without waiting, so an image in use is never evicted; a lease taken as an eviction moves the
  entry away sees it gone and unpacks it again.
* Bounded: after each unpack, the images least recently leased that no one holds are evicted
  until the cache holds at most ``max_bytes`` (``ROLLOUT_RAY_IMAGE_CACHE_BYTES``, default 10
  GiB), counted as the disk counts them (a block per file, directory and link besides the
  content), setup snapshots included, and at most ``max_inodes`` files and directories
  (``ROLLOUT_RAY_IMAGE_CACHE_INODES``, default 4 million). Images in use are never evicted,
  and snapshots are their owners' to let go, so the cache can exceed its bound while they run.
* Its own directories are opened without following a link: a link planted as ``v1/trash``
  or ``v1/locks`` refuses the cache (nothing is removed through it), and one planted as an
  image's entry is removed and the image unpacked again (never used as that image).
* An entry is filed under the digest it proved: the image's config, as read while unpacking,
  must have the digest the image was named by (``Image.unpack`` checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import os
import stat
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

from .._errors import SandboxError
from .cache_locks import held, lock, still_at
from .files import own_dir, remove_tree
from .image import Image, ImageConfig, locate
from .image_lease import ImageLease
from .kit import kit_dir
from .snapshot import SnapshotStore
from .unpack import Unpacker, usage

DEFAULT_MAX_BYTES = 10 << 30
DEFAULT_MAX_INODES = 4_000_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
UNPACK_TIMEOUT = 3600.0
"""Seconds a process waits for another one unpacking the same image."""
FORMAT = "v1"
"""Bumped when what an unpacked tree holds changes: older trees are then never used."""


@dataclass(frozen=True)
class CacheStatistics:
    images: int
    bytes: int
    in_use: int
    max_bytes: int
    snapshot_bytes: int = 0
    """Bytes the node's setup snapshots take: counted toward ``max_bytes``, not in ``bytes``."""
    inodes: int = 0


class ImageCache:
    """Unpacked images under ``root``, at most ``max_bytes`` of them not in use.

    Args:
        root: the cache's directory (default: ``ROLLOUT_RAY_IMAGE_CACHE``, else
            ``~/.cache/rollout-ray/images``); created 0700, and refused when someone else
            owns it or others may write to it.
        max_bytes: the bound (default: ``ROLLOUT_RAY_IMAGE_CACHE_BYTES``, else 10 GiB).
        max_inodes: the bound in files and directories (default:
            ``ROLLOUT_RAY_IMAGE_CACHE_INODES``, else 4 million).
    """

    def __init__(self, root: str | None = None, max_bytes: int | None = None, max_inodes: int | None = None) -> None:
        self.root = os.path.abspath(root or os.environ.get("ROLLOUT_RAY_IMAGE_CACHE") or _default_root())
        if max_bytes is None:
            max_bytes = int(os.environ.get("ROLLOUT_RAY_IMAGE_CACHE_BYTES") or DEFAULT_MAX_BYTES)
        if max_bytes < 1:
            raise ValueError(f"`max_bytes` of the image cache must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        if max_inodes is None:
            max_inodes = int(os.environ.get("ROLLOUT_RAY_IMAGE_CACHE_INODES") or DEFAULT_MAX_INODES)
        if max_inodes < 1:
            raise ValueError(f"`max_inodes` of the image cache must be >= 1, got {max_inodes}")
        self.max_inodes = max_inodes
        self.snapshots = SnapshotStore(os.path.join(self.root, FORMAT, "snapshots"))
        """The node's setup snapshots over these images (``snapshot.py``)."""
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    def _dir(self, name: str) -> str:
        """The cache's directory ``name`` (made when missing), checked to be a directory of
        this user's and no link: everything under it is then reached through real directories."""
        path = os.path.join(self.root, FORMAT, name)
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        st = os.stat(self.root)  # the root is the user's choice: it may be a link
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SandboxError(
                f"image cache {self.root!r} is not this user's own or others may write to it; "
                f"set ROLLOUT_RAY_IMAGE_CACHE to a directory of yours"
            )
        for own in (os.path.dirname(path), path):
            with contextlib.suppress(FileExistsError):
                os.mkdir(own, 0o700)
            own_dir(own, "image cache directory")
        return path

    def kit(self) -> str:
        """The host Python's files an image sandbox relays its routes with (``kit.py``)."""
        return kit_dir(self._dir("kit"))

    # -- leases ------------------------------------------------------------------------------

    async def acquire(self, spec: str) -> ImageLease:
        """``lease`` off the event loop; this loop's concurrent calls for one image wait for
        the first one (its unpack) without holding a thread each."""
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault(spec, asyncio.Lock()):
            leasing = asyncio.ensure_future(asyncio.to_thread(self.lease, spec))
            try:
                return await asyncio.shield(leasing)
            except asyncio.CancelledError:
                leasing.add_done_callback(_release_late)  # the thread finishes: let its lease go
                raise

    def lease(self, spec: str) -> ImageLease:
        """The unpacked image ``spec`` names (see ``image.locate``), unpacked now if no process
        did it before, held until ``ImageLease.release``.

        Raises:
            SandboxError: the image cannot be found, read, checked or unpacked.
        """
        image = locate(spec)
        hex_key = image.key.removeprefix("sha256:")
        deadline = time.monotonic() + UNPACK_TIMEOUT
        for _ in range(3):  # an eviction may move the entry away between our unpack and lease
            lease = self._try_lease(hex_key, deadline)
            if lease is not None:
                return lease
            with self._build_lock(hex_key, deadline, spec):
                lease = self._try_lease(hex_key, deadline)
                if lease is None:
                    self._build(image, hex_key)
                    lease = self._try_lease(hex_key, deadline)
                    if lease is not None:
                        lease.unpacked = True
            if lease is not None:
                if lease.unpacked:
                    with contextlib.suppress(OSError):  # best effort: the lease stands either way
                        self.evict(keep={hex_key})
                return lease
        raise SandboxError(
            f"image {spec!r} was evicted as soon as it was unpacked, three times; "
            f"raise the image cache's bound (ROLLOUT_RAY_IMAGE_CACHE_BYTES)"
        )

    def _try_lease(self, hex_key: str, deadline: float) -> ImageLease | None:
        meta = os.path.join(self._dir("images"), hex_key, "image.json")
        fd = self._open_meta(hex_key, planted="remove")
        if fd is None:
            return None
        try:
            lock(fd, fcntl.LOCK_SH, deadline, f"image {hex_key[:12]}", UNPACK_TIMEOUT)
            if not still_at(fd, meta):  # evicted between our open and our lock
                os.close(fd)
                return None
            info = json.loads(os.pread(fd, 1 << 20, 0))
            if not stat.S_ISDIR(os.lstat(os.path.join(os.path.dirname(meta), "rootfs")).st_mode):
                raise SandboxError(
                    f"image cache entry {os.path.dirname(meta)!r} holds no rootfs directory; remove the entry"
                )
            os.utime(fd)  # the last lease: what eviction orders by
        except BaseException:
            os.close(fd)
            raise
        config = ImageConfig(tuple(info.get("env") or ()), info.get("working_dir"))
        return ImageLease(
            "sha256:" + hex_key, os.path.join(os.path.dirname(meta), "rootfs"), config, int(info.get("bytes") or 0), fd
        )

    @contextlib.contextmanager
    def _build_lock(self, hex_key: str, deadline: float, spec: str) -> Iterator[None]:
        fd = os.open(os.path.join(self._dir("locks"), f"{hex_key}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            lock(fd, fcntl.LOCK_EX, deadline, f"unpacking image {spec!r}", UNPACK_TIMEOUT)
            yield
        finally:
            os.close(fd)

    def _open_meta(self, hex_key: str, planted: str) -> int | None:
        """A descriptor of entry ``hex_key``'s ``image.json``, reached without following a link
        (``None`` when there is none). An entry or ``image.json`` that is no real directory or
        file is no entry the cache made: ``planted="remove"`` removes it (never following it),
        else it is ignored."""
        images = os.open(self._dir("images"), _DIR_FLAGS)
        try:
            try:
                entry = os.open(hex_key, _DIR_FLAGS, dir_fd=images)
            except FileNotFoundError:
                return None
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if planted == "remove":
                    os.unlink(hex_key, dir_fd=images)  # a link or a file: unlink never follows it
                return None
            try:
                return os.open("image.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=entry)
            except FileNotFoundError:
                return None
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                if planted == "remove":
                    os.unlink("image.json", dir_fd=entry)
                return None
            finally:
                os.close(entry)
        finally:
            os.close(images)

    def _build(self, image: Image, hex_key: str) -> None:
        """Unpack ``image`` into a build directory and rename it into place (its lock held)."""
        builds = self._dir("build")
        for stale in os.listdir(builds):  # left by a process that died unpacking it
            if stale.startswith(f"{hex_key}-"):
                remove_tree(os.path.join(builds, stale))
        build = tempfile.mkdtemp(prefix=f"{hex_key}-", dir=builds)
        try:
            rootfs, scratch = os.path.join(build, "rootfs"), os.path.join(build, "scratch")
            os.mkdir(rootfs, 0o755)
            os.mkdir(scratch, 0o700)
            started = time.monotonic()
            unpacker = Unpacker(
                rootfs, max_bytes=self.max_bytes, max_inodes=self.max_inodes, what=f"image {image.spec!r}"
            )
            config = image.unpack(unpacker, scratch)
            if image.proved != image.key:
                raise SandboxError(
                    f"image {image.spec!r} is named {image.key} but its content proves "
                    f"{image.proved}; refusing it (it was changed, or claims another image's name)"
                )
            remove_tree(scratch)
            size, inodes = usage(build)
            info = {
                "key": image.key,
                "format": image.format,
                "source": image.spec,
                "env": list(config.env),
                "working_dir": config.working_dir,
                "bytes": size,
                "inodes": inodes,
                "unpack_seconds": round(time.monotonic() - started, 3),
            }
            with open(os.path.join(build, "image.json"), "w") as f:
                json.dump(info, f)
            os.rename(build, os.path.join(self._dir("images"), hex_key))
        except BaseException:
            remove_tree(build)
            raise

    # -- eviction ----------------------------------------------------------------------------

    def _entries(self) -> list[tuple[float, str, int, int]]:
        """(last lease, hex key, bytes, inodes) of every unpacked image."""
        found = []
        for hex_key in os.listdir(self._dir("images")):
            with contextlib.suppress(OSError, ValueError):
                fd = self._open_meta(hex_key, planted="ignore")
                if fd is None:
                    continue
                try:
                    info = json.loads(os.pread(fd, 1 << 20, 0))
                    found.append(
                        (os.fstat(fd).st_mtime, hex_key, int(info.get("bytes") or 0), int(info.get("inodes") or 0))
                    )
                finally:
                    os.close(fd)
        return found

    def evict(self, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Evict the least recently leased images no one holds (nor in ``keep``) until the cache,
        its setup snapshots included, is within ``max_bytes`` and ``max_inodes``; clear what
        dead processes left. Returns the evicted keys."""
        entries = sorted(self._entries())
        snapshot_bytes, snapshot_inodes = self.snapshots.usage()
        total = snapshot_bytes + sum(e[2] for e in entries)
        inodes = snapshot_inodes + sum(e[3] for e in entries)
        evicted = []
        for _, hex_key, size, count in entries:
            if total <= self.max_bytes and inodes <= self.max_inodes:
                break
            if hex_key not in keep and self._evict_unused(hex_key):
                total -= size
                inodes -= count
                evicted.append("sha256:" + hex_key)
        self._clear_leftovers()
        return evicted

    def _evict_unused(self, hex_key: str) -> bool:
        entry = os.path.join(self._dir("images"), hex_key)
        fd = self._open_meta(hex_key, planted="ignore")
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # leased: in use
        try:
            # Moved while locked: a lease waiting for the lock then finds the entry gone.
            os.rename(entry, os.path.join(self._dir("trash"), f"{hex_key}-{uuid.uuid4().hex[:8]}"))
        finally:
            os.close(fd)
        return True

    def _clear_leftovers(self) -> None:
        trash = self._dir("trash")
        for name in os.listdir(trash):
            remove_tree(os.path.join(trash, name))
        builds, locks = self._dir("build"), self._dir("locks")
        for name in os.listdir(builds):
            lock_file = os.path.join(locks, name.split("-")[0] + ".lock")
            with contextlib.suppress(OSError), held(lock_file) as free:
                if free:  # nobody is unpacking it: a dead process's
                    remove_tree(os.path.join(builds, name))

    def statistics(self) -> CacheStatistics:
        entries = self._entries()
        in_use = sum(not self._unused(e[1]) for e in entries)
        snapshot_bytes, snapshot_inodes = self.snapshots.usage()
        return CacheStatistics(
            len(entries),
            sum(e[2] for e in entries),
            in_use,
            self.max_bytes,
            snapshot_bytes,
            snapshot_inodes + sum(e[3] for e in entries),
        )

    def _unused(self, hex_key: str) -> bool:
        with contextlib.suppress(OSError):
            fd = self._open_meta(hex_key, planted="ignore")
            if fd is None:
                return False
            with held(fd) as free:
                return free
        return False


def _release_late(leasing: asyncio.Future[ImageLease]) -> None:
    if not leasing.cancelled() and leasing.exception() is None:
        leasing.result().release()


def _default_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rollout-ray", "images")


@functools.cache
def default_image_cache() -> ImageCache:
    """The process's cache, as the environment configures it (see ``ImageCache``)."""
    return ImageCache()
