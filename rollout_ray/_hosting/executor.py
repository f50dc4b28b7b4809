"""Executors: the interface between the driver and where its rollouts run.

A ``RolloutSpec`` (``spec``) says what one rollout is; an executor runs it to a closed trace, whatever
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
from collections.abc import Sequence
from typing import Any

from .._core.task import Task
from .._record.trace import AgentInfo, Timing, Trace
from .spec import RolloutSpec


def failed_trace(spec: RolloutSpec, error: BaseException) -> Trace:
    """The record of a rollout that ended without a trace of its own: its host was lost
    (``error`` an ``InfrastructureLost``: a lost rollout) or it could not be run at all
    (a task that cannot be pickled, say: a failed one). Completed, not ok, with ``error``."""
    trace = Trace(
        task=spec.task.trace_task(), agent=AgentInfo(harness=spec.harness.id), timing=Timing(start=time.time())
    )
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

    async def set_policy(self, version: int | None, paused: bool, interrupt: bool = False) -> None:
        """Make every rollout it runs see policy ``version`` and the pause (``_core/policy_gate``):
        while paused, their model calls wait before going upstream and their agent clocks
        stand still. Returns once every place where its rollouts make model calls knows;
        ``interrupt`` (with ``paused``): once their calls in flight that can be interrupted
        have stopped at their servers too.

        This one does nothing: a rollout built without a policy of its own obeys the
        process's (``process_gate()``), which an executor sharing it may set. An executor
        wrapping another forwards the call to it.
        """

    async def prepare(self, upcoming: Sequence[Task], admitted: Sequence[Task] = ()) -> None:
        """The schedule ahead (``lookahead``): the tasks of the next rollouts the driver will
        admit, in order (one per sample), and of those it admitted last, which may still be
        starting. An executor whose nodes run images starts their sandboxes ahead (a warm
        pool per image) and keeps the setup snapshots still needed. This one does nothing.
        An executor wrapping another forwards the call (and ``looks_ahead``) to it."""

    @property
    def looks_ahead(self) -> bool:
        """Whether ``prepare`` uses the schedule: only then does the driver read tasks ahead of
        what it admits (``max_in_flight`` rollouts' worth)."""
        return False

    def statistics(self) -> dict[str, Any]:
        return {}

    async def live(self) -> dict[str, Any]:
        """Where its rollouts are now, as ``_hosting/live.live_report`` says (a live run's
        status polls it every few seconds); this one knows nothing. An executor wrapping
        another forwards the call to it."""
        return {"rollouts": [], "servers": []}

    @property
    def max_in_flight(self) -> int | None:
        """Rollouts this executor runs at once, at most; ``None``: no bound of its own."""
        return None
