"""A committed turn as an OpenAI Responses answer: the ``response`` object, and the typed
events of its stream (``response.created`` ... ``response.completed``).

The turn's output items come in the order an agent sends them back: ``reasoning`` (its text
kept as ``reasoning_text`` content, so it reads back as the same assistant message), the
``message``, then one ``function_call`` per tool call. Item ids derive from the answer's
id, so a replayed retry gets the same ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec

from ..._record.messages import Response, text_of
from .dialect import sse

_ENCODER = msgspec.json.Encoder()


NAMESPACE_SEPARATOR = "__"


def qualified(namespace: str, name: str) -> str:
    """The one name upstream of a function of a ``namespace`` tool (Codex offers its MCP tools
    so: namespace ``mcp__calc``, function ``add``, upstream ``mcp__calc__add``)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def namespaces(tools: Any) -> dict[str, tuple[str, str]]:
    """Upstream name to ``(namespace, name)`` of each function of the request's namespace tools."""
    found: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for inner in tool.get("tools") or ():
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[qualified(tool["name"], inner["name"])] = (tool["name"], inner["name"])
    return found


def items(response: Response, answer_id: str, echo: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The output items of ``response``, each as it stands when done; a call of a namespace
    tool's function named as the agent offered it (``name`` and ``namespace``)."""
    key = answer_id.removeprefix("resp_")
    message = response.message
    out: list[dict[str, Any]] = []
    if message.reasoning_content:
        out.append(
            {
                "type": "reasoning",
                "id": f"rs_{key}",
                "summary": [],
                "status": "completed",
                "content": [{"type": "reasoning_text", "text": message.reasoning_content}],
            }
        )
    text = text_of(message.content)
    if text or not message.tool_calls:
        logprobs = msgspec.to_builtins(response.logprobs) if response.logprobs is not None else []
        out.append(
            {
                "type": "message",
                "id": f"msg_{key}",
                "role": "assistant",
                "status": "completed",
                "content": [_text_part(text, logprobs)],
            }
        )
    spaced = namespaces((echo or {}).get("tools")) if message.tool_calls else {}
    for i, call in enumerate(message.tool_calls or ()):
        item = {
            "type": "function_call",
            "id": f"fc_{key}_{i}",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        if call.name in spaced:
            item["namespace"], item["name"] = spaced[call.name]
        out.append(item)
    return out


def _text_part(text: str, logprobs: list[Any]) -> dict[str, Any]:
    """An ``output_text`` part; ``logprobs`` as the agent asked for them (``include``)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def body(
    response: Response | None, echo: dict[str, Any], answer_id: str, created: int, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ``response`` object; ``response`` ``None`` while it is still in progress."""
    status, incomplete = "in_progress", None
    if response is not None:
        status = "incomplete" if response.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": answer_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": (response.model if response else None) or "",
        "output": output,
        "usage": _usage(response) if response is not None else None,
        "text": {"format": {"type": "text"}},
        **echo,
    }


def _usage(response: Response) -> dict[str, Any] | None:
    usage = response.usage
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens or 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
    }


def encode(response: Response, echo: dict[str, Any], answer_id: str) -> bytes:
    return _ENCODER.encode(body(response, echo, answer_id, int(time.time()), items(response, answer_id, echo)))


def events(response: Response, echo: dict[str, Any], answer_id: str) -> Iterator[bytes]:
    """The stream: created, in progress, each item added, its content and done, completed
    (``response.incomplete`` for a reply cut at its length)."""
    created = int(time.time())
    sequence = iter(range(1 << 62))

    def event(kind: str, **fields: Any) -> bytes:
        return sse(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    yield event("response.created", response=body(None, echo, answer_id, created, []))
    yield event("response.in_progress", response=body(None, echo, answer_id, created, []))
    done = items(response, answer_id, echo)
    for index, item in enumerate(done):
        yield from _item_events(event, index, item)
    final = body(response, echo, answer_id, created, done)
    yield event(f"response.{final['status']}", response=final)


def _item_events(event: Any, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    if kind == "function_call":
        yield event(
            "response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"}
        )
        yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
        yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
    else:
        yield event(
            "response.output_item.added", output_index=index, item={**item, "content": [], "status": "in_progress"}
        )
        part = item["content"][0]
        text = part["text"]
        if kind == "reasoning":
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            yield event("response.reasoning_text.delta", **at, content_index=0, delta=text)
            yield event("response.reasoning_text.done", **at, content_index=0, text=text)
        else:
            logprobs = part["logprobs"]
            yield event("response.content_part.added", **at, content_index=0, part=_text_part("", []))
            yield event("response.output_text.delta", **at, content_index=0, delta=text, logprobs=logprobs)
            yield event("response.output_text.done", **at, content_index=0, text=text, logprobs=logprobs)
        yield event("response.content_part.done", **at, content_index=0, part=part)
    yield event("response.output_item.done", output_index=index, item=item)
