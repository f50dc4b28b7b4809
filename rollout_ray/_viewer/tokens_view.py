"""The rollout page's token view: each training sequence as the trainer reads it.

Per sequence (``tokens.token_sequences``): its branch and why the branch exists
(``branching.py``), whether it starts after template drift (a later sequence of the same
branch), its ids with their loss mask, sampling logprob (``None``: prompt id, or not
returned) and policy version, and where each turn's new prompt ids and its completion begin.
Each id's text where the viewer has the run's tokenizer (``Viewer(tokenizer=...)``; the CLI
knows the simulated model's), its id otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._record.tokens import token_sequences
from .._record.trace import Trace

MAX_SHOWN = 4096
"""Ids sent per sequence: a long agent's sequence is 100k ids, more than a page can draw;
``size`` says how many it has."""


def token_view(trace: Trace, token_text: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
    """The sequences of ``trace`` for the page (``[]``: it recorded no ids, or an inconsistent
    record, whose token columns are null in the table too), with each id's text where
    ``token_text`` is given (``None`` for an id it cannot decode)."""
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
        out.append(
            {
                "branch": sequence.branch,
                "reason": reasons[sequence.branch] if sequence.branch < len(reasons) else None,
                "drift": sequence.branch in seen,
                "size": len(sequence.input_ids),
                "ids": sequence.input_ids[:n],
                "mask": sequence.loss_mask[:n],
                "logprobs": [
                    None if not m or math.isnan(x) else round(x, 4)
                    for x, m in zip(sequence.logprobs[:n], sequence.loss_mask[:n])
                ],
                "policy": sequence.policy[:n],
                "turns": turns,
                "texts": None if token_text is None else [_decoded(token_text, i) for i in sequence.input_ids[:n]],
            }
        )
        seen.add(sequence.branch)
    return out


def _decoded(token_text: Callable[[int], str], token_id: int) -> str | None:
    try:
        return token_text(token_id)
    except ValueError:  # an id the tokenizer has no text for: the page shows the id
        return None
