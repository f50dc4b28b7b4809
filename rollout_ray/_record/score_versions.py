"""Score versions of a run: a rescore's new scores beside the stored ones, which stay.

Version 1 is what the shards hold. ``rollout-ray rescore`` (``_driver/rescore``) writes version
n + 1 (where ``run_layout`` says): one row per rollout it saw, keyed by ``(group_id,
sample_idx)`` and the ``rollout_id`` it scored, holding the *score columns* — ``ok``, the error
columns, ``reward``, ``rewards``, ``reward_weights``, ``metrics``, ``rescored`` and
``score_error`` (why its new scoring failed, if it did), and the group and judge columns of the
groups finalized again — plus the groups' table. The version's folder is written under a
temporary name and renamed once complete, so a version is whole or absent.

Readers (``read_run``, ``read_groups``, the viewer) see the latest version unless asked for
another: a stored row that a version scored (same key, same rollout id, in a shard that existed
when the version was made) shows the version's score columns, and its ``trace`` blob is
rewritten to match (``rescored_trace``). A row written later (a resume redid the rollout) keeps
its own.

A rollout is scored again when it reached scoring: it is ok, or its stored failure is the one
scoring recorded (``failed_in_scoring``). Its rescore starts from the stored trace, with that
failure taken off.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._errors import CorruptRun, TaskError
from .arrow import TRACE_SCHEMA
from .run_files import TMP_SUFFIX
from .run_layout import SCORE_GROUPS, SCORE_INFO, SCORE_SAMPLES, SCORES, RunLayout, score_version, score_versions
from .trace import Reward, Trace

KEY = ("group_id", "sample_idx", "rollout_id")
"""What a version's row is matched on."""
OUTCOME_FIELDS = [
    *(
        TRACE_SCHEMA.field(name)
        for name in (
            "ok",
            "error_type",
            "error_message",
            "num_errors",
            "reward",
            "rewards",
            "reward_weights",
            "metrics",
        )
    ),
    pa.field("rescored", pa.bool_()),
    pa.field("score_error", pa.string()),
]
"""The per-rollout score columns of a version, besides the group and judge columns."""

_DECODER = msgspec.msgpack.Decoder(Trace)
_ENCODER = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class ScoreVersion:
    """One stored score version."""

    number: int
    samples: pa.Table
    """``KEY`` + the score columns, one row per rollout the rescore saw."""
    groups: pa.Table
    """The groups' table, as ``read_groups`` returns it."""
    info: dict[str, Any]
    """``version.json``: ``created``, ``taskset``, ``rows``, ``rescored``, ``failed``, ``shards``."""

    @property
    def shards(self) -> int:
        """How many sample shards the run had when the version was made: rows of later shards
        are not the version's."""
        return int(self.info["shards"])

    def overlay(
        self, table: pa.Table, eligible: np.ndarray | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """``table`` (rows of a trace table) with this version's score columns (or only
        ``columns`` of them) on the rows it scored (``eligible``: which rows may be its,
        default all); the ``trace`` blob of those rows rewritten to match. Needs ``KEY`` in
        ``table``."""
        rows = self._matches(table, eligible)
        matched = rows >= 0
        if not matched.any():
            return table
        mask = pa.array(matched)
        picked = self.samples.take(pa.array(np.where(matched, rows, 0)))
        for name in self.samples.column_names if columns is None else columns:
            if name in KEY:
                continue
            new = picked[name]
            if name in table.column_names:
                old = table[name]
                if old.type != new.type:
                    old = old.cast(new.type) if pa.types.is_null(old.type) else old
                    new = new.cast(old.type) if pa.types.is_null(new.type) else new
                merged = pc.if_else(mask, new, old)
                table = table.set_column(table.column_names.index(name), name, merged)
            else:
                table = table.append_column(name, pc.if_else(mask, new, pa.nulls(len(new), new.type)))
        if "trace" in table.column_names:
            table = self._rewrite_traces(table, matched, picked)
        return table

    def row(self, group_id: str, sample_idx: int, rollout_id: str) -> dict[str, Any] | None:
        """The version's row of one rollout, or ``None``."""
        found = pc.and_(
            pc.and_(pc.equal(self.samples["group_id"], group_id), pc.equal(self.samples["sample_idx"], sample_idx)),
            pc.equal(self.samples["rollout_id"], rollout_id),
        )
        hits = self.samples.filter(found).to_pylist()
        return hits[-1] if hits else None

    @functools.cached_property
    def _index(self) -> dict[tuple[Any, ...], int]:
        return {key: i for i, key in enumerate(zip(*(self.samples[k].to_pylist() for k in KEY)))}

    def _matches(self, table: pa.Table, eligible: np.ndarray | None) -> np.ndarray:
        """For each row of ``table``, the version's row it matches, or -1."""
        keys = [table[k].to_pylist() for k in KEY]
        index = self._index
        rows = np.fromiter((index.get(key, -1) for key in zip(*keys)), np.int64, count=table.num_rows)
        if eligible is not None:
            rows[~eligible] = -1
        return rows

    def _rewrite_traces(self, table: pa.Table, matched: np.ndarray, picked: pa.Table) -> pa.Table:
        blobs = table["trace"].to_pylist()
        scores = picked.select([f.name for f in OUTCOME_FIELDS]).to_pylist()
        for i in np.flatnonzero(matched):
            if blobs[i] is not None:
                blobs[i] = _ENCODER.encode(rescored_trace(_DECODER.decode(blobs[i]), scores[i]))
        column = pa.array(blobs, table.schema.field("trace").type)
        return table.set_column(table.column_names.index("trace"), "trace", column)


def failed_in_scoring(trace: Trace) -> bool:
    """Whether the trace's failure is the one scoring recorded: scoring started (it runs
    last, after finalize succeeded) and its last error is a ``TaskError``."""
    last = trace.last_error
    return not trace.ok and bool(trace.timing.scoring.start) and last is not None and last.is_a(TaskError)


def strip_scoring_failure(trace: Trace) -> bool:
    """Take the failure scoring recorded off ``trace`` (see ``failed_in_scoring``), as before
    scoring ran; returns whether there was one."""
    if not failed_in_scoring(trace):
        return False
    trace.errors.pop()
    trace.ok = True
    return True


def rescored_trace(trace: Trace, scores: Mapping[str, Any]) -> Trace:
    """The stored ``trace`` with a version's ``scores`` (a row of its ``OUTCOME_FIELDS``):
    rewards and metrics replaced, a scoring failure taken off or added."""
    if not scores["rescored"]:
        return trace
    strip_scoring_failure(trace)
    weights = dict(scores["reward_weights"] or ())
    trace.rewards = {k: None if v is None else Reward(v, weights.get(k) or 1.0) for k, v in scores["rewards"] or ()}
    trace.metrics = dict(scores["metrics"] or ())
    if scores["score_error"] is not None:
        trace.record_error(TaskError(scores["score_error"]))
    trace.ok = bool(scores["ok"])
    return trace


def outcome_row(trace: Trace, *, rescored: bool, score_error: str | None, attempt_errors: int) -> dict[str, Any]:
    """The ``OUTCOME_FIELDS`` of a trace; ``attempt_errors``: how many of its errors are the
    stored attempt's (the error columns describe that attempt only)."""
    last = trace.errors[-1] if attempt_errors else None
    return {
        "ok": trace.ok,
        "error_type": None if last is None else last.type,
        "error_message": None if last is None else last.message,
        "num_errors": attempt_errors,
        "reward": trace.reward,
        "rewards": [(k, None if r is None else r.score) for k, r in trace.rewards.items()],
        "reward_weights": [(k, None if r is None else r.weight) for k, r in trace.rewards.items()],
        "metrics": list(trace.metrics.items()),
        "rescored": rescored,
        "score_error": score_error,
    }


# -- stored versions ------------------------------------------------------------------------------


def latest_version(run_dir: str | os.PathLike[str]) -> int:
    """The run's latest score version (1: no rescore yet)."""
    found = score_versions(RunLayout.of(run_dir))
    return found[-1] if found else 1


def read_version(run_dir: str | os.PathLike[str], number: int | None = None) -> ScoreVersion | None:
    """Score version ``number`` of the run (``None``: the latest); ``None`` for version 1 (the
    shards' own scores).

    Raises:
        ValueError: the run has no such version.
        CorruptRun: the version's files cannot be read.
    """
    layout = RunLayout.of(run_dir)
    found = score_versions(layout)
    if number is None:
        number = found[-1] if found else 1
    if number == 1:
        return None
    if number not in found:
        have = ", ".join(str(n) for n in [1, *found])
        raise ValueError(f"scores={number}: the run {layout.root} has score versions {have}")
    folder = score_version(layout, number)
    try:
        with layout.open() as run, run.folder(SCORES) as scores, scores.folder(folder.name) as files:
            with files.arrow_reader(SCORE_SAMPLES) as f:
                samples = pq.read_table(f)
            with files.arrow_reader(SCORE_GROUPS) as f:
                groups = pq.read_table(f)
            info = json.loads(files.read_bytes(SCORE_INFO))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptRun.shard(folder, f"score version {number} cannot be read: {type(e).__name__}: {e}") from e
    return ScoreVersion(number, samples, groups, info)


def next_version(run_dir: str | os.PathLike[str]) -> int:
    """The number the run's next score version gets.

    Raises:
        CorruptRun: its name is taken by something that is not a version's folder (a plain
            file, a link): a rescore would fail only after all its scoring, so it is refused
            before (``rescore`` asks first).
    """
    layout = RunLayout.of(run_dir)
    number = max([1, *score_versions(layout)]) + 1
    path = score_version(layout, number)
    with layout.open() as run:
        if not run.exists(SCORES):
            return number
        with run.folder(SCORES) as scores:
            if scores.exists(path.name):  # not counted by score_versions: not a directory
                raise CorruptRun(
                    path,
                    f"{path} is not a score version's folder (a file or a link, not a "
                    "directory); move it aside and run the rescore again",
                )
    return number


def write_version(run_dir: str | os.PathLike[str], samples: pa.Table, groups: pa.Table, info: Mapping[str, Any]) -> int:
    """Store a new score version (the next number); returns its number. Written under a
    temporary name, then renamed: a version is complete or absent, and a write that fails
    leaves no temporary folder. The caller holds the run's lock.

    Raises:
        CorruptRun: as ``next_version``.
    """
    layout = RunLayout.of(run_dir)
    number = next_version(run_dir)
    final = score_version(layout, number).name
    partial = final + TMP_SUFFIX
    # Through the run directory's descriptors, as every file of a run: no link is followed.
    with layout.open() as run, run.folder(SCORES, create=True) as scores:
        _remove(scores.fd, partial)  # a rescore cut short
        try:
            with scores.folder(partial, create=True) as files:
                with files.replacing(SCORE_SAMPLES) as f:
                    pq.write_table(samples, f, compression="zstd")
                with files.replacing(SCORE_GROUPS) as f:
                    pq.write_table(groups, f, compression="zstd")
                files.write_bytes(
                    SCORE_INFO, json.dumps({"version": number, "created": time.time(), **info}, indent=2).encode()
                )
            os.replace(partial, final, src_dir_fd=scores.fd, dst_dir_fd=scores.fd)
        except BaseException:
            _remove(scores.fd, partial)
            raise
        scores.fsync()
    return number


def _remove(dir_fd: int, name: str) -> None:
    """Remove ``name`` in the folder ``dir_fd`` (a folder's tree, or a file or link itself)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
