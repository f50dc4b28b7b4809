"""The host's Python as an image sandbox holds it: only the files the route relay runs with.

An image sandbox runs ``forwarder.py`` (the relay to its routes) on the host's Python, through
the host's dynamic loader, whatever the image holds. It needs the interpreter, the standard
library modules the relay imports, their extension modules and the C libraries: a few dozen
files. Binding the host's installation would show it all (its site-packages: every package
of the host's environment; with a system Python, the whole of ``/usr``), and every bind
names its host path in the sandbox's mount table.

So, once per node and host Python (``kit_dir``), those files are linked (or copied, across
filesystems) into a directory of the image cache, laid out as the installation is (Python
finds its standard library from its executable's place): ``python/...`` for files of the
installation, ``lib/`` for the C libraries outside it. Which files: what a probe run of the
interpreter (``-I -S``, as the relay runs) loaded after importing the relay, and ``libgcc_s``
beside its libc (glibc loads it lazily when a thread ends, as the relay's do), with their
bytecode caches (the relay compiles nothing at each exec), plus every codec (the locale
picks one at startup). Each sandbox mounts the directory read-only as an
overlay named by descriptor (``/proc/self/fd/N``), so its mount table names no host path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from .._errors import SandboxError
from .files import own_dir
from .layout import FORWARDER, interpreter

RUN_DIR = "/.rollout-ray"
"""Where the runtime's ``net`` directory is inside (top level: it cannot be moved away)."""
KIT = "host"
"""Subdirectory of ``RUN_DIR`` where the kit is, read-only."""
KIT_FORMAT = 3
"""Bumped when what a kit directory holds changes."""
PROBE_TIMEOUT = 60.0
_LIBC_NAMES = (
    "ld-",
    "libc.",
    "libc-",
    "libm.",
    "libm-",
    "libpython",
    "libpthread",
    "libdl",
    "libutil",
    "librt",
    "libgcc_s",
)
_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("rollout_ray_forwarder", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import encodings
loaded = list(sys.modules.values())
modules = [getattr(m, a, None) for m in loaded for a in ("__file__", "__cached__")]
with open("/proc/self/maps") as f:
    mapped = [line.split(maxsplit=5)[-1].strip() for line in f if line.count(" ") >= 5]
print(json.dumps({"modules": [m for m in modules if m], "mapped": mapped, "encodings": encodings.__path__[0]}))
"""


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _prefix(exe: str) -> str:
    prefix = os.path.realpath(sys.base_prefix)
    # An interpreter outside its base installation brings its own tree.
    return prefix if _within(exe, prefix) else os.path.dirname(os.path.dirname(exe))


@functools.cache
def host_kit() -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """``(files, argv)``: the host files the relay needs with their place in the kit, and the
    command prefix that runs the kit's Python inside (under ``RUN_DIR/host``) through its
    loader. Found by a probe run of the interpreter, once per process.

    Raises:
        SandboxError: the probe failed, or shows no dynamic loader.
    """
    exe = interpreter()
    why = f"no answer within {PROBE_TIMEOUT:g}s"
    try:
        done = subprocess.run(  # noqa: S603 - the sandbox interpreter probing our forwarder, no shell
            [exe, "-I", "-S", "-c", _PROBE, FORWARDER],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        why = done.stderr.strip()[-300:]
        found = json.loads(done.stdout)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        raise SandboxError(
            f"image sandboxes run the route relay on this host's Python ({exe}), which could not load it: {why}"
        ) from None
    prefix = _prefix(exe)
    wanted = {exe}
    wanted.update(os.path.realpath(m) for m in found["modules"] if os.path.isfile(m))
    with os.scandir(found["encodings"]) as codecs:
        for codec in (e.path for e in codecs if e.is_file() and e.name.endswith(".py")):
            wanted.add(os.path.realpath(codec))
            compiled = importlib.util.cache_from_source(codec)  # the relay compiles nothing
            if os.path.isfile(compiled):
                wanted.add(os.path.realpath(compiled))
    libraries = {
        os.path.realpath(p)
        for p in found["mapped"]
        if p.startswith("/") and os.path.basename(p).startswith(_LIBC_NAMES) and os.path.isfile(p)
    }
    # The relay's threads end, and glibc then loads libgcc_s (pthread_exit's unwinder) lazily,
    # after any probe: without it the relay aborts ("libgcc_s.so.1 must be installed for
    # pthread_exit to work"). It lives beside libc.
    libc = next((p for p in libraries if os.path.basename(p).startswith(("libc.", "libc-"))), None)
    if libc is not None:
        beside = os.path.join(os.path.dirname(libc), "libgcc_s.so.1")
        if os.path.isfile(beside):
            libraries.add(os.path.realpath(beside))
    wanted.update(libraries)
    files = {}
    for path in sorted(wanted):
        inside = (
            os.path.join("python", os.path.relpath(path, prefix))
            if _within(path, prefix)
            else (os.path.join("lib", os.path.basename(path)))
        )
        files[path] = inside
    loader = next((p for p in sorted(libraries) if os.path.basename(p).startswith("ld-")), None)
    if loader is None:
        raise SandboxError(
            "image sandboxes need the host's dynamic loader (ld-*.so), which the host's Python "
            "does not show in /proc/self/maps"
        )
    base = os.path.join(RUN_DIR, KIT)
    library_path = ":".join(dict.fromkeys(os.path.dirname(os.path.join(base, files[p])) for p in sorted(libraries)))
    argv = (os.path.join(base, files[loader]), "--library-path", library_path, os.path.join(base, files[exe]))
    return tuple(files.items()), argv


def kit_dir(root: str) -> str:
    """The kit's directory under ``root`` (the image cache's ``v1/kit``), made once per host
    Python (named by what it holds); its ``tree`` is what the sandbox mounts, its ``empty``
    the overlay's second layer (a read-only overlay needs two)."""
    files, _ = host_kit()
    final = os.path.join(root, _kit_name())
    if os.path.isdir(os.path.join(final, "tree")):
        own_dir(final, "image sandbox kit")
        return final
    work = tempfile.mkdtemp(prefix=f"{_kit_name()}-", dir=root)
    try:
        os.mkdir(os.path.join(work, "empty"), 0o755)
        for path, inside in files:
            dest = os.path.join(work, "tree", inside)
            os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
            try:
                os.link(path, dest)  # the same file, no copy, when on one filesystem
            except OSError:
                shutil.copy2(path, dest)
        _open_dirs(os.path.join(work, "tree"))
        try:
            os.rename(work, final)
        except OSError:  # another process made it meanwhile
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    own_dir(final, "image sandbox kit")
    return final


@functools.cache
def _kit_name() -> str:
    """What the kit holds, as a name: the host's files, at their versions (an upgraded Python
    gets a new kit). Once per process: a sandbox start stats nothing."""
    about = [KIT_FORMAT, *((path, inside, *_version(path)) for path, inside in host_kit()[0])]
    return hashlib.sha256(json.dumps(about).encode()).hexdigest()[:32]


def _version(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _open_dirs(tree: str) -> None:
    """Directories of the kit readable by the sandbox user (mkdtemp made its root 0700)."""
    for parent, dirs, _ in os.walk(tree):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(parent, d), 0o755)  # noqa: S103 - the kit is read and run by the sandbox's user
    os.chmod(tree, 0o755)  # noqa: S103 - the kit is read and run by the sandbox's user
