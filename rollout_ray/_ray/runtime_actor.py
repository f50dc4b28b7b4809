"""The runtime actor: a ``RuntimeHost`` in its own process, and a handle to use it as a pool."""

from __future__ import annotations

from typing import Any

import ray

from .._runtimes.host import RuntimeHost
from .._runtimes.start_gate import node_gate
from .calls import SHUTDOWN_GRACE, stop_actor
from .remote_runtime import RemoteRuntime
from .start_limiter import ClusterStartGate, find_limiter


class _RuntimeActor(RuntimeHost):
    """A ``RuntimeHost`` whose sandbox starts pass the node's gate, then the cluster's, when a
    driver set cluster caps (``start_limiter``)."""

    def __init__(self, root: str | None = None, *, kind: str = "auto") -> None:
        limiter = find_limiter()
        gates = None if limiter is None else (node_gate(), ClusterStartGate(limiter))
        super().__init__(root, kind=kind, start_gates=gates)


RuntimeActorClass = ray.remote(num_cpus=0, max_concurrency=1000)(_RuntimeActor)  # type: ignore[call-overload]  # ray's overloads omit actor options
"""``RuntimeHost`` made remote; a ``RolloutActor`` creates one for the runtimes it owns."""


class RuntimeActor:
    """Handle to a runtime pool: runtimes to *borrow*, alive until the pool stops them."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._count = 0

    @classmethod
    def create(cls, *, kind: str = "auto", **options: Any) -> RuntimeActor:
        """A pool of ``kind`` runtimes (``"auto"`` or a provider's name: ``_runtimes/providers.py``)."""
        return cls(RuntimeActorClass.options(**options).remote(kind=kind))

    async def runtime(self, name: str | None = None) -> RemoteRuntime:
        """A new started runtime owned by this pool (not by any rollout)."""
        self._count += 1
        runtime = RemoteRuntime(self.actor, name or f"pool-{self._count}-{id(self):x}")
        await runtime.start()
        return runtime

    async def aclose(self, grace: float = SHUTDOWN_GRACE) -> None:
        await stop_actor(self.actor, grace)
