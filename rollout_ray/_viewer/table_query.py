"""The queries the viewer's rollout table runs on a run's index (``index.py``): a ``Query``
parsed from the URL, the matching rows in its order (``select``), one page of them as the
table shows them (``page``), and the run's counts and filter values (``overview``). All of it
is ``pyarrow.compute`` over the index's scalar columns; no shard is read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import pyarrow as pa
import pyarrow.compute as pc

from .._driver.finalize import counted_reward
from .index import RunIndex

__all__ = ["ANY", "CELL_CHARS", "NONE", "ROW_COLUMNS", "BadQuery", "Query", "overview", "page", "select", "sortable"]

CELL_CHARS = 300
"""Text cells longer than this are cut in the table's rows (ending in ``…``)."""

ROW_COLUMNS = (
    "rollout_id",
    "group_id",
    "sample_idx",
    "attempt",
    "task_type",
    "task_idx",
    "ok",
    "stop_condition",
    "error_type",
    "error_message",
    "reward",
    "num_turns",
    "num_total_tokens",
    "num_tool_calls",
    "agent_s",
)
"""What a row of the rollout table carries (plus the stored extra columns)."""

NONE = "(none)"
"""Filter value matching a null stop condition or error type."""
ANY = "(any)"
"""Filter value matching any error type."""


class BadQuery(ValueError):
    """A query parameter the index cannot honour (unknown column, not a number)."""


@dataclass(frozen=True)
class Query:
    """Sort and filters of the rollout table; ``None`` means no constraint."""

    sort: str | None = None
    descending: bool = False
    reward_min: float | None = None
    reward_max: float | None = None
    ok: bool | None = None
    stop: str | None = None
    error: str | None = None
    task: str | None = None
    group: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Query:
        """Parse URL query parameters (``order=desc``, ``ok=true``, ...); empty means unset.

        Raises:
            BadQuery: a number or boolean that does not parse.
        """
        get = {k: v.strip() for k, v in params.items() if v.strip()}
        return cls(
            sort=get.get("sort"),
            descending=get.get("order", "asc") == "desc",
            reward_min=_number(get, "reward_min"),
            reward_max=_number(get, "reward_max"),
            ok=_boolean(get, "ok"),
            stop=get.get("stop"),
            error=get.get("error"),
            task=get.get("task"),
            group=get.get("group"),
        )

    def key(self) -> tuple[object, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def _number(params: Mapping[str, str], name: str) -> float | None:
    if name not in params:
        return None
    try:
        return float(params[name])
    except ValueError:
        raise BadQuery(f"{name} must be a number, got {params[name]!r}") from None


def _boolean(params: Mapping[str, str], name: str) -> bool | None:
    value = params.get(name)
    if value is None:
        return None
    if value not in ("true", "false"):
        raise BadQuery(f"{name} must be true or false, got {value!r}")
    return value == "true"


def sortable(index: RunIndex) -> list[str]:
    return [c for c in index.table.column_names if not c.startswith("_")]


def select(index: RunIndex, query: Query) -> pa.Array:
    """The index rows matching ``query``, in its order (write order without a sort).

    Raises:
        BadQuery: ``query.sort`` names no column of the index.
    """
    table = index.table
    if query.sort is not None and query.sort not in sortable(index):
        raise BadQuery(f"cannot sort by {query.sort!r}; columns: {', '.join(sortable(index))}")
    mask = _mask(table, query)
    kept = table.select([c for c in (query.sort, "_pos") if c])
    if mask is not None:
        kept = kept.filter(mask)
    if query.sort is None:
        return kept["_pos"].combine_chunks()
    order = "descending" if query.descending else "ascending"
    # Ties keep write order, so paging through equal values is stable; nulls sort last.
    positions = pc.sort_indices(kept, sort_keys=[(query.sort, order), ("_pos", "ascending")])
    return kept["_pos"].take(positions).combine_chunks()


def _mask(table: pa.Table, q: Query) -> pa.ChunkedArray | None:
    conditions = []
    if q.reward_min is not None:
        conditions.append(pc.greater_equal(table["reward"], q.reward_min))
    if q.reward_max is not None:
        conditions.append(pc.less_equal(table["reward"], q.reward_max))
    if q.ok is not None:
        conditions.append(pc.equal(table["ok"], q.ok))
    if q.stop is not None:
        conditions.append(_equal_or_none(table["stop_condition"], q.stop))
    if q.error == ANY:
        conditions.append(pc.is_valid(table["error_type"]))
    elif q.error is not None:
        conditions.append(_equal_or_none(table["error_type"], q.error))
    if q.task is not None:
        conditions.append(_task_matches(table, q.task))
    if q.group is not None:
        conditions.append(pc.starts_with(table["group_id"], q.group))
    if not conditions:
        return None
    mask = conditions[0]
    for condition in conditions[1:]:
        mask = pc.and_kleene(mask, condition)
    return mask


def _equal_or_none(column: pa.ChunkedArray, value: str) -> pa.ChunkedArray:
    return pc.is_null(column) if value == NONE else pc.equal(column, value)


def _task_matches(table: pa.Table, task: str) -> pa.ChunkedArray:
    """A task index (all digits), else a substring of the task type or a prefix of its key."""
    if task.isdigit():
        return pc.equal(table["task_idx"], int(task))
    by_type = pc.match_substring(table["task_type"], task, ignore_case=True)
    return pc.or_kleene(by_type, pc.starts_with(table["task_key"], task))


def page(index: RunIndex, positions: pa.Array, offset: int, limit: int) -> list[dict[str, object]]:
    """Rows ``offset .. offset + limit`` of ``positions`` as dicts of ``ROW_COLUMNS`` + extras."""
    chosen = positions.slice(offset, limit)
    rows = index.table.select([*ROW_COLUMNS, *index.extras]).take(chosen).to_pylist()
    for row in rows:  # the table shows a line of it; the rollout's page has all of it
        for name, value in row.items():
            if isinstance(value, str) and len(value) > CELL_CHARS:
                row[name] = value[:CELL_CHARS] + "…"
    return rows  # type: ignore[no-any-return]


def overview(index: RunIndex, facet_limit: int = 200) -> dict[str, object]:
    """Counts, mean reward, and the values each filter offers (with counts)."""
    table = index.table
    n = table.num_rows
    ok = int(pc.sum(table["ok"]).as_py() or 0) if n else 0
    return {
        "rollouts": n,
        "ok": ok,
        "failed": n - ok,
        "groups": pc.count_distinct(table["group_id"]).as_py() if n else 0,
        # As the summary counts it: a failed rollout is reward 0 (finalize's rule).
        "mean_reward": pc.mean(counted_reward(table)).as_py() if n else None,
        "facets": {name: _facet(table[name], facet_limit) for name in ("stop_condition", "error_type", "task_type")},
        "columns": sortable(index),
        "extras": index.extras,
        "long_columns": sorted(index.long),  # not in the table: on the rollout's page
        "stored_advantage": "advantage" in index.complete,
    }


def _facet(column: pa.ChunkedArray, limit: int) -> list[tuple[str, int]]:
    counts = pc.value_counts(column.combine_chunks()) if len(column) else pa.array([])
    pairs = [(NONE if d["values"] is None else d["values"], d["counts"]) for d in counts.to_pylist()]
    return sorted(pairs, key=lambda p: (-p[1], p[0]))[:limit]
