"""The ``podman`` provider: each runtime one Podman container over the task's image.

A runtime is a container started once (``podman run -d --rm``) whose first process is
Podman's static ``catatonit`` in pause mode (bound in from the host, so the image needs no
shell to stay up); every ``exec`` is a ``podman exec`` in it. What it guarantees:

* filesystem: the image under the container's own writable layer; nothing of the host but
  the two read-only binds below. ``read`` / ``write`` go through ``podman cp``, which
  resolves every path and planted link inside the container's root, never the host's;
* processes: a PID namespace of its own, no capability (``--cap-drop all``), no privilege
  gain, a pids and a memory limit (``--pids-limit``, ``--memory``), bounded open files;
* environment: the image's ``Env``, the runtime's ``env`` and the exec's, nothing of the
  host's (``podman exec`` passes only what it is given);
* grader files (``grader.py``): ``/.grader`` is a read-only bind of the runtime's
  ``grader`` directory on the host, empty while the agent runs (a mount point: it cannot be
  removed, moved or replaced by a link from inside). ``add_grader_files`` kills every
  process but the container's first, then writes the files on the host side;
* cleanup: the container carries the host's marker (``HOST_MARKER``) in its environment and
  runs with ``--rm``: when the host process dies, its guardian kills every marked process,
  the container's first among them, and Podman removes the container; ``stop()`` removes it
  at once (``podman rm -f``). Its images stay in Podman's store, which refuses to remove an
  image a container uses (the lease).

* network: none (``--network none``: a namespace of its own, only loopback) but the routes
  ``prepare_execution`` allows, served on ``127.0.0.1:PORT`` inside (``podman_net.py``): a
  program reaches no other host port, Ray's included.

Not enforced (``enforces`` says so): a disk limit (the writable layer grows on the host's disk).

An image is a name in the node's Podman store (never pulled), or an absolute path to a
``docker save`` / ``podman save`` archive, an OCI archive or layout (``podman load``), or a
rootfs tarball (``podman import``), loaded once per node under a tag derived from the path
and its size and mtime. Tested as root; rootless is not (killing reads ``/proc`` entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import resource
import shutil
import signal
import subprocess
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .._core.runtime import DEFAULT_OUTPUT_CAP, OpenProgram, PipedProgram, ProgramResult, Runtime
from .._errors import SandboxError
from .files import components
from .grader import grading_env, write_grader_files
from .layout import GRADER_DIR
from .podman_net import ContainerNetwork
from .provider import Capabilities, HostResources, Provider
from .routes import port_of, sandbox_url

EXEC_MARKER = "ROLLOUT_RAY_EXEC"
"""Each exec's programs carry it: a timed-out or cancelled exec kills what carries its value."""
LABEL = "rollout-ray.host"
"""Label of every container: the token of the host that made it."""
WORKDIR = "/work"
"""The work directory when the image names none."""
PIDS_LIMIT = 4096
MEMORY_LIMIT = "8g"
NOFILE = 65536
CALL_TIMEOUT = 120.0
"""Seconds a podman command other than an exec or a load (``LOAD_TIMEOUT``) may take."""
LOAD_TIMEOUT = 3600.0
KILL_ROUNDS = 50
"""Rounds of killing an exec's (or every) process, bounded: each round kills what the last
forked; a pids limit bounds how many there can be."""

_loads: dict[str, asyncio.Future[str]] = {}


def podman_unavailable() -> str | None:
    """Why this machine cannot run the podman provider, or ``None``."""
    if shutil.which("podman") is None:
        return "the podman runtime needs podman: apt-get install podman (and runc on cgroup v1 or hybrid hosts)"
    if _catatonit() is None:
        return "the podman runtime needs catatonit (Debian's catatonit package, which podman recommends)"
    if shutil.which("nsenter") is None:  # serves a container's routes in its network namespace
        return "the podman runtime needs nsenter (Debian's util-linux package)"
    return None


def _catatonit() -> str | None:
    for path in ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit"):
        if os.path.exists(path):
            return os.path.realpath(path)
    return None


def _oci_runtime() -> list[str]:
    """crun refuses hybrid cgroup hierarchies (v1 with a v2 mount); runc runs there."""
    chosen = os.environ.get("ROLLOUT_RAY_PODMAN_OCI_RUNTIME")
    if chosen:
        return ["--runtime", chosen]
    unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    return ["--runtime", "runc"] if not unified and shutil.which("runc") else []


def _ulimit(name: str, which: int, wanted: int) -> str:
    """``wanted``, within this process's hard limit: an OCI runtime may not raise it."""
    hard = resource.getrlimit(which)[1]
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    return f"{name}={value}:{value}"


async def _podman(*args: str, stdin: bytes | None = None, timeout: float = CALL_TIMEOUT) -> tuple[int, bytes, str]:
    """Run ``podman args``: its exit code, stdout and stderr (the end of it)."""
    proc = await asyncio.create_subprocess_exec(
        "podman",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(stdin)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out, err.decode(errors="replace").strip()[-500:]


async def _image_id(image: str) -> str:
    """The Podman image ``image`` names: loaded from its archive once per node (see module doc)."""
    if not os.path.isabs(image):
        code, _, _err = await _podman("image", "exists", image)
        if code != 0:
            raise SandboxError(
                f"image {image!r} is not in this node's podman store (it is never pulled): "
                f"podman pull or podman load it first, or give an absolute path to an archive"
            )
        return image
    try:
        st = os.stat(image)
    except OSError as e:
        raise SandboxError(f"image {image!r}: {e.strerror}; give an existing archive or OCI layout path") from None
    key = hashlib.sha256(f"{image}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:24]
    tag = f"localhost/rollout-ray/{key}"
    if tag not in _loads:
        _loads[tag] = asyncio.ensure_future(_load(image, tag))
    try:
        return await asyncio.shield(_loads[tag])
    except BaseException:
        if _loads[tag].done():
            _loads.pop(tag, None)  # a failed load is tried again by the next runtime
        raise


async def _load(path: str, tag: str) -> str:
    if (await _podman("image", "exists", tag))[0] == 0:
        return tag
    is_layout = os.path.isdir(path)  # noqa: ASYNC240 - one stat of a local path
    source = f"oci:{path}" if is_layout else path
    if is_layout:
        code, out, err = await _podman("pull", "-q", source, timeout=LOAD_TIMEOUT)
    else:
        code, out, err = await _podman("load", "-q", "-i", path, timeout=LOAD_TIMEOUT)
    loaded = out.decode().strip().rpartition(" ")[2] if code == 0 else ""
    if code != 0:  # not an image archive: a rootfs tarball
        code, out, err = await _podman("import", "-q", path, timeout=LOAD_TIMEOUT)
        loaded = out.decode().strip()
    if code != 0 or not loaded:
        raise SandboxError(
            f"image {path!r}: podman can neither load nor import it ({err}); give a docker or "
            "OCI archive, an OCI layout, or a rootfs tarball"
        )
    code, _, err = await _podman("tag", loaded, tag)
    if code != 0:
        raise SandboxError(f"image {path!r}: podman tag failed: {err}")
    return tag


class PodmanRuntime(Runtime):
    """A Podman container over ``image`` (see the module docstring).

    Args:
        name: the runtime's name.
        root: the host directory its ``grader`` directory is made in (a ``RuntimeHost``'s root).
        image: the task's image (required: a container needs one).
        env: variables of every program (a host's carry its marker).
        host_token: the label its container carries (``podman ps --filter label=...``).
    """

    type = "podman"
    enforces: frozenset[str] = frozenset({"filesystem", "pid", "pids", "memory", "network"})

    def __init__(
        self,
        name: str | None = None,
        *,
        root: str,
        image: str | None,
        env: Mapping[str, str] | None = None,
        host_token: str = "",
    ) -> None:
        super().__init__(name)
        self.image = image
        self.env = dict(env or {})
        self.host_token = host_token
        self.container = f"rollout-ray-{uuid.uuid4().hex[:20]}"
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
        image = await _image_id(self.image)
        code, out, _ = await _podman("image", "inspect", "--format", "{{.Config.WorkingDir}}", image)
        named = out.decode().strip() if code == 0 else ""
        self.workdir = named or WORKDIR
        os.makedirs(self.grader_host_dir, mode=0o755)
        env = [a for k, v in self.env.items() for a in ("--env", f"{k}={v}")]
        self._created = True  # from here on, teardown removes the container, whatever exists of it
        code, _, err = await _podman(
            *_oci_runtime(),
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
            "--pids-limit",
            str(PIDS_LIMIT),
            "--memory",
            MEMORY_LIMIT,
            "--ulimit",
            _ulimit("nofile", resource.RLIMIT_NOFILE, NOFILE),
            "--ulimit",
            _ulimit("nproc", resource.RLIMIT_NPROC, PIDS_LIMIT),
            *(() if named else ("--workdir", self.workdir)),
            "-v",
            f"{self.grader_host_dir}:{GRADER_DIR}:ro",
            "-v",
            f"{_catatonit()}:/.rollout-ray-init:ro",
            "--entrypoint",
            "/.rollout-ray-init",
            *env,
            image,
            "-P",
        )
        if code == 0:  # podman makes no missing work directory, nor /tmp (a rootfs tarball may lack one)
            skeleton = [("tmp", 0o1777, None), *([] if named else _parents(self.workdir))]
            code, _, err = await _podman("cp", "-", f"{self.container}:/", stdin=_tar(skeleton))
        if code == 0 and not self.stopped:  # a stop during the create found no container to remove
            code, _, err = await _podman("start", self.container)
        if code != 0 or self.stopped:
            err = "it was stopped while starting" if self.stopped else err
            await self._teardown()
            raise SandboxError(
                f"runtime {self.name!r}: podman cannot start a container over image {self.image!r}: {err}"
            )
        code, out, err = await _podman("inspect", "--format", "{{.State.Pid}}", self.container)
        self._init_pid = int(out.decode().strip() or 0) if code == 0 else None

    async def _teardown(self) -> None:
        await self.network.close()
        if self._created:
            await _podman("rm", "-f", "-t", "0", self.container)
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
        code, out, _ = await _podman("top", self.container, "hpid")
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
        command, client_env = _exec_command(self.container, argv, variables, where, stdin is not None)
        proc = await asyncio.create_subprocess_exec(
            *command,
            env=client_env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
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
        command, client_env = _exec_command(
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
        outcome = await asyncio.to_thread(_read_streamed, f"{self.container}:{self._path(path)}", max_bytes)
        if isinstance(outcome, str):
            raise SandboxError(f"read {path!r} in runtime {self.name!r}: {outcome}")
        return outcome

    async def write(self, path: str, data: bytes | str) -> None:
        """Write a file of the container, making its parent directories."""
        self._require_running(f"write {path!r}")
        target = self._path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        entries = [*_parents(os.path.dirname(target)), (target.strip("/"), 0o644, payload)]
        code, _, err = await _podman("cp", "-", f"{self.container}:/", stdin=_tar(entries))
        if code != 0:
            raise SandboxError(f"write {path!r} in runtime {self.name!r}: {err}")


def _exec_command(
    container: str, argv: list[str], variables: Mapping[str, str], workdir: str, interactive: bool
) -> tuple[list[str], dict[str, str]]:
    """The ``podman exec`` command line and the podman client's environment.

    Values go through the client's environment with only ``--env NAME`` on the command line:
    a command line is readable by every user of the host (``ps``), and an exec's variables
    carry secrets (``OPENAI_API_KEY``)."""
    command = [
        "podman",
        "exec",
        *(["-i"] if interactive else []),
        "--workdir",
        workdir,
        *(a for k in variables for a in ("--env", k)),
        container,
        *argv,
    ]
    return command, {**os.environ, **variables}


def _parents(path: str) -> list[tuple[str, int, bytes | None]]:
    """Tar entries of absolute ``path``'s directories (``path`` included), mode 0755."""
    parts = [p for p in path.split("/") if p]
    return [("/".join(parts[:depth]), 0o755, None) for depth in range(1, len(parts) + 1)]


def _tar(entries: list[tuple[str, int, bytes | None]]) -> bytes:
    """A tar of ``(name, mode, content)``: a directory where the content is ``None``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode, content in entries:
            entry = tarfile.TarInfo(name)
            entry.mode, entry.type = mode, tarfile.DIRTYPE if content is None else tarfile.REGTYPE
            entry.size = len(content or b"")
            archive.addfile(entry, None if content is None else io.BytesIO(content))
    return buffer.getvalue()


async def _capped(stream: Any, cap: int) -> tuple[bytes, bool]:
    kept, cut = bytearray(), False
    while chunk := await stream.read(65536):
        room = max(cap, 0) - len(kept)
        cut = cut or len(chunk) > room
        kept += chunk[: max(room, 0)]
    return bytes(kept), cut


def _read_streamed(source: str, max_bytes: int | None) -> bytes | str:
    """The file ``podman cp source -`` streams as a tar, reading no more than ``max_bytes`` of
    it (the client is killed then): a file of the container may be as large as its disk. The
    reason as a string when it is no regular file (a directory's tar would be its whole tree)."""
    proc = subprocess.Popen(  # noqa: S603 - podman from PATH as _podman; no shell
        ["podman", "cp", source, "-"],  # noqa: S607 - podman from PATH, as _podman
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                member = archive.next()
                if member is None or not member.isfile():
                    return "not a regular file (a directory or a link is refused): give a file's path"
                stream = archive.extractfile(member)
                assert stream is not None
                return stream.read(member.size if max_bytes is None else min(member.size, max(max_bytes, 0)))
        except tarfile.TarError:
            proc.kill()
            proc.wait(CALL_TIMEOUT)
            assert proc.stderr is not None
            return proc.stderr.read(4096).decode(errors="replace").strip() or "podman cp wrote no archive"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(CALL_TIMEOUT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _environ(pid: int) -> list[bytes]:
    """The initial environment of host process ``pid`` (none once gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _make(name: str, image: str | None, r: HostResources) -> Runtime:
    return PodmanRuntime(name, root=r.root, image=image, env={**r.env}, host_token=r.host_token)


PROVIDER = Provider(
    "podman",
    _make,
    Capabilities(isolation=True, images=True, grader_files=True, routes=True),
    unavailable=podman_unavailable,
    enforces=PodmanRuntime.enforces,
    label="podman",
    host_url=sandbox_url,
    help="a Podman container over the task's image; no network but the framework's routes; disk not limited",
)
