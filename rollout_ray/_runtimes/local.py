"""A runtime on the host: a private work directory and process-tree control, no sandbox.

What it isolates: each runtime gets its own work directory (mode 0o700, removed at stop);
each program runs in its own process group; every descendant inherits two marker variables
(``ROLLOUT_RAY_RUNTIME``, ``ROLLOUT_RAY_EXEC``) that ``/proc`` scans use to find it, even
after ``setsid`` or a double fork. Where a cgroup is writable (as root: the pids controller,
or the v2 hierarchy), the runtime also has its own cgroup, and every program joins it before
it starts (``cgroup.JOIN_CGROUPS``): a process that both leaves its session and clears its
environment (``setsid env -i ...``) is still found there. A timed-out or cancelled exec kills
its whole tree; ``stop()`` kills every process the runtime ever started — everything in its
cgroup, until the cgroup is empty and removed (a program still being spawned then finds it
gone and never runs), and everything the scans find — then removes the directory.

The environment is an allow-list: of the host's variables only ``HOST_ENV`` (``PATH``,
``HOME``, the locale, ``TERM``, ``TZ``) and those named in ``pass_env``; then the runtime's
``env``, the exec's ``env`` (what the harness or task declares), then the markers. Host
credentials (``AWS_SECRET_ACCESS_KEY``, ``RAY_AUTH_TOKEN``, ...) never reach a program unless
named.

``read`` / ``write`` resolve relative paths (and absolute ones inside the work directory)
beneath it without following links (``files.py``): a link a program planted gives an error,
never the host file it points to.

What it does NOT isolate: programs see the host filesystem (absolute paths outside the work
directory are the host's, for programs and for ``read`` / ``write``) and the host network;
it enforces no policy (``enforces`` is empty). Without a writable cgroup, a process that
clears its environment after ``setsid`` escapes ``stop()``. Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import Mapping, Sequence

from .._core.runtime import DEFAULT_OUTPUT_CAP, OpenProgram, ProgramResult, Runtime
from .._errors import SandboxError
from .cgroup import JOIN_CGROUPS, JOIN_FAILED, KILL_BUDGET, Cgroups, Parent, tracking_controller
from .files import components, read_beneath, remove_tree, write_beneath
from .grader import grading_env, write_grader_files
from .host_process import EXEC_MARKER, Capture, abandon_spawn, kill_marked, open_piped, wait_program

RUNTIME_MARKER = "ROLLOUT_RAY_RUNTIME"
HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
"""The host variables every program gets (when set); ``pass_env`` names more."""
SHELL = "/bin/sh"


class LocalRuntime(Runtime):
    """Runs programs on the host, in a private work directory (see the module docstring).

    Args:
        name: the runtime's name (default: generated).
        root: the directory the work directory is created in (default: the temp dir).
        env: variables added to every program's environment.
        pass_env: names of host variables passed to every program, beyond ``HOST_ENV``.
        cgroup_parents: parent cgroup per controller to make the runtime's cgroups in
            (a ``RuntimeHost``'s); default: this process's own cgroups.
        image: refused (``SandboxError``): only a ``SandboxRuntime`` runs over an image.
    """

    type = "local"

    def __init__(
        self,
        name: str | None = None,
        *,
        root: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        cgroup_parents: Mapping[str, Parent] | None = None,
        image: str | None = None,
    ) -> None:
        super().__init__(name)
        if image is not None:
            raise SandboxError(
                f"runtime {self.name!r}: image {image!r} needs a SandboxRuntime, and this runtime "
                f"is local (use runtime='sandbox' on a machine that runs sandboxes)"
            )
        self._root = root
        self._env = dict(env or {})
        self._pass_env = tuple(pass_env)
        self._cgroup_parents = dict(cgroup_parents or {})
        self._token = uuid.uuid4().hex
        self._workdir: str | None = None
        self._cgroups: Cgroups | None = None
        self._live: dict[Capture, asyncio.SubprocessTransport] = {}
        self._spawned = False
        self._grader_dir: str | None = None
        """Where the grader's files are, once they are in: its execs start there (``grader.py``)."""

    @property
    def id(self) -> str:
        """The work directory once started, else the name."""
        return self._workdir or self.name

    @property
    def workdir(self) -> str | None:
        """The work directory as programs see it, once started: where they start, where
        relative ``read`` / ``write`` paths lead."""
        return self._workdir

    def _dir_prefix(self) -> str:
        return "rollout-ray-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.name) + "-"

    async def _start(self) -> None:
        try:
            # abspath: mkdtemp returns a relative path for a relative root (before 3.12).
            self._workdir = os.path.abspath(tempfile.mkdtemp(prefix=self._dir_prefix(), dir=self._root))  # noqa: ASYNC240 - abspath of mkdtemp's answer: no I/O worth a thread
        except OSError as e:
            raise SandboxError(f"cannot start runtime {self.name!r}: {e}") from e
        with contextlib.suppress(SandboxError):  # tracking is best effort: the scans remain
            self._cgroups = self._make_cgroups(self._tracking())  # one mkdir: in the loop

    def _tracking(self) -> dict[str, int | None]:
        """The cgroups of this kind: one that only tracks processes, where one is writable."""
        controller = next((c for c in self._cgroup_parents if c in ("pids", "")), None)
        if controller is None:
            controller = tracking_controller()
        return {} if controller is None else {controller: None}

    def _make_cgroups(self, limits: Mapping[str, int | None]) -> Cgroups | None:
        if not limits:
            return None
        return Cgroups(f"rollout-ray-{self._token[:16]}", limits, self._cgroup_parents)

    async def _teardown(self) -> None:
        self._cut_short()
        await self._kill_all()
        if self._workdir is not None:
            await asyncio.to_thread(remove_tree, self._workdir)

    async def _kill_all(self) -> None:
        """Kill every process of the runtime: its cgroups (removed, so nothing joins them
        later), the marker scans, and the direct children still being waited for."""
        if self._cgroups is not None:  # finds what the scans cannot see (env -i)
            self._cgroups.remove(budget=0)  # one pass here: enough when nothing is running
            if self._cgroups.dirs:
                await asyncio.to_thread(self._cgroups.remove)
        if self._spawned:  # scanning /proc costs milliseconds: only when something ran
            await kill_marked(RUNTIME_MARKER, self._token)
        for proto, transport in list(self._live.items()):
            if not proto.exited.done():  # the direct child, if the scans could not see it yet
                # Not transport.close(): its Popen.poll() can reap the child before asyncio's
                # child watcher does, which then reports exit 255 ("Unknown child process").
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(transport.get_pid(), signal.SIGKILL)
            await asyncio.wait([proto.exited], timeout=KILL_BUDGET)

    def _cut_short(self) -> None:
        """As ``stop()`` begins: mark the programs still running, so their execs raise
        ``SandboxError`` whatever exit code their killing is reported with."""
        for proto in self._live:
            if not proto.exited.done():
                proto.cut_short = True

    def intact(self) -> bool:
        """Whether the runtime still holds what it was started with (its directory, its
        cgroups): a warm pool hands out no other. Cheap: no program runs."""
        return (
            self.started
            and not self.stopped
            and self._workdir is not None
            and os.path.isdir(self._workdir)
            and all(os.path.isdir(d) for d in (self._cgroups.dirs if self._cgroups is not None else ()))
        )

    async def _end_programs(self) -> None:
        """Kill every process the runtime started and wait for its execs to end; the runtime
        stays usable (the grader's turn comes next)."""
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.kill)
        if self._spawned:
            await kill_marked(RUNTIME_MARKER, self._token)
        for proto in list(self._live):
            await asyncio.wait([proto.exited], timeout=KILL_BUDGET)

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        """``Runtime.add_grader_files``: in ``.grader`` under the work directory, made anew
        (whatever a program left there is removed, never followed) once every process of the
        runtime is killed. Programs here run on the host: this keeps nothing from an agent
        that looks for them elsewhere, as nothing of a local runtime does."""
        workdir = self._require_running("add_grader_files")
        await self._end_programs()
        directory = os.path.join(workdir, ".grader")
        await asyncio.to_thread(_fresh_dir, directory)
        await asyncio.to_thread(write_grader_files, directory, files, f"grader files of runtime {self.name!r}")
        self._grader_dir = directory
        return directory

    def _require_running(self, what: str) -> str:
        if not self.started or self.stopped or self._workdir is None:
            state = "stopped" if self.stopped else "not started"
            raise SandboxError(f"{what}: runtime {self.name!r} is {state}")
        return self._workdir

    def _spawn_dir(self, what: str) -> str:
        """The host directory programs are spawned in: the grader's, once its files are in."""
        workdir = self._require_running(what)
        return self._grader_dir or workdir

    def _beneath(self, path: str, what: str) -> tuple[str, list[str]] | None:
        """``(directory, components beneath it)`` of ``path``, or ``None`` for a host path
        (absolute, outside the work directory)."""
        workdir = self._require_running(what)
        full = os.path.normpath(os.path.join(workdir, path))
        if full == workdir or full.startswith(workdir + os.sep):
            return workdir, components(os.path.relpath(full, workdir)) or []
        if os.path.isabs(path):
            return None
        raise ValueError(f"path {path!r} escapes the work directory of runtime {self.name!r}")

    def _host_env(self) -> dict[str, str]:
        names = (*HOST_ENV, *self._pass_env)
        return {k: os.environ[k] for k in names if k in os.environ}

    def _program_env(self, extra: Mapping[str, str] | None, exec_token: str) -> dict[str, str]:
        env = self._host_env()
        if self._grader_dir is not None:
            env.update(grading_env(self._grader_dir))
        env.update(self._env)
        env.update(extra or {})
        env[RUNTIME_MARKER] = self._token
        env[EXEC_MARKER] = exec_token
        return env

    def _command(self, argv: list[str], env: Mapping[str, str]) -> list[str]:
        """What to spawn for ``argv``: the program itself, joining the runtime's cgroups
        first when it has some."""
        if self._cgroups is None:
            return argv
        self._check_program(argv[0], env)
        return [SHELL, "-c", JOIN_CGROUPS, "sh", *self._cgroups.join_files, "--", *argv]

    def _check_program(self, program: str, env: Mapping[str, str]) -> None:
        """Raise as spawning would when ``program`` cannot be found (the cgroup-joining shell
        would report it as an exit code)."""
        workdir = self._require_running(f"program {program!r}")
        if os.sep in program:
            joined = os.path.join(workdir, program)
            found = joined if os.access(joined, os.X_OK) and not os.path.isdir(joined) else None
        else:
            found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            raise SandboxError(
                f"cannot start program {program!r} in runtime {self.name!r}: "
                f"[Errno {errno.ENOENT}] no such executable: {program!r}"
            )

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        """Run ``argv`` in the work directory, in a new session (see ``Runtime.exec``).

        Returns when the program exited and its pipes closed, or ``EXIT_GRACE`` seconds
        after it exited. Background processes it leaves running are not killed (they may
        be servers); ``stop()`` kills them.
        """
        argv = list(argv)
        if not argv:
            raise ValueError("exec needs a program to run")
        what = f"program {argv[0]!r}"
        token = uuid.uuid4().hex
        program_env = self._program_env(env, token)
        command = self._command(argv, program_env)
        transport, proto = await self._spawn(command, program_env, max_output, stdin is not None, what)
        self._live[proto] = transport
        try:
            timed_out = await wait_program(transport, proto, token, timeout, stdin)
        finally:
            transport.close()
            del self._live[proto]
        code = transport.get_returncode()
        killed = code is None or code < 0 or code in (JOIN_FAILED, 128 + signal.SIGKILL)
        if self.stopped and not timed_out and (proto.cut_short or killed):
            # stop() ran during the exec (or its spawn) and killed the program: found running
            # (``cut_short``), or, stopped during the spawn, by its code: itself (negative), or
            # a child it waited for first, when it exits 128 + SIGKILL (a shell's `wait` can see
            # its child killed before it is killed itself).
            raise SandboxError(f"{what} was killed: runtime {self.name!r} stopped")
        return ProgramResult(
            exit_code=-signal.SIGKILL if timed_out or code is None else code,
            stdout=proto.data[1].decode("utf-8", errors="replace"),
            stderr=proto.data[2].decode("utf-8", errors="replace"),
            stdout_truncated=proto.truncated[1],
            stderr_truncated=proto.truncated[2],
            timed_out=timed_out,
        )

    async def open_program(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, limit: int = 1 << 16
    ) -> OpenProgram:
        """``Runtime.open_program``: spawned as an ``exec`` is (so a sandbox's is sandboxed),
        in its own session; ``stop()`` kills it with the runtime's other programs."""
        argv = list(argv)
        if not argv:
            raise ValueError("open_program needs a program to run")
        what, token = f"program {argv[0]!r}", uuid.uuid4().hex
        program_env = self._program_env(env, token)
        command, workdir = self._command(argv, program_env), self._spawn_dir(what)
        self._spawned = True  # before the fork: a stop during the spawn must still scan
        try:
            return await open_piped(command, program_env, workdir, limit, token)
        except OSError as e:
            raise SandboxError(f"cannot start {what} in runtime {self.name!r}: {e}") from e

    async def _spawn(
        self, command: list[str], env: Mapping[str, str], max_output: int, with_stdin: bool, what: str
    ) -> tuple[asyncio.SubprocessTransport, Capture]:
        """Start the program in its own session, its output captured up to ``max_output``."""
        workdir = self._spawn_dir(what)
        loop = asyncio.get_running_loop()
        self._spawned = True  # before the fork: a stop during the spawn must still scan
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: Capture(max_output),
                *command,
                stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=workdir,
                start_new_session=True,
            )
        )
        try:
            return await asyncio.shield(spawn)
        except OSError as e:
            raise SandboxError(f"cannot start {what} in runtime {self.name!r}: {e}") from e
        except asyncio.CancelledError:
            # A cancelled spawn makes asyncio kill only the direct child, then wait forever
            # on pipes its children hold: finish the spawn, then kill the tree.
            await asyncio.shield(abandon_spawn(spawn, env[EXEC_MARKER]))
            raise

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file (relative paths are under the work directory and never follow
        a link; ``..`` escapes raise ``ValueError``); at most ``max_bytes`` bytes when given.

        Raises:
            SandboxError: the path holds a link, or is not a regular file (a FIFO, ...).
        """
        what = f"read {path!r}"
        located = self._beneath(path, what)
        if located is None:
            return await asyncio.to_thread(_host_read, path, max_bytes)
        return await asyncio.to_thread(read_beneath, *located, max_bytes, f"{what} in runtime {self.name!r}")

    async def write(self, path: str, data: bytes | str) -> None:
        """Write a regular file (``str`` as UTF-8), creating parent directories; paths as
        for ``read``."""
        what = f"write {path!r}"
        located = self._beneath(path, what)
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if located is None:
            return await asyncio.to_thread(_host_write, path, payload)
        await asyncio.to_thread(write_beneath, *located, payload, f"{what} in runtime {self.name!r}")


def _fresh_dir(path: str) -> None:
    """An empty directory at ``path``, replacing whatever is there (a link is removed, not followed)."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            os.unlink(path)
    os.mkdir(path, 0o755)


def _host_read(path: str, max_bytes: int | None) -> bytes:
    with open(path, "rb") as f:
        return f.read() if max_bytes is None else f.read(max_bytes)


def _host_write(path: str, payload: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(payload)
