"""How a run's samples are run: group by group as admission lets them in, at most
``max_in_flight`` at once, each to one record, a stale one run again.

The driver (``driver.py``) owns the run: its store, finalizer, stream and reporting; this is
its scheduling, inherited as ``PolicyOwner`` is. Each planned group's samples get a slot each
(``Slots``: the in-flight bound, steered while the run runs) and run through the operator's
``Steering`` and ``run_attempts`` (a lost rollout run again); the record closes its group at
the finalizer when it is the last. With ``max_staleness``, a group whose members are too old
for the policy when it is finalized has them masked or run again (``staleness``). Provider
failures in a row halt the run (the circuit breaker, ``breaker``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import aclosing
from typing import Literal

from .._core.harness import Harness
from .._core.limits import LIMIT_FIELDS
from .._core.model import Model
from .._core.task import Task
from .._errors import ProviderError
from .._hosting.executor import Executor
from .._hosting.lookahead import lookahead
from .._hosting.spec import RolloutSpec
from .._record.arrow import RolloutRecord
from .._record.trace import Trace
from .admission import Admission
from .attempts import run_attempts
from .eval_config import EvalConfig
from .group_finalizer import GroupFinalizer, Masks
from .progress import Progress
from .run_dir import RunDirectory
from .slots import Slots
from .staleness import split_stale
from .steering import Steering

log = logging.getLogger("rollout_ray")


def group_id_of(position: int, task: Task) -> str:
    """The group of the task at ``position`` in its taskset: the position (identical tasks are
    distinct groups) and the task's key (a resume over a changed taskset is refused)."""
    return f"{position}-{task.key[:16]}"


class SampleScheduler:
    """The scheduling of ``Driver``: ``_rollouts`` runs every planned sample."""

    tasks: Iterable[Task]
    harness: Harness
    model: Model
    executor: Executor
    config: EvalConfig
    progress: Progress
    run_id: str
    status: Literal["completed", "halted"]
    reason: str
    _admission: Admission
    _slots: Slots
    _steering: Steering
    _halt: asyncio.Event
    _whole_groups: bool
    _store: RunDirectory | None
    _finalizer: GroupFinalizer | None
    _tg: asyncio.TaskGroup | None
    _done: set[tuple[str, int]]
    _redo: dict[tuple[str, int], RolloutRecord]
    _pending: dict[str, list[RolloutRecord]]
    _group_sizes: dict[str, int]
    _group_tasks: dict[str, tuple[int, Task]]
    _provider_streak: int
    _policy_version: int

    _report: Callable[[], None]
    """``on_progress`` when due: the driver's (``Driver._report``)."""

    async def _rollouts(self) -> None:
        """Every planned sample, at most ``max_in_flight`` at once, group by group as admission
        allows, until done or halted."""
        slots = self._slots
        bound = self.executor.max_in_flight
        if bound is not None and bound < slots.limit:
            log.warning(
                "the executor runs at most %d rollouts at once, below max_in_flight=%d: the rest wait for room in it",
                bound,
                slots.limit,
            )
        limits, timeouts = self.config.limits, self.config.timeouts
        if all(getattr(limits, name) is None for name in LIMIT_FIELDS) and timeouts.agent is None:
            log.warning(
                "EvalConfig sets no turn, token or time limit: an agent that never stops runs forever; "
                "set limits=RolloutLimits(max_turns=...) or timeouts=RolloutTimeouts(agent=...)"
            )
        # The executor hears what comes next (warm sandboxes per image, setup snapshots kept).
        window = slots.limit if self.executor.looks_ahead else 0
        planned = lookahead(
            self._plan(), window, self.executor.prepare, tasks_of=lambda group: [group[1]] * len(group[3])
        )
        async with aclosing(planned), asyncio.TaskGroup() as tg:
            while await self._admission.room():
                self.progress.held = self._admission.held
                group = await anext(planned, None)
                if group is None:
                    return
                position, task, group_id, todo = group
                self._admission.admit()
                for n, sample_idx in enumerate(todo):
                    await slots.acquire()
                    if self._halt.is_set() and (n == 0 or not self._whole_groups):
                        slots.release()
                        return
                    self.progress.in_flight += 1
                    tg.create_task(self._one(position, task, group_id, sample_idx, slots))

    def _plan(self) -> Iterator[tuple[int, Task, str, list[int]]]:
        """Each group with samples to run, and those samples; a task is read when its group is planned."""
        done = self._done
        for position, task in enumerate(self.tasks):
            group_id = group_id_of(position, task)
            if self._store is not None:
                self._store.check_task(position, group_id)
            self._group_sizes[group_id] = self.config.samples_per_task
            todo = [i for i in range(self.config.samples_per_task) if (group_id, i) not in done]
            self.progress.skipped += self.config.samples_per_task - len(todo)
            if todo:
                yield position, task, group_id, todo

    async def _one(self, position: int, task: Task, group_id: str, sample_idx: int, slots: Slots) -> None:
        """One sample; its slot is held until its record is in (and, if it closes its group,
        until the group is queued for the finalizer: ``finished_buffer``)."""
        try:
            try:
                trace, attempt, attempts = await run_attempts(
                    self._steering.run,
                    lambda: self._spec(task, f"{group_id}#{sample_idx}"),
                    self._redo.pop((group_id, sample_idx), None),
                    retries=self.config.max_infra_retries,
                    retry_failed=self.config.retry_failed,
                    on_retry=self._retried,
                    run_id=self.run_id,
                )
            finally:
                self.progress.in_flight -= 1
            self._count(trace)
            members = self._pending.setdefault(group_id, [])
            members.append(RolloutRecord(trace, self.run_id, group_id, sample_idx, attempt, position, attempts))
            if len(members) == self._group_sizes[group_id]:
                del self._pending[group_id]
                if self.config.max_staleness is not None:
                    self._group_tasks[group_id] = (position, task)
                assert self._finalizer is not None
                await self._finalizer.close(group_id, members)
        finally:
            slots.release()
        self._report()

    def _fresh_or_rerun(self, group_id: str, members: list[RolloutRecord]) -> Masks | None:
        """As the finalizer finalizes a group (``max_staleness``): keep it if no member is too old
        for the current policy; else mask those (``stale_samples="mask"``: the masks), or drop
        them, run their samples again and keep the group pending until they are back (``None``)."""
        position, task = self._group_tasks.pop(group_id)
        assert self.config.max_staleness is not None and self._tg is not None
        fresh, stale = split_stale(members, self._policy_version, self.config.max_staleness)
        if not stale:
            return {}
        if self.config.stale_samples == "mask":
            self.progress.masked += len(stale)
            return {record.sample_idx: "stale" for record in stale}
        self._pending[group_id] = fresh
        for record in stale:
            self.progress.stale += 1
            self.progress.count(record.trace.ok, record.trace.reward, sign=-1)
            self._tg.create_task(self._again(position, task, group_id, record.sample_idx))
        return None

    async def _again(self, position: int, task: Task, group_id: str, sample_idx: int) -> None:
        """A stale sample's new run, when there is room (a halted run leaves its group incomplete)."""
        assert self._finalizer is not None
        await self._slots.acquire()
        if self._halt.is_set():
            self._slots.release()
            self._finalizer.abandon(group_id)
            return
        self.progress.in_flight += 1
        await self._one(position, task, group_id, sample_idx, self._slots)

    def _spec(self, task: Task, label: str = "") -> RolloutSpec:
        c = self.config
        return RolloutSpec(
            task,
            self.harness,
            self.model,
            limits=c.limits,
            timeouts=c.timeouts,
            model_name=c.model_name,
            sampling=dict(c.sampling),
            runtime_kind=c.runtime,
            label=label,
        )

    def _retried(self) -> None:
        self.progress.retried += 1

    def _count(self, trace: Trace) -> None:
        self.progress.count(trace.ok, trace.reward)
        last = trace.last_error
        if not trace.ok and last is not None and last.is_a(ProviderError):
            self._provider_streak += 1
            if self._provider_streak >= self.config.breaker and not self._halt.is_set():
                self.status = "halted"
                self.reason = (
                    f"circuit breaker: {self._provider_streak} consecutive provider "
                    f"failures (last: {last.message[:200]})"
                )
                self._halt.set()
                self._admission.stop()
        else:
            self._provider_streak = 0
