"""The filesystem an image sandbox sees: its image, a private writable layer, no host file.

At start, on the host (``mount_kit``, ``mount_root``), in the runtime's base directory (its
disk-limit tmpfs):

* ``root``: an overlay of the cached image (the read-only lower layer every sandbox on that
  image shares) under the runtime's own ``upper`` directory. Programs may write anywhere;
  their writes land in ``upper``, within the disk limit, seen by no other sandbox, kept
  across execs, gone at stop. ``upper`` is the whole of what the runtime's programs changed:
  frozen, it is a snapshot a later sandbox can start from (``snapshot.py``): its root is then
  remade (``clear_layer``, ``mount_root``) over two lower layers, the snapshot above the image.
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
import ctypes
import os
import stat
from collections.abc import Iterator

from .._errors import SandboxError
from .files import components, read_beneath, remove_tree, replace_beneath
from .guardian import unmount
from .image import ImageConfig
from .kit import KIT, RUN_DIR, host_kit  # noqa: F401  (host_kit: the sandbox's)
from .layout import GRADER_DIR, HOSTNAME, PATH, SANDBOX_UID, SANDBOX_USER
from .unpack import Unpacker

DEFAULT_WORKDIR = "/work"
SUBDIRS = ("net", "upper", "overlay-work", "root", "grader")
PINNED = ("proc", "dev", RUN_DIR.lstrip("/"), GRADER_DIR.lstrip("/"))
"""Top-level directories of the root that are mount points in every exec (none is writable)."""
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    encode = (lambda s: None if s is None else os.fsencode(s))
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _bind(source: str, target: str, *, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _fd_path(fd: int) -> str:
    """A directory as a mount option names it: by this process's descriptor, so the sandbox's
    mount table shows no host path (and no ',' or ':' of a path can break the options)."""
    return f"/proc/self/fd/{fd}"


@contextlib.contextmanager
def _opened(paths: list[str]) -> Iterator[list[str]]:
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        yield [_fd_path(fd) for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


def mount_kit(base: str, kit: str) -> list[str]:
    """The kit (``kit.py``: the host Python's files the relay runs with) under ``net/host``,
    read-only. Returns the mount points made; none are left when it raises."""
    point = os.path.join(base, "net", KIT)
    os.mkdir(point, 0o755)
    with _opened([os.path.join(kit, "tree"), os.path.join(kit, "empty")]) as (tree, empty):
        _mount("overlay", point, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, f"lowerdir={tree}:{empty}")
    return [point]


def mount_root(base: str, lowers: list[str]) -> list[str]:
    """The overlay of ``lowers`` (topmost first: a setup snapshot, then the image) under the
    runtime's ``upper``, and its pinned mount points (see the module docstring).

    Returns the mount points made, to ``unmount_all`` at stop; none are left when it raises.
    """
    root = os.path.join(base, "root")
    mounted: list[str] = []
    try:
        with _opened([*lowers, os.path.join(base, "upper"), os.path.join(base, "overlay-work")]) as named:
            options = (f"lowerdir={':'.join(named[:-2])},upperdir={named[-2]},workdir={named[-1]},"
                       f"index=off,metacopy=off")
            _mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV, options)
        mounted.append(root)
        # Before any program ran, the tree is its layers: only their own links can be there,
        # and these names are top-level, so no link is followed on the way to them.
        for name in PINNED:
            point = os.path.join(root, name)
            st = _lstat(point)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                os.unlink(point)
            if st is None or not stat.S_ISDIR(st.st_mode):
                os.mkdir(point, 0o755)
        for source, name in ((os.path.join(base, "net"), RUN_DIR), (os.path.join(base, "grader"), GRADER_DIR)):
            _bind(source, os.path.join(root, name.lstrip("/")), read_only=True)
            mounted.append(os.path.join(root, name.lstrip("/")))
    except BaseException:
        unmount_all(mounted)
        raise
    return mounted


def clear_layer(base: str) -> None:
    """Empty the runtime's ``upper`` and overlay work directories (its overlay unmounted)."""
    for name in ("upper", "overlay-work"):
        path = os.path.join(base, name)
        remove_tree(path)
        os.mkdir(path, 0o755)


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
        os.chmod(os.path.join(root, "tmp"), 0o1777)
    wanted = config.working_dir if config.working_dir not in (None, "", "/") else DEFAULT_WORKDIR
    real = tree.resolve(components(os.path.relpath(os.path.join("/", wanted), "/")) or [])
    assert real is not None  # made when missing
    workdir = "/" + "/".join(real)
    what = "preparing the image's /etc"
    etc = tree.resolve(["etc"])
    assert etc is not None
    for name, line in (("passwd", f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{workdir}:/bin/sh"),
                       ("group", f"{SANDBOX_USER}:x:{SANDBOX_UID}:")):
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
