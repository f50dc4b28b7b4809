"""LocalExecutor: the driver's rollouts in the driver's own event loop, behind real servers."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from .._core.limits import TaskResources
from .._core.policy_gate import PolicyGate
from .._core.runtime import Runtime
from .._core.task import Task
from .._record.trace import Trace
from .._runtimes.host import RuntimeHost, runtime_kind
from .._serving.proxy import HTTPInterception
from .._serving.tool_server import ToolServer
from .executor import Executor
from .lazy_runtime import LazyRuntime
from .lookahead import wanted
from .rollout_host import RolloutHost
from .spec import RolloutSpec


class LocalExecutor(Executor):
    """The lifecycle core in this event loop, behind a real HTTP proxy and tool server.

    Its rollouts are hosted as a rollout actor hosts its own (``RolloutHost``), with no bound
    of its own. ``runtime`` is the kind of the runtimes rollouts own: ``"auto"`` (the sandbox where the
    machine runs one, else local; ``runtime_reason`` then says why) or any provider's name
    (``_runtimes/providers.py``: ``"local"``, ``"sandbox"``, ``"podman"``, ...), for the
    rollouts whose task (``TaskData.runtime``) or run (``EvalConfig.runtime``) names none. A
    runtime starts on its first use (``LazyRuntime``): a rollout that never runs a program
    costs no directory, no cgroup.

    Owned runtimes live on an in-process ``RuntimeHost``, so that if this process is killed
    its guardian still removes their processes and directories.

    Its rollouts obey its own ``policy`` (not the process's): two executors in one process
    pause and version apart.
    """

    def __init__(self, *, runtime: str = "auto") -> None:
        self.runtime, self.runtime_reason = runtime_kind(runtime)
        self._stack = AsyncExitStack()
        self._proxy: HTTPInterception | None = None
        self._tools: ToolServer | None = None
        self._runtimes: RuntimeHost | None = None
        self.policy = PolicyGate()
        self._host: RolloutHost | None = None

    async def start(self) -> None:
        self._proxy = await self._stack.enter_async_context(HTTPInterception())
        self._tools = await self._stack.enter_async_context(ToolServer(sessions=self._proxy.session_of_state))
        self._runtimes = RuntimeHost(kind=self.runtime)
        self._stack.push_async_callback(self._runtimes.shutdown)
        # The driver's max_in_flight bounds the rollouts: the host adds no bound of its own.
        self._host = RolloutHost(
            None,
            interception=self._proxy,
            runtime_factory=self._new_runtime,
            tool_server=self._tools.serve,
            policy=self.policy,
        )

    async def stop(self) -> None:
        await self._stack.aclose()

    async def run(self, spec: RolloutSpec) -> Trace:
        if self._host is None:
            raise RuntimeError("LocalExecutor.run before start(); use 'async with LocalExecutor()'")
        return await self._host.run(spec)

    async def live(self) -> dict[str, Any]:
        return await super().live() if self._host is None else self._host.live()

    async def set_policy(self, version: int | None, paused: bool, interrupt: bool = False) -> None:
        self.policy.set(version, paused, interrupt)
        if paused and interrupt:
            await self.policy.until_stopped()

    @property
    def looks_ahead(self) -> bool:
        return True

    async def prepare(self, upcoming: Sequence[Task], admitted: Sequence[Task] = ()) -> None:
        """Its host's warm pool starts sandboxes for the upcoming rollouts over images; its setup
        snapshots no longer needed are let go."""
        if self._runtimes is not None:
            await self._runtimes.prepare(*wanted(upcoming, admitted))

    def _new_runtime(
        self, name: str, image: str | None = None, kind: str | None = None, resources: TaskResources | None = None
    ) -> Runtime:
        assert self._runtimes is not None
        return LazyRuntime(self._runtimes.new_runtime(name, owner=name, image=image, kind=kind, resources=resources))
