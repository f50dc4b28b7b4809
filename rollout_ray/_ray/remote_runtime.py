"""RemoteRuntime: a runtime hosted by a ``RuntimeActor``, used from another process, and the
owned runtime of a rollout actor's rollouts (``owned_runtime``: one started on first use)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from ray.exceptions import RayActorError

from .._core.limits import TaskResources
from .._core.runtime import DEFAULT_OUTPUT_CAP, OpenProgram, ProgramResult, Runtime
from .._errors import InfrastructureLost, RuntimeStopped, SandboxError
from .._hosting.lazy_runtime import LazyRuntime
from .._record.trace import RuntimeInfo
from .._runtimes.open_program import connect_program
from .._runtimes.providers import provider, resolve
from .calls import call

CALL_TIMEOUT = 60.0
"""Seconds a call to the runtime actor may take (beyond an exec's own timeout)."""
IMAGE_START_TIMEOUT = 3600.0
"""Seconds starting a runtime over an image may take: its node may have to unpack it first;
also the most a runtime waits for its group's setup run by another (``claim_setup``), whose
wait ends anyway when the rollout ends (its runtime is stopped)."""


class RemoteRuntime(Runtime):
    """A runtime hosted by a ``RuntimeActor``, driven from another process. Picklable: a copy
    drives the same runtime. ``start`` provisions it in the actor (``owned_runtime`` defers
    that to the first use)."""

    def __init__(
        self,
        actor: Any,
        name: str,
        *,
        owner: str | None = None,
        started: bool = False,
        runtime_type: str = "local",
        runtime_id: str | None = None,
        provisioned: bool = False,
        actor_on_demand: Callable[[], Any] | None = None,
        image: str | None = None,
        resources: TaskResources | None = None,
        ask_kind: bool = False,
    ) -> None:
        super().__init__(name)
        self.__actor = actor
        self._actor_on_demand = actor_on_demand
        """Instead of ``actor``: called on the first call to make (and pin) it. A rollout actor
        starts its runtime actor only when one of its rollouts first needs a box."""
        self._owner = owner
        self.started = started
        self.type = runtime_type
        self._id = runtime_id
        self._provisioned = provisioned or started
        self._provisioning: asyncio.Future[Any] | None = None
        self.image = image
        """The image it runs over (``TaskData.image``), on the runtime actor's node."""
        self.resources = resources
        """What it may use (``TaskData.resources``), held by its kind where it enforces it."""
        self._ask_kind = ask_kind
        """Whether ``runtime_type`` is the kind the runtime actor makes it of (an owned
        runtime's), or only what it was last known as (a pool's: the actor's own kind)."""
        self._info: RuntimeInfo | None = None
        """What the runtime actor last said of it (its image's digest, its setup snapshot)."""

    @property
    def _actor(self) -> Any:
        if self.__actor is None:
            self.__actor = self._actor_on_demand()  # type: ignore[misc]
        return self.__actor

    def __reduce__(self) -> Any:
        return (
            _rebuild_remote_runtime,
            (
                self._actor,
                self.name,
                self._owner,
                self.started,
                self.type,
                self._id,
                self.stopped,
                self._provisioned,
                self.image,
                self.resources,
                self._ask_kind,
            ),
        )

    @property
    def id(self) -> str:
        return self._id or self.name

    def info(self, *, borrowed: bool = False) -> RuntimeInfo:
        if self._info is None:
            return super().info(borrowed=borrowed)
        return msgspec.structs.replace(self._info, name=self.name, borrowed=borrowed)

    async def _call(self, method: str, *args: Any, wait: float | None = CALL_TIMEOUT, **kwargs: Any) -> Any:
        try:
            return await call(getattr(self._actor, method).remote(*args, **kwargs), timeout=wait)
        except RuntimeStopped:
            self.stopped = True
            raise
        except RayActorError as e:
            self.stopped = True
            # The process hosting the box died, not the box: the rollout is lost, and retried.
            raise InfrastructureLost(f"runtime {self.name!r}: its runtime actor died ({type(e).__name__})") from None
        except TimeoutError:
            raise SandboxError(
                f"runtime {self.name!r}: its runtime actor did not answer {method} within {wait:g}s"
            ) from None

    @property
    def enforces(self) -> frozenset[str]:  # type: ignore[override]
        return provider(self.type).enforces

    def host_url(self, url: str) -> str:
        return provider(self.type).host_url(url)

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        # A kind without routes has no network policy; one with is closed until its routes are set.
        if provider(self.type).capabilities.routes:
            await self._provision()
            await self._call("prepare_execution", self.name, list(routes) if routes is not None else None)

    async def refresh(self) -> None:
        """Learn whether the owner stopped this runtime."""
        self.stopped = self.stopped or await self._call("stopped", self.name)

    async def _start(self) -> None:
        await self._provision()

    async def _provision(self) -> None:
        if self._provisioned:
            return
        if self._provisioning is None:  # concurrent first uses share one start
            self._provisioning = asyncio.ensure_future(self._provision_once())
        info = await asyncio.shield(self._provisioning)
        self.type, self._id, self._provisioned, self._info = info.type, info.id, True, info

    async def _provision_once(self) -> Any:
        return await self._call(
            "create_started",
            self.name,
            owner=self._owner,
            image=self.image,
            kind=self.type if self._ask_kind else None,
            resources=self.resources,
            wait=CALL_TIMEOUT if self.image is None else IMAGE_START_TIMEOUT,
        )

    async def _teardown(self) -> None:
        with contextlib.suppress(RayActorError):  # the actor is gone, and its guardian removed the runtime with it
            await self._actor.stop.remote(self.name)

    async def alive(self) -> bool:
        try:
            return bool(await self._call("alive", self.name))
        except SandboxError:
            return False

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        await self._provision()
        # The program's own timeout bounds it, plus time to kill it; an exec without one is
        # bounded by the rollout's deadline of the phase that runs it.
        wait = None if timeout is None else timeout + CALL_TIMEOUT
        return await self._call(  # type: ignore[no-any-return]
            "exec",
            self.name,
            list(argv),
            wait=wait,
            env=dict(env or {}),
            timeout=timeout,
            max_output=max_output,
            stdin=stdin,
        )

    async def open_program(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, limit: int = 1 << 16
    ) -> OpenProgram:
        """Held open by the runtime actor, reached over loopback: the actor is on this node (a
        rollout actor's runtimes are; a borrowed runtime of another node's pool is not)."""
        await self._provision()
        port, token = await self._call("open_program", self.name, list(argv), dict(env or {}))
        try:
            return await connect_program(port, token, limit)
        except OSError as e:
            raise SandboxError(
                f"runtime {self.name!r}: cannot reach its program {argv[0]!r} on loopback port {port} "
                f"(is its runtime actor on another node?): {e}"
            ) from None

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        await self._provision()
        return await self._call("read", self.name, path, max_bytes)  # type: ignore[no-any-return]

    async def claim_setup(self, key: str) -> str | None:
        await self._provision()
        self._info = await self._call("claim_setup", self.name, key, wait=IMAGE_START_TIMEOUT)
        return self._info.snapshot

    async def freeze_setup(self) -> str | None:
        await self._provision()
        return await self._call("freeze_setup", self.name, wait=IMAGE_START_TIMEOUT)  # type: ignore[no-any-return]

    async def add_grader_files(self, files: Mapping[str, bytes | str]) -> str:
        await self._provision()
        return await self._call("add_grader_files", self.name, dict(files))  # type: ignore[no-any-return]

    async def write(self, path: str, data: bytes | str) -> None:
        await self._provision()
        await self._call("write", self.name, path, data)


def _rebuild_remote_runtime(
    actor: Any,
    name: str,
    owner: str | None,
    started: bool,
    runtime_type: str,
    runtime_id: str | None,
    stopped: bool,
    provisioned: bool,
    image: str | None = None,
    resources: TaskResources | None = None,
    ask_kind: bool = False,
) -> RemoteRuntime:
    runtime = RemoteRuntime(
        actor,
        name,
        owner=owner,
        started=started,
        runtime_type=runtime_type,
        runtime_id=runtime_id,
        provisioned=provisioned,
        image=image,
        resources=resources,
        ask_kind=ask_kind,
    )
    runtime.stopped = stopped
    return runtime


def owned_runtime(
    name: str,
    kind: str,
    actor: Callable[[], Any],
    image: str | None = None,
    resources: TaskResources | None = None,
    *,
    default: str | None = None,
) -> LazyRuntime:
    """A rollout actor's runtime for its rollout ``name`` (which owns it), of ``kind`` (the
    actor's, or its task's: ``TaskData.runtime``), in the runtime actor ``actor()`` returns:
    started on its first use (``LazyRuntime``), so a rollout that never touches its box costs
    no runtime actor call (a sandbox's start is ~6 ms of that actor's CPU), and a rollout actor
    none of whose rollouts does starts no runtime actor. ``image``: the task's
    (``TaskData.image``), unpacked on the runtime actor's node; ``resources``: the task's;
    ``default``: the actor's kind, already resolved.

    Raises:
        SandboxError: an unknown kind (the rollout fails, naming the kinds there are).
    """
    if kind != default:  # a task's own: checked here ("auto": decided on this node, which runs the boxes)
        try:
            kind = resolve(kind)[0]
        except ValueError as e:
            raise SandboxError(f"TaskData.runtime / EvalConfig.runtime: {e}") from None
    return LazyRuntime(
        RemoteRuntime(
            None,
            name,
            owner=name,
            runtime_type=kind,
            actor_on_demand=actor,
            image=image,
            resources=resources,
            ask_kind=True,
        )
    )
