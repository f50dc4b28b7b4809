"""The OpenAI Chat Completions wire format, to and from our Request / Response.

Decoding validates the shape with msgspec, so a bad body is rejected with the location of
the bad field (``Expected `str`, got `int` - at `$.messages[0].content```). Usage follows
our convention: ``prompt_tokens`` excludes cache reads (OpenAI's includes them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import msgspec

from .._errors import WireError
from .messages import (
    AssistantMessage,
    Content,
    Message,
    Request,
    Response,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)

# Fields of a request body that are not sampling settings: everything else passes through.
_STRUCTURAL = frozenset({"messages", "tools", "model", "stream", "stream_options"})


class WireFunction(msgspec.Struct):
    name: str
    arguments: str = "{}"


class WireToolCall(msgspec.Struct):
    id: str
    function: WireFunction
    type: str = "function"


class WireMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class WireFunctionSpec(msgspec.Struct, omit_defaults=True):
    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    strict: bool | None = None


class WireTool(msgspec.Struct, omit_defaults=True):
    function: WireFunctionSpec
    type: str = "function"


class WireRequest(msgspec.Struct):
    messages: list[WireMessage]
    model: str | None = None
    tools: list[WireTool] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class WireUsage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None
    cost: float | None = None


class WireChoice(msgspec.Struct):
    message: WireMessage
    finish_reason: str | None = None
    index: int = 0


class WireResponse(msgspec.Struct):
    choices: list[WireChoice]
    model: str | None = None
    usage: WireUsage | None = None


_REQUEST = msgspec.json.Decoder(WireRequest)
_RESPONSE = msgspec.json.Decoder(WireResponse)
_ENCODER = msgspec.json.Encoder()


def parse_request(body: bytes) -> tuple[Request, dict[str, Any], bool]:
    """Decode a request body into ``(request, params, stream)``.

    ``params`` are the body's other fields (sampling settings, ``tool_choice``, ...) to pass
    upstream.

    Raises:
        WireError: the body is not JSON, or a field has the wrong shape.
    """
    try:
        wire = _REQUEST.decode(body)
        raw = msgspec.json.decode(body)
    except msgspec.ValidationError as e:
        raise WireError(f"invalid request: {e}", _param_of(str(e))) from None
    except msgspec.DecodeError as e:
        raise WireError(f"body is not valid JSON: {e}") from None
    messages = [_to_message(m, i) for i, m in enumerate(wire.messages)]
    tools = [_to_tool(t) for t in wire.tools] if wire.tools else None
    params = {k: v for k, v in raw.items() if k not in _STRUCTURAL}
    for key, value in params.items():
        _check_integers(value, key)
    return Request(messages, tools), params, wire.stream


def _check_integers(value: Any, param: str) -> None:
    """Params are recorded on the trace, whose msgpack holds 64-bit integers at most."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 64):
        raise WireError(f"invalid request: `{param}` is out of the 64-bit integer range", param)
    if isinstance(value, dict):
        for k, v in value.items():
            _check_integers(v, f"{param}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_integers(v, f"{param}[{i}]")


def _param_of(message: str) -> str | None:
    marker = " - at `$."
    if marker not in message:
        return None
    return message.split(marker, 1)[1].rstrip("`")


def _to_message(m: WireMessage, i: int) -> Message:
    if m.role in ("system", "developer"):
        return SystemMessage(_required(m.content, f"messages[{i}].content"))
    if m.role == "user":
        return UserMessage(_required(m.content, f"messages[{i}].content"))
    if m.role == "tool":
        call_id = _required(m.tool_call_id, f"messages[{i}].tool_call_id")
        return ToolMessage(call_id, m.content if m.content is not None else "", m.name)
    calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()]
    return AssistantMessage(m.content, m.reasoning_content, calls or None)


def _required(value: Any, param: str) -> Any:
    if value is None:
        raise WireError(f"invalid request: `{param}` is required", param)
    return value


def _to_tool(t: WireTool) -> Tool:
    f = t.function
    return Tool(f.name, f.description, f.parameters, f.strict)


def encode_request(request: Request, params: dict[str, Any], *, model: str | None, stream: bool) -> bytes:
    """The upstream body: ``params`` with the messages, the tools and the model forced."""
    body: dict[str, Any] = dict(params)
    body["messages"] = [wire_message(m) for m in request.messages]
    if request.tools:
        body["tools"] = [
            WireTool(WireFunctionSpec(t.name, t.description, t.parameters, t.strict))
            for t in request.tools
        ]
    if model is not None:
        body["model"] = model
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return _ENCODER.encode(body)


def wire_message(m: Message) -> WireMessage:
    if isinstance(m, AssistantMessage):
        calls = [WireToolCall(c.id, WireFunction(c.name, c.arguments)) for c in m.tool_calls or ()]
        return WireMessage("assistant", m.content, calls or None, reasoning_content=m.reasoning_content)
    if isinstance(m, ToolMessage):
        return WireMessage("tool", m.content, tool_call_id=m.tool_call_id, name=m.name)
    return WireMessage(m.role, m.content)  # type: ignore[arg-type]


def parse_response(body: bytes) -> Response:
    """Decode an upstream ``chat.completion`` body.

    Raises:
        WireError: the body is not a chat completion.
    """
    try:
        wire = _RESPONSE.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise WireError(f"malformed completion from the model: {e}") from None
    if not wire.choices:
        raise WireError("malformed completion from the model: no choices")
    choice = wire.choices[0]
    message = _to_message(msgspec.structs.replace(choice.message, role="assistant"), 0)
    return Response(message, _finish(choice.finish_reason), _usage(wire.usage), wire.model)  # type: ignore[arg-type]


def _finish(reason: str | None) -> Any:
    return reason if reason in ("stop", "length", "tool_calls") else None


def _usage(wire: WireUsage | None) -> Usage | None:
    if wire is None:
        return None
    cached = (wire.prompt_tokens_details or {}).get("cached_tokens")
    reasoning = (wire.completion_tokens_details or {}).get("reasoning_tokens")
    return Usage(
        prompt_tokens=wire.prompt_tokens - (cached or 0),
        completion_tokens=wire.completion_tokens,
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
        cost=wire.cost,
    )


def _wire_usage(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_input_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_input_tokens}
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def encode_response(response: Response, *, completion_id: str | None = None) -> bytes:
    """A ``chat.completion`` body for the harness."""
    body = {
        "id": completion_id or f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": response.model,
        "choices": [
            {"index": 0, "message": wire_message(response.message), "finish_reason": response.finish_reason}
        ],
    }
    if response.usage is not None:
        body["usage"] = _wire_usage(response.usage)
    return _ENCODER.encode(body)


def sse_events(response: Response, *, include_usage: bool, completion_id: str | None = None) -> Iterator[bytes]:
    """The SSE events of a streamed ``response``, ending with ``data: [DONE]``."""
    cid = completion_id or f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
        body = {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": response.model, "choices": choices, **extra}
        return b"data: " + _ENCODER.encode(body) + b"\n\n"

    message = response.message
    yield chunk({"role": "assistant", "content": ""})
    if isinstance(message.content, str) and message.content:
        yield chunk({"content": message.content})
    for i, call in enumerate(message.tool_calls or ()):
        yield chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": call.arguments}}]})
    yield chunk({}, response.finish_reason)
    if include_usage and response.usage is not None:
        yield chunk(None, usage=_wire_usage(response.usage))  # type: ignore[arg-type]
    yield b"data: [DONE]\n\n"


class StreamAssembler:
    """Folds ``chat.completion.chunk`` events into one Response."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        """Feed the payload of one ``data:`` line."""
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = msgspec.json.decode(data)
        except msgspec.DecodeError as e:
            raise WireError(f"malformed stream chunk from the model: {e}") from None
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = _usage(msgspec.convert(chunk["usage"], WireUsage))
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            self.content.append(delta.get("content") or "")
            self.reasoning.append(delta.get("reasoning_content") or "")
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                function = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish

    def response(self) -> Response:
        if not self.done:
            raise WireError("malformed stream from the model: no terminal [DONE] event")
        calls = [ToolCall(c["id"], c["name"], c["arguments"] or "{}") for _, c in sorted(self.calls.items())]
        message = AssistantMessage(
            "".join(self.content) or None, "".join(self.reasoning) or None, calls or None
        )
        return Response(message, _finish(self.finish), self.usage, self.model)
