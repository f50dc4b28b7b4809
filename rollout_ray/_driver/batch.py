"""A finalized group as the padded numpy arrays a trainer's step takes (``Group.batch``).

One row per training sequence of each sample, in sample order: a sample has one sequence
per branch, and one more for each turn whose chat template drifted (``_record/tokens.py``);
``sample_idx`` and ``branch`` map the rows back. A sample is left out when it has no token
ids, no advantage, or it failed: a failed sample counts as reward 0 in its siblings'
advantages (``finalize``), but what it sampled before failing is not trained on (the failure
may be the provider's or the machine's, not the policy's). A sample whose tokens are masked
(the samples' ``masked`` column, e.g. ``"stale"``: older than ``max_staleness`` with
``stale_samples="mask"``) keeps its rows, its reward having counted in its group's baseline,
with ``loss_mask`` and ``advantages`` 0 and the reason in ``masked``. Rows are padded on the
right, to ``pad_to`` or to the longest sequence.

=================  ===============  =======================================================
array              dtype, shape     value
=================  ===============  =======================================================
``input_ids``      int64 [R, T]     the ids, then ``pad_id``
``attention_mask`` int64 [R, T]     1 on ids, 0 on padding
``loss_mask``      float32 [R, T]   1.0 on ids the policy sampled, else 0.0
``old_logprobs``   float32 [R, T]   the sampling logprob of each sampled id, else 0.0
                                    (NaN: the server returned none for that id)
``advantages``     float32 [R, T]   the sample's advantage where ``loss_mask`` is 1, else 0.0
``sample_idx``     int64 [R]        the row's sample in the group
``branch``         int64 [R]        the row's branch in that sample's trace
``agent``          str [R]          the agent whose sequence the row is (``token_agent``;
                                    ``""`` in a table written before schema version 6)
``masked``         str [R]          why the row's tokens are masked from the loss (``""``:
                                    they are not)
=================  ===============  =======================================================

A multi-agent group's batch per agent (``agent_batches``, ``Group.batch_by_agent``): the rows
of each agent, each with that agent's advantage: its reward (``agent_rewards``) minus the
group's mean of it, a failed sample counting 0 (as ``finalize`` counts a failed sample's
reward), 0 where every sample's is equal; not divided by the spread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._record.arrow import TOKEN_COLUMNS

__all__ = ["agent_batches", "batch_arrays"]


def batch_arrays(samples: pa.Table, *, pad_to: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
    """The training arrays of a group's ``samples`` (a finalized trace table); see the module.

    Raises:
        ValueError: ``pad_to`` is below 1, a sequence is longer than ``pad_to``, or
            ``samples`` lacks the token or ``advantage`` columns.
    """
    if pad_to is not None and pad_to < 1:
        raise ValueError(f"`pad_to` must be >= 1 or None, got {pad_to}")
    present = set(samples.column_names)
    missing = [c for c in ("sample_idx", "ok", "advantage", *TOKEN_COLUMNS[:3], "token_branch") if c not in present]
    if missing:
        raise ValueError(
            f"samples lack the column(s) {', '.join(missing)}: pass a finalized group's "
            "samples, written with token columns (schema version 2)"
        )
    kept = samples.filter(
        pc.and_(
            pc.and_(pc.fill_null(samples["ok"], False), pc.is_valid(samples["advantage"])),
            pc.is_valid(samples["input_ids"]),
        )
    )
    per_sample = _numpy(pc.list_value_length(kept["input_ids"]), np.int64)
    ids, starts, lengths = _flat(kept["input_ids"])
    rows = len(lengths)
    sample_idx = np.repeat(_numpy(kept["sample_idx"], np.int64), per_sample)
    branch = _numpy(pc.list_flatten(kept["token_branch"]), np.int64)
    width = pad_to if pad_to is not None else int(lengths.max(initial=0))
    too_long = np.flatnonzero(lengths > width)
    if too_long.size:
        r = int(too_long[0])
        raise ValueError(
            f"sample {sample_idx[r]} (branch {branch[r]}) has a sequence of {lengths[r]} ids, "
            f"more than pad_to={width}: raise pad_to, or leave it None to pad to the longest"
        )
    at = (np.repeat(np.arange(rows), lengths), np.arange(ids.size) - np.repeat(starts, lengths))

    def padded(values: np.ndarray, dtype: type, fill: float = 0) -> np.ndarray:
        out: np.ndarray = np.full((rows, width), fill, dtype)
        out[at] = values
        return out

    masked = np.repeat(
        np.array(kept["masked"].fill_null("").to_pylist() if "masked" in present else [""] * kept.num_rows, dtype=str),
        per_sample,
    )
    loss_mask = padded(_flat(kept["loss_mask"])[0], np.float32)
    loss_mask[masked != ""] = 0.0
    advantage = np.repeat(_numpy(kept["advantage"], np.float32), per_sample)
    agent = (
        np.array(pc.list_flatten(kept["token_agent"]).to_pylist(), dtype=str).reshape(rows)
        if "token_agent" in present
        else np.full(rows, "", dtype=str)
    )
    return {
        "input_ids": padded(ids, np.int64, pad_id),
        "attention_mask": padded(np.ones(ids.size, np.int64), np.int64),
        "loss_mask": loss_mask,
        "old_logprobs": padded(_flat(kept["logprobs"])[0], np.float32),
        "advantages": loss_mask * advantage[:, None],
        "sample_idx": sample_idx,
        "branch": branch,
        "agent": agent,
        "masked": masked,
    }


def agent_batches(samples: pa.Table, *, pad_to: int | None = None, pad_id: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """The training arrays of a group's ``samples`` split by agent, each with the agent's own
    advantage (see the module); agents in name order.

    Raises:
        ValueError: as ``batch_arrays``, and when ``samples`` lack the agent columns (written
            before schema version 6).
    """
    missing = [c for c in ("token_agent", "agent_rewards") if c not in samples.column_names]
    if missing:
        raise ValueError(
            f"samples lack the column(s) {', '.join(missing)}: a batch per agent needs a table "
            "of schema version 6 or later (each sequence's agent, each agent's reward)"
        )
    whole = batch_arrays(samples, pad_to=pad_to, pad_id=pad_id)
    ok = pc.fill_null(samples["ok"], False).to_pylist()
    rewards = [dict(row or ()) if good else {} for row, good in zip(samples["agent_rewards"].to_pylist(), ok)]
    sample_idx = samples["sample_idx"].to_pylist()
    batches = {}
    for agent in sorted(set(whole["agent"].tolist()) - {""}):
        scores = np.array([float(r.get(agent) or 0.0) for r in rewards])
        spread = scores.max(initial=0.0) - scores.min(initial=0.0)
        advantage = dict(zip(sample_idx, scores - scores.mean() if spread else np.zeros_like(scores)))
        rows = whole["agent"] == agent
        part = {name: values[rows] for name, values in whole.items()}
        per_row = np.array([advantage[i] for i in part["sample_idx"]], np.float32)
        part["advantages"] = part["loss_mask"] * per_row[:, None]
        batches[agent] = part
    return batches


def _numpy(values: pa.Array | pa.ChunkedArray, dtype: type) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype)


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids of every sequence of every row, laid end to end; each sequence's start and length."""
    sequences = pc.list_flatten(column)  # list<list<x>> → one list per sequence
    lengths = _numpy(pc.list_value_length(sequences), np.int64)
    starts = np.cumsum(lengths) - lengths
    return _numpy(pc.list_flatten(sequences), np.float64 if _is_float(column) else np.int64), starts, lengths


def _is_float(column: pa.ChunkedArray) -> bool:
    return pa.types.is_floating(column.type.value_type.value_type)  # type: ignore[no-any-return]
