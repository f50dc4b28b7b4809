"""Group finalize: advantages, best-of-n and pass@k across the n samples of one task.

This goes beyond upstream semantics (docs/lifecycle.md §4, Q33). Upstream, the n rollouts of a task are
independent episodes that never meet, and the only cross-trace step is ``Env.finalize`` over
the traces of one episode. Comparing samples across rollouts by ``group_id`` is our own
addition, so it lives in this explicitly named stage and does not hide inside per-rollout
scoring. It runs on the finished Arrow table after every runtime is gone, because it needs
only rows.

A sample is *failed* when ``ok`` is not true or its ``reward`` is null or NaN. A failed
sample counts as reward 0.0 and not correct, everywhere: group statistics, advantages,
best-of-n, pass@k (in ``n``, never in ``c``), and the summaries' mean reward. Upstream has no
group statistics, but its best-of-n finalize reads ``trace.reward``, which is 0 for a failed
trace (Q26); one rule means no two numbers of a run disagree on what a failure counts for.

A table that was finalized before (``read_run`` of a stored run) is finalized again: its
group columns are replaced, as are the judge columns the new judge returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._record.arrow import TRACE_SCHEMA
from .bounded_call import JUDGE_TIMEOUT, call_within

__all__ = ["FinalizeConfig", "Finalized", "GroupJudge", "counted_reward", "finalize", "judge_columns", "pass_at_k"]

GroupJudge = Callable[[pa.Table], "Mapping[str, Sequence[float | None]] | None"]
"""The cross-trace hook over one group's table (``Judge`` is the per-trace grader of a task)."""

_REQUIRED = ("group_id", "ok", "reward")
_SAMPLE_STATS = ("group_size", "group_valid", "group_mean", "group_std", "group_min", "group_max")
_TRACE_COLUMNS = frozenset(TRACE_SCHEMA.names)
_GROUP_COLUMNS = frozenset((*_SAMPLE_STATS, "advantage", "best"))
_JUDGE_PREFIXES = ("reward_", "metric_")
_F64 = pa.float64()


class FinalizeConfig(BaseModel):
    """How a group of samples is scored. Frozen and validated."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    normalize_std: bool = True
    """GRPO advantage ``(r - mean) / (std + eps)`` when True; ``r - mean`` when False."""
    eps: float = Field(1e-6, ge=0.0, allow_inf_nan=False)
    """Added to the group std before dividing."""
    std_ddof: int = Field(0, ge=0)
    """Delta degrees of freedom of the group std (0: population std, 1: sample std)."""
    pass_k: tuple[int, ...] = (1,)
    """The k values to report pass@k for: distinct, each >= 1."""
    correct_threshold: float = Field(1.0, allow_inf_nan=False)
    """A sample is correct when it did not fail and its reward is >= this."""

    @field_validator("pass_k")
    @classmethod
    def _check_pass_k(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(k < 1 for k in value):
            raise ValueError(f"pass_k values must be >= 1, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"pass_k values must be distinct, got {value}")
        return value


@dataclass(frozen=True)
class Finalized:
    """``samples``: the input rows (minus dropped groups), in input order, plus group columns.
    ``groups``: one row per group, in order of first appearance."""

    samples: pa.Table
    groups: pa.Table


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> pa.Array:
    """Unbiased pass@k ``1 - C(n-c, k) / C(n, k)`` per group; null where ``k > n``."""
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    ratio = np.ones(len(n))
    # Product form: C(n-c,k)/C(n,k) = prod_j (n-c-j)/(n-j). Every factor is in [0, 1], so
    # nothing overflows, and a zero factor (n-c < k) makes the product exactly 0. The loop
    # runs over the k draws; each step is vectorised over the groups.
    for j in range(min(k, int(n.max(initial=0)))):
        ratio *= np.clip(n - c - j, 0, None) / np.maximum(n - j, 1)
    return pa.array(1.0 - ratio, type=_F64, mask=n < k)


_DEFAULT = FinalizeConfig()  # frozen, so one shared default is safe


def finalize(
    table: pa.Table,
    config: FinalizeConfig = _DEFAULT,
    judge: GroupJudge | None = None,
    *,
    judge_timeout: float = JUDGE_TIMEOUT,
) -> Finalized:
    """Score every group of ``table`` by ``group_id``. See the module docstring for failures.

    ``judge`` is called once per group, with that group's rows of ``samples`` in input
    order, and waited for ``judge_timeout`` seconds at most (``bounded_call``). It may return
    ``None`` or a mapping of new ``reward_*`` / ``metric_*`` column names to one value per
    row. Those columns are appended to ``samples``, null for groups that returned nothing.
    Group columns ``table`` already has (a stored run's) are replaced.
    Raises ValueError on a bad input table or a bad judge result, ``CallTimeout`` (a
    ``TimeoutError``) when the judge overran on a group.
    """
    _check_input(table)
    table = table.drop_columns([c for c in table.column_names if _is_group_column(c)])
    failed = _failed(table)
    gidx, group_ids = _encode(table["group_id"])
    eff = counted_reward(table, failed)
    groups = _group_summary(gidx, group_ids, eff, failed, config)
    samples = _with_group_columns(table, gidx, eff, groups, config)
    if judge is not None:
        samples = _apply_judge(samples, gidx, group_ids, judge, judge_timeout)
    return Finalized(samples=samples, groups=groups)


def counted_reward(table: pa.Table, failed: np.ndarray | None = None) -> pa.Array:
    """The reward each row counts for: its ``reward``, 0.0 where the sample failed."""
    failed = _failed(table) if failed is None else failed
    return pc.if_else(pa.array(failed), 0.0, table["reward"].cast(_F64).combine_chunks())


def _group_summary(
    gidx: np.ndarray, group_ids: pa.Array, eff: pa.Array, failed: np.ndarray, config: FinalizeConfig
) -> pa.Table:
    """One row per group: counts, reward statistics, pass@k."""
    correct = pc.and_(pc.invert(pa.array(failed)), pc.greater_equal(eff, config.correct_threshold)).cast(pa.int32())
    stats = _group_stats(gidx, len(group_ids), eff, correct, failed, config.std_ddof)
    g_min, g_max, g_std = stats["min"], stats["max"], stats["std"]
    flat = pc.equal(g_min, g_max)
    # A group without spread gets an exact 0 std and exact mean, not summation noise.
    g_mean = pc.if_else(flat, g_min, stats["mean"])
    g_std = pc.if_else(pc.and_(flat, pc.is_valid(g_std)), 0.0, g_std)
    n_valid = stats["n_valid"]
    return pa.table(
        {
            "group_id": group_ids,
            "n": pa.array(stats["n"], pa.int32()),
            "n_valid": pa.array(n_valid, pa.int32()),
            "n_failed": pa.array(stats["n_failed"], pa.int32()),
            "mean": g_mean,
            "std": g_std,
            "min": g_min,
            "max": g_max,
            "n_correct": pa.array(stats["n_correct"]).cast(pa.int32()),
            **{f"pass_at_{k}": pass_at_k(n_valid, stats["n_correct"], k) for k in config.pass_k},
            "best_reward": g_max,
        }
    )


def _with_group_columns(
    table: pa.Table, gidx: np.ndarray, eff: pa.Array, groups: pa.Table, config: FinalizeConfig
) -> pa.Table:
    """``table`` plus each sample's group statistics, advantage, best and pass@k."""
    rows = pa.array(gidx, type=pa.int32())
    r_mean, r_std, r_min, r_max = (groups[name].take(rows) for name in ("mean", "std", "min", "max"))
    advantage = pc.subtract(eff, r_mean)
    if config.normalize_std:
        # Null where the std is undefined (n_valid <= std_ddof), except for the line below.
        advantage = pc.divide(advantage, pc.add(r_std, config.eps))
    # No spread means no signal: an exact 0, not (r - mean) noise over eps, nor null for a
    # lone sample with std_ddof=1.
    advantage = pc.if_else(pc.equal(r_min, r_max), 0.0, advantage)
    new_cols = {
        "group_size": groups["n"].take(rows),
        "group_valid": groups["n_valid"].take(rows),
        "group_mean": r_mean,
        "group_std": r_std,
        "group_min": r_min,
        "group_max": r_max,
        "advantage": advantage,
        "best": pc.equal(eff, r_max),
        **{f"pass_at_{k}": groups[f"pass_at_{k}"].take(rows) for k in config.pass_k},
    }
    for name, col in new_cols.items():
        table = table.append_column(name, col)
    return table


def _group_stats(
    gidx: np.ndarray, groups: int, eff: pa.Array, correct: pa.Array, failed: np.ndarray, ddof: int
) -> dict[str, Any]:
    """Per-group counts and reward statistics, with numpy over group indices.

    (Arrow's group_by costs about a millisecond per call whatever the size, and the driver
    finalizes each group alone.) Null where Arrow's aggregates are null: mean, min and max of
    a group with no valid reward, std of one with ``n_valid <= ddof``.
    """
    valid = eff.is_valid().to_numpy(zero_copy_only=False)
    values = eff.fill_null(0.0).to_numpy(zero_copy_only=False)
    n = np.bincount(gidx, minlength=groups)
    n_valid = np.bincount(gidx, weights=valid, minlength=groups).astype(np.int64)
    total = np.bincount(gidx, weights=np.where(valid, values, 0.0), minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n_valid
        dev = np.where(valid, values - mean[gidx], 0.0)
        var = np.bincount(gidx, weights=dev * dev, minlength=groups) / (n_valid - ddof)
    lo, hi = np.full(groups, np.inf), np.full(groups, -np.inf)
    np.minimum.at(lo, gidx[valid], values[valid])
    np.maximum.at(hi, gidx[valid], values[valid])
    empty, no_std = n_valid == 0, n_valid <= ddof
    hit = correct.fill_null(0).to_numpy(zero_copy_only=False)
    return {
        "n": n,
        "n_valid": n_valid,
        "n_failed": np.bincount(gidx, weights=failed, minlength=groups).astype(np.int64),
        "n_correct": np.bincount(gidx, weights=hit, minlength=groups).astype(np.int64),
        "mean": pa.array(mean, _F64, mask=empty),
        "std": pa.array(np.sqrt(np.maximum(var, 0.0)), _F64, mask=no_std),
        "min": pa.array(lo, _F64, mask=empty),
        "max": pa.array(hi, _F64, mask=empty),
    }


def _is_group_column(name: str) -> bool:
    """A column ``finalize`` adds (whatever the k of a ``pass_at_k``)."""
    return name in _GROUP_COLUMNS or (name.startswith("pass_at_") and name[len("pass_at_") :].isdigit())


def _check_input(table: pa.Table) -> None:
    names = set(table.column_names)  # a new list of every name on each access
    missing = [c for c in _REQUIRED if c not in names]
    if missing:
        raise ValueError(f"finalize: table lacks required column(s) {missing}")
    if table["group_id"].null_count:
        raise ValueError("finalize: group_id has nulls; every row needs a group")


def _failed(table: pa.Table) -> np.ndarray:
    reward = table["reward"].cast(_F64)
    scored = pc.fill_null(pc.invert(pc.is_nan(reward)), False)
    ok = pc.fill_null(table["ok"].cast(pa.bool_()), False)
    return pc.invert(pc.and_(ok, scored)).to_numpy()  # type: ignore[no-any-return]


def _encode(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Row -> group index (in order of first appearance), and the group ids."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    # One chunk, so that every row is indexed into one shared dictionary.
    encoded = pc.dictionary_encode(col.combine_chunks())
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary


def _apply_judge(
    samples: pa.Table, gidx: np.ndarray, group_ids: pa.Array, judge: GroupJudge, timeout: float
) -> pa.Table:
    order = np.argsort(gidx, kind="stable")  # stable: input order within a group
    bounds = np.concatenate([[0], np.cumsum(np.bincount(gidx, minlength=len(group_ids)))])
    grouped = samples.take(pa.array(order))
    values: dict[str, np.ndarray] = {}
    valid: dict[str, np.ndarray] = {}
    for g in range(len(group_ids)):
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        out = call_within(judge, grouped.slice(lo, hi - lo), timeout, f"the judge on group {group_ids[g].as_py()!r}")
        if out is None:
            continue
        where = f"judge result for group {group_ids[g].as_py()!r}"
        if not isinstance(out, Mapping):  # ValueError like every other bad judge result
            raise ValueError(  # noqa: TRY004
                f"{where}: expected a mapping of column -> values or None, got {type(out).__name__}"
            )
        for name, col in out.items():
            arr = _judge_column(where, name, col, hi - lo)
            if name not in values:
                values[name] = np.full(len(samples), np.nan)
                valid[name] = np.zeros(len(samples), dtype=bool)
            values[name][order[lo:hi]] = arr.to_numpy(zero_copy_only=False)
            valid[name][order[lo:hi]] = arr.is_valid().to_numpy(zero_copy_only=False)
    for name, column in values.items():  # replacing a judge's column of a stored run
        samples = samples.drop_columns([name] if name in samples.column_names else [])
        samples = samples.append_column(name, pa.array(column, type=_F64, mask=~valid[name]))
    return samples


def judge_columns(names: list[str]) -> list[str]:
    """The columns among ``names`` a judge added: ``reward_*`` / ``metric_*`` and not a column
    of every trace table (``reward_weights`` is one)."""
    return [n for n in names if n.startswith(_JUDGE_PREFIXES) and n not in _TRACE_COLUMNS]


def _judge_column(where: str, name: object, col: object, size: int) -> pa.Array:
    if not isinstance(name, str) or not name.startswith(_JUDGE_PREFIXES) or name in _JUDGE_PREFIXES:
        raise ValueError(f"{where}: column name {name!r} must start with 'reward_' or 'metric_'")
    if name in _TRACE_COLUMNS:
        raise ValueError(f"{where}: column {name!r} is a column of every trace table; name yours otherwise")
    if isinstance(col, (str, bytes)) or not hasattr(col, "__len__"):
        kind = type(col).__name__
        raise ValueError(f"{where}: column {name!r} must be a sequence of floats, got {kind}")
    if len(col) != size:
        raise ValueError(f"{where}: column {name!r} has {len(col)} values, expected {size} (one per sample)")
    try:
        if isinstance(col, pa.ChunkedArray):  # e.g. computed from the group's table
            col = col.combine_chunks()
        return col.cast(_F64) if isinstance(col, pa.Array) else pa.array(col, type=_F64)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise ValueError(f"{where}: column {name!r} is not numeric: {exc}") from exc
