"""The driver: tasks × samples rollouts, bounded in flight, into Arrow and finalized groups.

Each (task, sample) is scheduled once; at most ``max_in_flight`` run at a time, so memory
stays flat however many tasks there are. A task's identity in a run is its position in the
taskset (``group_id_of``): two identical tasks are two groups. Every scheduled sample ends as
exactly one record: a rollout lost to infrastructure is retried up to ``max_infra_retries``
times (each attempt's errors kept on the final trace, oldest first, and numbered in the
record's ``attempts``) and then recorded as failed — so a group always
completes and is never blocked by one bad sample. Task and harness failures are data and are
not retried unless ``retry_failed``. ``breaker`` consecutive provider failures halt the run:
nothing new is scheduled and the status says why.

Records stream into Parquet shards when a run directory is given (and a rerun with
``resume=True`` skips every (group, sample) already stored); each group is finalized (group
statistics, advantages, best-of-n, pass@k) the moment its last sample closes, and handed to
the consumer of ``groups()`` through a bounded queue.

For asynchronous RL the driver owns the policy version and the weight-update pause
(``pause`` / ``resume`` / ``paused``, carried to wherever model calls are made by
``Executor.set_policy``; see ``_core/policy_gate``), and with ``max_staleness`` drops and re-runs
a finished rollout too old for the current version when its group is handed on (``staleness``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from .._core.aio import unwrapped
from .._core.harness import Harness
from .._core.limits import RolloutLimits, RolloutTimeouts
from .._core.model import Model
from .._core.task import Task
from .._errors import InfrastructureLost, ProviderError, ResumeMismatch
from .._hosting.executor import Executor, failed_trace
from .._hosting.gc_tuning import tuned_for_rollouts
from .._hosting.spec import RolloutSpec
from .._record.arrow import RolloutRecord, warm_arrow
from .._record.store import read_groups, read_run
from .._record.trace import Trace
from .finalize import FinalizeConfig
from .group_finalizer import Group, GroupFinalizer
from .policy_owner import PolicyOwner
from .run_dir import RunDirectory
from .staleness import split_stale

log = logging.getLogger("rollout_ray")


class EvalConfig(BaseModel):
    """How a run is driven (user config)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, use_attribute_docstrings=True)

    samples_per_task: int = Field(1, ge=1)
    """n: rollouts per task; the samples of one task form a group."""
    max_in_flight: int = Field(64, ge=1)
    """Rollouts running at once (backpressure)."""
    max_infra_retries: int = Field(2, ge=0)
    """Retries of a rollout whose host died."""
    retry_failed: bool = False
    """Also retry rollouts that failed inside (task or harness errors), up to the same count."""
    breaker: int = Field(10, ge=1)
    """Consecutive provider failures that halt the run."""
    rows_per_shard: int = Field(1000, ge=1)
    """Rows per Parquet shard, at most: finalized groups are written when this many are
    buffered, or 2 s after the first of them was (``group_finalizer.WRITE_WITHIN``), or 64 MiB of them."""
    stream_buffer: int = Field(64, ge=1)
    """Finalized groups waiting for the consumer before the driver waits too."""
    limits: RolloutLimits = RolloutLimits()
    timeouts: RolloutTimeouts = RolloutTimeouts()
    model_name: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    finalize: FinalizeConfig = FinalizeConfig()
    max_staleness: int | None = Field(None, ge=0)
    """Versions a rollout's oldest turn may lag the current policy version when its group is
    handed to the consumer; an older one is dropped and re-run (0: synchronous on-policy;
    see ``_driver/staleness``). ``None``: all kept."""


@dataclass
class Progress:
    """Counters of a running driver, for progress displays."""

    total: int | None
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    retried: int = 0
    skipped: int = 0
    stale: int = 0
    """Rollouts dropped as too old for the policy version (``max_staleness``) and re-run."""
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if self.total is None or not self.rate:
            return None
        return (self.total - self.skipped - self.done) / self.rate


@dataclass(frozen=True)
class RunResult:
    status: Literal["completed", "halted"]
    reason: str
    samples: pa.Table
    groups: pa.Table
    run_dir: str | None
    stale: int = 0
    """Rollouts dropped as stale and re-run."""


def group_id_of(position: int, task: Task) -> str:
    """The group of the task at ``position`` in its taskset: the position (identical tasks are
    distinct groups) and the task's key (a resume over a changed taskset is refused)."""
    return f"{position}-{task.key[:16]}"


class Driver(PolicyOwner):
    """Runs ``tasks`` × ``config.samples_per_task`` rollouts on ``executor`` (once).

    Args:
        tasks: the taskset (any iterable; consumed lazily).
        harness: the agent.
        model: the upstream model.
        executor: where rollouts run (``LocalExecutor``, ``RayExecutor``).
        config: run settings.
        run_dir: directory for the manifest and Parquet shards; ``None`` keeps results in memory.
        resume: continue the run in ``run_dir``: skip every (group, sample) already stored,
            except those that failed for infrastructure or provider reasons (redone, with
            their earlier errors kept) unless ``keep_failed``; see ``RunDirectory``.
        overwrite: replace the run stored in ``run_dir`` (only a run directory: one with a
            manifest; never through a symbolic link).
        judge: cross-trace hook for ``finalize`` (called once per group's table).
        on_progress: called with ``Progress`` at most every ``progress_every`` seconds.
        policy_version: the policy version the run starts at (``set_policy_version``).
    """

    def __init__(
        self,
        tasks: Iterable[Task],
        harness: Harness,
        model: Model,
        *,
        executor: Executor,
        config: EvalConfig | None = None,
        run_dir: str | None = None,
        resume: bool = False,
        overwrite: bool = False,
        keep_failed: bool = False,
        judge: Callable[[pa.Table], Any] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        progress_every: float = 0.5,
        manifest_config: dict[str, Any] | None = None,
        policy_version: int = 0,
    ) -> None:
        self.tasks, self.harness, self.model, self.executor = tasks, harness, model, executor
        self.config = config or EvalConfig()
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run, or replace it")
        self.run_dir, self.resume_run, self.keep_failed, self.judge = run_dir, resume, keep_failed, judge
        self.overwrite = overwrite
        self._on_progress, self._progress_every = on_progress, progress_every
        self._manifest_config = manifest_config or {}
        total = len(tasks) * self.config.samples_per_task if hasattr(tasks, "__len__") else None  # type: ignore[arg-type]
        self.progress = Progress(total=total)
        self.run_id = uuid.uuid4().hex
        self.status: Literal["completed", "halted"] = "completed"
        self.reason = ""
        self._pending: dict[str, list[RolloutRecord]] = {}
        self._group_sizes: dict[str, int] = {}
        self._finalizer: GroupFinalizer | None = None
        self._provider_streak = 0
        self._halt = asyncio.Event()
        self._last_report = 0.0
        self._done: set[tuple[str, int]] = set()
        self._redo: dict[tuple[str, int], RolloutRecord] = {}
        self._store: RunDirectory | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ray-shards")
        self._init_policy(policy_version)
        self._tg: asyncio.TaskGroup | None = None
        self._slots: asyncio.Semaphore | None = None
        self._group_tasks: dict[str, tuple[int, Task]] = {}
        """With ``max_staleness``: the task of each group closed and not yet finalized."""

    # -- public API -------------------------------------------------------------------------

    async def groups(self) -> AsyncIterator[Group]:
        """Finalized groups as they complete (the trainer stream).

        To stop early, iterate inside ``contextlib.aclosing(driver.groups())``: leaving it
        cancels the rollouts in flight at once and keeps what completed (a resume skips it).
        """
        queue: asyncio.Queue[Group | None] = asyncio.Queue(self.config.stream_buffer)
        demand = asyncio.Semaphore(0)  # with max_staleness, a group is finalized when asked for
        producer = asyncio.create_task(self._drive(queue, demand))
        try:
            while True:
                demand.release()
                if (group := await queue.get()) is None:
                    break
                yield group
            await producer  # re-raise a driver failure
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def arun(self) -> RunResult:
        """Drive the whole run; returns every sample (finalized) and one row per group.

        With a run directory, the samples are read back at the end without the two large
        conversation columns (memory stays flat however large the run; ``read_run`` has
        them), with the group columns each sample was stored with.
        """
        async for _ in self.groups():
            pass
        if self.run_dir is not None:
            return RunResult(self.status, self.reason, read_run(self.run_dir, conversation=False),
                             read_groups(self.run_dir), self.run_dir, self.progress.stale)
        samples, groups = self._finalizer.tables() if self._finalizer is not None else (pa.table({}), pa.table({}))
        return RunResult(self.status, self.reason, samples, groups, self.run_dir, self.progress.stale)

    def run(self) -> RunResult:
        """The run on an event loop of its own, for callers without one (blocks until it ends).

        What is bound to that loop ends with it: the executor is started and stopped around
        the run (pass one not started), and the model's connections are released
        (``model.aclose()``; a later call opens new ones). ``arun`` does neither: the
        caller's loop, executor and model live on.

        Raises:
            RuntimeError: called inside async code (a running event loop): ``await driver.arun()``.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._run_on_own_loop())
        raise RuntimeError("Driver.run() cannot be called from a running event loop; use 'await driver.arun()'")

    async def _run_on_own_loop(self) -> RunResult:
        try:
            async with self.executor:
                return await self.arun()
        finally:
            await self.model.aclose()

    # -- the run ----------------------------------------------------------------------------

    async def _drive(self, queue: asyncio.Queue[Group | None], demand: asyncio.Semaphore) -> None:
        finalizer = None
        warm_arrow()  # in a thread, beside the first rollouts: not on the loop at the first group
        try:
            self._open_store()
            await self._announce_policy()
            finalizer = self._finalizer = GroupFinalizer(
                config=self.config.finalize, judge=self.judge, store=self._store, io=self._io, emit=queue.put,
                rows_per_write=self.config.rows_per_shard,
                **({} if self.config.max_staleness is None else {"keep": self._fresh_or_rerun, "demand": demand}))
            # A lazy taskset is checked as it is planned, while rollouts run.
            with tuned_for_rollouts(), unwrapped(ResumeMismatch):
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg  # where stale samples run again, while the finalizer runs
                    tg.create_task(finalizer.run())
                    try:
                        await self._rollouts()
                    finally:
                        finalizer.finish()
        finally:
            try:
                # Also on cancellation: what was finalized is kept, so a resume will not redo it.
                if finalizer is not None:
                    await finalizer.flush()
            finally:
                # A write that failed (a link planted in the run dir, a full disk) still ends the
                # stream, and closes the store: the consumer re-raises the error, never waits on.
                self._io.shutdown(wait=True)
                try:
                    if self._store is not None:
                        self._store.close()
                finally:
                    if self.progress.stale:
                        log.info("staleness: %d rollouts dropped as older than max_staleness=%s versions "
                                 "and re-run", self.progress.stale, self.config.max_staleness)
                    self._report(force=True)
                    await queue.put(None)

    async def _rollouts(self) -> None:
        """Every planned sample, at most ``max_in_flight`` at once, until done or halted."""
        slots = self._slots = asyncio.Semaphore(self.config.max_in_flight)
        bound = self.executor.max_in_flight
        if bound is not None and bound < self.config.max_in_flight:
            log.warning("the executor runs at most %d rollouts at once, below max_in_flight=%d: "
                        "the rest wait for room in it", bound, self.config.max_in_flight)
        async with asyncio.TaskGroup() as tg:
            for position, task, group_id, sample_idx in self._plan():
                await slots.acquire()
                if self._halt.is_set():
                    slots.release()
                    break
                self.progress.in_flight += 1
                tg.create_task(self._one(position, task, group_id, sample_idx, slots))

    def _open_store(self) -> None:
        if self.run_dir is None:
            return
        config = {**self._manifest_config, "eval": self.config.model_dump(mode="json")}
        self._store = RunDirectory(self.run_dir, run_id=self.run_id, config=config, resume=self.resume_run,
                                   overwrite=self.overwrite, keep_failed=self.keep_failed,
                                   samples_per_task=self.config.samples_per_task,
                                   rows_per_shard=self.config.rows_per_shard)
        self._store.open()
        self.run_id = self._store.run_id
        self._done, self._redo = self._store.done, self._store.redo
        self._pending.update(self._store.pending)
        if self._store.groups_at and hasattr(self.tasks, "__len__"):
            # A taskset in memory is checked whole before anything runs; a lazy one as planned.
            for position, task in enumerate(self.tasks):
                self._store.check_task(position, group_id_of(position, task))

    def _plan(self) -> Iterator[tuple[int, Task, str, int]]:
        done = self._done
        for position, task in enumerate(self.tasks):
            group_id = group_id_of(position, task)
            if self._store is not None:
                self._store.check_task(position, group_id)
            self._group_sizes[group_id] = self.config.samples_per_task
            for sample_idx in range(self.config.samples_per_task):
                if (group_id, sample_idx) in done:
                    self.progress.skipped += 1
                    continue
                yield position, task, group_id, sample_idx

    async def _one(self, position: int, task: Task, group_id: str, sample_idx: int,
                   slots: asyncio.Semaphore) -> None:
        try:
            trace, attempt, attempts = await self._attempts(task, self._redo.pop((group_id, sample_idx), None))
        finally:
            slots.release()
            self.progress.in_flight -= 1
        self._count(trace)
        members = self._pending.setdefault(group_id, [])
        members.append(RolloutRecord(trace, self.run_id, group_id, sample_idx, attempt, position, attempts))
        if len(members) == self._group_sizes[group_id]:
            del self._pending[group_id]
            if self.config.max_staleness is not None:
                self._group_tasks[group_id] = (position, task)
            assert self._finalizer is not None
            self._finalizer.close(group_id, members)
        self._report()

    def _fresh_or_rerun(self, group_id: str, members: list[RolloutRecord]) -> bool:
        """As the finalizer finalizes a group (``max_staleness``): keep it if no member is too old
        for the current policy; else drop those, run their samples again and keep the group
        pending until they are back (``staleness``)."""
        position, task = self._group_tasks.pop(group_id)
        assert self.config.max_staleness is not None and self._tg is not None
        fresh, stale = split_stale(members, self._policy_version, self.config.max_staleness)
        if not stale:
            return True
        self._pending[group_id] = fresh
        for record in stale:
            self.progress.stale += 1
            self.progress.done -= 1
            self.progress.failed -= not record.trace.ok
            self._tg.create_task(self._again(position, task, group_id, record.sample_idx))
        return False

    async def _again(self, position: int, task: Task, group_id: str, sample_idx: int) -> None:
        """A stale sample's new run, when there is room (a halted run leaves its group incomplete)."""
        assert self._slots is not None and self._finalizer is not None
        await self._slots.acquire()
        if self._halt.is_set():
            self._slots.release()
            self._finalizer.abandon(group_id)
            return
        self.progress.in_flight += 1
        await self._one(position, task, group_id, sample_idx, self._slots)

    async def _attempts(self, task: Task, earlier: RolloutRecord | None) -> tuple[Trace, int, tuple[int, ...]]:
        """Run ``task`` until it is not lost (or the retries are spent). Returns its trace,
        carrying the errors of every earlier attempt first (``earlier``: a resumed run's
        stored record, whose attempts come first and are numbered on from), the trace's
        attempt number and how many errors each attempt left (``RolloutRecord.attempts``)."""
        history = earlier.attempt_errors() if earlier is not None else []
        errors = [e for attempt_errors in history for e in attempt_errors]
        counts = [len(attempt_errors) for attempt_errors in history]
        attempt = earlier.attempt + 1 if earlier is not None else 0
        retries = 0
        while True:
            spec = RolloutSpec(task, self.harness, self.model, limits=self.config.limits,
                               timeouts=self.config.timeouts, model_name=self.config.model_name,
                               sampling=dict(self.config.sampling))
            try:
                trace, ran = await self.executor.run(spec), True
            except Exception as e:  # noqa: BLE001 - e.g. a task that cannot be pickled: this rollout fails, not the run
                trace, ran = failed_trace(spec, e), False
            retryable = lost(trace) or (ran and self.config.retry_failed and not trace.ok)
            counts.append(len(trace.errors))
            if not retryable or retries >= self.config.max_infra_retries:
                trace.errors[:0] = errors  # earlier attempts first (B52)
                return trace, attempt, tuple(counts)
            errors.extend(trace.errors)
            attempt += 1
            retries += 1
            self.progress.retried += 1

    def _count(self, trace: Trace) -> None:
        self.progress.done += 1
        if not trace.ok:
            self.progress.failed += 1
        last = trace.last_error
        if not trace.ok and last is not None and last.is_a(ProviderError):
            self._provider_streak += 1
            if self._provider_streak >= self.config.breaker and not self._halt.is_set():
                self.status = "halted"
                self.reason = (f"circuit breaker: {self._provider_streak} consecutive provider "
                               f"failures (last: {last.message[:200]})")
                self._halt.set()
        else:
            self._provider_streak = 0

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._on_progress is not None and (force or now - self._last_report >= self._progress_every):
            self._last_report = now
            self._on_progress(self.progress)


def lost(trace: Trace) -> bool:
    """Whether a rollout's host or services were lost under it (an ``InfrastructureLost`` among
    its errors): its outcome says nothing of the task, so it is run again."""
    return not trace.ok and any(error.is_a(InfrastructureLost) for error in trace.errors)
