"""Executors: where the driver's rollouts run.

An executor runs one ``RolloutSpec`` to a closed trace. Failures *inside* a rollout are on
the trace; an executor raises only ``InfrastructureLost`` — the rollout's host (actor,
process, node) went away and the rollout may be retried elsewhere. ``LocalExecutor`` runs
the core in this process (tests, small runs, the plain-asyncio baseline); ``RayExecutor``
(``_ray_executor``) runs it on a pool of rollout actors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AsyncExitStack
from typing import Any

from .._serving.proxy import HTTPInterception
from .host import RolloutSpec
from .runtime import Runtime
from .._runtimes.host import RUNTIME_KINDS, RuntimeHost
from .._serving.tool_server import ToolServer
from .._record.trace import Trace


class InfrastructureLost(Exception):
    """The rollout's host died (actor, worker or node): the rollout's outcome is unknown."""


class Executor(ABC):
    """Runs rollouts; use as ``async with executor:``."""

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Acquire what the rollouts need (servers, actors)."""

    async def stop(self) -> None:
        """Release it; nothing started by the executor is left running."""

    @abstractmethod
    async def run(self, spec: RolloutSpec) -> Trace:
        """Run one rollout to its closed trace.

        Raises:
            InfrastructureLost: the host of the rollout died.
        """

    def statistics(self) -> dict[str, Any]:
        return {}


class LocalExecutor(Executor):
    """The lifecycle core in this event loop, behind a real HTTP proxy and tool server.

    ``runtime`` is the kind of the runtimes rollouts own: ``"local"`` or ``"sandbox"``.

    Owned runtimes live on an in-process ``RuntimeHost``, so that if this process is killed
    its guardian still removes their processes and directories.
    """

    def __init__(self, *, runtime: str = "local") -> None:
        if runtime not in RUNTIME_KINDS:
            raise ValueError(f"runtime must be one of {RUNTIME_KINDS}, got {runtime!r}")
        self.runtime = runtime
        self._stack = AsyncExitStack()
        self._proxy: HTTPInterception | None = None
        self._tools: ToolServer | None = None
        self._runtimes: RuntimeHost | None = None

    async def start(self) -> None:
        self._proxy = await self._stack.enter_async_context(HTTPInterception())
        self._tools = await self._stack.enter_async_context(ToolServer())
        self._runtimes = RuntimeHost(kind=self.runtime)
        self._stack.push_async_callback(self._runtimes.shutdown)

    async def stop(self) -> None:
        await self._stack.aclose()

    async def run(self, spec: RolloutSpec) -> Trace:
        if self._proxy is None or self._tools is None:
            raise RuntimeError("LocalExecutor.run before start(); use 'async with LocalExecutor()'")
        rollout = spec.rollout(interception=self._proxy, runtime_factory=self._new_runtime,
                               tool_server=self._tools.serve)
        return await rollout.run()

    def _new_runtime(self, name: str) -> Runtime:
        assert self._runtimes is not None
        return self._runtimes.new_runtime(name, owner=name)
