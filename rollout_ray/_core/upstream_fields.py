"""What of a model request goes upstream: the operator's settings over the harness's fields.

``upstream_fields`` merges the harness's request fields with the operator's (``sampling``):
a harness field goes only if allowed (``sampling.FORWARDED_FIELDS`` plus what the operator's
model adds), an operator setting overrides every alias of it the harness sent, and a token
budget left in the rollout's limits clamps the reply's length. What was dropped is returned
with why, for the trace (``ModelCall.dropped``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .sampling import ALIASES, FORWARDED_FIELDS, FORWARDED_TOOL_CHOICES

NOT_FORWARDED = "not forwarded: it may change the sampling distribution or the server's work"
FORCED_TOOL = "not forwarded: a forced tool call is constrained decoding"


def upstream_fields(
    params: Mapping[str, Any],
    operator: Mapping[str, Any],
    *,
    extra: frozenset[str] = frozenset(),
    tokens_left: int | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(fields sent upstream, dropped field → why)``.

    Args:
        params: the harness's request fields (beside messages, tools, model and stream).
        operator: the operator's settings; each goes, whatever the list says.
        extra: harness fields the operator forwards beyond ``FORWARDED_FIELDS``.
        tokens_left: completion tokens the rollout's budget still allows (``None``: no budget);
            the reply's length is clamped to it.
    """
    allowed = FORWARDED_FIELDS | extra
    sent: dict[str, Any] = {}
    dropped: dict[str, str] = {}
    for key, value in params.items():
        if key in operator:
            continue  # the operator's value stands; not a drop
        if key not in allowed:
            dropped[key] = NOT_FORWARDED
        elif key == "tool_choice" and not _unforced(value) and "tool_choice" not in extra:
            dropped[key] = FORCED_TOOL
        else:
            sent[key] = value
    for names in ALIASES:
        _one_alias(sent, operator, names, dropped)
    sent.update(operator)
    if tokens_left is not None:
        _clamp(sent, max(0, tokens_left))
    return sent, dropped


def _unforced(choice: Any) -> bool:
    # Compared as a string only: the object shape ({"type": "function", ...}) is unhashable.
    return isinstance(choice, str) and choice in FORWARDED_TOOL_CHOICES


def _one_alias(
    sent: dict[str, Any], operator: Mapping[str, Any], names: tuple[str, ...], dropped: dict[str, str]
) -> None:
    """Keep at most one name of a setting: the operator's, else the one the server reads first."""
    chosen = next((n for n in names if n in operator), None)
    why = f"the operator's {chosen} overrides it"
    if chosen is None:
        chosen = next((n for n in names if n in sent), None)
        why = f"an alias of {chosen}, which the server reads first"
    for name in names:
        if name != chosen and name in sent:
            del sent[name]
            dropped[name] = why


def _clamp(sent: dict[str, Any], left: int) -> None:
    name = next((n for n in ALIASES[0] if n in sent), "max_tokens")
    current = sent.get(name)
    if not isinstance(current, int) or isinstance(current, bool) or current > left:
        sent[name] = max(1, left)
