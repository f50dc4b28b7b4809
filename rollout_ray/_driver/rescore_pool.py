"""The worker processes of a rescore (``rescore.py``): jobs of a stored shard's rows, each
rollout's task scoring run again under a timer signal, the outcomes sent back.

Spawned, not forked (a forked copy of a driver with threads may deadlock); each worker loads
the taskset once (``TasksLoader``). A rollout's scoring that overruns its bound is interrupted
by ``SIGALRM`` (``_Overran``, a ``BaseException`` user code does not catch) and recorded as its
scoring failure; a pool that answers nothing for ``STALL`` seconds past its slowest job's bound
halts the rescore.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .._core.task import Task
from .._errors import TaskError
from .._record.arrow import table_to_traces
from .._record.score_versions import KEY, outcome_row, strip_scoring_failure

__all__ = ["JOB_ROWS", "RESCORE_TIMEOUT", "STALL", "TasksLoader", "score_in_workers"]

RESCORE_TIMEOUT = 60.0
"""Seconds one rollout's scoring may take when neither the run nor its task set a timeout."""
STALL = 60.0
"""Seconds, past the longest a job may take, after which a pool that returned nothing is hung."""
JOB_ROWS = 256
"""Rollouts per job: small enough that the pool spreads a run over its workers."""

TasksLoader = Callable[[], Sequence[Task]]
"""Gives the taskset's tasks in order; picklable (each worker process calls it once)."""


def score_in_workers(
    jobs: list[tuple[str, list[int]]], load_tasks: TasksLoader, scoring: float | None, workers: int
) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Every job's outcomes, by (group_id, sample_idx, rollout_id)."""
    if not jobs:
        return {}
    context = multiprocessing.get_context("spawn")  # a forked copy of a driver with threads may deadlock
    pool = context.Pool(min(workers, len(jobs)), initializer=_start_worker, initargs=(load_tasks, scoring))
    bound = STALL + JOB_ROWS * (scoring or RESCORE_TIMEOUT)
    outcomes: dict[tuple[str, int, str], dict[str, Any]] = {}
    try:
        results = pool.imap_unordered(_score_job, jobs)
        for _ in jobs:
            try:
                outcomes.update(results.next(timeout=bound))
            except multiprocessing.TimeoutError:
                raise TimeoutError(
                    f"rescore halted: its worker processes returned nothing for {bound:g}s "
                    "(a scoring function that ignores its timeout, or a worker that died)"
                ) from None
        pool.close()
    finally:
        pool.terminate()  # by the pool's own handles: only the processes it started
        pool.join()
    return outcomes


_tasks: list[Task] = []
_scoring: float | None = None


class _Overran(BaseException):
    """Raised by the timer signal into a rollout's scoring that overran its bound (a
    ``BaseException``: user code catching ``Exception`` must not swallow it)."""


def _start_worker(load_tasks: TasksLoader, scoring: float | None) -> None:
    global _tasks, _scoring
    _tasks, _scoring = list(load_tasks()), scoring
    signal.signal(signal.SIGALRM, _overran)


def _overran(signum: int, frame: Any) -> None:
    raise _Overran


def _score_job(job: tuple[str, list[int]]) -> list[tuple[tuple[str, int, str], dict[str, Any]]]:
    path, rows = job
    with pq.ParquetFile(path) as shard:
        names = [
            "task_idx",
            "num_errors",
            *KEY,
            "trace",
            *(c for c in ("input_ids", "logprobs") if c in shard.schema_arrow.names),
        ]
        table = shard.read(columns=names).take(pa.array(rows, pa.int64()))
    traces = table_to_traces(table)
    out = []
    for trace, position, stored_errors, *key in zip(
        traces, *(table[c].to_pylist() for c in ("task_idx", "num_errors", *KEY))
    ):
        outcome = _score_one(trace, _tasks[position], stored_errors)
        if outcome is not None:
            out.append((tuple(key), outcome))
    return out


def _score_one(trace: Any, task: Task, stored_errors: int) -> dict[str, Any] | None:
    """The rollout's outcome scored again, or ``None`` when it failed before scoring."""
    stripped = strip_scoring_failure(trace)
    if not trace.ok:
        return None
    trace.rewards = {}
    timeout = _scoring or (task.data.timeout.scoring if task.data.timeout else None) or RESCORE_TIMEOUT
    error: BaseException | None = None
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        asyncio.run(task.score(trace))
    except _Overran:
        error = TaskError(f"rescoring did not finish within {timeout:g}s")
    except Exception as e:  # noqa: BLE001 - the rollout's scoring failure, as a live run records it
        error = e if isinstance(e, TaskError) else TaskError(f"scoring failed: {type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if error is not None:
        trace.record_error(error)
    attempt_errors = stored_errors - stripped + (error is not None)
    return outcome_row(
        trace, rescored=True, score_error=None if error is None else str(error), attempt_errors=attempt_errors
    )
