"""The rollout page's token view: each training sequence as the trainer reads it.

Per sequence (``tokens.token_sequences``): its branch and why the branch exists
(``branching.py``), whether it starts after template drift (a later sequence of the same
branch), its ids with their loss mask, sampling logprob (``None``: prompt id, or not
returned) and policy version, and where each turn's new prompt ids and its completion begin.
Ids only: the run table keeps no tokenizer, so the page shows no decoded text.
"""

from __future__ import annotations

import math
from typing import Any

from .._record.tokens import token_sequences
from .._record.trace import Trace

MAX_SHOWN = 4096
"""Ids sent per sequence: a long agent's sequence is 100k ids, more than a page can draw;
``size`` says how many it has."""


def token_view(trace: Trace) -> list[dict[str, Any]]:
    """The sequences of ``trace`` for the page (``[]``: it recorded no ids, or an inconsistent
    record, whose token columns are null in the table too)."""
    try:
        sequences = token_sequences(trace)
    except ValueError:
        return []
    reasons = trace.branch_reasons
    calls = {c.node: c for c in trace.calls if c.node is not None}
    seen: set[int] = set()
    out = []
    for sequence in sequences:
        own = [(len(calls[i].prompt_ids or ()), len(trace.nodes[i].token_ids or ())) for i in sequence.turns]
        at = len(sequence.input_ids) - sum(p + c for p, c in own)  # ids repeated from before
        turns = []
        for i, (prompt, completion) in zip(sequence.turns, own):
            turns.append({"node": i, "prompt": at, "completion": at + prompt})
            at += prompt + completion
        n = min(len(sequence.input_ids), MAX_SHOWN)
        out.append({
            "branch": sequence.branch,
            "reason": reasons[sequence.branch] if sequence.branch < len(reasons) else None,
            "drift": sequence.branch in seen,
            "size": len(sequence.input_ids),
            "ids": sequence.input_ids[:n],
            "mask": sequence.loss_mask[:n],
            "logprobs": [None if not m or math.isnan(x) else round(x, 4)
                         for x, m in zip(sequence.logprobs[:n], sequence.loss_mask[:n])],
            "policy": sequence.policy[:n],
            "turns": turns,
        })
        seen.add(sequence.branch)
    return out
