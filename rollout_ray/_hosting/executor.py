"""Executors: the interface between the driver and where its rollouts run.

A ``RolloutSpec`` says what one rollout is; an executor runs it to a closed trace, whatever
happens to it. Failures inside a rollout are on its trace; so is the loss of what hosted it
(its actor, process, node or services): a *lost* rollout is a trace whose error is an
``InfrastructureLost`` (``ErrorRecord.is_a``), made by ``failed_trace`` when the executor
has no trace of its own to return. The driver runs a lost rollout again. ``LocalExecutor``
runs the core in the driver's process; ``RayExecutor`` (``_ray``) on a pool of rollout
actors.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.harness import Harness
from .._core.interception import Interception
from .._core.limits import RolloutLimits, RolloutTimeouts
from .._core.model import Model
from .._core.policy_gate import PolicyGate
from .._core.rollout import Rollout, ToolServerFactory
from .._core.runtime import Runtime
from .._core.task import Task
from .._record.trace import AgentInfo, Timing, Trace


@dataclass
class RolloutSpec:
    """One rollout to run: what, with which model, under which budgets, in which runtime.

    ``runtime`` is a live runtime to borrow (e.g. from a ``RuntimeActor`` pool); ``None``
    makes the rollout own a fresh one on its host.
    """

    task: Task
    harness: Harness
    model: Model
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    timeouts: RolloutTimeouts = field(default_factory=RolloutTimeouts)
    model_name: str | None = None
    sampling: dict[str, Any] | None = None
    has_user: bool = False
    runtime: Runtime | None = None

    def rollout(self, *, interception: Interception, runtime_factory: Callable[[str], Runtime],
                tool_server: ToolServerFactory | None, policy: PolicyGate | None = None) -> Rollout:
        """The ``Rollout`` this spec describes, served by the given services, under ``policy``
        (default: the process's)."""
        return Rollout(
            self.task,
            self.harness,
            model=self.model,
            runtime=self.runtime,
            runtime_factory=runtime_factory,
            interception=None if self.harness.in_process else interception,  # the host's, whatever the harness
            tool_server=tool_server,
            limits=self.limits,
            timeouts=self.timeouts,
            model_name=self.model_name,
            sampling=self.sampling,
            has_user=self.has_user,
            policy=policy,
        )


def failed_trace(spec: RolloutSpec, error: BaseException) -> Trace:
    """The record of a rollout that ended without a trace of its own: its host was lost
    (``error`` an ``InfrastructureLost``: a lost rollout) or it could not be run at all
    (a task that cannot be pickled, say: a failed one). Completed, not ok, with ``error``."""
    trace = Trace(task=spec.task.trace_task(), agent=AgentInfo(harness=spec.harness.id),
                  timing=Timing(start=time.time()))
    trace.record_error(error)
    trace.is_completed = True
    return trace


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
        """Run one rollout to its closed trace; a rollout whose host died is a lost one
        (``failed_trace(spec, InfrastructureLost(...))``), returned, not raised."""

    async def set_policy(self, version: int | None, paused: bool) -> None:
        """Make every rollout it runs see policy ``version`` and the pause (``_core/policy_gate``):
        while paused, their model calls wait before going upstream and their agent clocks
        stand still. Returns once every place where its rollouts make model calls knows.

        This one does nothing: a rollout built without a policy of its own obeys the
        process's (``process_gate()``), which an executor sharing it may set. An executor
        wrapping another forwards the call to it.
        """

    def statistics(self) -> dict[str, Any]:
        return {}

    @property
    def max_in_flight(self) -> int | None:
        """Rollouts this executor runs at once, at most; ``None``: no bound of its own."""
        return None
