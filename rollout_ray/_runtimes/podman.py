"""The ``podman`` provider: each runtime one Podman container over the task's image.

A runtime is a container started once (``podman run -d --rm``) whose first process is
Podman's static ``catatonit`` in pause mode (bound in from the host, so the image needs no
shell to stay up); every ``exec`` is a ``podman exec`` in it. What it guarantees:

* filesystem: the image under the container's own writable layer; nothing of the host but
  the two read-only binds below. ``read`` / ``write`` go through ``podman cp``, which
  resolves every path and planted link inside the container's root, never the host's;
* processes: a PID namespace of its own, no capability (``--cap-drop all``), no privilege
  gain, a pids, a memory and (when the task asks: ``TaskData.resources``) a CPU limit
  (``--pids-limit``, ``--memory`` without swap, ``--cpus``), bounded open files
  (``podman_limits.py``);
* users (``podman_limits.py``): run as root, Podman maps the container's users onto host uids
  ``USERNS_BASE`` and up, none a host user: the container's root is no one outside. Rootless,
  Podman maps the container's root onto the invoking user and, with no subuid range for it
  in ``/etc/subuid``, can map nothing else (``--userns=auto`` and ``keep-id`` need one or keep
  the user): a container's root is then the host's user, as for every rootless container;
* environment: the image's ``Env``, the runtime's ``env`` and the exec's, nothing of the
  host's (``podman exec`` passes only what it is given);
* grader files (``grader.py``): ``/.grader`` is a read-only bind of the runtime's
  ``grader`` directory on the host, empty while the agent runs (a mount point: it cannot be
  removed, moved or replaced by a link from inside). ``add_grader_files`` kills every
  process but the container's first, then writes the files on the host side;
* cleanup: the container carries the host's marker (``HOST_MARKER``) in its environment and
  runs with ``--rm``: when the host process dies, its guardian kills every marked process,
  the container's first among them, and Podman removes the container; ``stop()`` removes it
  at once (``podman rm -f``). The image tags it loaded go when its host shuts down
  (``podman_images.release``); Podman refuses to remove an image a container uses (the lease).

* network: none (``--network none``: a namespace of its own, only loopback) but the routes
  ``prepare_execution`` allows, served on ``127.0.0.1:PORT`` inside (``podman_net.py``): a
  program reaches no other host port, Ray's included.

Not enforced (``enforces`` says so): a disk limit (the writable layer grows on the host's disk).

An image is a name in the node's Podman store or an archive (``podman_images.py``); the
podman client is run by ``podman_cli.py``, files move through ``podman cp`` (``podman_files.py``).
Tested as root; rootless is not (killing reads ``/proc`` entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .._core.limits import TaskResources
from .._core.runtime import DEFAULT_OUTPUT_CAP, OpenProgram, PipedProgram, ProgramResult, Runtime
from .._errors import SandboxError
from .files import components
from .grader import grading_env, write_grader_files
from .layout import GRADER_DIR
from .podman_cli import catatonit, exec_command, oci_runtime, podman, podman_unavailable
from .podman_files import parents, read_streamed, tar
from .podman_images import TAG_PREFIX, forget, image_ref, release
from .podman_limits import confinement
from .podman_net import ContainerNetwork
from .provider import Capabilities, HostResources, Provider
from .routes import port_of, sandbox_url

__all__ = ["LABEL", "PROVIDER", "PodmanRuntime", "podman_unavailable"]

EXEC_MARKER = "ROLLOUT_RAY_EXEC"
"""Each exec's programs carry it: a timed-out or cancelled exec kills what carries its value."""
LABEL = "rollout-ray.host"
"""Label of every container: the token of the host that made it."""
WORKDIR = "/work"
"""The work directory when the image names none."""
KILL_ROUNDS = 50
"""Rounds of killing an exec's (or every) process, bounded: each round kills what the last
forked; a pids limit bounds how many there can be."""


class PodmanRuntime(Runtime):
    """A Podman container over ``image`` (see the module docstring).

    Args:
        name: the runtime's name.
        root: the host directory its ``grader`` directory is made in (a ``RuntimeHost``'s root).
        image: the task's image (required: a container needs one).
        env: variables of every program (a host's carry its marker).
        host_token: the label its container carries (``podman ps --filter label=...``), and
            the holder of its image's tag (``podman_images.release``).
        budget: what its programs may use together (``TaskData.resources``).
    """

    type = "podman"
    enforces: frozenset[str] = frozenset({"filesystem", "pid", "pids", "memory", "cpu", "network"})

    def __init__(
        self,
        name: str | None = None,
        *,
        root: str,
        image: str | None,
        env: Mapping[str, str] | None = None,
        host_token: str = "",
        budget: TaskResources | None = None,
    ) -> None:
        super().__init__(name)
        self.image = image
        self.env = dict(env or {})
        self.host_token = host_token
        self.budget = budget
        self.container = f"rollout-ray-{uuid.uuid4().hex[:20]}"
        self.root = root
        self.grader_host_dir = os.path.join(root, f"{self.container}.grader")
        self.workdir: str = WORKDIR
        self._grading = False
        self._init_pid: int | None = None
        self._created = False
        self._remote: dict[int, tuple[str, int]] = {}
        self.network = ContainerNetwork(os.path.join(root, f"{self.container}.net"), self.env)

    @property
    def id(self) -> str:
        return self.container

    async def _start(self) -> None:
        if self.image is None:
            raise SandboxError(
                f"runtime {self.name!r}: the podman runtime runs over a task's image "
                "(TaskData.image); give the task one, or pass --runtime sandbox or local"
            )
        image = await image_ref(self.image, self.host_token)
        code, out, _ = await podman("image", "inspect", "--format", "{{.Config.WorkingDir}}", image)
        if code != 0 and image.startswith(TAG_PREFIX):  # removed since loaded (another process's release)
            forget(image)
            image = await image_ref(self.image, self.host_token)
            code, out, _ = await podman("image", "inspect", "--format", "{{.Config.WorkingDir}}", image)
        named = out.decode().strip() if code == 0 else ""
        self.workdir = named or WORKDIR
        os.makedirs(self.grader_host_dir, mode=0o755)
        env = [a for k, v in self.env.items() for a in ("--env", f"{k}={v}")]
        self._created = True  # from here on, teardown removes the container, whatever exists of it
        code, _, err = await podman(
            *oci_runtime(),
            "create",
            "--rm",
            "--pull",
            "never",
            "--name",
            self.container,
            "--label",
            f"{LABEL}={self.host_token}",
            "--network",
            "none",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            *confinement(self.budget),
            *(() if named else ("--workdir", self.workdir)),
            "-v",
            f"{self.grader_host_dir}:{GRADER_DIR}:ro",
            "-v",
            f"{catatonit()}:/.rollout-ray-init:ro",
            "--entrypoint",
            "/.rollout-ray-init",
            *env,
            image,
            "-P",
        )
        if code == 0:  # podman makes no missing work directory, nor /tmp (a rootfs tarball may lack one)
            skeleton = [("tmp", 0o1777, None), *([] if named else parents(self.workdir))]
            code, _, err = await podman("cp", "-", f"{self.container}:/", stdin=tar(skeleton))
        if code == 0 and not self.stopped:  # a stop during the create found no container to remove
            code, _, err = await podman("start", self.container, cwd=self.root)  # its conmon's cwd
        if code != 0 or self.stopped:
            err = "it was stopped while starting" if self.stopped else err
            await self._teardown()
            raise SandboxError(
                f"runtime {self.name!r}: podman cannot start a container over image {self.image!r}: {err}"
            )
        code, out, err = await podman("inspect", "--format", "{{.State.Pid}}", self.container)
        self._init_pid = int(out.decode().strip() or 0) if code == 0 else None

    async def _teardown(self) -> None:
        await self.network.close()
        if self._created:
            await podman("rm", "-f", "-t", "0", self.container)
        await asyncio.to_thread(shutil.rmtree, self.grader_host_dir, True)
        await asyncio.to_thread(shutil.rmtree, self.network.directory, True)

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        """Allow exactly ``routes`` (full URLs) to the execs started from now on: the
        container has no other network (``podman_net.py``)."""
        self._require_running("prepare_execution")
        if self._init_pid is None:
            raise SandboxError(f"runtime {self.name!r}: its container's first process is unknown; cannot route")
        await self.network.allow(self._init_pid, routes, self._remote, self.name)

    def host_url(self, url: str) -> str:
        """``url`` as the container reaches it (``sandbox_url``), remembering the real target."""
        inside = sandbox_url(url)
        if inside != url:
            self._remote[port_of(url)] = (urlsplit(url).hostname or "", port_of(url))
        return inside

    def _require_running(self, what: str) -> None:
        if self.stopped or not self.started:
            raise SandboxError(
                f"cannot {what} in runtime {self.name!r}: it is {'stopped' if self.stopped else 'not started'}"
            )

    async def _host_pids(self) -> list[int]:
        """Host pids of the container's processes but its first."""
        code, out, _ = await podman("top", self.container, "hpid")
        if code != 0:
            return []
        return [int(w) for w in out.decode().split()[1:] if w.isdigit() and int(w) != self._init_pid]

    async def _kill(self, marker: str | None) -> None:
        """Kill the container's processes (but its first) carrying ``EXEC_MARKER=marker``, or
        all of them when ``marker`` is None, until none is left (bounded)."""
        needle = None if marker is None else f"{EXEC_MARKER}={marker}".encode()
        for _ in range(KILL_ROUNDS):
            found = [p for p in await self._host_pids() if needle is None or needle in _environ(p)]
            if not found:
                return
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        """See ``Runtime.add_grader_files``: every process the agent left is killed first."""
        self._require_running("add grader files")
        await self._kill(None)
        await asyncio.to_thread(write_grader_files, self.grader_host_dir, files, f"runtime {self.name!r}")
        self._grading = True
        self.grader_dir = GRADER_DIR
        return GRADER_DIR

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        """``podman exec``; a timed-out or cancelled exec kills every process it started."""
        argv = list(argv)
        if not argv:
            raise ValueError("exec needs a program to run")
        self._require_running(f"run {argv[0]!r}")
        token = uuid.uuid4().hex
        variables = {**(env or {}), **(grading_env(GRADER_DIR) if self._grading else {}), EXEC_MARKER: token}
        where = GRADER_DIR if self._grading else self.workdir
        command, client_env = exec_command(self.container, argv, variables, where, stdin is not None)
        proc = await asyncio.create_subprocess_exec(
            *command,
            env=client_env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.root,  # as the container's conmon (``podman_cli.podman``)
        )
        reads = asyncio.gather(_capped(proc.stdout, max_output), _capped(proc.stderr, max_output))
        timed_out = False
        try:
            if stdin is not None:
                assert proc.stdin is not None
                proc.stdin.write(stdin)
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
                proc.stdin.close()
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:  # timed out or cancelled: the programs, then the client
                await asyncio.shield(self._kill(token))
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.shield(proc.wait())
        (out, out_cut), (err, err_cut) = await reads
        code = proc.returncode or 0
        if self.stopped and not timed_out:
            raise SandboxError(f"program {argv[0]!r} was killed: runtime {self.name!r} stopped")
        if code in (125, 126, 127) and err.startswith(b"Error:"):  # podman's own, not the program's
            raise SandboxError(
                f"cannot start program {argv[0]!r} in runtime {self.name!r}: {err.decode(errors='replace').strip()}"
            )
        return ProgramResult(
            exit_code=-signal.SIGKILL if timed_out else code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            timed_out=timed_out,
        )

    async def open_program(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, limit: int = 1 << 16
    ) -> OpenProgram:
        """``Runtime.open_program``: ``podman exec -i``, marked as an exec is, so its kill (and
        the runtime's stop) ends every process it started in the container."""
        argv = list(argv)
        if not argv:
            raise ValueError("open_program needs a program to run")
        self._require_running(f"run {argv[0]!r}")
        token = uuid.uuid4().hex
        command, client_env = exec_command(
            self.container, argv, {**(env or {}), EXEC_MARKER: token}, self.workdir, True
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                env=client_env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                limit=limit,
                cwd=self.root,  # as the container's conmon (``podman_cli.podman``)
            )
        except OSError as e:
            raise SandboxError(f"cannot start program {argv[0]!r} in runtime {self.name!r}: {e}") from e

        async def kill() -> None:  # the container's processes first, then the podman client
            await self._kill(token)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

        return PipedProgram(proc, kill)

    def _path(self, path: str) -> str:
        if os.path.isabs(path):
            return os.path.normpath(path)
        if components(path) is None:
            raise ValueError(f"path {path!r} climbs out of the work directory: give a path under it")
        return os.path.join(self.workdir, path)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """A regular file of the container (relative: under the work directory)."""
        self._require_running(f"read {path!r}")
        outcome = await asyncio.to_thread(read_streamed, f"{self.container}:{self._path(path)}", max_bytes)
        if isinstance(outcome, str):
            raise SandboxError(f"read {path!r} in runtime {self.name!r}: {outcome}")
        return outcome

    async def write(self, path: str, data: bytes | str) -> None:
        """Write a file of the container, making its parent directories."""
        self._require_running(f"write {path!r}")
        target = self._path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        entries = [*parents(os.path.dirname(target)), (target.strip("/"), 0o644, payload)]
        code, _, err = await podman("cp", "-", f"{self.container}:/", stdin=tar(entries))
        if code != 0:
            raise SandboxError(f"write {path!r} in runtime {self.name!r}: {err}")


async def _capped(stream: Any, cap: int) -> tuple[bytes, bool]:
    kept, cut = bytearray(), False
    while chunk := await stream.read(65536):
        room = max(cap, 0) - len(kept)
        cut = cut or len(chunk) > room
        kept += chunk[: max(room, 0)]
    return bytes(kept), cut


def _environ(pid: int) -> list[bytes]:
    """The initial environment of host process ``pid`` (none once gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _make(name: str, image: str | None, r: HostResources) -> Runtime:
    return PodmanRuntime(name, root=r.root, image=image, env={**r.env}, host_token=r.host_token, budget=r.budget)


PROVIDER = Provider(
    "podman",
    _make,
    Capabilities(isolation=True, images=True, grader_files=True, routes=True),
    unavailable=podman_unavailable,
    enforces=PodmanRuntime.enforces,
    release=release,
    label="podman",
    host_url=sandbox_url,
    help="a Podman container over the task's image; no network but the framework's routes; disk not limited",
)
