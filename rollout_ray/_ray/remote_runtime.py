"""RemoteRuntime: a runtime hosted by a ``RuntimeActor``, used from another process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ray.exceptions import RayActorError

from .._core.runtime import DEFAULT_OUTPUT_CAP, ProgramResult, Runtime
from .._errors import RuntimeStopped, SandboxError
from .._runtimes.sandbox import SandboxRuntime, sandbox_url
from .calls import call

CALL_TIMEOUT = 60.0
"""Seconds a call to the runtime actor may take (beyond an exec's own timeout)."""
IMAGE_START_TIMEOUT = 3600.0
"""Seconds starting a runtime over an image may take: its node may have to unpack it first."""


class RemoteRuntime(Runtime):
    """A runtime hosted by a ``RuntimeActor``, driven from another process. Picklable.

    ``lazy=True`` defers provisioning to the first use (``exec``, ``read``, ``write``): a
    rollout that never touches its box costs no runtime actor calls (a sandbox's start is
    ~6 ms of the runtime actor's CPU). It is still "started" as far as the lifecycle goes;
    a sandbox's routes given meanwhile are applied when it is provisioned. It is stopped at
    teardown if it was ever provisioned or handed to another process (which may have
    provisioned it).
    """

    def __init__(self, actor: Any, name: str, *, owner: str | None = None, started: bool = False,
                 runtime_type: str = "local", runtime_id: str | None = None, lazy: bool = False,
                 provisioned: bool = False, actor_on_demand: Callable[[], Any] | None = None,
                 image: str | None = None) -> None:
        super().__init__(name)
        self.image = image
        """The image it runs over (``TaskData.image``), on the runtime actor's node."""
        self.__actor = actor
        self._actor_on_demand = actor_on_demand
        """Instead of ``actor``: called on the first call to make (and pin) it. A rollout actor
        starts its runtime actor only when one of its rollouts first needs a box."""
        self._owner = owner
        self.started = started
        self.type = runtime_type
        self._id = runtime_id
        self._lazy = lazy
        self._provisioned = provisioned or (started and not lazy)
        self._provisioning: asyncio.Future[Any] | None = None
        self._shared = False
        self._routes: list[str] | None = None
        """A lazy sandbox's routes, applied when it is provisioned (by whichever copy does)."""

    @property
    def _actor(self) -> Any:
        if self.__actor is None:
            self.__actor = self._actor_on_demand()  # type: ignore[misc]
        return self.__actor

    def __reduce__(self) -> Any:
        self._shared = True  # the copy may provision it: teardown must reach the actor
        return (_rebuild_remote_runtime, (self._actor, self.name, self._owner, self.started,
                                          self.type, self._id, self.stopped, self._lazy,
                                          self._provisioned, self._routes, self.image))

    @property
    def id(self) -> str:
        return self._id or self.name

    async def _call(self, method: str, *args: Any, wait: float | None = CALL_TIMEOUT, **kwargs: Any) -> Any:
        try:
            return await call(getattr(self._actor, method).remote(*args, **kwargs), timeout=wait)
        except RuntimeStopped:
            self.stopped = True
            raise
        except RayActorError as e:
            self.stopped = True
            raise SandboxError(f"runtime {self.name!r}: its runtime actor died ({type(e).__name__})") from None
        except TimeoutError:
            raise SandboxError(f"runtime {self.name!r}: its runtime actor did not answer {method} "
                               f"within {wait:g}s") from None

    @property
    def enforces(self) -> frozenset[str]:  # type: ignore[override]
        return SandboxRuntime.enforces if self.type == "sandbox" else frozenset()

    def host_url(self, url: str) -> str:
        return sandbox_url(url) if self.type == "sandbox" else url

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        # A local runtime has no network policy. A sandbox's network is closed until its
        # routes are set: set now if it runs, else when it is provisioned.
        if self.type != "sandbox":
            return
        self._routes = list(routes) if routes is not None else None
        if self._provisioned or self._provisioning is not None or not self._lazy:
            await self._provision()
            await self._call("prepare_execution", self.name, self._routes)

    async def refresh(self) -> None:
        """Learn whether the owner stopped this runtime."""
        self.stopped = self.stopped or await self._call("stopped", self.name)

    async def _start(self) -> None:
        if not self._lazy:
            await self._provision()

    async def _provision(self) -> None:
        if self._provisioned:
            return
        if self._provisioning is None:  # concurrent first uses share one start
            self._provisioning = asyncio.ensure_future(self._provision_once())
        info = await asyncio.shield(self._provisioning)
        self.type, self._id, self._provisioned = info.type, info.id, True

    async def _provision_once(self) -> Any:
        info = await self._call("create_started", self.name, owner=self._owner, image=self.image,
                                wait=CALL_TIMEOUT if self.image is None else IMAGE_START_TIMEOUT)
        if info.type == "sandbox" and self._routes is not None:
            await self._call("prepare_execution", self.name, self._routes)
        return info

    async def stop(self) -> None:
        if not self._reached_actor():
            self.stopped = True  # never provisioned nor handed on: nothing to tear down, no task
            return
        await super().stop()

    def _reached_actor(self) -> bool:
        return self._provisioned or self._shared or self._provisioning is not None

    async def _teardown(self) -> None:
        if not self._reached_actor():
            return
        try:
            await getattr(self._actor, "stop").remote(self.name)
        except RayActorError:
            pass  # the actor is gone, and its guardian removed the runtime with it

    async def alive(self) -> bool:
        if not self._provisioned and not self._shared and self.started and not self.stopped:
            return True  # it can run a program: it would be provisioned for it (a copy elsewhere may have been)
        try:
            return bool(await self._call("alive", self.name))
        except SandboxError:
            return False

    async def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float | None = None, max_output: int = DEFAULT_OUTPUT_CAP,
                   stdin: bytes | None = None) -> ProgramResult:
        await self._provision()
        # The program's own timeout bounds it, plus time to kill it; an exec without one is
        # bounded by the rollout's deadline of the phase that runs it.
        wait = None if timeout is None else timeout + CALL_TIMEOUT
        return await self._call("exec", self.name, list(argv), wait=wait, env=dict(env or {}),
                                timeout=timeout, max_output=max_output, stdin=stdin)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        await self._provision()
        return await self._call("read", self.name, path, max_bytes)

    async def write(self, path: str, data: bytes | str) -> None:
        await self._provision()
        await self._call("write", self.name, path, data)


def _rebuild_remote_runtime(actor: Any, name: str, owner: str | None, started: bool,
                            runtime_type: str, runtime_id: str | None, stopped: bool, lazy: bool,
                            provisioned: bool, routes: list[str] | None = None,
                            image: str | None = None) -> RemoteRuntime:
    runtime = RemoteRuntime(actor, name, owner=owner, started=started, runtime_type=runtime_type,
                            runtime_id=runtime_id, lazy=lazy, provisioned=provisioned, image=image)
    runtime.stopped = stopped
    runtime._routes = routes
    return runtime
