"""The token columns of the run table: each rollout's training sequences, built column-wise.

The *token* columns (schema version 2) are the trace's training sequences
(``tokens.token_sequences``), one list per sequence in each row: ``input_ids``
(list<list<int32>>), ``loss_mask`` (list<list<int8>>), ``logprobs`` (list<list<float32>>),
``token_branch`` (the branch of each sequence) and ``token_drift`` (the drifted turns); schema
version 4 appended ``token_policy`` (list<list<int32>>), aligned with ``input_ids``, the
version that sampled each completion id (null on prompt ids and where no version is known). A
row stays one rollout, so the table keeps its key; a rollout with one branch and no drift has
one sequence. A rollout without token ids has nulls there.

They live apart from ``arrow.py`` (the rest of the schema) beside ``token_store.py``, which
keeps the same ids once: a row's blob leaves out what these columns hold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from .tokens import TokenSequence, token_drift, token_sequences
from .trace import Trace

TOKEN_FIELDS = [
    pa.field("input_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("loss_mask", pa.list_(pa.list_(pa.int8()))),
    pa.field("logprobs", pa.list_(pa.list_(pa.float32()))),
    pa.field("token_branch", pa.list_(pa.int32())),
    pa.field("token_drift", pa.list_(pa.int32())),
]
"""The token fields of schema version 2, in their schema order."""

POLICY_TOKEN_FIELD = pa.field("token_policy", pa.list_(pa.list_(pa.int32())))
"""The policy version of each id (schema version 4, appended after the history columns)."""

TOKEN_COLUMNS: tuple[str, ...] = (*(f.name for f in TOKEN_FIELDS), POLICY_TOKEN_FIELD.name)
"""The training sequences of each rollout, and each id's policy version (null: it has no
token ids)."""

log = logging.getLogger("rollout_ray")


def row_sequences(trace: Trace) -> list[TokenSequence] | None:
    """``trace``'s training sequences, or ``None`` (its token columns stay null) when they
    cannot be built."""
    try:
        return token_sequences(trace)
    except ValueError as e:  # one bad record must not cost the batch its table
        log.warning("rollout=%s token columns left null: %s", trace.id, e)
        return None


def token_columns(traces: Sequence[Trace], rows: list[list[TokenSequence] | None]) -> dict[str, pa.Array]:
    """The token columns of ``traces``' sequences (``None``: the row's are null)."""
    if all(r is None for r in rows):
        return {f.name: pa.nulls(len(traces), f.type) for f in (*TOKEN_FIELDS, POLICY_TOKEN_FIELD)}
    null = pa.array([r is None for r in rows])
    outer = _offsets(len(r or ()) for r in rows)
    sequences = [s for r in rows for s in r or ()]
    inner = _offsets(len(s.input_ids) for s in sequences)

    def nested(name: str, dtype: type) -> pa.Array:
        parts: list[np.ndarray] = [np.asarray(getattr(s, name), dtype) for s in sequences]
        values = np.concatenate(parts) if parts else np.empty(0, dtype)
        return pa.ListArray.from_arrays(outer, pa.ListArray.from_arrays(inner, pa.array(values)), mask=null)

    return {
        "input_ids": nested("input_ids", np.int32),
        "loss_mask": nested("loss_mask", np.int8),
        "logprobs": nested("logprobs", np.float32),
        "token_branch": pa.ListArray.from_arrays(outer, pa.array([s.branch for s in sequences], pa.int32()), mask=null),
        "token_drift": pa.array(
            [token_drift(t) if r is not None else None for t, r in zip(traces, rows)], pa.list_(pa.int32())
        ),
        "token_policy": pa.ListArray.from_arrays(
            outer,
            pa.ListArray.from_arrays(inner, pa.array([v for s in sequences for v in s.policy], pa.int32())),
            mask=null,
        ),
    }


def _offsets(sizes: Iterable[int]) -> pa.Array:
    offsets = np.zeros(1, np.int32)
    counts = np.fromiter(sizes, np.int64)
    return pa.array(np.concatenate([offsets, np.cumsum(counts)]).astype(np.int32))
