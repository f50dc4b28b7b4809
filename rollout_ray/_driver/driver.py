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

Here: the run, its store, finalizer, stream and reporting. How samples are scheduled is
``scheduling.py`` (``SampleScheduler``, inherited); the knobs it is steered by while it runs
(slots, the ``"auto"`` bound, steering, the control endpoint) are wired in ``live_controls.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal

import pyarrow as pa

from .._core.aio import unwrapped
from .._core.harness import Harness
from .._core.model import Model
from .._core.task import Task
from .._errors import ResumeMismatch
from .._hosting.executor import Executor
from .._hosting.gc_tuning import tuned_for_rollouts
from .._record.arrow import RolloutRecord, warm_arrow
from .._record.store import read_groups
from .admission import Admission
from .eval_config import EvalConfig
from .group import Group
from .group_finalizer import GroupFinalizer
from .live_controls import LiveControls
from .policy_owner import PolicyOwner
from .progress import Progress, RunResult
from .run_dir import RunDirectory
from .scheduling import SampleScheduler, group_id_of

__all__ = ["Driver", "EvalConfig", "Group", "Progress", "RunResult", "group_id_of"]

log = logging.getLogger("rollout_ray")


class Driver(SampleScheduler, PolicyOwner):
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
        # Steered while it runs (``rollout-ray ctl``); the rollouts run through its slots and steering.
        self._live = LiveControls(executor, self.progress, model, config.max_in_flight, stop=self._stopped_by_operator)
        self._slots, self._steering = self._live.slots, self._live.steering
        self.in_flight = self._live.auto
        """``max_in_flight="auto"``: the controller that sets the bound from the servers' /metrics."""
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
        finalizer = None
        warm_arrow()  # in a thread, beside the first rollouts: not on the loop at the first group
        try:
            self._open_store()
            await self._live.start(self.run_dir, self.run_id)
            await self._announce_policy()
            finalizer = self._finalizer = self._make_finalizer(queue, demand)
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
            await self._live.stop_sampling()
            try:
                # Also on cancellation: what was finalized is kept, so a resume will not redo it.
                if finalizer is not None:
                    await finalizer.flush()
            finally:
                # A write that failed (a link planted in the run dir, a full disk) still closes
                # the store: the run's lock is released.
                self._io.shutdown(wait=True)
                await self._live.aclose(self.status, self.reason)
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

    def _report(self, force: bool = False) -> None:
        """Call ``on_progress`` when due. If it raises, the run fails with its error: raised
        here, and by ``groups`` / ``arun`` (the callback is not called again)."""
        now = time.monotonic()
        self._live.report(self.progress)
        if self._on_progress is None or self._callback_error is not None:
            return
        if force or now - self._last_report >= self._progress_every:
            self._last_report = now
            try:
                self._on_progress(self.progress)
            except Exception as e:
                self._callback_error = e
                raise
