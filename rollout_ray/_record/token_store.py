"""A stored rollout's token ids, kept once: in the run table's token columns, not in its blob.

Every id of a rollout with token capture sits in its training sequences, the ``input_ids`` /
``logprobs`` columns that readers take (a trainer's batch, a polars or duckdb filter), and
would sit again in the ``trace`` blob (each turn's new prompt ids, its completion ids and
logprobs): ~9 KB more per 1,000-token turn (``benchmarks/bench_token_storage.py``). The
columns stay whole; the blob leaves out what they hold. ``without_ids`` blanks, for each turn
of a sequence, its call's ``prompt_ids`` and its node's ``token_ids`` and counts them in
``ModelCall.stored_ids``; ``restore_ids`` puts them back from the row's columns as the table
is read (``arrow.table_to_traces``), so a trace read back equals the one written.

Where a turn's ids are: the counts and ``prompt_shared`` alone decide which sequence holds a
turn (``tokens.sequence_turns``), and in it the turn's new prompt ids begin at its
``prompt_shared``, its completion right after them.

Logprobs: the column is float32. A node's logprobs leave the blob only when float32 holds
every one exactly (a server's are float32 numbers: vLLM's and SGLang's); others stay, so the
record stays lossless. A node whose logprobs stayed, or that has none, is left as it is on
reading (the column says NaN where a sampled id has none). A node's ``mask`` stays in the blob.

A blob written before schema version 3 has no ``stored_ids`` and is read as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from .tokens import _turn_calls, sequence_turns
from .trace import ModelCall, Trace

__all__ = ["has_stored_ids", "restore_ids", "restore_rows", "without_ids"]


def without_ids(trace: Trace) -> Trace:
    """A copy of ``trace`` without the ids its token sequences hold (``trace`` is unchanged).

    Only for a trace whose sequences are stored beside it: ``token_sequences(trace)`` did not
    raise.
    """
    turns = _turn_calls(trace)
    if not turns:
        return trace
    nodes = list(trace.nodes)
    calls = list(trace.calls)
    for k, call in enumerate(calls):
        i = call.node
        if i is None or turns.get(i) is not call:
            continue
        node = nodes[i]
        counts = (len(call.prompt_ids or ()), len(node.token_ids or ()))
        calls[k] = msgspec.structs.replace(call, prompt_ids=None, stored_ids=counts)
        logprobs = None if _float32_holds(node.logprobs) else node.logprobs
        nodes[i] = msgspec.structs.replace(node, token_ids=None, logprobs=logprobs)
    return msgspec.structs.replace(trace, nodes=nodes, calls=calls)


def has_stored_ids(trace: Trace) -> bool:
    """Whether ``trace``, decoded from a blob, left ids to its row's token columns."""
    return any(call.stored_ids is not None for call in trace.calls)


def restore_rows(traces: list[Trace], input_ids: pa.ChunkedArray, logprobs: pa.ChunkedArray) -> None:
    """``restore_ids`` for each of ``traces`` that left ids to the columns (one row each).

    Raises:
        ValueError: a row's token columns are null or do not hold what its trace counts.
    """
    ids_column, logprobs_column = input_ids.combine_chunks(), logprobs.combine_chunks()
    for k, trace in enumerate(traces):
        if has_stored_ids(trace):
            row_ids, row_logprobs = _row(ids_column, k), _row(logprobs_column, k)
            if row_ids is None or row_logprobs is None:
                raise ValueError(f"row {k}: trace {trace.id} left its token ids to its token columns, which are null")
            restore_ids(trace, row_ids, row_logprobs)


def _row(column: pa.ListArray, k: int) -> list[np.ndarray] | None:
    """Row ``k``'s sequences as numpy views (``None``: null)."""
    row = column[k]
    if not row.is_valid:
        return None
    sequences = row.values
    flat, offsets = sequences.values.to_numpy(zero_copy_only=False), sequences.offsets.to_numpy()
    return [flat[offsets[s] : offsets[s + 1]] for s in range(len(sequences))]


def restore_ids(
    trace: Trace, input_ids: Sequence[Sequence[int] | np.ndarray], logprobs: Sequence[Sequence[float] | np.ndarray]
) -> None:
    """Put back in ``trace`` the ids ``without_ids`` left to its row's ``input_ids`` and
    ``logprobs`` (the row's values, one array per sequence).

    Raises:
        ValueError: the columns do not hold the sequences the blob counts.
    """
    turns: dict[int, ModelCall] = {c.node: c for c in trace.calls if c.stored_ids is not None and c.node is not None}
    lengths = {i: call.stored_ids for i, call in turns.items()}
    sequence = -1
    for _, members, new in sequence_turns(trace, turns, lengths):  # type: ignore[arg-type]
        if not new:
            continue
        sequence += 1
        if sequence >= len(input_ids):
            raise ValueError(
                f"trace {trace.id}: its token columns hold {len(input_ids)} sequences, fewer than its turns make"
            )
        for i in members:
            _restore_turn(trace, i, turns[i], np.asarray(input_ids[sequence]), np.asarray(logprobs[sequence]))


def _restore_turn(trace: Trace, i: int, call: ModelCall, ids: np.ndarray, logprobs: np.ndarray) -> None:
    if call.stored_ids is None:  # put back from an earlier sequence (a prefix branches share)
        return
    prompt, completion = call.stored_ids
    start = call.prompt_shared
    end = start + prompt + completion
    if end > len(ids) or end > len(logprobs):
        raise ValueError(f"trace {trace.id}: node {i}'s ids end at {end}, past its sequence of {len(ids)}")
    node = trace.nodes[i]
    call.prompt_ids, node.token_ids = ids[start : start + prompt].tolist(), ids[start + prompt : end].tolist()
    if node.logprobs is None and completion:
        values = logprobs[start + prompt : end]
        if not np.isnan(values).any():
            node.logprobs = values.tolist()
    call.stored_ids = None


def _float32_holds(values: list[float] | None) -> bool:
    """Whether float32 keeps every one of ``values`` exactly (none is NaN; there is one)."""
    if not values:
        return False
    array: Any = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):
        return bool(np.array_equal(array, array.astype(np.float32)))
