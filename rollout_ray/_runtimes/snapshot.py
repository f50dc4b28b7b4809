"""A node's setup snapshots: a group's task setup, run once, frozen, and started from by the rest.

A task whose setup does not depend on the sample (``Task.setup_shareable``) has its setup run
in the first sample's sandbox; that sandbox's writable layer (everything setup wrote, an
overlay upper directory) is then copied here, and every other sample of the group on this
node mounts it as a read-only layer between its own writable layer and the image: it starts
where setup left off, and what it writes stays its own (copy on write).

Under the image cache's root (``v1/snapshots``)::

    entries/<hex>.<gen>/layer          the frozen layer: files, whiteouts and opaque directories as overlay made them
    entries/<hex>.<gen>/snapshot.json  what it is; sandboxes started from it hold shared locks on it (leases)
    entries/<hex>.<gen>/owner          its owner's exclusive lock: the process that built it keeps it for the group
    locks/<hex>.lock             held by the sandbox running the setup, until it froze it (or stopped)
    build/<hex>-<random>/        a snapshot being written, renamed into entries/ when complete
    trash/                       snapshots on their way out

``<hex>`` names the setup (the task's class and data) over one image; ``<gen>`` one freezing of
it (a snapshot whose owner let go is never started from again: its setup may be another
version's by now; the next claim builds a new one beside it). Single flight: the first
sandbox to ``claim`` a setup takes its lock and runs it; the others wait for the lock, then find
the snapshot (or, if the first one's setup failed, one of them runs it). Nothing is kept
longer than someone holds it: a snapshot goes when its owner and every sandbox on it have let
go (``guardian.reap_snapshot``, run by whoever lets go last: a sandbox at stop, the owner when
the schedule moved on, or a dead process's guardian once it has unmounted everything).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import SandboxError
from .files import own_dir, remove_tree
from .guardian import reap_snapshot
from .keeper import Keeper
from .unpack import usage

POLL = 0.02
"""Seconds between looks at a setup another sandbox is running."""
COPY_TIMEOUT = 3600.0


def snapshot_key(image_key: str, setup_key: str) -> str:
    """The hex naming ``setup_key`` (a task's shareable setup) over image ``image_key``."""
    return hashlib.sha256(f"{image_key}\0{setup_key}".encode()).hexdigest()[:32]


@dataclass
class Held:
    """A lock this process holds on a snapshot (a lease, an ownership or a build), with the
    guardian's copy of it when a keeper was given."""

    hex: str
    fd: int
    entry: str = ""
    """Its directory's name under ``entries`` (``<hex>.<gen>``); ``""`` for a build claim."""
    keeper: Keeper | None = None
    kept: str | None = None
    layer: str = ""
    bytes: int = 0
    label: tuple[str, str] = ("", "")
    """What it is a snapshot of: ``(image as the task names it, setup key)``."""
    last_used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        """Let the lock go (idempotent); the guardian's copy first, so ours is the last."""
        if self.keeper is not None and self.kept is not None:
            self.keeper.drop(self.kept)
            self.kept = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SnapshotStore:
    """The snapshots under ``root`` (see the module docstring); ``owned`` are this process's."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.owned: dict[str, Held] = {}

    def _dir(self, name: str) -> str:
        """Directory ``name`` of the store (made when missing), checked to be no link."""
        path = os.path.join(self.root, name)
        for own in (self.root, path):
            with contextlib.suppress(FileExistsError):
                os.mkdir(own, 0o700)
            own_dir(own, "setup snapshot directory")
        return path

    def _hold(self, held: Held, keeper: Keeper | None) -> Held:
        if keeper is not None:
            held.keeper, held.kept = keeper, keeper.hold(held.fd, (self.root, held.entry or held.hex))
        return held

    # -- claiming ----------------------------------------------------------------------------

    async def claim(self, hex_key: str, keeper: Keeper | None, gone: Callable[[], bool]) -> tuple[str, Held]:
        """``("lease", held)``: the snapshot exists, start from ``held.layer``; or ``("build",
        held)``: run the setup, then ``freeze``. Waits while another sandbox runs it; ``gone()``
        true (the claiming runtime stopped) ends the wait with ``SandboxError``; the caller's
        deadline bounds it."""
        while True:
            lease = self._lease(hex_key)
            if lease is not None:
                return "lease", self._hold(lease, keeper)
            fd = os.open(
                os.path.join(self._dir("locks"), f"{hex_key}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
            else:
                lease = self._lease(hex_key)  # finished between our two looks
                if lease is not None:
                    os.close(fd)
                    return "lease", self._hold(lease, keeper)
                return "build", self._hold(Held(hex_key, fd), keeper)
            if gone():
                raise SandboxError(f"setup snapshot {hex_key[:12]}: the runtime waiting for it stopped")
            await asyncio.sleep(POLL)  # another process runs the setup: nothing here can signal us

    def _lease(self, hex_key: str) -> Held | None:
        """A lease on the snapshot of ``hex_key`` that has an owner, if one exists."""
        entries = self._dir("entries")
        for name in sorted(n for n in os.listdir(entries) if n.split(".")[0] == hex_key):
            lease = self._lease_entry(hex_key, os.path.join(entries, name))
            if lease is not None:
                return lease
        return None

    def _lease_entry(self, hex_key: str, entry: str) -> Held | None:
        meta = os.path.join(entry, "snapshot.json")
        try:
            fd = os.open(meta, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails only while it is being removed
            if not os.path.samestat(os.fstat(fd), os.stat(meta)):
                raise FileNotFoundError(meta)
            if not _owned(os.path.join(entry, "owner")):
                raise FileNotFoundError(meta)  # its owner is gone: never started from again
            size = int(json.loads(os.pread(fd, 1 << 16, 0)).get("bytes") or 0)
        except (OSError, ValueError):
            os.close(fd)
            with contextlib.suppress(OSError):
                reap_snapshot(self.root, os.path.basename(entry))
            return None
        return Held(hex_key, fd, os.path.basename(entry), layer=os.path.join(entry, "layer"), bytes=size)

    # -- freezing ----------------------------------------------------------------------------

    def freeze(
        self, build: Held, upper: str, about: dict[str, str], keeper: Keeper | None, label: tuple[str, str] = ("", "")
    ) -> Held:
        """Copy ``upper`` (an idle sandbox's writable layer) into the store as the snapshot
        ``build`` claimed, owned by this process; let the build lock go. Returns the ownership,
        ``label``ed (image, setup key) for ``let_go``."""
        builds = self._dir("build")
        for stale in os.listdir(builds):  # left by a process that died freezing it
            if stale.startswith(f"{build.hex}-"):
                remove_tree(os.path.join(builds, stale))
        work = tempfile.mkdtemp(prefix=f"{build.hex}-", dir=builds)
        try:
            copy_layer(upper, os.path.join(work, "layer"))
            size, inodes = usage(os.path.join(work, "layer"))
            with open(os.path.join(work, "snapshot.json"), "w") as f:
                json.dump({**about, "hex": build.hex, "bytes": size, "inodes": inodes, "created": time.time()}, f)
            owner = os.open(os.path.join(work, "owner"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(owner, fcntl.LOCK_EX)  # nobody else can see it yet
            entry = f"{build.hex}.{uuid.uuid4().hex[:8]}"
            os.rename(work, os.path.join(self._dir("entries"), entry))
        except BaseException:
            remove_tree(work)
            raise
        finally:
            build.close()
        held = self._hold(Held(build.hex, owner, entry, bytes=size, label=label), keeper)
        if build.hex in self.owned:  # one it let go of is never started from: no longer needed
            self.release(self.owned.pop(build.hex))
        self.owned[build.hex] = held
        return held

    # -- letting go ----------------------------------------------------------------------------

    def release(self, held: Held) -> None:
        """Let a lease (or a build claim) go; remove the snapshot if no one holds it any more."""
        held.close()
        with contextlib.suppress(OSError):
            reap_snapshot(self.root, held.entry or held.hex)

    def let_go(self, keep: Callable[[Held], bool] = lambda held: False) -> list[str]:
        """Give up this process's ownership of every snapshot ``keep`` does not want (by its
        ``label``); each goes once no sandbox runs on it. Returns their entries."""
        gone = [self.owned.pop(h) for h, held in list(self.owned.items()) if not keep(held)]
        for held in gone:
            self.release(held)
        return [held.entry for held in gone]

    def usage(self) -> tuple[int, int]:
        """``(bytes, inodes)`` the store's snapshots take (as frozen; what the image cache's
        bound counts beside its images)."""
        entries = self._dir("entries")
        size = inodes = 0
        for name in os.listdir(entries):
            with contextlib.suppress(OSError, ValueError):
                fd = os.open(os.path.join(entries, name, "snapshot.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    info = json.loads(os.pread(fd, 1 << 16, 0))
                finally:
                    os.close(fd)
                size += int(info.get("bytes") or 0)
                inodes += int(info.get("inodes") or 0)
        return size, inodes


def _owned(path: str) -> bool:
    """Whether a process holds the owner lock ``path`` (a snapshot whose owner let go, or died,
    is left to its last users: the setup it froze may be another version's by now)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def copy_layer(source: str, dest: str) -> None:
    """Copy an overlay's writable layer as root, keeping what makes it one: whiteouts (0/0
    character devices), ``trusted.overlay.*`` attributes (opaque directories), owners and
    modes. No link is followed (``cp -a`` copies links as links).

    Raises:
        SandboxError: the copy failed (e.g. the node's disk is full).
    """
    try:
        done = subprocess.run(  # noqa: S603 - coreutils cp from PATH on fixed flags, no shell
            ["cp", "-a", "--no-dereference", "--preserve=all", "--", source, dest],  # noqa: S607 - cp from PATH
            capture_output=True,
            text=True,
            timeout=COPY_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise SandboxError(f"freezing a setup snapshot took over {COPY_TIMEOUT:g}s") from None
    if done.returncode != 0:
        raise SandboxError(f"cannot freeze a setup snapshot: cp: {done.stderr.strip()[-300:]}")
