"""The Runtime interface: the box a harness runs in.

A rollout either *owns* its runtime (it builds it named after the trace id, starts it, and
stops it last in ``close``) or *borrows* a live one (never starts or stops it). ``stop()`` is
idempotent, marks the runtime stopped *before* tearing down, and finishes its teardown even
when the caller is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec

from .._errors import InfrastructureLost, SandboxError
from .._record.trace import RuntimeInfo

DEFAULT_OUTPUT_CAP = 1 << 20
"""Bytes kept of each of stdout and stderr by ``exec`` unless the caller says otherwise."""


class ProgramResult(msgspec.Struct, frozen=True):
    """The outcome of one program run.

    ``stdout_truncated`` / ``stderr_truncated`` say the stream went over the output cap and
    only its first ``cap`` bytes were kept. ``timed_out`` says the program was killed (with its
    whole process tree) because its timeout expired; ``exit_code`` is then the signal's
    negative number.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False


KILL_WAIT = 5.0
"""Seconds an ``OpenProgram``'s ``kill`` waits for it (or its connection) to be gone."""


class OpenProgram(ABC):
    """A program started by ``Runtime.open_program``, its stdin and stdout open to the caller
    (a stdio MCP server). Its stderr is dropped."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """Its exit code once it exited and that is known here, else ``None``."""

    @abstractmethod
    async def kill(self) -> None:
        """Kill it and every process it started; idempotent, bounded."""


class PipedProgram(OpenProgram):
    """A program this process spawned with pipes; ``kill`` is its runtime's way to end its tree."""

    def __init__(self, process: asyncio.subprocess.Process, kill: Callable[[], Awaitable[None]]) -> None:
        assert process.stdin is not None and process.stdout is not None  # spawned with both as pipes
        self.stdin, self.stdout = process.stdin, process.stdout
        self._process, self._kill = process, kill

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def kill(self) -> None:
        await self._kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT):
                await self._process.wait()


class Runtime(ABC):
    """A sandbox: start / stop, exec, files, and the network policy hooks.

    Subclasses implement ``_start``, ``_teardown``, ``exec``, ``read`` and ``write``.
    ``type`` names the kind (``"local"``, ...).
    """

    type: str = "abstract"
    enforces: frozenset[str] = frozenset()
    """The isolation policies this kind enforces, from ``filesystem``, ``pid``, ``network``
    (framework routes only), ``pids``, ``memory`` and ``output``; none by default."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"rr-{uuid.uuid4().hex[:12]}"
        self.started = False
        self.stopped = False
        self.grader_dir: str | None = None
        """Where the grader's files are, as programs see it, once ``add_grader_files`` put them."""
        self._teardown_task: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        """A stable identifier of the box (a path, a container id, ...)."""
        return self.name

    def info(self, *, borrowed: bool = False) -> RuntimeInfo:
        return RuntimeInfo(id=self.id, type=self.type, name=self.name, borrowed=borrowed)

    async def start(self) -> None:
        """Start the box. Raises ``SandboxError`` when it cannot be started."""
        if self.stopped:
            raise ValueError(f"runtime {self.name!r} was stopped; a runtime starts only once")
        if self.started:
            return
        await self._start()
        self.started = True

    async def stop(self) -> None:
        """Stop the box and release everything it holds; idempotent, finishes if cancelled."""
        self.stopped = True
        if self._teardown_task is None:
            self._teardown_task = asyncio.ensure_future(self._teardown())
        # Shielded: a cancelled caller must not leave processes or files behind.
        await asyncio.shield(self._teardown_task)

    async def alive(self) -> bool:
        """True when the box can still run a program (runs ``true`` in it).

        Raises:
            InfrastructureLost: the process hosting the box died: whether the box could
                run a program is not the box's to answer.
        """
        if self.stopped or not self.started:
            return False
        try:
            result = await self.exec(["true"], timeout=10.0)
        except InfrastructureLost:
            raise
        except Exception:  # noqa: BLE001 - a health probe: any failure is 'not healthy'
            return False
        return result.exit_code == 0

    def host_url(self, url: str) -> str:
        """How a program inside the box reaches ``url`` on the host."""
        return url

    async def prepare_setup(self) -> None:
        """Open the setup-phase network policy (no-op for unrestricted runtimes)."""

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        """Switch to the agent-phase policy, always allowing the framework ``routes``.

        ``None`` restores the permissive setup policy. Unrestricted runtimes ignore it.
        """

    async def claim_setup(self, key: str) -> str | None:
        """Share the task setup named ``key`` (``Task.setup_key``) with the other runtimes of
        this machine: the first to claim it runs it, the others wait, then start from what it
        froze. Call it before the setup ran anything. Returns the id of the setup snapshot this
        runtime now stands on (the setup is done: skip it), or ``None``: run the setup, then
        ``freeze_setup``. A kind that shares nothing (this one) always returns ``None``."""
        return None

    async def freeze_setup(self) -> str | None:
        """After the setup this runtime claimed ran: freeze what it wrote as the snapshot the
        others start from. Returns its id; ``None`` if nothing was frozen (this kind)."""
        return None

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        """Put the grader's files (``Task.grader_files``: relative name -> content) in the box
        once the agent is gone: every process of the box is killed first, and nothing the
        agent wrote can replace them. Returns the directory holding them, as programs see it;
        every exec from then on is the grader's and starts there, ``HOME`` there, with neither
        the current directory nor the user's site-packages on Python's module path.

        Raises:
            SandboxError: this kind cannot keep them from the agent.
        """
        raise SandboxError(
            f"runtime {self.name!r} ({self.type}) cannot hold a task's grader files; use SandboxRuntime or LocalRuntime"
        )

    async def open_program(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, limit: int = 1 << 16
    ) -> OpenProgram:
        """Start ``argv`` in the box with its stdin and stdout open to the caller, under the
        box's policies as an ``exec`` (environment allow-list, filesystem, network, limits),
        until ``kill`` or the box's ``stop``.

        Args:
            argv: the program and its arguments.
            env: extra environment variables.
            limit: bytes of one line its ``stdout`` reader may buffer.

        Raises:
            SandboxError: the box is not running, the program could not be started, or this
                kind cannot hold a program open (this one).
        """
        raise SandboxError(
            f"runtime {self.name!r} ({self.type}) cannot run a program with open pipes; "
            "use LocalRuntime or SandboxRuntime, or a server reached by URL"
        )

    @abstractmethod
    async def _start(self) -> None: ...

    @abstractmethod
    async def _teardown(self) -> None: ...

    @abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        """Run ``argv`` in the box and wait for it.

        Args:
            argv: the program and its arguments.
            env: extra environment variables.
            timeout: seconds before the program and every process it started are killed
                (``timed_out=True`` in the result). ``None`` waits forever.
            max_output: bytes kept of each of stdout and stderr; the rest is drained and
                dropped, and the stream is flagged truncated.
            stdin: bytes written to the program's standard input.

        Raises:
            SandboxError: the box is not running, or the program could not be started.
        """

    @abstractmethod
    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file of the box (relative paths are under its work directory)."""

    @abstractmethod
    async def write(self, path: str, data: bytes | str) -> None:
        """Write a file of the box, creating parent directories."""
