"""An MCP server run as a program: JSON-RPC messages one per line on its stdin/stdout.

Started by the first request of a rollout runtime's client (``mcp_pool.stdio_client``),
under the per-process limit on starts in progress; a message over ``max_message`` bytes, a
line that is not JSON, or the process's exit fails the requests waiting with
``ToolServerError``, and the next request starts it again.

With a runtime it runs IN the runtime (``Runtime.open_program``): a sandboxed rollout's server
is sandboxed as its programs are (the sandbox's filesystem, network policy, limits and
environment allow-list, plus the toolset's ``env``), and it is killed with the runtime at the
latest. Without one (an in-process rollout with no box) it runs on the host, so it gets none
of the host's secrets by default: only the variables of ``INHERITED_ENV`` (the official MCP
SDK's allow-list) plus its ``env``, and, without a ``cwd``, a fresh empty working directory of
its own (removed when it stops); it is stopped by killing its process group (``npx`` starts
children).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .._core.runtime import OpenProgram, PipedProgram, Runtime
from .._errors import SandboxError
from .mcp_client import Limits, _Client, _Retry

INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
"""Variables a stdio server inherits from this process (as the MCP SDK's DEFAULT_INHERITED_ENV_VARS)."""


def server_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A stdio server's environment: this process's ``INHERITED_ENV`` variables, then ``env``."""
    inherited = {k: v for k in INHERITED_ENV if (v := os.environ.get(k)) is not None and not v.startswith("()")}
    return {**inherited, **(env or {})}  # "()": a shell function exported, as the SDK skips


class StdioClient(_Client):
    """An MCP server run as a subprocess, JSON-RPC messages one per line on its stdin/stdout."""

    def __init__(
        self,
        server: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        limits: Limits,
        starting: asyncio.Semaphore,
        runtime: Runtime | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(server, limits)
        self.command, self._env, self._cwd, self._starting_slots = list(command), env, cwd, starting
        self.runtime, self._files = runtime, dict(files or {})
        self.process: OpenProgram | None = None
        self._scratch: str | None = None  # the working directory made when no cwd is given
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    def _starting(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._starting_slots

    async def _open(self) -> None:
        await self.close()
        if self.runtime is not None:
            self.process = await self._open_in_runtime(self.runtime)
        else:
            self.process = await self._open_on_host()
        self._reader = asyncio.ensure_future(self._read_lines(self.process))

    async def _open_in_runtime(self, runtime: Runtime) -> OpenProgram:
        argv = self.command
        if self._cwd is not None:  # a directory of the box: entered there, whatever its kind
            argv = ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', self._cwd, *argv]
        try:
            for path, content in self._files.items():
                await runtime.write(path if self._cwd is None else os.path.join(self._cwd, path), content)
            return await runtime.open_program(argv, env=self._env, limit=self.limits.max_message)
        except (SandboxError, ValueError) as e:
            raise self._fail(f"cannot start {self.command[0]!r} in runtime {runtime.name!r}: {e}") from None

    async def _open_on_host(self) -> OpenProgram:
        cwd = self._cwd
        if cwd is None:  # not the tool server's own directory: the server sees nothing of the host's files there
            cwd = self._scratch = tempfile.mkdtemp(prefix="rollout-ray-mcp-")
        try:
            await asyncio.to_thread(_write_files, cwd, self._files)
        except (OSError, ValueError) as e:
            raise self._fail(f"cannot write its files in {cwd!r}: {e}") from None
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=server_env(self._env),
                cwd=cwd,
                limit=self.limits.max_message,
                start_new_session=True,
            )
        except OSError as e:
            raise self._fail(f"cannot start {self.command[0]!r}: {e}") from None
        return PipedProgram(process, lambda: _kill_group(process.pid))

    async def _read_lines(self, process: OpenProgram) -> None:
        why = "closed its stdout"
        try:
            while line := await process.stdout.readline():
                if not line.strip():
                    continue
                try:
                    message = msgspec.json.decode(line)
                except (msgspec.DecodeError, RecursionError):
                    why = f"wrote something that is not JSON: {line[:200]!r}"
                    break
                if (
                    isinstance(message, dict)
                    and (waiter := self._pending.pop(message.get("id"), None))  # type: ignore[arg-type]
                    and not waiter.done()
                ):
                    waiter.set_result(message)
        except ValueError:  # asyncio's answer to a line over the stream's limit
            why = f"wrote a message over the {self.limits.max_message} bytes of max_message"
        except Exception as e:  # noqa: BLE001 - any reader failure ends the server; the message says why
            why = f"{type(e).__name__}: {e}"
        code = process.returncode
        why = why if code is None else f"exited with code {code}"
        if self.runtime is not None and self.tools is None:  # it never served: most often not there
            why += (
                f" before serving, in runtime {self.runtime.name!r}: its command and files must be in the "
                "runtime (a sandbox sees neither the host's /tmp nor a checkout; ship a script with files=)"
            )
        error = self._fail(why)
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._pending.clear()
        self._ready = None  # the next request starts it again
        if process.returncode is None:
            await process.kill()

    async def _send(self, message: dict[str, Any]) -> Any:
        process, id = self.process, message.get("id")
        if process is None or process.returncode is not None or self._reader is None or self._reader.done():
            raise _Retry("the server process is gone")
        waiter: asyncio.Future[Any] | None = None
        if id is not None:
            waiter = self._pending[id] = asyncio.get_running_loop().create_future()
        try:
            async with self._write_lock:
                process.stdin.write(msgspec.json.encode(message) + b"\n")
                await process.stdin.drain()
        except (ConnectionError, RuntimeError) as e:
            self._pending.pop(id, None)  # type: ignore[arg-type]
            raise self._fail(f"its stdin broke: {e}") from None
        if waiter is None:
            return None
        try:
            return await waiter
        finally:
            self._pending.pop(id, None)  # type: ignore[arg-type]

    async def close(self) -> None:
        process, reader, self.process, self._reader = self.process, self._reader, None, None
        if process is not None and process.returncode is None:
            await process.kill()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            await asyncio.to_thread(shutil.rmtree, scratch, True)


def _write_files(directory: str, files: Mapping[str, str | bytes]) -> None:
    for path, content in files.items():
        target = os.path.normpath(os.path.join(directory, path))
        if os.path.isabs(path) or not target.startswith(os.path.join(directory, "")):
            raise ValueError(f"file {path!r} must be a relative path under the working directory")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)


async def _kill_group(pid: int) -> None:
    """Kill a host server and what it started (its own process group: start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
