"""RunDirectory: a run directory as one driver writes it — new, or resumed without mixing.

Opening one takes its lock (a second writer gets ``RunInUse``), then either writes a new
manifest (after clearing the run stored there, to overwrite it) or, to resume, checks that the
settings that decide what a rollout is (samples, limits, timeouts, model, sampling, finalize,
taskset) are those it was run with
(``ResumeMismatch`` names the ones that differ; how many run at once may change). A resume
knows which ``(group_id, sample_idx)`` are done; a stored rollout that failed because the
infrastructure or the model provider failed is *redone* unless ``keep_failed`` (with
``retry_failed``, every stored failure is: a task or harness failure too), and the
errors of its earlier attempts go onto its new trace (its attempts numbered on from them).
Stored samples of groups left incomplete are reloaded, so those groups finalize with their
new samples. A group id starts with its task's position in the taskset (``group_id_of``):
``check_task`` refuses a resume whose task at a stored position is another one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from .._errors import InfrastructureLost, ProviderError, ResumeMismatch
from .._record.arrow import RolloutRecord, table_to_records
from .._record.run_layout import GROUPS, LOCK, MANIFEST, RunLayout
from .._record.store import (
    Manifest,
    RunLock,
    ShardWriter,
    read_groups,
    read_manifest,
    read_run,
    stored_outcomes,
    write_manifest,
)
from .._record.trace import ErrorRecord
from .finalize import FinalizeConfig, GroupJudge, finalize

RESULT_SETTINGS = ("samples_per_task", "limits", "timeouts", "model_name", "sampling", "finalize")
"""The eval settings a resume must keep: they decide what a rollout is, or how it is scored."""

Key = tuple[str, int]


class RunDirectory:
    """The run directory ``path``, opened for one driver (``open`` … ``close``).

    Args:
        path: the run directory.
        run_id: the id of a new run (a resumed one keeps its own).
        config: what the manifest records; its ``eval`` entry is the driver's ``EvalConfig``.
        resume: continue the run stored there (else it must hold none, unless ``overwrite``).
        overwrite: replace the run stored there: everything in the directory goes. Only a
            run directory (one with a manifest) is cleared; a link inside is removed, never
            followed.
        keep_failed: on resume, keep rollouts that failed for infrastructure or provider
            reasons instead of redoing them.
        retry_failed: on resume (unless ``keep_failed``), redo every stored failure, a task
            or harness failure too (``EvalConfig.retry_failed``: the run retries them).
        samples_per_task: n, to know which stored groups are incomplete.
        rows_per_shard: as ``ShardWriter``.
    """

    def __init__(
        self,
        path: str,
        *,
        run_id: str,
        config: dict[str, Any],
        resume: bool,
        keep_failed: bool,
        samples_per_task: int,
        rows_per_shard: int,
        overwrite: bool = False,
        retry_failed: bool = False,
    ) -> None:
        self.path, self.run_id, self.config = path, run_id, config
        self.resume, self.keep_failed, self.overwrite = resume, keep_failed, overwrite
        self.retry_failed = retry_failed
        self.samples_per_task, self.rows_per_shard = samples_per_task, rows_per_shard
        self.done: set[Key] = set()
        """Samples stored and not to be redone."""
        self.redo: dict[Key, RolloutRecord] = {}
        """The stored record of each sample to redo (its errors and attempts go on the new one)."""
        self.groups_at: dict[int, set[str]] = {}
        """The stored group ids at each task position."""
        self.pending: dict[str, list[RolloutRecord]] = {}
        """Stored samples of groups left incomplete."""
        self._samples: ShardWriter | None = None
        self._groups: ShardWriter | None = None
        self._lock = RunLock(path)

    def open(self) -> None:
        """Lock, check or write the manifest, restore.

        Raises:
            RunInUse: another process writes this run.
            FileExistsError: it holds a run and neither ``resume`` nor ``overwrite`` is on.
            ResumeMismatch: resuming with other settings than the run was made with.
            CorruptRun: what is stored cannot be trusted, or the directory (or a file the run
                opens in it) is a symbolic link.
        """
        RunLayout.of(self.path).open(create=True).close()
        self._lock.acquire()
        try:
            holds_run = RunLayout.of(self.path).holds_run()
            if holds_run and self.overwrite:
                clear_run(self.path)
            if not holds_run or self.overwrite:
                write_manifest(self.path, Manifest(run_id=self.run_id, config=self.config))
            elif not self.resume:
                raise FileExistsError(
                    f"{self.path} already holds a run; pass resume=True to continue it, "
                    "overwrite=True to replace it, or another directory"
                )
            else:
                stored = read_manifest(self.path)
                self._check_settings(stored.config)
                self.run_id = stored.run_id
                self._restore()
            self._samples = ShardWriter(self.path, rows_per_shard=self.rows_per_shard)
            self._groups = ShardWriter(self.path, rows_per_shard=self.rows_per_shard, part=GROUPS)
        except BaseException:
            self._lock.release()
            raise

    def write(self, samples: pa.Table, summaries: pa.Table) -> None:
        """Store finalized groups: their samples' rows (with ``filter_columns``), then their
        summary rows."""
        assert self._samples is not None and self._groups is not None, "open() first"
        sampling = self.config.get("eval", {}).get("sampling") or {}
        self._samples.write(with_filter_columns(samples, sampling))
        self._samples.flush()
        self._groups.write(summaries)
        self._groups.flush()

    def check_task(self, position: int, group_id: str) -> None:
        """Refuse to resume with another task at ``position`` than the one stored there.

        Raises:
            ResumeMismatch: the run stored another group at that position.
        """
        stored = self.groups_at.get(position)
        if stored and stored != {group_id}:
            raise ResumeMismatch.taskset(self.path, position, min(stored - {group_id}), group_id)

    def close(self) -> None:
        """Write what is buffered and release the lock (also when the write fails)."""
        try:
            for writer in (self._samples, self._groups):
                if writer is not None:
                    writer.close()
        finally:
            self._lock.release()

    def _check_settings(self, stored: dict[str, Any]) -> None:
        check_settings(self.path, stored, self.config)

    def _restore(self) -> None:
        outcomes = stored_outcomes(self.path)
        for group_id, _ in outcomes:
            position = _position(group_id)
            if position is not None:
                self.groups_at.setdefault(position, set()).add(group_id)
        redo = (
            set()
            if self.keep_failed
            else {k for k, (ok, error) in outcomes.items() if not ok and (self.retry_failed or redoable(error))}
        )
        self.done = set(outcomes) - redo
        counts = Counter(group for group, _ in self.done)
        partial = sorted({g for g, _ in redo} | {g for g, c in counts.items() if c < self.samples_per_task})
        if not partial:
            return
        table = read_run(self.path)
        table = table.filter(pc.is_in(table["group_id"], pa.array(partial)))
        for record in table_to_records(table):
            key = (record.group_id, record.sample_idx)
            if key in redo:
                self.redo[key] = record
            else:
                self.pending.setdefault(record.group_id, []).append(record)


def clear_run(path: str) -> None:
    """Remove everything in the run directory ``path`` but its lock (held by the caller).

    Links inside are removed, never followed. The manifest goes last: a clear that is cut
    short leaves a run directory, which a second overwrite clears."""
    with RunLayout.of(path).open() as run:
        run.remove_all(keep=[LOCK], last=MANIFEST)


class _Agent(msgspec.Struct):
    harness: str = ""
    model: str | None = None


class _Task(msgspec.Struct):
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class _Described(msgspec.Struct):
    """The part of a stored ``Trace`` the filter columns come from (the rest is skipped)."""

    task: _Task = msgspec.field(default_factory=_Task)
    agent: _Agent = msgspec.field(default_factory=_Agent)


_DESCRIBED = msgspec.msgpack.Decoder(_Described)

DATA_PREFIX = "data_"
"""The filter columns of a task's data fields are named ``data_<field>``."""


def with_filter_columns(samples: pa.Table, sampling: dict[str, Any]) -> pa.Table:
    """``samples`` plus the columns users filter on: ``model``, ``harness``, ``sampling`` (the
    run's, JSON) and each of the task's data fields as ``data_<field>`` (its value where every
    row's is a scalar of one type, JSON otherwise). ``trace`` stays the lossless record."""
    if not samples.num_rows or "trace" not in samples.column_names or "harness" in samples.column_names:
        return samples
    described = [_DESCRIBED.decode(blob) for blob in samples.column("trace").to_pylist()]
    columns: dict[str, pa.Array] = {
        "model": pa.array([d.agent.model for d in described], pa.string()),
        "harness": pa.array([d.agent.harness for d in described], pa.string()),
        "sampling": pa.array([_JSON.encode(sampling).decode()] * len(described), pa.string()),
    }
    names = dict.fromkeys(k for d in described for k in d.task.data)
    for name in names:
        columns[DATA_PREFIX + name] = _data_column([d.task.data.get(name) for d in described])
    present = set(samples.column_names)
    for name, column in columns.items():
        if name not in present:
            samples = samples.append_column(name, column)
    return samples


_JSON = msgspec.json.Encoder()
_SCALARS = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


def _data_column(values: list[Any]) -> pa.Array:
    kinds = {type(v) for v in values if v is not None}
    if kinds == {int, float}:
        kinds = {float}
    if not kinds:
        return pa.nulls(len(values))  # null-typed: it takes the type of another shard's values
    if len(kinds) == 1 and (kind := next(iter(kinds))) in _SCALARS:
        return pa.array(values, _SCALARS[kind])
    return pa.array([None if v is None else _JSON.encode(v).decode() for v in values], pa.string())


def _position(group_id: str) -> int | None:
    """The task position a group id starts with (``<position>-<key>``), if it does."""
    head, sep, _ = group_id.partition("-")
    return int(head) if sep and head.isdigit() else None


def redoable(error_type: str | None) -> bool:
    """Whether a stored rollout that failed with ``error_type`` failed for a reason outside its
    task, which a resume runs again: its infrastructure was lost, or the model provider failed.

    The run's scalar columns keep the stored error's type name only, so the record asks this
    process for its class (a taskset's own subclass is known once the taskset is imported)."""
    return error_type is not None and ErrorRecord(error_type, "").is_a((InfrastructureLost, ProviderError))


def check_settings(path: str, stored: dict[str, Any], planned: dict[str, Any]) -> None:
    """Refuse to resume the run in ``path``, made with the manifest config ``stored``, with
    ``planned`` (the config a driver would record: ``taskset``, ``model``, ``eval``, ...) when a
    setting that decides what a rollout is differs (``RESULT_SETTINGS``; all but ``eval``'s
    other fields). Eval calls it before Ray starts; ``RunDirectory.open`` again, for drivers.

    Raises:
        ResumeMismatch: naming each setting that differs, with its stored and given values.
    """

    def decisive(config: dict[str, Any]) -> dict[str, Any]:
        eval_config = config.get("eval", {})
        return {
            **{k: v for k, v in config.items() if k != "eval"},
            "eval": {k: eval_config.get(k) for k in RESULT_SETTINGS},
        }

    values = _changed_values(decisive(stored), decisive(planned))
    if values:
        raise ResumeMismatch(path, list(values), values=values)


def _changed_values(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """``changed_settings`` with each path's ``(old, new)`` values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {
            path: pair
            for k in sorted(old.keys() | new.keys(), key=str)
            for path, pair in _changed_values(old.get(k), new.get(k), f"{prefix}{k}.").items()
        }
    return {} if old == new else {prefix.rstrip("."): (old, new)}


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted paths at which two settings trees differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            c
            for k in sorted(old.keys() | new.keys(), key=str)
            for c in changed_settings(old.get(k), new.get(k), f"{prefix}{k}.")
        ]
    return [] if old == new else [prefix.rstrip(".")]


def stored_results(
    path: str, config: FinalizeConfig | None = None, judge: GroupJudge | None = None
) -> tuple[pa.Table, pa.Table]:
    """``(samples, groups)`` of a run directory, without its conversation columns.

    The driver stores each group finalized as it closes; a run written before it did so
    (no ``advantage`` column) is finalized here with ``config`` (the manifest's when None).
    """
    samples = read_run(path, conversation=False)
    if "advantage" in samples.column_names or not samples.num_rows:
        return samples, read_groups(path)
    if config is None:
        recorded = read_manifest(path).config.get("eval", {}).get("finalize")
        config = FinalizeConfig.model_validate(recorded) if recorded else FinalizeConfig()
    whole = finalize(samples, config, judge)
    return whole.samples, whole.groups
