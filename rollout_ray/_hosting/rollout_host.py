"""RolloutHost: up to K concurrent rollouts in one long-lived process.

What a ``RolloutActor`` runs, and what ``LocalExecutor`` runs in the driver's process (no
bound of its own there, under the executor's own policy). It forwards ``open`` / ``step`` / ``close`` / ``abort`` to the
``Rollout`` core and adds no lifecycle logic; ``run`` does open → step → close in one call so
a driver pays one actor call per rollout. It hands back ``Trace`` objects: how they cross
to the driver is the Ray layer's business (``_ray/wire``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from .._core.interception import Interception
from .._core.policy_gate import PolicyGate
from .._core.rollout import Rollout, ToolServerFactory
from .._core.runtime import Runtime
from .._record.messages import Message
from .._record.trace import Trace
from .live import live_report
from .spec import RolloutSpec


class RolloutHost:
    """Hosts rollouts; at most ``capacity`` are open at once (``open`` waits for room).

    Args:
        capacity: K, the number of concurrent rollouts; ``None``: no bound of its own (the
            driver's ``max_in_flight`` bounds them).
        interception: serves the sessions of this host's rollouts.
        runtime_factory: builds an owned runtime named after the trace id.
        tool_server: serves tasks' toolsets, if any task declares some.
        policy: the policy version and pause its rollouts obey (default: the process's).
    """

    def __init__(
        self,
        capacity: int | None,
        *,
        interception: Interception,
        runtime_factory: Callable[..., Runtime],
        tool_server: ToolServerFactory | None = None,
        policy: PolicyGate | None = None,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 (or None: no bound), got {capacity}")
        self.capacity = capacity
        self._room = None if capacity is None else asyncio.Semaphore(capacity)
        self._policy = policy
        self._interception = interception
        self._runtime_factory = runtime_factory
        self._tool_server = tool_server
        self._rollouts: dict[str, Rollout] = {}
        self._labels: dict[str, str] = {}
        """The driver's label of each open rollout (``RolloutSpec.label``), by trace id."""
        self.completed = 0

    def _build(self, spec: RolloutSpec) -> Rollout:
        return build_rollout(
            spec,
            interception=self._interception,
            runtime_factory=self._runtime_factory,
            tool_server=self._tool_server,
            policy=self._policy,
        )

    async def open(self, spec: RolloutSpec) -> tuple[str, bool]:
        """Open a rollout; returns its id (the trace id) and ``Rollout.open``'s result."""
        rollout = await self._admit(spec)
        try:
            return rollout.trace.id, await rollout.open()
        except BaseException:
            await self._release(rollout)
            raise

    async def _admit(self, spec: RolloutSpec) -> Rollout:
        """Wait for room, then build and register the rollout."""
        if self._room is not None:
            await self._room.acquire()
        try:
            rollout = self._build(spec)
            refresh = getattr(spec.runtime, "refresh", None)
            if refresh is not None:
                await refresh()  # B8 must see the owner's latest word on a borrowed runtime
        except BaseException:
            if self._room is not None:
                self._room.release()
            raise
        self._rollouts[rollout.trace.id] = rollout
        self._labels[rollout.trace.id] = spec.label
        return rollout

    def _get(self, rollout_id: str) -> Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise KeyError(f"no open rollout {rollout_id!r} on this host")
        return rollout

    async def step(self, rollout_id: str, messages: Sequence[Message] | None = None) -> bool:
        return await self._get(rollout_id).step(messages)

    async def close(self, rollout_id: str) -> Trace:
        rollout = self._get(rollout_id)
        try:
            return await rollout.close()
        finally:
            await self._release(rollout)

    async def abort(self, rollout_id: str) -> None:
        rollout = self._rollouts.get(rollout_id)
        if rollout is not None:
            try:
                await rollout.abort()
            finally:
                await self._release(rollout)

    async def run(self, spec: RolloutSpec) -> Trace:
        """``Rollout.run`` (open → step → close) in one call: one actor call per rollout. A
        rollout whose services were lost under it comes back lost (its ``InfrastructureLost``
        recorded), like any other outcome."""
        rollout = await self._admit(spec)
        try:
            return await rollout.run()
        finally:
            await self._release(rollout)

    def trace(self, rollout_id: str) -> Trace:
        """The current trace of an open rollout."""
        return self._get(rollout_id).trace

    async def _release(self, rollout: Rollout) -> None:
        # Only the first release of a rollout frees its room (close after abort is harmless).
        self._labels.pop(rollout.trace.id, None)
        if self._rollouts.pop(rollout.trace.id, None) is not None:
            self.completed += 1
            if self._room is not None:
                self._room.release()

    def live(self) -> dict[str, Any]:
        """Where each open rollout is now (``live.live_report``)."""
        return live_report((self._labels.get(i, ""), r) for i, r in self._rollouts.items())

    def open_ids(self) -> list[str]:
        return list(self._rollouts)

    async def shutdown(self) -> None:
        """Abort every open rollout (their owned runtimes are stopped)."""
        await asyncio.gather(*(self.abort(i) for i in list(self._rollouts)), return_exceptions=True)


def build_rollout(
    spec: RolloutSpec,
    *,
    interception: Interception,
    runtime_factory: Callable[..., Runtime],
    tool_server: ToolServerFactory | None,
    policy: PolicyGate | None = None,
) -> Rollout:
    """The ``Rollout`` ``spec`` describes, served by the given services, under ``policy``
    (default: the process's). An in-process harness is served by its own session, whatever
    the host's interception."""
    return Rollout(
        spec.task,
        spec.harness,
        model=spec.model,
        runtime=spec.runtime,
        runtime_factory=runtime_factory,
        runtime_kind=spec.runtime_kind,
        interception=None if spec.harness.in_process else interception,
        tool_server=tool_server,
        limits=spec.limits,
        timeouts=spec.timeouts,
        model_name=spec.model_name,
        sampling=spec.sampling,
        has_user=spec.has_user,
        policy=policy,
    )
