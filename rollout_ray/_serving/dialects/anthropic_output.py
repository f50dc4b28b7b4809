"""A committed turn as an Anthropic Messages answer: the ``message`` object, and its stream
(``message_start``, each block's start, deltas and stop, ``message_delta``, ``message_stop``).

Blocks come in the order Claude's do: ``thinking`` (its ``signature`` empty: there is no
Anthropic model to sign it), ``text``, then one ``tool_use`` per tool call, its ``input``
the call's arguments as an object (``{}`` when they are not one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from ..._record.messages import Response, ToolCall, text_of
from .dialect import sse

_ENCODER = msgspec.json.Encoder()
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def blocks(response: Response) -> list[dict[str, Any]]:
    message = response.message
    out: list[dict[str, Any]] = []
    if message.reasoning_content:
        out.append({"type": "thinking", "thinking": message.reasoning_content, "signature": ""})
    text = text_of(message.content)
    if text or not message.tool_calls:
        out.append({"type": "text", "text": text})
    out += [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)}
        for call in message.tool_calls or ()
    ]
    return out


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(call.arguments)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _usage(response: Response, *, output: bool = True) -> dict[str, Any]:
    usage = response.usage
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    # Anthropic's input_tokens exclude cache reads, as our prompt_tokens do.
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens if output else 0,
        "cache_read_input_tokens": usage.cached_input_tokens or 0,
        "cache_creation_input_tokens": 0,
    }


def _message(response: Response, answer_id: str, content: list[dict[str, Any]], *, done: bool) -> dict[str, Any]:
    return {
        "id": answer_id,
        "type": "message",
        "role": "assistant",
        "model": response.model or "",
        "content": content,
        "stop_reason": _STOP_REASONS.get(response.finish_reason or "stop") if done else None,
        "stop_sequence": None,
        "usage": _usage(response, output=done),
    }


def encode(response: Response, answer_id: str) -> bytes:
    return _ENCODER.encode(_message(response, answer_id, blocks(response), done=True))


def events(response: Response, answer_id: str) -> Iterator[bytes]:
    """The stream: the message started, each block started, its delta and stopped, the stop
    reason and output tokens, the message stopped."""
    yield sse("message_start", {"type": "message_start", "message": _message(response, answer_id, [], done=False)})
    yield sse("ping", {"type": "ping"})
    for index, block in enumerate(blocks(response)):
        kind = block["type"]
        if kind == "thinking":
            start, deltas = (
                {**block, "thinking": ""},
                [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": ""},
                ],
            )
        elif kind == "text":
            start, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        else:
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": _ENCODER.encode(block["input"]).decode()}]
        yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        for delta in deltas:
            yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    done = _message(response, answer_id, [], done=True)
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "usage": {"output_tokens": done["usage"]["output_tokens"]},
            "delta": {"stop_reason": done["stop_reason"], "stop_sequence": None},
        },
    )
    yield sse("message_stop", {"type": "message_stop"})
