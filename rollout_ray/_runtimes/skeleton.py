"""Mount points under a sandbox's ``/tmp``, made on the host where no program writes.

A sandbox over the host's system binds its work directory at its host path, and the running
virtual environment at its own; with a runtime's root under ``/tmp`` (the default) or a
checkout there, those paths lie in the runtime's ``/tmp``, which programs write and keep
across execs. bwrap makes the mount points on the way there before it pivots its root, when
``../oldroot/...`` is the host's: a link a program planted at ``/tmp/x`` would steer that
``mkdir`` (or a ``--symlink``) onto the host, as root.

So each top directory under ``/tmp`` that holds mount points gets a skeleton: a directory of
the runtime's own on the host (``base/skeleton/<i>``, never shown writable to a program)
holding the directories, empty files and links on the way to them, bound read-only over
that top directory before them. bwrap then makes nothing under a directory programs write:
only the top directory itself, whose planted link at worst binds the skeleton elsewhere in
the sandbox's own mount namespace (or fails that sandbox's exec).
"""

from __future__ import annotations

import os
from collections.abc import Callable

WRITABLE = ("/tmp", "/var/tmp")  # noqa: S108 - the sandbox's writable directories, private binds
"""Where programs write, among the places bwrap makes mount points."""

Bind = tuple[str, str, bool]
"""``(host source, path inside, writable)``."""
Link = tuple[str, str]
"""``(target, path inside)``."""


def writable_top(path: str) -> str | None:
    """The directory right under ``/tmp`` (or ``/var/tmp``) that holds ``path``, if any."""
    for place in WRITABLE:
        if path.startswith(place + "/"):
            return os.path.join(place, path[len(place) + 1 :].split("/")[0])
    return None


def tops(binds: list[Bind], links: list[Link]) -> list[str]:
    """The top directories the skeletons go over, in a stable order."""
    dests = [dest for _, dest, _ in binds] + [name for _, name in links]
    return sorted({top for dest in dests if (top := writable_top(dest)) is not None})


def make(base: str, binds: list[Bind], links: list[Link], reach: Callable[[str], str] = str) -> None:
    """Build the skeletons in runtime directory ``base`` (at its start); ``reach``: a path as
    this process reaches it (a runtime's own mount namespace: ``mount_ns.py``)."""
    for i, top in enumerate(tops(binds, links)):
        skeleton = reach(os.path.join(base, "skeleton", str(i)))
        os.makedirs(skeleton, 0o755)

        def inside(path: str, top: str = top, skeleton: str = skeleton) -> str:
            return os.path.join(skeleton, os.path.relpath(path, top))

        for source, dest, _ in binds:
            if writable_top(dest) == top:
                os.makedirs(os.path.dirname(inside(dest)), 0o755, exist_ok=True)
                if os.path.isdir(reach(source)):
                    os.makedirs(inside(dest), 0o755, exist_ok=True)
                else:
                    open(inside(dest), "a").close()
        for target, name in links:
            if writable_top(name) == top:
                os.makedirs(os.path.dirname(inside(name)), 0o755, exist_ok=True)
                os.symlink(target, inside(name))


def args(base: str, binds: list[Bind], links: list[Link]) -> list[str]:
    """bwrap's arguments for ``binds`` and ``links``, the skeletons first."""
    out: list[str] = []
    for i, top in enumerate(tops(binds, links)):
        out += ["--ro-bind", os.path.join(base, "skeleton", str(i)), top]
    for source, dest, writable in binds:
        out += ["--bind" if writable else "--ro-bind", source, dest]
    for target, name in links:
        if writable_top(name) is None:
            out += ["--symlink", target, name]
    return out
