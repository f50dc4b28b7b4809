"""The filesystem an image sandbox sees: its image, a private writable layer, no host file.

At start, in the runtime's own mount namespace (``mount_ns.py``; ``kit_ops``, ``root_ops`` are
what ``mounter.py`` runs there), in the runtime's base directory (its disk-limit tmpfs):

* ``root``: an overlay of the cached image (the read-only lower layer every sandbox on that
  image shares) under the runtime's own ``upper`` directory. Programs may write anywhere;
  their writes land in ``upper``, within the disk limit, seen by no other sandbox, kept
  across execs, gone at stop. ``upper`` is the whole of what the runtime's programs changed:
  frozen, it is a snapshot a later sandbox can start from (``snapshot.py``): its root is then
  remade (``clear_ops``, ``root_ops``) over two lower layers, the snapshot above the image.
* ``root/proc`` and ``root/dev``: directories, where every exec mounts its own ``/proc`` and
  ``/dev``;
* ``root/.rollout-ray`` (``RUN_DIR``): the runtime's ``net`` directory, bound read-only — route
  sockets and ``forwarder.py`` — and in ``host/``, read-only, the base installation of the
  Python running rollout-ray and the directories of its C library. The forwarder runs with
  them through the host's dynamic loader, whatever the image holds (busybox has no Python).
* ``root/.grader`` (``GRADER_DIR``): the runtime's ``grader`` directory, bound read-only: empty
  while the agent runs, where the grader's files appear once it is gone (``grader.py``);
* ``/etc/passwd`` and ``/etc/group``: the image's plus the sandbox user; ``/etc/hosts``: the
  runtime's; the work directory (the image's ``WorkingDir``, else ``/work``) and ``/tmp``
  (1777) made when missing.

Each exec binds ``root`` as its ``/`` (submounts included) and mounts ``/proc`` and ``/dev``, so
bwrap makes no mount point in a directory a program can write: a link a program planted
cannot steer a mount or a ``mkdir`` onto the host (at setup, before its root is pivoted,
bwrap resolves ``../oldroot/...`` to the host's). The four mount points (``PINNED``) cannot be
replaced: a program cannot remove or rename a mount point of its own namespace (``EBUSY``),
and every exec has its own ``/proc`` and ``/dev`` and the ``RUN_DIR`` and ``GRADER_DIR`` binds
mounted on them. The image's
``/usr``, ``/lib`` and ``/etc`` are what programs see; nothing of the host's but ``RUN_DIR``.
Setting all this up is a few mounts at start (root or ``CAP_SYS_ADMIN``, as for the disk limit).
"""

from __future__ import annotations

import contextlib
import os

from .._errors import SandboxError
from .files import components, read_beneath, replace_beneath
from .guardian import unmount
from .image import ImageConfig
from .kit import KIT, RUN_DIR, host_kit  # noqa: F401  (host_kit: the sandbox's)
from .layout import GRADER_DIR, HOSTNAME, PATH, SANDBOX_UID, SANDBOX_USER
from .mount_ns import Op
from .unpack import Unpacker

DEFAULT_WORKDIR = "/work"
SUBDIRS = ("net", "upper", "overlay-work", "root", "grader")
PINNED = ("proc", "dev", RUN_DIR.lstrip("/"), GRADER_DIR.lstrip("/"))
"""Top-level directories of the root that are mount points in every exec (none is writable)."""


def kit_ops(base: str, kit: str) -> list[Op]:
    """Mount the kit (``kit.py``: the host Python's files the relay runs with) under
    ``net/host``, read-only (``mounter.py``'s ops)."""
    point = os.path.join(base, "net", KIT)
    return [
        ["mkdir", point, 0o755],
        ["overlay", point, [os.path.join(kit, "tree"), os.path.join(kit, "empty")], None, None, True],
    ]


def root_ops(base: str, lowers: list[str]) -> tuple[list[Op], list[str]]:
    """``(ops, mount points)``: the overlay of ``lowers`` (topmost first: a setup snapshot, then
    the image) under the runtime's ``upper``, and its pinned mount points (see the module
    docstring); the points to unmount, last first, before the root is remade."""
    root = os.path.join(base, "root")
    ops: list[Op] = [["overlay", root, lowers, os.path.join(base, "upper"), os.path.join(base, "overlay-work"), False]]
    ops += [["pin", os.path.join(root, name)] for name in PINNED]
    points = [root]
    for source, name in ((os.path.join(base, "net"), RUN_DIR), (os.path.join(base, "grader"), GRADER_DIR)):
        ops.append(["bind", source, os.path.join(root, name.lstrip("/")), True])
        points.append(os.path.join(root, name.lstrip("/")))
    return ops, points


def clear_ops(base: str) -> list[Op]:
    """Empty the runtime's ``upper`` and overlay work directories (its overlay unmounted)."""
    return [["clear", os.path.join(base, name)] for name in ("upper", "overlay-work")]


def unmount_all(points: list[str]) -> None:
    """Detach ``points``, the last made first (what is mounted on each goes with it)."""
    for point in reversed(points):
        with contextlib.suppress(OSError):
            unmount(point)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def prepare_root(root: str, config: ImageConfig) -> str:
    """Make the work directory and ``/tmp``, write the sandbox user and hosts into ``/etc``
    (before any program ran). Returns the work directory as programs see it."""
    tree = Unpacker(root, what="image root")
    tmp = _lstat(os.path.join(root, "tmp"))
    if tmp is None:
        os.mkdir(os.path.join(root, "tmp"))
        os.chmod(os.path.join(root, "tmp"), 0o1777)  # noqa: S103 - the sandbox's /tmp is world-writable and sticky, as any /tmp
    wanted = config.working_dir if config.working_dir not in (None, "", "/") else DEFAULT_WORKDIR
    real = tree.resolve(components(os.path.relpath(os.path.join("/", wanted), "/")) or [])
    assert real is not None  # made when missing
    workdir = "/" + "/".join(real)
    what = "preparing the image's /etc"
    etc = tree.resolve(["etc"])
    assert etc is not None
    for name, line in (
        ("passwd", f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{workdir}:/bin/sh"),
        ("group", f"{SANDBOX_USER}:x:{SANDBOX_UID}:"),
    ):
        try:
            text = read_beneath(root, [*etc, name], 1 << 20, what).decode(errors="replace")
        except (FileNotFoundError, SandboxError):  # none, or a link: ours alone
            text = ""
        entries = text.splitlines()
        if any(e.split(":")[2:3] == [str(SANDBOX_UID)] for e in entries):
            continue  # the image has its own user for that id: programs run as it
        replace_beneath(root, [*etc, name], ("\n".join([*entries, line]) + "\n").encode(), what)
    hosts = f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    replace_beneath(root, [*etc, "hosts"], hosts.encode(), what)
    return workdir


def image_args(base: str, workdir: str) -> list[str]:
    """An exec's view: the root with its submounts, its own ``/proc`` and ``/dev``."""
    return ["--bind", os.path.join(base, "root"), "/", "--proc", "/proc", "--dev", "/dev", "--chdir", workdir]


def image_env(config: ImageConfig) -> dict[str, str]:
    """The image's ``Env``, with a standard ``PATH`` where it sets none."""
    env = dict(e.split("=", 1) for e in config.env)
    env.setdefault("PATH", PATH)
    return env
