"""The OpenAI chunks of an answer without token capture: text in pieces, paced.

Each choice streams a role chunk after ``ttft``, a tool call's opening, its text (or the
call's arguments) in four pieces whose waits add up to ``per_token * tokens`` (the choice's
token estimate), and a finish chunk; the choices go side by side.
"""

from __future__ import annotations

import itertools
from typing import Any

from .completion import Choice
from .dialects import Event

__all__ = ["STREAM_PIECES", "plain_events"]

STREAM_PIECES = 4


def _pieces(text: str) -> list[str]:
    size = max(1, -(-len(text) // STREAM_PIECES))
    return [text[i : i + size] for i in range(0, len(text), size)]


def plain_events(
    head: dict[str, Any], choices: list[Choice], usage: dict[str, int] | None, ttft: float, per_token: float
) -> list[Event]:
    """Every choice's chunks with the wait before each, then the usage chunk (``usage``
    ``None``: without one)."""
    head = {**head, "object": "chat.completion.chunk"}
    if usage is not None:
        head["usage"] = None
    per_choice = [_choice_events(head, c, ttft, per_token) for c in choices]
    events: list[Event] = []
    for step in itertools.zip_longest(*per_choice):
        present = [e for e in step if e is not None]
        wait = max(w for w, _ in present)
        events += [(wait if i == 0 else 0.0, chunk) for i, (_, chunk) in enumerate(present)]
    if usage is not None:
        events.append((0.0, {**head, "choices": [], "usage": usage}))
    return events


def _choice_events(head: dict[str, Any], c: Choice, ttft: float, per_token: float) -> list[Event]:
    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": c.index, "delta": delta, "logprobs": None, "finish_reason": reason}]}

    events: list[Event] = [(ttft, chunk({"role": "assistant", "content": ""}))]
    calls = c.message.get("tool_calls")
    if calls:
        call, fn = calls[0], calls[0]["function"]
        opening = {"index": 0, "id": call["id"], "type": "function"}
        opening["function"] = {"name": fn["name"], "arguments": ""}
        events.append((0.0, chunk({"tool_calls": [opening]})))
        text = fn["arguments"]
    else:
        text = c.message["content"]
    per_char = per_token * c.tokens / max(1, len(text))
    for piece in _pieces(text):
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if calls else {"content": piece}
        events.append((per_char * len(piece), chunk(delta)))
    events.append((0.0, chunk({}, c.finish)))
    return events
