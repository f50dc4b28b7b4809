"""Rescore a stored run: its task's scoring run again on the stored traces, without a model
or a sandbox, written as a new score version (``_record/score_versions``; the old ones stay).

For a reward found wrong after a long run. Every rollout that reached scoring (ok, or failed
*in* scoring) is scored again by its task's ``@metric``s, ``@reward``s and judges; its groups
are finalized again with the group judge. Rollouts that failed earlier keep what they had.

Where: a pool of spawned worker processes, each scoring whole shards' rows. Scoring is user
code, possibly CPU-bound (a GIL-bound thread pool would not run it in parallel) and possibly
blocking (an event loop would not take it back): a process can be bounded per rollout by a
timer signal, and killed if it stops answering at all. The run's own executor is not used: a
rescore needs no model, sandbox or Ray, and a process per core is what scoring can use.

Bounds: each rollout's scoring gets the run's scoring timeout (else the task's, else
``RESCORE_TIMEOUT``): one that overruns is that rollout's scoring failure. A pool that returns
nothing for ``STALL`` seconds past what its slowest job may take halts the rescore, naming it.
The pool and what runs in its workers are ``rescore_pool.py``; here, what is rescored and the
version written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._core.hooks import requires
from .._core.limits import RolloutTimeouts
from .._core.task import Task
from .._record.score_versions import (
    KEY,
    OUTCOME_FIELDS,
    ScoreVersion,
    latest_version,
    next_version,
    write_version,
)
from .._record.store import RunLock, read_manifest, read_run, shard_paths
from .bounded_call import JUDGE_TIMEOUT
from .driver import group_id_of
from .finalize import FinalizeConfig, Finalized, GroupJudge, finalize
from .rescore_pool import JOB_ROWS, TasksLoader, score_in_workers

_SCALARS = (
    "run_id",
    *KEY,
    "task_idx",
    "ok",
    "error_type",
    "error_message",
    "num_errors",
    "reward",
    "rewards",
    "reward_weights",
    "metrics",
)


class RescoreRefused(ValueError):
    """The run cannot be rescored with this taskset (the message says why, in one line)."""


@dataclass(frozen=True)
class RescoreResult:
    version: int
    """The score version written."""
    rows: int
    """Rollouts of the run."""
    rescored: int
    """Rollouts scored again (the others failed before scoring)."""
    failed: int
    """Rescored rollouts whose new scoring failed."""
    changed: int
    """Rescored rollouts whose reward changed (from the latest version before this one)."""
    mean_before: float | None
    mean_after: float | None
    seconds: float


def rescore(
    run_dir: str,
    load_tasks: TasksLoader,
    *,
    judge: GroupJudge | None = None,
    workers: int | None = None,
    timeout: float | None = None,
    describe: str = "",
    judge_timeout: float = JUDGE_TIMEOUT,
) -> RescoreResult:
    """Score the run in ``run_dir`` again and store the result as its next score version.

    Args:
        load_tasks: the taskset's tasks, in the order the run was made with (``describe``
            names it in the version's record).
        judge: the group judge, called as the driver calls it.
        workers: worker processes (default: one per CPU).
        timeout: seconds one rollout's scoring may take (default: the run's scoring timeout,
            else the task's, else ``RESCORE_TIMEOUT``).

    Raises:
        RescoreRefused: a task's scoring needs its runtime, or the taskset is not the run's.
        RunInUse: another process writes the run.
        CorruptRun: the next version's name is taken by a file (nothing is scored).
        TimeoutError: the pool stopped answering (the message names how long).
    """
    t0 = time.monotonic()
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        next_version(run_dir)  # its name taken by a file: refused now, not after all the scoring
        config = read_manifest(run_dir).config.get("eval", {})
        rows, shards = _latest_rows(run_dir)
        shown = read_run(run_dir, ["ok", "reward"])  # what readers showed until now: the latest version
        tasks = list(load_tasks())
        _check_tasks(tasks, rows)
        scoring = timeout or RolloutTimeouts(**(config.get("timeouts") or {})).scoring
        jobs = _jobs(rows, shards)
        outcomes = score_in_workers(jobs, load_tasks, scoring, workers or os.cpu_count() or 1)
        outcome = _version_rows(rows, outcomes)
        counts = {
            "rows": outcome.num_rows,
            "rescored": int(pc.sum(outcome["rescored"]).as_py() or 0),
            "failed": int(pc.sum(pc.is_valid(outcome["score_error"])).as_py() or 0),
            "changed": _changed(shown, outcome),
        }
        finalize_config = FinalizeConfig.model_validate(config.get("finalize") or {})
        samples, groups = _finalized(run_dir, outcome, finalize_config, judge, judge_timeout)
        number = write_version(
            run_dir,
            samples,
            groups,
            {"taskset": describe, "based_on": latest_version(run_dir), "shards": len(shards), **counts},
        )
    finally:
        lock.release()
    return RescoreResult(
        number,
        counts["rows"],
        counts["rescored"],
        counts["failed"],
        counts["changed"],
        _mean(shown),
        _mean(outcome),
        time.monotonic() - t0,
    )


# -- what to score --------------------------------------------------------------------------------


def _latest_rows(run_dir: str) -> tuple[pa.Table, list[str]]:
    """The rows ``read_run`` shows (as stored: score version 1), with ``_shard`` and ``_row``
    saying where each is; and the shards' paths."""
    paths = [str(p) for p in shard_paths(run_dir)]
    table = read_run(run_dir, list(_SCALARS), scores=1)
    where: dict[tuple[str, int], tuple[int, int]] = {}
    for shard, path in enumerate(paths):
        stored = pq.read_table(path, columns=["group_id", "sample_idx"])
        for row, key in enumerate(zip(stored["group_id"].to_pylist(), stored["sample_idx"].to_pylist())):
            where[key] = (shard, row)  # the latest write of a key wins, as read_run's
    located = [where[key] for key in zip(table["group_id"].to_pylist(), table["sample_idx"].to_pylist())]
    table = table.append_column("_shard", pa.array([s for s, _ in located], pa.int32()))
    return table.append_column("_row", pa.array([r for _, r in located], pa.int32())), paths


def needs_runtime(task: Task) -> str | None:
    """The first of ``task``'s scorers that takes the rollout's ``runtime``, or ``None``."""
    for kind in ("metric", "reward"):
        for hook in task.hooks(kind):
            if requires(hook.fn, "runtime"):
                return f"@{kind} {hook.name}"
    for grader in task.config.judges:
        if requires(grader.score, "runtime"):
            return f"judge {grader.reward_name}"
    return None


def _check_tasks(tasks: list[Task], rows: pa.Table) -> None:
    seen: set[type] = set()
    for position, group_id in sorted(set(zip(rows["task_idx"].to_pylist(), rows["group_id"].to_pylist()))):
        if position >= len(tasks) or group_id_of(position, tasks[position]) != group_id:
            raise RescoreRefused(
                f"the taskset's task at position {position} is not the run's (group {group_id}): "
                "give the taskset the run was made with"
            )
        task = tasks[position]
        if type(task) not in seen:
            seen.add(type(task))
            hook = needs_runtime(task)
            if hook is not None:
                raise RescoreRefused(
                    f"task {type(task).__name__}'s {hook} takes `runtime`: its scoring needs the "
                    "rollout's sandbox, which a rescore does not have"
                )


def _jobs(rows: pa.Table, shards: list[str]) -> list[tuple[str, list[int]]]:
    """(shard path, its rows to read) in chunks of ``JOB_ROWS``, for rows that reached scoring
    (the others are not scored again; which ones is decided in the worker, from the trace)."""
    by_shard: dict[int, list[int]] = {}
    for shard, row in zip(rows["_shard"].to_pylist(), rows["_row"].to_pylist()):
        by_shard.setdefault(shard, []).append(row)
    return [
        (shards[shard], picked[i : i + JOB_ROWS])
        for shard, picked in sorted(by_shard.items())
        for i in range(0, len(picked), JOB_ROWS)
    ]


# -- the version ------------------------------------------------------------------------------------


def _version_rows(rows: pa.Table, outcomes: dict[tuple[str, int, str], dict[str, Any]]) -> pa.Table:
    """``KEY`` + ``OUTCOME_FIELDS`` for every row: the new outcome where it was rescored,
    the stored one otherwise."""
    stored = rows.select([f.name for f in OUTCOME_FIELDS if f.name in rows.column_names]).to_pylist()
    keys = list(zip(*(rows[k].to_pylist() for k in KEY)))
    merged = []
    for key, old in zip(keys, stored):
        new = outcomes.get(key)
        merged.append(new if new is not None else {**old, "rescored": False, "score_error": None})
    columns = {k: rows[k] for k in KEY}
    for field in OUTCOME_FIELDS:
        columns[field.name] = pa.array([m[field.name] for m in merged], field.type)
    return pa.table(columns)


def _finalized(
    run_dir: str, outcome: pa.Table, config: FinalizeConfig, judge: GroupJudge | None, judge_timeout: float
) -> tuple[pa.Table, pa.Table]:
    """The version's rows with their groups' columns, and the groups' table: the stored rows
    (whole, for a judge; their scalars otherwise) with the new outcomes, finalized again."""
    table = read_run(run_dir, scores=1, conversation=judge is not None)
    table = ScoreVersion(0, outcome, pa.table({}), {}).overlay(table)
    try:
        done, errors = finalize(table, config, judge, judge_timeout=judge_timeout), None
    except Exception:
        if judge is None:
            raise
        done, errors = _finalized_by_group(table, config, judge, judge_timeout)
    keep = [*KEY, *(f.name for f in OUTCOME_FIELDS if f.name not in KEY)]
    extra = [
        c
        for c in done.samples.column_names
        if c not in table.column_names
        or c.startswith(("reward_", "metric_"))
        or c in _GROUP_COLUMNS
        or c.startswith("pass_at_")
    ]
    version = done.samples.select([*keep, *(c for c in extra if c not in keep)])
    groups = done.groups.append_column("judge_error", pa.array(errors or [None] * done.groups.num_rows, pa.string()))
    return version, groups


_GROUP_COLUMNS = ("group_size", "group_valid", "group_mean", "group_std", "group_min", "group_max", "advantage", "best")


def _finalized_by_group(
    table: pa.Table, config: FinalizeConfig, judge: GroupJudge, judge_timeout: float
) -> tuple[Finalized, list[str | None]]:
    parts: list[Finalized] = []
    errors: list[str | None] = []
    for group_id in pc.unique(table["group_id"]).to_pylist():
        group = table.filter(pc.equal(table["group_id"], group_id))
        try:
            parts.append(finalize(group, config, judge, judge_timeout=judge_timeout))
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - a judge's failure is its group's
            parts.append(finalize(group, config))
            errors.append(f"{type(e).__name__}: {e}")
    samples = pa.concat_tables([p.samples for p in parts], promote_options="permissive")
    groups = pa.concat_tables([p.groups for p in parts], promote_options="permissive")
    return Finalized(samples=samples, groups=groups), errors


def _changed(rows: pa.Table, samples: pa.Table) -> int:
    before = np.asarray(rows["reward"].fill_null(np.nan).to_numpy(zero_copy_only=False), float)
    after = np.asarray(samples["reward"].fill_null(np.nan).to_numpy(zero_copy_only=False), float)
    rescored = samples["rescored"].to_numpy(zero_copy_only=False)
    differ = ~((before == after) | (np.isnan(before) & np.isnan(after)))
    return int(np.sum(differ & rescored))


def _mean(table: pa.Table) -> float | None:
    """Mean reward, a failed rollout counting 0 (as the summary counts it)."""
    if not table.num_rows:
        return None
    counted = pc.if_else(pc.fill_null(table["ok"], False), pc.fill_null(table["reward"], 0.0), 0.0)
    return float(pc.mean(counted).as_py())
