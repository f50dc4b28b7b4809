"""A sandbox's directory on the host: its disk limit, the directories its layout binds, and an
image's root — what is mounted, in the runtime's own mount namespace (``mount_ns.py``), so
that no exec of any other sandbox copies it."""

from __future__ import annotations

import os

from .._errors import SandboxError
from .disk import PAGE
from .image_layout import SUBDIRS as IMAGE_SUBDIRS
from .image_root import ImageRoot
from .layout import SUBDIRS, make_skeletons, prepare, write_run_files
from .mount_ns import MountNamespace, Op


def system_dirs(base: str, disk_limit: int | None, what: str) -> tuple[MountNamespace | None, bool]:
    """The directories of a sandbox over the host's system in ``base``, on a tmpfs of
    ``disk_limit`` bytes (when given) in a mount namespace of its own; returns that namespace
    and whether the limit is mounted.

    Raises:
        SandboxError: the tmpfs cannot be mounted (naming ``what``, the runtime).
    """
    ns = None
    if disk_limit is not None:
        try:
            ns = MountNamespace([["tmpfs", base, disk_limit, PAGE]])
        except OSError as e:
            raise SandboxError(
                f"cannot mount the disk limit of {what}: {e}; pass disk_limit=None to run without one"
            ) from e

    def reach(path: str) -> str:
        return ns.path(path) if ns is not None else path

    here = reach(base)
    for sub in SUBDIRS:
        os.mkdir(os.path.join(here, sub), 0o755 if sub == "grader" else 0o700)
    write_run_files(os.path.join(here, "net"), home=os.path.join(base, "work"))
    prepare()  # builds the /etc snapshot once per process: here, off the event loop
    make_skeletons(base, os.path.join(base, "work"), reach=reach)
    return ns, ns is not None


def image_dirs(base: str, image: ImageRoot, disk_limit: int | None, what: str) -> tuple[MountNamespace, bool, str]:
    """The disk limit, directories and mounts of an image's root in ``base``, all in a mount
    namespace of the runtime's own; returns it, whether the limit is mounted, and the work
    directory (the image's ``WorkingDir``, else ``/work``).

    Raises:
        SandboxError: something cannot be mounted (naming ``what``, the image and runtime).
    """
    ops: list[Op] = []
    if disk_limit is not None:
        ops.append(["tmpfs", base, disk_limit, PAGE])
    ops += [["mkdir", os.path.join(base, sub), 0o755] for sub in IMAGE_SUBDIRS]
    try:
        ops += image.ops()
        ns = MountNamespace(ops)
        write_run_files(ns.path(os.path.join(base, "net")), home=os.path.join(base, "work"))
        return ns, disk_limit is not None, image.mounted(ns)
    except OSError as e:
        raise SandboxError(
            f"cannot mount {what}: {e}; an image sandbox needs the right to mount (root or CAP_SYS_ADMIN)"
        ) from e
