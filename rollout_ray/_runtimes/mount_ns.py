"""A sandbox's own mount namespace: its mounts out of every other sandbox's way.

Every exec copies the mount table of the namespace bwrap starts from. Were each sandbox's
mounts (disk limit, image overlay, kit, binds) made in the host's namespace, that table would
grow with every live sandbox, and so would every exec's cost (~3.4 s at 1,000 live). Instead
each sandbox has a namespace of its own, held by one tiny process (``mounter.py``: ``cat``
reading a pipe, carrying the host's marker), made private from the host's right away: its
table is the host's few mounts plus the sandbox's own, however many others live.

* its mounts are made by ``mounter.py`` inside it (``run``): a Python running several threads
  cannot enter another mount namespace itself;
* each exec enters it (``enter_args``: ``nsenter --mount=... -- bwrap ...``);
* the host reaches the files under its mounts through the holder's root (``path``:
  ``/proc/PID/root/<path>``): what the host's namespace shows there is the empty directory
  beneath;
* ``close`` kills the holder: the namespace and every mount in it go at once, nothing is
  unmounted one by one. If the host dies, its guardian kills the holder by its marker (or the
  holder reads the end of its pipe), with the same effect.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import SandboxError

_MOUNTER = os.path.join(os.path.dirname(__file__), "mounter.py")
Op = Sequence[Any]
"""``[name, *args]``: one of ``mounter.py``'s operations."""


@functools.cache
def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise SandboxError(f"an image or disk-limited sandbox needs `{name}` (Debian: apt-get install util-linux "
                           f"coreutils); install it or pass disk_limit=None without an image")
    return found


def _outcome(proc: subprocess.Popen[bytes], what: str) -> None:
    """Read the mounter's one-line outcome; raise ``OSError`` as the mount did."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    try:
        found = json.loads(line) if line else {}
    except ValueError:
        found = {}
    if found.get("ok"):
        return
    if "errno" in found:
        raise OSError(found["errno"], f"{what}: {found['error']}", found.get("path"))
    proc.wait()
    raise OSError(0, f"{what}: the mounter exited {proc.returncode} without saying why")


class MountNamespace:
    """A new mount namespace with ``ops`` run in it (``env``: the holder's environment, the
    host's marker). Raises ``OSError`` when an op fails (nothing is left then)."""

    def __init__(self, ops: Sequence[Op], env: Mapping[str, str]) -> None:
        cat = _tool("cat")
        self._env = dict(env)
        self._enter = [_tool("nsenter")]
        self._holder = subprocess.Popen([sys.executable, "-I", "-S", _MOUNTER, "hold", cat, json.dumps(list(ops))],  # noqa: S603 - sys.executable running our mounter, no shell
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env,
                                        start_new_session=True)  # the host's Ctrl-C is the host's to handle
        self.pid = self._holder.pid
        try:
            _outcome(self._holder, "making the sandbox's mount namespace")
        except BaseException:
            self.close()
            raise

    def path(self, path: str) -> str:
        """``path`` (absolute) as the host reaches it in this namespace."""
        return f"/proc/{self.pid}/root{path}"

    def enter_args(self) -> list[str]:
        """The prefix that runs a program in this namespace."""
        return [*self._enter, f"--mount=/proc/{self.pid}/ns/mnt", "--"]

    def alive(self) -> bool:
        return self._holder.poll() is None

    def run(self, ops: Sequence[Op]) -> None:
        """Run ``ops`` in this namespace. Raises ``OSError`` (what they mounted undone)."""
        proc = subprocess.Popen([sys.executable, "-I", "-S", _MOUNTER, "enter", str(self.pid), json.dumps(list(ops))],  # noqa: S603 - sys.executable running our mounter, no shell
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=self._env)  # the marker: the guardian finds it too
        try:
            _outcome(proc, "mounting in the sandbox's namespace")
        finally:
            proc.wait()

    def close(self) -> None:
        """Kill the holder and reap it: every mount of the namespace is gone (idempotent)."""
        if self._holder.stdin is not None:
            self._holder.stdin.close()  # the holder's cue to go, should the kill not reach it
        if self._holder.returncode is None:
            self._holder.kill()
            self._holder.wait()


def is_mount(path: str) -> bool:
    """``os.path.ismount`` for a path through ``/proc/PID/root``, which ``ismount`` would
    resolve (``realpath``) to the host's namespace: a directory whose parent, as the kernel
    walks ``..``, is on another filesystem or is itself."""
    try:
        st, parent = os.lstat(path), os.lstat(os.path.join(path, ".."))
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_dev != parent.st_dev or st.st_ino == parent.st_ino)
