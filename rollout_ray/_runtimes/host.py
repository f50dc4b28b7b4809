"""RuntimeHost: many runtimes in one process, each with a recorded owner, none outliving it.

The host is what a ``RuntimeActor`` runs (the actor adds no logic). All its runtimes live
under one root directory, their cgroups under the host's parent cgroups (``HostCgroups``,
listed in the root, where the machine allows it) and all their programs carry the host's
marker, so one guardian process (``guardian.py``) can remove every one of them —
processes, cgroups, disk-limit mounts and files — when the host process dies, even by
SIGKILL. Ownership is recorded: ``stop_owned_by(owner)`` stops what a closed, aborted or
dead rollout owned.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .._core.limits import TaskResources
from .._core.runtime import DEFAULT_OUTPUT_CAP, ProgramResult, Runtime
from .._errors import RuntimeStopped, SandboxError
from .._record.trace import RuntimeInfo
from . import providers
from .cgroup import HostCgroups
from .guardian import HOST_MARKER
from .image_cache import default_image_cache
from .keeper import Keeper, socket_pair
from .open_program import serve_program
from .start_gate import StartGate, node_gate
from .warm_pool import DEFAULT_MAX_IDLE, WarmPool

_GUARDIAN = os.path.join(os.path.dirname(__file__), "guardian.py")


_PRUNE_AT = 1024
"""Runtimes held before the stopped ones are forgotten."""
POOL_OWNER = "warm-pool"
"""The owner of a warm pool's members until a rollout's runtime adopts one."""
CHECK_TIMEOUT = 60.0
"""Seconds a pool member's first ``true`` may take."""


def runtime_kind(kind: str) -> tuple[str, str | None]:
    """``(the kind to use, why not the sandbox)`` for a requested kind: ``providers.resolve``.

    Raises:
        ValueError: an unknown kind.
    """
    return providers.resolve(kind)


class RuntimeHost:
    """Hosts runtimes by name, each of its kind's provider's making (``providers.py``).

    Args:
        root: the directory under which the host's runtimes live (default: a new temp dir).
        kind: the runtime kind it makes when a runtime asks for none (``auto``: see
            ``runtime_kind``); a runtime may ask for any other (``new_runtime(kind=...)``).
        start_gates: the caps on sandbox starts its sandboxes pass (``start_gate.py``);
            default: the node's (``node_gate``).
        max_idle: the most idle sandboxes its warm pool keeps (``warm_pool.py``).
    """

    def __init__(
        self,
        root: str | None = None,
        *,
        kind: str = "auto",
        start_gates: Sequence[StartGate] | None = None,
        max_idle: int = DEFAULT_MAX_IDLE,
    ) -> None:
        self.kind, _ = runtime_kind(kind)
        self.provider = providers.provider(self.kind)
        self._used: dict[str, providers.Provider] = {self.kind: self.provider}  # released at shutdown
        self.root = root or tempfile.mkdtemp(prefix="rollout-ray-host-")
        self.token = uuid.uuid4().hex
        self._runtimes: dict[str, Runtime] = {}
        self._owners: dict[str, str | None] = {}
        self._gone: set[str] = set()
        self._prune_at = _PRUNE_AT
        self._closed = asyncio.Event()
        self._cgroups = HostCgroups(f"rollout-ray-host-{self.token[:16]}", self.provider.controllers(), self.root)
        # The guardian reads the other end of this socket; the kernel closes ours when we die.
        ours, theirs = socket_pair()
        with theirs:
            launcher = subprocess.Popen(  # noqa: S603 - argv of our launcher under sys.executable, no shell
                [sys.executable, _GUARDIAN, self.root, self.token],
                stdin=theirs.fileno(),
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        assert launcher.stdout is not None
        self.keeper = Keeper(ours)
        self.guardian_pid_value = int(launcher.stdout.readline())
        launcher.stdout.close()
        launcher.wait()  # the launcher exits at once; the detached guardian lives on
        self._gates = tuple(start_gates) if start_gates is not None else (node_gate(),)
        self.pool = WarmPool(self._start_member, self._stop_member, max_idle)
        self._members = itertools.count()

    def guardian_pid(self) -> int:
        """Process id of the guardian (tests wait for it to finish cleaning)."""
        return self.guardian_pid_value

    def pid(self) -> int:
        """The host's process id (tests kill it)."""
        return os.getpid()

    def names(self) -> list[str]:
        """Names of the runtimes not yet stopped."""
        return [n for n, r in self._runtimes.items() if not r.stopped]

    def owner(self, name: str) -> str | None:
        return self._owners.get(name)

    async def create(
        self,
        name: str,
        *,
        owner: str | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        kind: str | None = None,
        resources: TaskResources | None = None,
    ) -> RuntimeInfo:
        """Create (not start) a runtime named ``name``, owned by rollout ``owner``, over
        ``image`` when given (a sandbox's; see ``SandboxRuntime``), of ``kind`` (default: the
        host's), held to ``resources`` where its kind enforces them."""
        return self.new_runtime(name, owner=owner, env=env, image=image, kind=kind, resources=resources).info()

    def new_runtime(
        self,
        name: str,
        *,
        owner: str | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        kind: str | None = None,
        resources: TaskResources | None = None,
    ) -> Runtime:
        """``create``, returning the runtime itself, for a caller in this process to drive.

        It is the guardian's to clean up if this process dies; its caller starts and stops it.
        Over an image, of the host's kind and with no resources asked, it may be a member of
        the warm pool: started already.

        Raises:
            SandboxError: an ``image`` for a kind that runs none; a kind unknown or not run here.
        """
        if name in self._runtimes or name in self._gone:
            raise ValueError(f"runtime {name!r} already exists on this host")
        made_by = self._provider(kind)
        member = (
            self.pool.take(image)
            if image is not None
            and made_by is self.provider
            and self.provider.capabilities.warm_pool
            and env is None
            and resources is None
            else None
        )
        if member is not None:  # warm: started before it was asked for
            self._adopt(member, name, owner)
            return member
        return self._make(name, owner, env, image, made_by, resources)

    def _provider(self, kind: str | None) -> providers.Provider:
        """The provider of ``kind`` (``None``: the host's), checked once that this machine runs it."""
        if kind is None or kind == self.kind:
            return self.provider
        try:
            found = providers.provider(runtime_kind(kind)[0])
        except ValueError as e:  # an unknown kind fails its rollout, saying which there are
            raise SandboxError(f"TaskData.runtime / EvalConfig.runtime: {e}") from None
        if found.name not in self._used:
            reason = found.unavailable()
            if reason is not None:
                raise SandboxError(
                    f"runtime kind {found.name!r}: this machine cannot run it ({reason}); run the task "
                    "where it can, or name another kind"
                )
            self._used[found.name] = found
        return found

    def _make(
        self,
        name: str,
        owner: str | None,
        env: Mapping[str, str] | None,
        image: str | None,
        made_by: providers.Provider | None = None,
        resources: TaskResources | None = None,
    ) -> Runtime:
        made_by = made_by or self.provider
        if len(self._runtimes) >= self._prune_at:
            self._forget_stopped()
            # Amortised: with many runtimes live, the next scan waits until as many more exist.
            self._prune_at = max(_PRUNE_AT, 2 * len(self._runtimes))
        env = {**(env or {}), HOST_MARKER: self.token}
        runtime = made_by.make(
            name,
            image,
            providers.HostResources(
                root=self.root,
                env=env,
                cgroup_parents=self._cgroups.ensure(made_by.controllers()),
                keeper=self.keeper,
                start_gates=self._gates,
                host_token=self.token,
                budget=resources,
            ),
        )
        self._runtimes[name] = runtime
        self._owners[name] = owner
        return runtime

    def _forget_stopped(self) -> None:
        # Runtimes stopped by their caller, not through ``stop``: keep only their names.
        for name in [n for n, r in self._runtimes.items() if r.stopped]:
            del self._runtimes[name]
            self._owners.pop(name, None)
            self._gone.add(name)

    def _get(self, name: str) -> Runtime:
        runtime = self._runtimes.get(name)
        if runtime is None or runtime.stopped:
            raise RuntimeStopped(f"runtime {name!r} is stopped or unknown on this host")
        return runtime

    async def create_started(
        self,
        name: str,
        *,
        owner: str | None = None,
        image: str | None = None,
        kind: str | None = None,
        resources: TaskResources | None = None,
    ) -> RuntimeInfo:
        """``create`` then ``start`` in one call; idempotent for a runtime already running.
        ``RuntimeStopped`` if it existed and was stopped."""
        if name in self._gone:
            raise RuntimeStopped(f"runtime {name!r} is stopped or unknown on this host")
        runtime = self._runtimes.get(name)
        runtime = runtime or self.new_runtime(name, owner=owner, image=image, kind=kind, resources=resources)
        cold, started = not runtime.started, time.monotonic()
        await self.start(name)
        if cold and image is not None:
            self.pool.measured(image, time.monotonic() - started)
        return runtime.info()

    # -- the warm pool -----------------------------------------------------------------------

    async def prepare(self, images: Mapping[str, int], setups: Collection[tuple[str, str]] = ()) -> None:
        """The schedule ahead (``Executor.prepare``): how many rollouts over each image may come
        to this host (its warm pool fills to what it measured they need, and drops what is
        no longer coming), and which shareable setups ``(image, setup key)`` are still to come
        (the setup snapshots it owns of others are let go)."""
        surplus = self.pool.want(images if self.provider.capabilities.warm_pool else {})
        await asyncio.gather(*(self.stop(m.name) for m in surplus), return_exceptions=True)
        wanted = set(setups)
        await asyncio.to_thread(default_image_cache().snapshots.let_go, lambda held: held.label in wanted)

    async def _start_member(self, image: str) -> Any:
        runtime = self._make(f"pool-{next(self._members)}-{self.token[:8]}", POOL_OWNER, None, image)
        started = time.monotonic()
        try:
            await runtime.start()
            check = await runtime.exec(["true"], timeout=CHECK_TIMEOUT)
            if check.exit_code != 0:
                raise SandboxError(
                    f"a sandbox over image {image!r} cannot run `true`: exit {check.exit_code}, "
                    f"{check.stderr.strip()[-200:]}"
                )
        except BaseException:
            await self.stop(runtime.name)
            raise
        self.pool.measured(image, time.monotonic() - started)
        return runtime

    async def _stop_member(self, runtime: Runtime) -> None:
        await self.stop(runtime.name)

    def _adopt(self, member: Runtime, name: str, owner: str | None) -> None:
        """A pool member becomes runtime ``name`` of ``owner``."""
        self._runtimes.pop(member.name, None)
        self._owners.pop(member.name, None)
        member.name = name
        self._runtimes[name] = member
        self._owners[name] = owner

    async def start(self, name: str) -> RuntimeInfo:
        runtime = self._get(name)
        await runtime.start()
        return runtime.info()

    async def stop(self, name: str) -> None:
        """Stop a runtime (idempotent; unknown names are ignored)."""
        runtime = self._runtimes.get(name)
        if runtime is not None:
            await runtime.stop()
            # Keep only its name: a long-lived host would otherwise hold one runtime per rollout.
            self._runtimes.pop(name, None)
            self._owners.pop(name, None)
            self._gone.add(name)

    async def stop_owned_by(self, owner: str) -> list[str]:
        """Stop every runtime ``owner`` owns; returns their names."""
        names = [n for n, o in self._owners.items() if o == owner]
        await asyncio.gather(*(self.stop(n) for n in names))
        return names

    async def stopped(self, name: str) -> bool:
        runtime = self._runtimes.get(name)
        return runtime is None or runtime.stopped

    async def alive(self, name: str) -> bool:
        """Whether the runtime can run a program. A name this host never saw counts as alive:
        a lazy runtime is created on its first use."""
        if name not in self._runtimes and name not in self._gone:
            return True
        runtime = self._runtimes.get(name)
        return runtime is not None and await runtime.alive()

    async def exec(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        stdin: bytes | None = None,
    ) -> ProgramResult:
        return await self._get(name).exec(argv, env=env, timeout=timeout, max_output=max_output, stdin=stdin)

    async def open_program(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """``Runtime.open_program`` for a caller in another process on this node: the program's
        stdin/stdout on a loopback port, ``(port, token)`` (``open_program.serve_program``)."""
        return await serve_program(await self._get(name).open_program(argv, env=env))

    async def prepare_execution(self, name: str, routes: Sequence[str] | None) -> None:
        await self._get(name).prepare_execution(routes)

    async def read(self, name: str, path: str, max_bytes: int | None = None) -> bytes:
        return await self._get(name).read(path, max_bytes)

    async def write(self, name: str, path: str, data: bytes | str) -> None:
        await self._get(name).write(path, data)

    async def info(self, name: str) -> RuntimeInfo:
        return self._get(name).info()

    async def claim_setup(self, name: str, key: str, timeout: float | None = None) -> RuntimeInfo:
        """``Runtime.claim_setup`` within ``timeout`` seconds; its info then says whether it
        stands on a setup snapshot (``RuntimeInfo.snapshot``)."""
        runtime = self._get(name)
        async with asyncio.timeout(timeout):
            await runtime.claim_setup(key)
        return runtime.info()

    async def freeze_setup(self, name: str) -> str | None:
        return await self._get(name).freeze_setup()

    async def add_grader_files(self, name: str, files: Mapping[str, bytes | str]) -> str:
        return await self._get(name).add_grader_files(files)

    async def wait_closed(self) -> None:
        """Return when the host shuts down: a watcher's long call, which fails if the host dies."""
        await self._closed.wait()

    async def shutdown(self) -> None:
        """Stop every runtime and let the guardian go; the host is unusable afterwards."""
        self._closed.set()
        await self.pool.close()  # its members are among the runtimes
        await asyncio.gather(*(r.stop() for r in self._runtimes.values()), return_exceptions=True)
        await asyncio.to_thread(default_image_cache().snapshots.let_go)  # each goes once unused
        releases = (p.release(self.token) for p in self._used.values() if p.release is not None)
        await asyncio.gather(*releases, return_exceptions=True)  # what one kind leaves is its own
        await asyncio.to_thread(self._cgroups.remove)
        await asyncio.to_thread(shutil.rmtree, self.root, True)
        self.keeper.close()  # the guardian finds nothing left and exits

    def statistics(self) -> dict[str, Any]:
        live = self.names()
        found: dict[str, Any] = {"runtimes": len(live), "owners": len({self._owners[n] for n in live})}
        if self.pool.stats:  # once an image was asked for
            found["pool"] = self.pool.statistics()
        return found
