"""The filesystem a sandbox sees: what programs need, read-only, and the runtime's own dirs.

Every ``SandboxRuntime`` exec gets a new, empty root (read-only once built) holding only:

* the system: ``/usr`` read-only, and ``/bin``, ``/sbin``, ``/lib``, ``/lib32``, ``/lib64``,
  ``/libx32`` as the host has them (symlinks where it has symlinks, e.g. merged-usr);
* a minimal ``/etc`` (``etc_snapshot``): copies of the harmless host entries in
  ``ETC_SHARED`` (dynamic linker, alternatives, time zone, CA certificates, Debian's
  ``python3.X``) — never ``shadow``, ``gshadow``, ``sudoers``, ssh keys, ``ssl/private`` or
  ``machine-id`` — and ``passwd``, ``group``, ``hosts`` linked to the runtime's own (root,
  nobody and the sandbox user, whose home is the work directory);
* fresh ``/proc`` and ``/dev`` (``/dev/shm`` is bwrap's tmpfs: bounded by the memory limit,
  not the disk limit), an empty tmpfs ``/run``, and ``RUN_DIR`` read-only: the runtime's
  route sockets, its ``passwd`` / ``group`` / ``hosts`` and ``forwarder.py``;
* the runtime's work directory (read-write, at its host path) and private ``/tmp``
  (read-write; ``/var/tmp`` links to it), both kept across execs;
* the interpreter that runs ``forwarder.py``: the base installation of the running Python
  (``sys.base_prefix``) read-only at its host path when it is not under ``/usr`` — only that
  subtree, e.g. ``/root/.pyenv/versions/3.11.7``, never its home — and a link at
  ``sys.executable`` to it, so ``[sys.executable, ...]`` commands run;
* when the running Python is a virtual environment (``sys.prefix``, e.g. the checkout's
  ``.venv``), that environment as a program needs it and nothing else of it: its
  ``pyvenv.cfg`` and site-packages read-only at their host paths, and ``python``,
  ``python3``, ``python3.X`` in its ``bin`` (first on ``PATH``) linking to the interpreter.
  So a program run with ``python3`` or ``sys.executable`` imports what the environment has
  installed, as it would on the host with the environment activated; the environment's other
  files (scripts, ``pip.conf``, anything put next to it) and the checkout around it are not
  there. A package installed in editable mode points into the checkout and does not import.

Nothing of ``/root``, ``/home``, the checkout, the host's ``/tmp``, ``/run`` or ``/var``: their
files, credentials and unix sockets do not exist inside. Programs run as ``SANDBOX_UID``
(not 0) in a user namespace, without capabilities. That uid maps to the host uid running
bwrap (root, here), so root-owned host files *would* pass owner checks: what is not bound is
the protection, not the uid.

Why a snapshot and not a bind per ``/etc`` file: every bind mount costs an exec ~0.3 ms here
(20 of them would add ~60 % to a sandbox's start); the snapshot is one bind. It is built once
per machine and ``/etc`` state (named by a fingerprint of the entries' metadata) in the
user's cache directory, and trusted only if it is ours and not writable by others.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import hashlib
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Callable

from . import skeleton
from .skeleton import Bind, Link

SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
HOSTNAME = "rollout-ray"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The system part of every sandboxed program's ``PATH`` (the host's names host directories);
``program_path`` puts a virtual environment's ``bin`` before it."""
RUN_DIR = "/run/rollout-ray"
"""Where the runtime's ``net`` directory is mounted inside: route sockets, ``forwarder.py``,
``passwd``, ``group``, ``hosts``."""
GRADER_DIR = "/.grader"
"""Where the grader's files appear, read-only, once the agent is gone (``grader.py``)."""
FORWARDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forwarder.py")
FORWARDER_INSIDE = f"{RUN_DIR}/forwarder.py"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_SHARED = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "mime.types",
    "os-release",
    "debian_version",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust",
    "terminfo",
    "python3*",
)
"""Host entries of ``/etc`` a sandbox sees (globs; those the host lacks are skipped)."""
OWN_ETC = ("passwd", "group", "hosts")
"""``/etc`` files each runtime writes for itself (the snapshot links them into ``RUN_DIR``)."""
SUBDIRS = ("work", "tmp", "net", "grader")
"""The runtime's directories, made in its base directory at start."""
SNAPSHOT_FORMAT = 1
"""Bumped when ``_fill`` changes what a snapshot holds (it is part of the fingerprint)."""


def namespace_args() -> list[str]:
    """New namespaces (user, mount, PID, network, IPC, UTS, cgroup), an unprivileged uid,
    no capabilities, and the sandbox dies with its parent."""
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        HOSTNAME,
    ]


def _expose(path: str) -> list[str]:
    """``path`` as the host has it: a symlink as the same symlink, else read-only."""
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    if os.path.exists(path):
        return ["--ro-bind", path, path]
    return []


REPLACED = ("/etc", "/proc")
"""Host directories a sandbox replaces with its own: a runtime's directory cannot live there."""


def replaced_parent(root: str) -> str | None:
    """The directory of ``REPLACED`` that holds ``root`` (resolved), or ``None``."""
    real = os.path.realpath(root)
    return next((d for d in REPLACED if _within(real, (d,))), None)


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _visible(path: str) -> bool:
    """Whether ``path`` (resolved) is inside the system directories a sandbox sees."""
    return _within(os.path.realpath(path), tuple(map(os.path.realpath, SYSTEM)))


def interpreter() -> str:
    """The base interpreter running this process: it runs the forwarder inside."""
    return os.path.realpath(sys.executable)


def _base_prefix() -> str:
    return os.path.realpath(sys.base_prefix)


def _python_args() -> list[str]:
    exe, roots = interpreter(), {_base_prefix()}
    # An interpreter outside its base installation brings its own tree, unless it was copied
    # into a virtual environment (then only the file is bound, by _environment).
    if not _within(exe, (*roots, os.path.abspath(sys.prefix))):
        roots.add(os.path.dirname(os.path.dirname(exe)))
    return [a for r in sorted(roots) if not _visible(r) for a in ("--ro-bind", r, r)]


def _venv() -> str | None:
    """The virtual environment running this process, unless a sandbox sees it anyway."""
    if sys.prefix == sys.base_prefix:
        return None
    venv = os.path.abspath(sys.prefix)
    return None if _visible(venv) or _within(os.path.realpath(venv), (_base_prefix(),)) else venv


def _site_packages(venv: str) -> list[str]:
    paths = sysconfig.get_paths()
    found = {os.path.abspath(paths[k]) for k in ("purelib", "platlib")}
    return sorted(p for p in found if _within(p, (venv,)) and os.path.isdir(p))


def program_path() -> str:
    """The ``PATH`` of sandboxed programs: the virtual environment's ``bin`` first, if any."""
    venv = _venv()
    return PATH if venv is None else f"{os.path.join(venv, 'bin')}:{PATH}"


@functools.cache
def _environment() -> tuple[tuple[Bind, ...], tuple[Link, ...]]:
    """The running Python's links and its virtual environment (see the module docstring), as
    binds and links. Made after ``/tmp`` is mounted: a checkout under the host's ``/tmp`` (a CI
    clone) would otherwise be hidden under the runtime's ``/tmp`` (``skeleton.py`` keeps bwrap
    from making their mount points where programs write)."""
    exe, venv = interpreter(), _venv()
    names = {os.path.abspath(sys.executable)} if sys.executable else set()
    binds: list[Bind] = []
    if venv is not None:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        names |= {os.path.join(venv, "bin", n) for n in ("python", "python3", version)}
        if _within(exe, (venv,)):  # an interpreter copied into the environment (--copies)
            binds.append((exe, exe, False))
        binds += [(p, p, False) for p in [os.path.join(venv, "pyvenv.cfg"), *_site_packages(venv)]]
    # Where a link itself is (not what it resolves to): under a system dir it already exists.
    links = [(exe, n) for n in sorted(names) if n != exe and not _within(n, (*SYSTEM, _base_prefix()))]
    return tuple(binds), tuple(links)


def _runtime_mounts(base: str, workdir: str) -> tuple[list[Bind], list[Link]]:
    """The work directory (read-write, at its host path) and the environment."""
    binds, links = _environment()
    return [(workdir, workdir, True), *binds], list(links)


def make_skeletons(base: str, workdir: str, reach: Callable[[str], str] = str) -> None:
    """The runtime's skeletons under its ``/tmp`` (``skeleton.py``), at its start; ``reach``: a
    path of the runtime as this process reaches it (through its mount namespace)."""
    skeleton.make(base, *_runtime_mounts(base, workdir), reach=reach)


@functools.cache
def system_args() -> tuple[str, ...]:
    """The part of the layout every runtime shares: system, ``/etc``, interpreter. The first
    call may build the ``/etc`` snapshot (tens of ms): make it off the event loop."""
    args: list[str] = []
    for path in SYSTEM:
        args += _expose(path)
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run", "--ro-bind", etc_snapshot(), "/etc"]
    return (*args, *_python_args())


def prepare() -> None:
    """Make sure the shared part of the layout exists (a snapshot removed behind our back is
    rebuilt); at a runtime's start, off the event loop."""
    if not os.path.isdir(etc_snapshot()):
        etc_snapshot.cache_clear()
        system_args.cache_clear()
    system_args()


def runtime_args(base: str, workdir: str) -> list[str]:
    """The runtime's part: ``/tmp``, work directory, ``RUN_DIR``; then the root is made
    read-only. ``/var/tmp`` is a relative link (``../tmp``): bwrap builds the root under a
    prefix, where an absolute ``/tmp`` would point out of it and a work directory under
    ``/var/tmp`` could not be made."""
    return [
        "--bind",
        os.path.join(base, "tmp"),
        "/tmp",  # noqa: S108 - the sandbox's own /tmp, bound to a private host directory
        "--symlink",
        "../tmp",
        "/var/tmp",  # noqa: S108 - the sandbox's own /tmp, bound to a private host directory
        "--ro-bind",
        os.path.join(base, "net"),
        RUN_DIR,
        "--ro-bind",
        os.path.join(base, "grader"),
        GRADER_DIR,
        *skeleton.args(base, *_runtime_mounts(base, workdir)),
        "--chdir",
        workdir,
        "--remount-ro",
        "/",
    ]


def write_run_files(directory: str, home: str) -> None:
    """The runtime's own ``passwd``, ``group``, ``hosts`` and ``forwarder.py``."""
    files = {
        "passwd": (
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{home}:/bin/sh\n"
        ),
        "group": f"root:x:0:\nnogroup:x:65534:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\n",
        "hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "forwarder.py": _forwarder_source(),
    }
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


@functools.cache
def _forwarder_source() -> str:
    with open(FORWARDER) as f:
        return f.read()


# -- the /etc snapshot --------------------------------------------------------------------------


def _etc_entries() -> list[str]:
    return sorted({p for pattern in ETC_SHARED for p in glob.glob(os.path.join("/etc", pattern))})


def _fingerprint(entries: list[str]) -> str:
    """Changes when an entry, or anything below one, changes (metadata, link targets)."""
    digest = hashlib.sha256(repr((SNAPSHOT_FORMAT, OWN_ETC, RUN_DIR)).encode())
    for top in entries:
        walk = os.walk(top) if os.path.isdir(top) and not os.path.islink(top) else [("", [], [top])]
        for parent, dirs, names in walk:
            for name in sorted(dirs + names):
                path = os.path.join(parent, name)
                st = os.lstat(path)
                link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
                digest.update(f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\0".encode())
    return digest.hexdigest()[:20]


def _private(directory: str, names: list[str]) -> set[str]:
    """Entries not readable by everyone: left out, whatever the list says (inside, the
    sandbox user passes owner checks on root's files)."""
    return {
        n
        for n in names
        if not os.path.islink(p := os.path.join(directory, n)) and not os.stat(p).st_mode & stat.S_IROTH
    }


def _fill(target: str, entries: list[str]) -> None:
    for path in entries:
        dest = os.path.join(target, os.path.relpath(path, "/etc"))
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), dest)
        elif _private(os.path.dirname(path), [os.path.basename(path)]):
            continue
        elif os.path.isdir(path):
            shutil.copytree(path, dest, symlinks=True, ignore=_private)
        else:
            shutil.copy2(path, dest)
    for name in OWN_ETC:
        os.symlink(f"{RUN_DIR}/{name}", os.path.join(target, name))
    os.chmod(target, 0o755)  # noqa: S103 - a program the sandbox's user runs


def _trusted(path: str) -> bool:
    """Ours, a real directory, and writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _cache_dir() -> str | None:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "rollout-ray")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if _trusted(path) and os.access(path, os.W_OK) else None


@functools.cache
def etc_snapshot() -> str:
    """The directory mounted as a sandbox's ``/etc`` (see the module docstring); built if
    missing. Without a usable cache directory, a private one removed at exit."""
    entries = _etc_entries()
    cache = _cache_dir()
    final = os.path.join(cache, f"etc-{_fingerprint(entries)}") if cache else None
    if final is not None and _trusted(final):
        return final
    building = tempfile.mkdtemp(prefix="rollout-ray-etc-", dir=cache)
    _fill(building, entries)
    if final is None:
        atexit.register(shutil.rmtree, building, True)
        return building
    with contextlib.suppress(OSError):  # another process may have made it meanwhile
        os.rename(building, final)
    if not os.path.exists(building):
        return final
    if _trusted(final):
        shutil.rmtree(building, ignore_errors=True)
        return final
    atexit.register(shutil.rmtree, building, True)  # someone else's: use our own
    return building
