"""The driver: tasks × samples rollouts, bounded in flight, into Arrow and finalized groups.

Each (task, sample) is scheduled once; at most ``max_in_flight`` run at a time and at most
``finished_buffer`` finished groups wait to be finalized, so memory stays flat however many
tasks there are. A task's identity in a run is its position in the taskset (``group_id_of``): two identical
tasks are two groups. Every scheduled sample ends as exactly one record: a rollout lost to
infrastructure is retried up to ``max_infra_retries`` times (each attempt's errors kept on
the final trace, oldest first, and numbered in the record's ``attempts``) and then recorded
as failed — so a group always completes and is never blocked by one bad sample (it is then
stored but not streamed: ``keep_rule``). Task and harness failures are data and are not
retried unless ``retry_failed``. ``breaker`` consecutive provider failures halt the run:
nothing new is scheduled and the status says why.

Records stream into Parquet shards when a run directory is given (and a rerun with
``resume=True`` skips every (group, sample) already stored); each group is finalized (group
statistics, advantages, best-of-n, pass@k) the moment its last sample closes, and handed to
the consumer of ``groups()`` through a bounded queue unless the keep rule refuses it.

A group is started when ``admission`` allows (the staleness bound, ``max_groups``). For
asynchronous RL the driver owns the policy version and the weight-update pause
(``PolicyOwner``; ``_core/policy_gate``), and with ``max_staleness`` a rollout still too old
when its group is handed on is re-run or masked (``staleness``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, contextmanager
from typing import Any, Literal

import pyarrow as pa

from .._core.aio import unwrapped
from .._core.harness import Harness
from .._core.limits import LIMIT_FIELDS
from .._core.model import Model
from .._core.task import Task
from .._errors import ProviderError, ResumeMismatch
from .._hosting.executor import Executor
from .._hosting.gc_tuning import tuned_for_rollouts
from .._hosting.lookahead import lookahead
from .._hosting.spec import RolloutSpec
from .._record.arrow import RolloutRecord, warm_arrow
from .._record.store import read_groups
from .._record.trace import Trace
from .admission import Admission
from .attempts import run_attempts
from .auto_in_flight import AutoInFlight, fleet_roots
from .control import ControlServer
from .eval_config import EvalConfig
from .group_finalizer import Group, GroupFinalizer, Masks
from .policy_owner import PolicyOwner
from .progress import Progress, RunResult
from .run_dir import RunDirectory
from .slots import Slots
from .staleness import split_stale
from .steering import Steering

__all__ = ["Driver", "EvalConfig", "Group", "Progress", "RunResult", "group_id_of"]

log = logging.getLogger("rollout_ray")


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
            their earlier errors kept; with ``config.retry_failed``, every stored failure)
            unless ``keep_failed``; see ``RunDirectory``.
        overwrite: replace the run stored in ``run_dir`` (only a run directory: one with a
            manifest; never through a symbolic link).
        judge: cross-trace hook for ``finalize`` (called once per group's table).
        on_progress: called with ``Progress`` at most every ``progress_every`` seconds; if it
            raises, the run stops and fails with its error.
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
        self.config = config = config or EvalConfig()
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run, or replace it")
        self.run_dir, self.resume_run, self.keep_failed, self.judge = run_dir, resume, keep_failed, judge
        self.overwrite = overwrite
        self._on_progress, self._progress_every = on_progress, progress_every
        self._callback_error: Exception | None = None
        self._manifest_config = manifest_config or {}
        # With max_groups the rollouts to run are not known ahead (a rejected group is replaced).
        sized = hasattr(tasks, "__len__") and config.max_groups is None
        total = len(tasks) * config.samples_per_task if sized else None  # type: ignore[arg-type]
        self.progress = Progress(total=total)
        self.run_id = uuid.uuid4().hex
        self.status: Literal["completed", "halted"] = "completed"
        self.reason = ""
        self._pending: dict[str, list[RolloutRecord]] = {}
        self._group_sizes: dict[str, int] = {}
        self._finalizer: GroupFinalizer | None = None
        self._provider_streak = 0
        self._halt = asyncio.Event()
        self._whole_groups = False
        """A stop (not a circuit breaker's halt): the group being started is started whole."""
        self._last_report = 0.0
        self._done: set[tuple[str, int]] = set()
        self._redo: dict[tuple[str, int], RolloutRecord] = {}
        self._store: RunDirectory | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ray-shards")
        self._init_policy(policy_version)
        self._admission = Admission(
            version=policy_version,
            max_staleness=config.max_staleness,
            batch_groups=config.batch_groups,
            max_groups=config.max_groups,
        )
        self._tg: asyncio.TaskGroup | None = None
        # Steered while it runs (``rollout-ray ctl``: steering, control); the rollouts run through it.
        self._slots = Slots(AutoInFlight.start(config.max_in_flight))
        self.in_flight = AutoInFlight(self._slots, fleet_roots(model)) if config.max_in_flight == "auto" else None
        """``max_in_flight="auto"``: the controller that sets the bound from the servers' /metrics."""
        self._steering = Steering(
            executor, self.progress, self._slots, stop=self._stopped_by_operator, auto=self.in_flight
        )
        self._group_tasks: dict[str, tuple[int, Task]] = {}
        """With ``max_staleness``: the task of each group closed and not yet finalized."""

    # -- public API -------------------------------------------------------------------------

    async def groups(self) -> AsyncIterator[Group]:
        """Finalized groups as they complete (the trainer stream), those the keep rule keeps.

        To stop early, iterate inside ``contextlib.aclosing(driver.groups())``: leaving it
        cancels the rollouts in flight at once and keeps what completed (a resume skips it).
        """
        queue: asyncio.Queue[Group | None] = asyncio.Queue(self.config.stream_buffer)
        demand = asyncio.Semaphore(0)  # with max_staleness, a group is finalized when asked for
        producer = asyncio.create_task(self._drive(queue, demand))
        admission = self._admission
        try:
            while True:
                demand.release()
                if waits := queue.empty():
                    admission.consumer_waits(True)
                group = await queue.get()
                if waits:
                    admission.consumer_waits(False)
                if group is None:
                    break
                admission.stream()
                yield group
            await producer  # re-raise a driver failure
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def arun(self) -> RunResult:
        """Drive the whole run; returns every sample (finalized) and one row per group.

        With a run directory, the result reads them from it when first asked for (memory
        stays flat however large the run, its end too; see ``RunResult``).
        """
        async for _ in self.groups():
            pass
        p = self.progress
        counts = {"stale": p.stale, "masked": p.masked, "held": p.held, "rejected": p.rejected}
        if self.run_dir is not None:
            return RunResult(self.status, self.reason, None, None, self.run_dir, **counts)
        samples, groups = self._finalizer.tables() if self._finalizer is not None else (pa.table({}), pa.table({}))
        return RunResult(self.status, self.reason, samples, groups, self.run_dir, **counts)

    def run(self) -> RunResult:
        """The run on an event loop of its own, for callers without one (blocks until it ends);
        returns its ``RunResult``, as ``arun`` does (status and reason, the samples and groups
        tables, the run directory).

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

    async def live_status(self) -> dict[str, Any]:
        """The run now, as ``rollout-ray ctl RUN status`` shows it: the rollouts in flight by
        phase with their age and the stalled ones, progress, the model servers (``steering``)."""
        return await self._steering.status()

    def stop(self, reason: str = "stopped") -> None:
        """Admit no more groups: those in flight finish and are stored, and the run ends
        ``halted`` with ``reason`` (a resume runs the rest). A group whose first samples have
        started gets its others started too: a group is stored whole, and a sample of a group
        left short would be counted done, never stored, and run again by the resume."""
        if not self._halt.is_set():
            self.status, self.reason = "halted", reason
            self._whole_groups = True
            self._halt.set()
            self._admission.stop()
            self._slots.resume()

    def _stopped_by_operator(self) -> None:
        self.stop("stopped by the operator (rollout-ray ctl stop)")

    async def _set_policy(self, *args: Any, **kwargs: Any) -> None:
        await super()._set_policy(*args, **kwargs)
        self._admission.version(self._policy_version)  # a new version may admit more

    # -- the run ----------------------------------------------------------------------------

    async def _drive(self, queue: asyncio.Queue[Group | None], demand: asyncio.Semaphore) -> None:
        """The run, then the end of the stream: also after a failure (the consumer re-raises
        it), not after a cancellation (the consumer left)."""
        try:
            await self._drive_run(queue, demand)
        except asyncio.CancelledError:
            raise
        except BaseException:
            await queue.put(None)
            raise
        await queue.put(None)

    async def _drive_run(self, queue: asyncio.Queue[Group | None], demand: asyncio.Semaphore) -> None:
        finalizer = control = sampler = None
        warm_arrow()  # in a thread, beside the first rollouts: not on the loop at the first group
        try:
            self._open_store()
            if self.run_dir is not None:
                control = ControlServer(self._steering, self.run_dir, run_id=self.run_id)
                await control.start()
            await self._announce_policy()
            finalizer = self._finalizer = self._make_finalizer(queue, demand)
            if self.in_flight is not None:  # the first bound from the fleet as it is, before any rollout
                await self.in_flight.sample()
                sampler = asyncio.create_task(self.in_flight.run())
            # A lazy taskset is checked as it is planned, while rollouts run.
            with tuned_for_rollouts(), unwrapped(ResumeMismatch), self._error_unwrapped():
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg  # where stale samples run again, while the finalizer runs
                    tg.create_task(finalizer.run())
                    try:
                        await self._rollouts()
                    finally:
                        finalizer.finish()
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
            if self.in_flight is not None:
                await self.in_flight.aclose()
            try:
                # Also on cancellation: what was finalized is kept, so a resume will not redo it.
                if finalizer is not None:
                    await finalizer.flush()
            finally:
                # A write that failed (a link planted in the run dir, a full disk) still closes
                # the store: the run's lock is released.
                self._io.shutdown(wait=True)
                if control is not None:
                    await control.aclose(self.status, self.reason)
                if self._store is not None:
                    self._store.close()
                if self.progress.stale:
                    log.info(
                        "staleness: %d rollouts dropped as older than max_staleness=%s versions and re-run",
                        self.progress.stale,
                        self.config.max_staleness,
                    )
                if self._callback_error is None:
                    self._report(force=True)

    def _make_finalizer(self, queue: asyncio.Queue[Group | None], demand: asyncio.Semaphore) -> GroupFinalizer:
        config = self.config

        async def emit(group: Group) -> None:
            self._admission.passes()
            await queue.put(group)

        def rejected(group_id: str, reason: str) -> None:
            self._admission.reject()
            self.progress.rejected += 1
            log.debug("group %s stored, not streamed: %s", group_id, reason)

        staleness: dict[str, Any] = (
            {} if config.max_staleness is None else {"keep": self._fresh_or_rerun, "demand": demand}
        )
        return GroupFinalizer(
            config=config.finalize,
            judge=self.judge,
            store=self._store,
            io=self._io,
            emit=emit,
            rows_per_write=config.rows_per_shard,
            capacity=config.finished_buffer,
            rule=config.keep_group,
            judge_timeout=config.judge_timeout,
            rejected=rejected,
            **staleness,
        )

    @contextmanager
    def _error_unwrapped(self) -> Iterator[None]:
        """The one error that failed the run (the progress callback's, a keep rule's), not
        the task groups' wrapping of it."""
        try:
            yield
        except BaseExceptionGroup as group:
            if self._callback_error is not None:
                raise self._callback_error from None
            leaves = group.exceptions
            while len(leaves) == 1 and isinstance(leaves[0], BaseExceptionGroup):
                leaves = leaves[0].exceptions
            if len(leaves) == 1:
                raise leaves[0] from None
            raise

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

    def _open_store(self) -> None:
        if self.run_dir is None:
            return
        config = {**self._manifest_config, "eval": self.config.model_dump(mode="json")}
        self._store = RunDirectory(
            self.run_dir,
            run_id=self.run_id,
            config=config,
            resume=self.resume_run,
            overwrite=self.overwrite,
            keep_failed=self.keep_failed,
            retry_failed=self.config.retry_failed,
            samples_per_task=self.config.samples_per_task,
            rows_per_shard=self.config.rows_per_shard,
        )
        self._store.open()
        self.run_id = self._store.run_id
        self._done, self._redo = self._store.done, self._store.redo
        self._pending.update(self._store.pending)
        if self._store.groups_at and hasattr(self.tasks, "__len__"):
            # A taskset in memory is checked whole before anything runs; a lazy one as planned.
            for position, task in enumerate(self.tasks):
                self._store.check_task(position, group_id_of(position, task))
        if self._store.groups_at and self.config.max_groups is not None:
            self._admission.resumed(read_groups(self.run_dir))

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

    def _report(self, force: bool = False) -> None:
        """Call ``on_progress`` when due. If it raises, the run fails with its error: raised
        here, and by ``groups`` / ``arun`` (the callback is not called again)."""
        now = time.monotonic()
        if self.in_flight is not None:
            self.progress.target, self.progress.target_why = (
                self.in_flight.target.target,
                self.in_flight.status()["why"],
            )
        if self._on_progress is None or self._callback_error is not None:
            return
        if force or now - self._last_report >= self._progress_every:
            self._last_report = now
            try:
                self._on_progress(self.progress)
            except Exception as e:
                self._callback_error = e
                raise
