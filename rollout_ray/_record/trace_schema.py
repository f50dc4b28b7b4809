"""The run table's schema: its columns, their types and versions, and the check a reader makes.

``TRACE_SCHEMA`` is one row per rollout; ``arrow.py`` converts records to and from it (the
module docstring there tells each schema version's columns) and ``token_columns.py`` builds its
token columns. ``check_schema`` refuses a table this code cannot read (a missing or mistyped
column, a newer version) and lets an older one through without the columns added after it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from .._errors import SchemaMismatch
from .token_columns import POLICY_TOKEN_FIELD, TOKEN_COLUMNS, TOKEN_FIELDS

# WARNING: the schema evolves by appending columns at the end of TRACE_SCHEMA, never by
# retyping, renaming or reordering one. Bump only for an incompatible change: a reader refuses
# a table whose version is newer than the one it knows.
ARROW_SCHEMA_VERSION = 6

VERSION_KEY = b"rollout_ray.schema_version"
"""The schema-metadata key holding ``ARROW_SCHEMA_VERSION`` (ASCII digits)."""

SCORES = pa.map_(pa.string(), pa.float64())
"""The type of the score columns: a name's float (``rewards``, ``reward_weights``, ``metrics``)."""

_SCALAR_FIELDS = [
    pa.field("run_id", pa.string()),
    pa.field("rollout_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("sample_idx", pa.int32()),
    pa.field("attempt", pa.int32()),
    pa.field("task_type", pa.string()),
    pa.field("task_key", pa.string()),
    pa.field("task_hash", pa.string()),
    pa.field("task_idx", pa.int64()),
    pa.field("ok", pa.bool_()),
    pa.field("is_completed", pa.bool_()),
    pa.field("stop_condition", pa.string()),
    pa.field("error_type", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("num_errors", pa.int32()),
    pa.field("reward", pa.float64()),
    pa.field("rewards", SCORES),
    pa.field("reward_weights", SCORES),
    pa.field("metrics", SCORES),
    pa.field("num_turns", pa.int64()),
    pa.field("num_input_tokens", pa.int64()),
    pa.field("num_output_tokens", pa.int64()),
    pa.field("num_total_tokens", pa.int64()),
    pa.field("num_tool_calls", pa.int32()),
    pa.field("started_at", pa.float64()),
    pa.field("boot_s", pa.float64()),
    pa.field("setup_s", pa.float64()),
    pa.field("agent_s", pa.float64()),
    pa.field("agent_model_s", pa.float64()),
    pa.field("agent_harness_s", pa.float64()),
    pa.field("finalize_s", pa.float64()),
    pa.field("scoring_s", pa.float64()),
]
_CONVERSATION_FIELDS = [
    pa.field("messages", pa.string()),
    pa.field("trace", pa.binary()),
    *TOKEN_FIELDS,
]
_ERROR = pa.struct([pa.field("type", pa.string()), pa.field("message", pa.string())])
_ATTEMPT = pa.struct([pa.field("attempt", pa.int32()), pa.field("errors", pa.list_(_ERROR))])
_HISTORY_FIELDS = [pa.field("attempts", pa.list_(_ATTEMPT))]
_POLICY_FIELDS = [POLICY_TOKEN_FIELD, pa.field("policy_min", pa.int64()), pa.field("policy_max", pa.int64())]
_BRANCH_FIELDS = [pa.field("branches", pa.int32()), pa.field("branch_reasons", pa.list_(pa.string()))]
_AGENT_FIELDS = [pa.field("token_agent", pa.list_(pa.string())), pa.field("agent_rewards", SCORES)]

TRACE_SCHEMA: pa.Schema = pa.schema(
    _SCALAR_FIELDS + _CONVERSATION_FIELDS + _HISTORY_FIELDS + _POLICY_FIELDS + _BRANCH_FIELDS + _AGENT_FIELDS,
    metadata={VERSION_KEY: str(ARROW_SCHEMA_VERSION).encode()},
)
"""One row per rollout; see the module docstring for the column sets."""

SCALAR_COLUMNS: tuple[str, ...] = tuple(f.name for f in _SCALAR_FIELDS)
"""The small columns of the first schema version: everything but the conversation (the
policy range, appended later, is small too: ``POLICY_COLUMNS``)."""

CONVERSATION_COLUMNS: tuple[str, ...] = ("messages", "trace", *TOKEN_COLUMNS)
"""The large columns: the last branch's messages (JSON), the whole trace (msgpack), the tokens."""

HISTORY_COLUMNS: tuple[str, ...] = tuple(f.name for f in _HISTORY_FIELDS)
"""Every attempt of the sample and its errors (small, but nested: not a scalar)."""

POLICY_COLUMNS: tuple[str, ...] = ("policy_min", "policy_max")
"""The oldest and newest policy version a rollout sampled with (small; null: none recorded)."""

BRANCH_COLUMNS: tuple[str, ...] = tuple(f.name for f in _BRANCH_FIELDS)
"""How many branches a rollout's conversation has and why each exists (small)."""

AGENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in _AGENT_FIELDS)
"""Whose each training sequence is (aligned with ``token_branch``) and each agent's reward
(``_record/agent_branches.py``): a multi-agent rollout's per-agent view (small)."""

_ADDED_IN = {
    **dict.fromkeys(TOKEN_COLUMNS[:5], 2),
    **dict.fromkeys(HISTORY_COLUMNS, 3),
    **dict.fromkeys(("token_policy", *POLICY_COLUMNS), 4),
    **dict.fromkeys(BRANCH_COLUMNS, 5),
    **dict.fromkeys(AGENT_COLUMNS, 6),
}
"""Columns appended after version 1, by the version that added them."""

_SCHEMA_NAMES = frozenset(TRACE_SCHEMA.names)


def check_schema(
    table_or_schema: pa.Table | pa.RecordBatch | pa.Schema,
    columns: Iterable[str] | None = None,
) -> None:
    """Check that a table (or schema) is a trace table this code can read.

    A table without the version metadata is accepted when its columns match. Columns beyond
    ``TRACE_SCHEMA`` are allowed (appended by a newer writer of the same version). When the
    whole schema is checked, a column added after the table's version (or in any version, for
    a table without one) may be absent: an older shard is read as it was written.

    Args:
        table_or_schema: the table, record batch or schema to check.
        columns: the columns that must be present with their ``TRACE_SCHEMA`` type; all of
            ``TRACE_SCHEMA`` when ``None``. A name outside ``TRACE_SCHEMA`` need only exist.

    Raises:
        SchemaMismatch: a column is missing or mistyped, or the version is newer than
            ``ARROW_SCHEMA_VERSION`` (or not an integer).
    """
    schema = table_or_schema if isinstance(table_or_schema, pa.Schema) else table_or_schema.schema
    version = _check_version(schema.metadata or {})
    names = TRACE_SCHEMA.names if columns is None else columns
    for name in names:
        expected = TRACE_SCHEMA.field(name).type if name in _SCHEMA_NAMES else None
        index = schema.get_field_index(name)
        if index < 0 and columns is None and (version or 0) < _ADDED_IN.get(name, 0):
            continue
        if index < 0:
            wanted = str(expected) if expected is not None else "any type"
            raise SchemaMismatch(
                f"trace table has no column {name!r} (expected {wanted})",
                column=name,
                expected=wanted,
                found="missing",
            )
        found = schema.field(index).type
        if expected is not None and found != expected:
            raise SchemaMismatch(
                f"column {name!r} has type {found}, expected {expected}",
                column=name,
                expected=str(expected),
                found=str(found),
            )


def newer_columns(schema: pa.Schema) -> frozenset[str]:
    """The columns appended to ``TRACE_SCHEMA`` after ``schema``'s version: a table of that
    version lacks them, and a reader gives nulls there."""
    version = _check_version(schema.metadata or {}) or 0
    return frozenset(name for name, added in _ADDED_IN.items() if version < added)


def _check_version(metadata: dict[bytes, bytes]) -> int | None:
    """The table's schema version (``None``: not recorded), if this code can read it."""
    raw = metadata.get(VERSION_KEY)
    if raw is None:
        return None
    try:
        version = int(raw)
    except ValueError:
        raise SchemaMismatch(
            f"schema version {raw!r} is not an integer",
            expected=str(ARROW_SCHEMA_VERSION),
            found=repr(raw),
        ) from None
    if version > ARROW_SCHEMA_VERSION:
        raise SchemaMismatch(
            f"trace table has schema version {version}, newer than version "
            f"{ARROW_SCHEMA_VERSION} known here; upgrade rollout_ray to read it",
            expected=str(ARROW_SCHEMA_VERSION),
            found=str(version),
        )
    return version
