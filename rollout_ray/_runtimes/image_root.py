"""An image sandbox's filesystem as its runtime holds it: the image's lease, the mounts, and
the setup snapshot it started from or is building.

``image_layout`` says what the mounts are; ``snapshot`` how a group's setup is shared. This is
the state in between, owned by one ``SandboxRuntime``: what it leases (each lease handed to
the host's guardian too, when it has one: ``keeper.py``), what it mounted (in the runtime's
own mount namespace: ``mount_ns.py``), and in what order it lets them go — the namespace
first (every mount with it), then the leases, so no layer goes while mounted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from .._errors import SandboxError
from .image_cache import ImageCache
from .image_layout import clear_ops, kit_ops, prepare_root, root_ops
from .image_lease import ImageLease
from .keeper import Keeper
from .mount_ns import MountNamespace, Op
from .snapshot import Held, snapshot_key


class ImageRoot:
    """The image ``lease`` (of image ``spec``) mounted in ``base`` (a runtime's directory), from ``cache``."""

    def __init__(self, base: str, lease: ImageLease, cache: ImageCache, keeper: Keeper | None, spec: str) -> None:
        self.base = base
        self.spec = spec
        self.lease = lease
        self._cache = cache
        self._keeper = keeper
        self._kept = keeper.hold(lease.fd) if keeper is not None and lease.fd is not None else None
        self._root: list[str] = []
        self._ns: MountNamespace | None = None
        self.snapshot: str | None = None
        """The setup snapshot the root stands on (its entry, ``<hex>.<gen>``), if any."""
        self._snapshot_lease: Held | None = None
        self._building: Held | None = None
        self._setup_key = ""

    @property
    def rootfs(self) -> str:
        return os.path.join(self.base, "root")

    def ops(self) -> list[Op]:
        """What mounts the root over the image, for the runtime's namespace to run."""
        root, self._root = root_ops(self.base, [self.lease.rootfs])
        return [*kit_ops(self.base, self._cache.kit()), *root]

    def mounted(self, ns: MountNamespace) -> str:
        """The ``ops`` ran in ``ns``, now the root's: prepare it; returns the work directory as
        programs see it."""
        self._ns = ns
        return prepare_root(ns.path(self.rootfs), self.lease.config)

    # -- a group's shared setup --------------------------------------------------------------------

    async def claim(self, setup_key: str, gone: Callable[[], bool]) -> tuple[str, str | None]:
        """Take the setup ``setup_key`` over this image: ``("snapshot", hex)`` when the root now
        stands on its snapshot (nothing of this runtime's own writes is kept: call it before
        its setup ran anything), ``("build", None)`` when this runtime runs it and ``freeze``s
        it. Waits while another runtime of the node runs it (bounded by the caller)."""
        if self.snapshot is not None or self._building is not None:
            raise SandboxError("a runtime claims one setup, before it ran anything")
        store = self._cache.snapshots
        hex_key = snapshot_key(self.lease.key, setup_key)
        outcome, held = await store.claim(hex_key, self._keeper, gone)
        if outcome == "build":
            self._building, self._setup_key = held, setup_key
            return "build", None
        self._snapshot_lease = held
        await asyncio.to_thread(self._restack, held.layer)
        self.snapshot = held.entry
        return "snapshot", held.entry

    def _restack(self, layer: str) -> None:
        """Remake the root over ``layer`` above the image, with an empty writable layer."""
        assert self._ns is not None
        unmount: list[Op] = [["umount", point] for point in reversed(self._root)]
        self._root = []
        ops, points = root_ops(self.base, [layer, self.lease.rootfs])
        self._ns.run([*unmount, *clear_ops(self.base), *ops])  # one mounter child: a fork saved
        self._root = points
        prepare_root(self._ns.path(self.rootfs), self.lease.config)

    def freeze(self) -> str | None:
        """Freeze the writable layer as the snapshot this runtime claimed to build (its
        programs done); returns its hex, or ``None`` if it claimed none."""
        if self._building is None:
            return None
        building, self._building = self._building, None
        assert self._ns is not None
        held = self._cache.snapshots.freeze(
            building,
            self._ns.path(os.path.join(self.base, "upper")),
            {"setup": self._setup_key, "image": self.lease.key},
            self._keeper,
            label=(self.spec, self._setup_key),
        )
        return held.entry

    # -- letting go ----------------------------------------------------------------------------

    def release(self) -> None:
        """End the mount namespace (every mount goes with it), then let the snapshot, the
        build claim and the image go (idempotent)."""
        if self._ns is not None:
            self._ns.close()
        self._root = []
        store = self._cache.snapshots
        for held in (self._snapshot_lease, self._building):
            if held is not None:
                store.release(held)
        self._snapshot_lease = self._building = None
        if self._kept is not None and self._keeper is not None:
            self._keeper.drop(self._kept)
            self._kept = None
        self.lease.release()
