"""LazyRuntime: a runtime provisioned on its first use, so a rollout that never uses its box
pays nothing for it. The one mechanism for every executor's owned runtimes.

An in-process agent (``ChatHarness``) answering a task with no setup and no tools never
runs a program, reads or writes a file: for it a runtime's start (a directory; for a
sandbox also cgroups and a tmpfs; on Ray a call to the runtime actor, and that actor's
start) is pure cost. A ``LazyRuntime`` is "started" as far as the lifecycle goes (B10
holds: an owned runtime is started in ``open``), but the runtime it wraps starts at the
first ``exec`` / ``read`` / ``write``, with the network policy it was given meanwhile;
``stop`` stops it only if it started.

A copy handed to another process (pickled: a node's tool server gets the runtime of a tool
that needs one) starts the same runtime there if it is used there; the original, once
handed on, stops the runtime at teardown whether or not it started it itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.runtime import DEFAULT_OUTPUT_CAP, OpenProgram, ProgramResult, Runtime
from .._record.trace import RuntimeInfo


class LazyRuntime(Runtime):
    """Wraps ``inner`` (created, not started) and starts it on first use.

    Picklable when ``inner`` is (a ``RemoteRuntime``): the copy shares the runtime itself,
    not this object's state.
    """

    def __init__(self, inner: Runtime) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.type = inner.type
        self.enforces = inner.enforces
        self._routes: Sequence[str] | None = None
        self._provisioning: asyncio.Future[None] | None = None
        self._provisioned = False
        self._handed_on = False
        """A copy went to another process, which may have started the runtime."""

    def __reduce__(self) -> Any:
        self._handed_on = True
        return (_copy_of_lazy_runtime, (self.inner, self.started, self.stopped, self._routes, self._provisioned))

    @property
    def id(self) -> str:
        return self.inner.id

    def info(self, *, borrowed: bool = False) -> RuntimeInfo:
        return self.inner.info(borrowed=borrowed)

    def host_url(self, url: str) -> str:
        return self.inner.host_url(url)

    async def _start(self) -> None:
        """Nothing yet: the wrapped runtime starts on first use."""

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        if self._provisioning is None and not self._provisioned:
            self._routes = routes  # applied when the runtime starts
        else:
            await self._runtime()
            await self.inner.prepare_execution(routes)

    async def _runtime(self) -> Runtime:
        if not self._provisioned:
            if self._provisioning is None:  # concurrent first uses share one start
                self._provisioning = asyncio.ensure_future(self._provision())
            await asyncio.shield(self._provisioning)
        return self.inner

    async def _provision(self) -> None:
        await self.inner.start()
        await self.inner.prepare_setup()
        if self._routes is not None:
            await self.inner.prepare_execution(self._routes)
        self._provisioned = True

    async def stop(self) -> None:
        if self._provisioning is None and not self._provisioned and not self._handed_on:
            # Never started, here or elsewhere: nothing to tear down (no teardown task to pay
            # for, most rollouts' case), but the wrapped runtime must count as stopped, or the
            # host that made it keeps it (one per rollout, scanned on every creation).
            self.stopped = self.inner.stopped = True
            return
        await super().stop()

    async def _teardown(self) -> None:
        if self._provisioning is not None:
            await asyncio.gather(self._provisioning, return_exceptions=True)
        await self.inner.stop()

    async def alive(self) -> bool:
        if self._provisioning is None and not self._provisioned:
            return self.started and not self.stopped  # it would start for a program
        return await super().alive()

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        runtime = await self._runtime()
        return await runtime.exec(argv, env=env, timeout=timeout, max_output=max_output, stdin=stdin)

    async def open_program(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, limit: int = 1 << 16
    ) -> OpenProgram:
        runtime = await self._runtime()
        return await runtime.open_program(argv, env=env, limit=limit)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        return await (await self._runtime()).read(path, max_bytes)

    async def write(self, path: str, data: bytes | str) -> None:
        await (await self._runtime()).write(path, data)

    async def claim_setup(self, key: str) -> str | None:
        return await (await self._runtime()).claim_setup(key)

    async def freeze_setup(self) -> str | None:
        return await (await self._runtime()).freeze_setup()

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        return await (await self._runtime()).add_grader_files(files)


def _copy_of_lazy_runtime(
    inner: Runtime, started: bool, stopped: bool, routes: Sequence[str] | None, provisioned: bool
) -> LazyRuntime:
    runtime = LazyRuntime(inner)
    runtime.started, runtime.stopped, runtime._routes, runtime._provisioned = started, stopped, routes, provisioned
    return runtime
