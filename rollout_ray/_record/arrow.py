"""Trace ⇄ Arrow: one versioned table schema for rollouts, built column-wise.

A row is one rollout. The *scalar* columns (ids, outcome, reward, token counts, span
durations) are what reports, the env finalize and resume read; the *conversation* columns
(``messages`` as JSON and ``trace`` as the msgpack of the whole Trace, the lossless copy) are
large and a reader skips them by selecting columns. ``table_to_traces`` decodes the ``trace``
column only, so every Trace field survives the table whatever the scalar columns hold. The
schema itself and the check a reader makes are in ``trace_schema.py``, re-exported here.

The *token* columns (schema version 2; ``token_policy`` in version 4) are the trace's
training sequences, one list per sequence in each row, built in ``token_columns.py``. They
count among the conversation columns, the large ones a reader of outcomes leaves out. A table
of version 1 lacks them and is still read whole.

Schema version 3 appended ``attempts``: every attempt of the rollout's sample, oldest first,
each with its number and its errors (list<struct<attempt, errors: list<struct<type,
message>>>>), the last being the stored one. The trace keeps every attempt's errors, oldest
first (B52); the error columns (``error_type``, ``error_message``, ``num_errors``) describe
the stored attempt only, so a rollout that succeeded on a retry has none.

Schema version 4 appended the policy versions: ``token_policy`` (list<list<int32>>), aligned
with ``input_ids``, the version that sampled each completion id (null on prompt ids and where
no version is known), and ``policy_min`` / ``policy_max``, the oldest and newest version the
rollout's model calls sampled with (``tokens.policy_range``; a call interrupted by a weight
update and continued holds ids of two). Tables of versions 1 to 3 lack them and are read with
nulls there.

In version 3 the ids are stored once: a row's ``trace`` blob leaves out the ids and
logprobs its token columns hold, and ``table_to_traces`` puts them back from those columns
(``token_store.py``). Blobs of versions 1 and 2 hold their ids and are read as they are.

Schema version 5 appended the branches: ``branches`` (int32), how many root-to-leaf branches
the conversation has (one per ``token_branch`` value), and ``branch_reasons``
(list<string>), why each exists (``main``, ``subagent``, ``compaction``, ``resample``,
``edit``: ``branching.py``). Tables of versions 1 to 4 lack them and are read with nulls.

Schema version 6 appended the agents (``agent_branches.py``): ``token_agent`` (list<string>), the
agent of each training sequence, aligned with ``token_branch`` (null where the token columns
are), and ``agent_rewards`` (map<string, float64>), each agent's reward (the rollout's own
agent's alone without peers). Tables of versions 1 to 5 lack them and are read with nulls.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from .._errors import SchemaMismatch
from .agent_branches import agent_rewards, sequence_agents
from .branching import branch_reasons
from .openai_codec import wire_message
from .token_columns import TOKEN_COLUMNS, row_sequences, token_columns
from .token_store import has_stored_ids, restore_rows, without_ids
from .tokens import has_tokens, policy_range
from .trace import ErrorRecord, Trace
from .trace_schema import (
    AGENT_COLUMNS,
    ARROW_SCHEMA_VERSION,
    BRANCH_COLUMNS,
    CONVERSATION_COLUMNS,
    HISTORY_COLUMNS,
    POLICY_COLUMNS,
    SCALAR_COLUMNS,
    SCORES,
    TRACE_SCHEMA,
    VERSION_KEY,
    check_schema,
    newer_columns,
)

__all__ = [  # the schema's names are re-exported: importers of arrow keep working
    "AGENT_COLUMNS",
    "ARROW_SCHEMA_VERSION",
    "BRANCH_COLUMNS",
    "CONVERSATION_COLUMNS",
    "HISTORY_COLUMNS",
    "POLICY_COLUMNS",
    "SCALAR_COLUMNS",
    "TOKEN_COLUMNS",
    "TRACE_SCHEMA",
    "VERSION_KEY",
    "RolloutRecord",
    "SchemaMismatch",
    "check_schema",
    "newer_columns",
    "records_to_table",
    "table_to_records",
    "table_to_traces",
    "warm_arrow",
]

_ENCODER = msgspec.msgpack.Encoder()
_JSON_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.msgpack.Decoder(Trace)


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as stored: its trace and where it sits in the run."""

    trace: Trace
    """The lossless record of the rollout."""
    run_id: str
    """The run this rollout belongs to."""
    group_id: str
    """The group of samples on the same task (the unit of group advantages)."""
    sample_idx: int
    """The sample's index within its group; ``(group_id, sample_idx)`` keys resume."""
    attempt: int = 0
    """0 for the first try; a retry of the same sample counts up, across resumes."""
    task_idx: int | None = None
    """The task's position in its taskset (``None``: the trace's ``task.idx`` stands in)."""
    attempts: tuple[int, ...] = ()
    """How many of ``trace.errors`` each attempt left, oldest first, the last being this
    record's (``()``: unknown; every error counts as this attempt's)."""

    def attempt_errors(self) -> list[list[ErrorRecord]]:
        """The trace's errors split by attempt, oldest first; the last list is the stored
        attempt's (see ``attempts``)."""
        errors = self.trace.errors
        if not self.attempts or sum(self.attempts) != len(errors):
            return [list(errors)]
        bounds = np.cumsum((0, *self.attempts))
        return [errors[a:b] for a, b in itertools.pairwise(bounds)]


def _score_map(maps: Iterable[dict[str, Any]]) -> pa.MapArray:
    """A map<string, float64> column from one dict per row (a None value stays null)."""
    offsets = [0]
    keys: list[str] = []
    values: list[float | None] = []
    for mapping in maps:
        keys.extend(mapping)
        values.extend(mapping.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(values, pa.float64()),
        type=SCORES,
    )


_warming: threading.Thread | None = None


def warm_arrow() -> None:
    """Have pyarrow's lazy imports done now, in a daemon thread; once per process.

    pyarrow imports pandas (when installed) on its first ``pa.array``: ~0.3 s on a quiet
    2-core machine, 2-3 s during a cold start. Without this, the driver's event loop pays it
    at the first closing group, with every rollout in flight waiting on it. The driver calls
    this as its run starts, so the import overlaps the first rollouts' model calls; called
    while Ray started, it competed with Ray's processes for the cores (cold start of an eval
    ~0.15 s longer: bench_cost.py --executors eval).
    """
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=pa.array, args=([0],), name="rollout-ray-warm-arrow", daemon=True)
        _warming.start()


def records_to_table(records: Sequence[RolloutRecord]) -> pa.Table:
    """Convert many records at once, column by column, into a ``TRACE_SCHEMA`` table."""
    traces = [r.trace for r in records]
    sequences = [row_sequences(t) if has_tokens(t) else None for t in traces]
    counts = [t.counts() for t in traces]
    history = [r.attempt_errors() for r in records]
    last_errors = [h[-1][-1] if h[-1] else None for h in history]
    timings = [t.timing for t in traces]
    ranges = [policy_range(t) for t in traces]
    why = [branch_reasons(t) for t in traces]
    columns: dict[str, Any] = {
        "run_id": [r.run_id for r in records],
        "rollout_id": [t.id for t in traces],
        "group_id": [r.group_id for r in records],
        "sample_idx": [r.sample_idx for r in records],
        "attempt": [r.attempt for r in records],
        "task_type": [t.task.type for t in traces],
        "task_key": [t.task.key for t in traces],
        "task_hash": [t.task.hash for t in traces],
        "task_idx": [t.task.idx if r.task_idx is None else r.task_idx for r, t in zip(records, traces)],
        "ok": [t.ok for t in traces],
        "is_completed": [t.is_completed for t in traces],
        "stop_condition": [t.stop_condition for t in traces],
        "error_type": [e.type if e is not None else None for e in last_errors],
        "error_message": [e.message if e is not None else None for e in last_errors],
        "num_errors": [len(h[-1]) for h in history],
        "reward": [t.reward for t in traces],
        "rewards": _score_map({k: (r.score if r is not None else None) for k, r in t.rewards.items()} for t in traces),
        "reward_weights": _score_map(
            {k: (r.weight if r is not None else None) for k, r in t.rewards.items()} for t in traces
        ),
        "metrics": _score_map(t.metrics for t in traces),
        "num_turns": [c.num_turns for c in counts],
        "num_input_tokens": [c.num_input_tokens for c in counts],
        "num_output_tokens": [c.num_output_tokens for c in counts],
        "num_total_tokens": [c.num_total_tokens for c in counts],
        "num_tool_calls": [len(t.tool_calls) for t in traces],
        "started_at": [tm.start for tm in timings],
        "boot_s": [tm.boot.duration for tm in timings],
        "setup_s": [tm.setup.duration for tm in timings],
        "agent_s": [tm.agent.duration for tm in timings],
        "agent_model_s": [tm.agent.model.duration for tm in timings],
        "agent_harness_s": [tm.agent.harness.duration for tm in timings],
        "finalize_s": [tm.finalize.duration for tm in timings],
        "scoring_s": [tm.scoring.duration for tm in timings],
        "messages": [_JSON_ENCODER.encode([wire_message(m) for m in t.messages]) for t in traces],
        "trace": [_ENCODER.encode(t if r is None else without_ids(t)) for t, r in zip(traces, sequences)],
        **token_columns(traces, sequences),
        "attempts": [_attempts_row(r.attempt, h) for r, h in zip(records, history)],
        "policy_min": [low for low, _ in ranges],
        "policy_max": [high for _, high in ranges],
        "branches": [len(reasons) for reasons in why],
        "branch_reasons": why,
        "token_agent": [None if r is None else sequence_agents(t, r) for t, r in zip(traces, sequences)],
        "agent_rewards": _score_map(agent_rewards(t) for t in traces),
    }
    arrays = [_to_array(columns[f.name], f.type) for f in TRACE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=TRACE_SCHEMA)


def _attempts_row(attempt: int, history: list[list[ErrorRecord]]) -> list[dict[str, Any]]:
    """Each attempt's number and errors; numbered so that the last is ``attempt``."""
    first = attempt - len(history) + 1
    return [
        {"attempt": first + i, "errors": [{"type": e.type, "message": e.message} for e in errors]}
        for i, errors in enumerate(history)
    ]


def _to_array(values: pa.Array | list[Any], type_: pa.DataType) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type_)


def table_to_traces(table: pa.Table) -> list[Trace]:
    """Decode the ``trace`` column back into Traces (lossless), with the token ids the rows
    keep in their ``input_ids`` and ``logprobs`` columns put back.

    Raises:
        SchemaMismatch: the table has no readable ``trace`` column, or a row's blob left its
            ids to token columns the table lacks.
    """
    check_schema(table, columns=("trace",))
    blobs = table.column("trace").to_pylist()
    if None in blobs:
        raise SchemaMismatch(
            f"column 'trace' is null at row {blobs.index(None)}; every row needs its trace",
            column="trace",
            expected="binary, not null",
            found="null",
        )
    decode = _DECODER.decode
    with _gc_paused():
        traces = [decode(blob) for blob in blobs]
        if any(has_stored_ids(t) for t in traces):
            _restore_ids(table, traces)
    return traces


def _restore_ids(table: pa.Table, traces: list[Trace]) -> None:
    if not {"input_ids", "logprobs"} <= set(table.column_names):
        raise SchemaMismatch(
            "the traces keep their token ids in the token columns: read 'input_ids' and 'logprobs' with 'trace'",
            column="input_ids",
            expected="present",
            found="missing",
        )
    check_schema(table, columns=("input_ids", "logprobs"))
    try:
        restore_rows(traces, table.column("input_ids"), table.column("logprobs"))
    except ValueError as e:
        raise SchemaMismatch(
            str(e), column="input_ids", expected="the sequences the trace counts", found="other sequences"
        ) from None


@contextmanager
def _gc_paused() -> Iterator[None]:
    # A decoded trace is dozens of new container objects and none is garbage, yet each burst
    # of allocations triggers a collection that rescans the heap: decoding 20,000 traces took
    # 1.24 s with the collector on and 0.27 s with it off.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_RECORD_COLUMNS = ("run_id", "group_id", "sample_idx", "attempt", "trace")


def table_to_records(table: pa.Table) -> list[RolloutRecord]:
    """Rebuild the records of a trace table. ``task_idx`` equal to the trace's own
    ``task.idx``, and a history of one attempt, come back as the defaults that mean them.

    Raises:
        SchemaMismatch: a column a record needs is missing or mistyped.
    """
    check_schema(table, columns=_RECORD_COLUMNS)
    traces = table_to_traces(table)
    run_ids, group_ids, sample_idxs, attempts = (table.column(name).to_pylist() for name in _RECORD_COLUMNS[:-1])
    names = set(table.column_names)
    positions = table.column("task_idx").to_pylist() if "task_idx" in names else [None] * len(traces)
    histories = table.column("attempts").to_pylist() if "attempts" in names else [None] * len(traces)
    return [
        RolloutRecord(
            trace,
            run_id,
            group_id,
            sample_idx,
            attempt,
            task_idx=None if position == trace.task.idx else position,
            attempts=tuple(len(a["errors"]) for a in history) if history and len(history) > 1 else (),
        )
        for trace, run_id, group_id, sample_idx, attempt, position, history in zip(
            traces, run_ids, group_ids, sample_idxs, attempts, positions, histories
        )
    ]
