"""The OpenAI Chat Completions wire format, to and from our Request / Response.

Decoding validates the shape with msgspec, so a bad body is rejected with the location of
the bad field (``Expected `str`, got `int` - at `$.messages[0].content```). Usage follows
our convention: ``prompt_tokens`` excludes cache reads (OpenAI's includes them).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Generic, Literal, TypeVar

import msgspec

from .._errors import WireError
from .messages import (
    AssistantMessage,
    Content,
    Message,
    Request,
    Response,
    SystemMessage,
    TokenLogprob,
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


class _Logprob(msgspec.Struct):
    """What the capture reads of a ``logprobs.content`` entry the harness did not ask for
    (decoding skips its bytes and alternatives)."""

    logprob: float
    token: str = ""


L = TypeVar("L", TokenLogprob, _Logprob)


class WireLogprobs(msgspec.Struct, Generic[L]):
    content: list[L] | None = None


class WireChoice(msgspec.Struct, Generic[L]):
    message: WireMessage
    finish_reason: str | None = None
    index: int = 0
    logprobs: WireLogprobs[L] | None = None
    token_ids: list[int] | None = None
    """vLLM and SGLang (``return_token_ids``): the completion's ids."""
    prompt_token_ids: list[int] | None = None
    """SGLang: the prompt's ids, per choice."""


class WireMetadata(msgspec.Struct):
    weight_version: str | int | None = None


class WireResponse(msgspec.Struct, Generic[L]):
    choices: list[WireChoice[L]]
    model: str | None = None
    usage: WireUsage | None = None
    prompt_token_ids: list[int] | None = None
    """vLLM: the prompt's ids, at the top level."""
    metadata: WireMetadata | None = None
    """SGLang: ``weight_version``."""


_REQUEST = msgspec.json.Decoder(WireRequest)
_RESPONSE = msgspec.json.Decoder(WireResponse[TokenLogprob])
_RESPONSE_SLIM = msgspec.json.Decoder(WireResponse[_Logprob])
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
        check_integers(value, key)
    n = params.get("n")
    if n is not None and n != 1:
        raise WireError(
            f"invalid request: `n` must be 1, got {n!r}: each model call of a rollout "
            "records one reply; send n requests to sample n replies",
            "n",
        )
    return Request(messages, tools), params, wire.stream


def check_integers(value: Any, param: str) -> None:
    """A 400 naming ``param`` for an integer in ``value`` out of the 64-bit range: params are
    recorded on the trace, whose msgpack holds 64-bit integers at most."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 64):
        raise WireError(f"invalid request: `{param}` is out of the 64-bit integer range", param)
    if isinstance(value, dict):
        for k, v in value.items():
            check_integers(v, f"{param}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_integers(v, f"{param}[{i}]")


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


def encode_request(
    request: Request,
    params: dict[str, Any],
    *,
    model: str | None,
    stream: bool,
    extensions: dict[str, Any] | None = None,
) -> bytes:
    """The upstream body: ``params`` with the messages, the tools and the model forced.

    ``extensions`` (a server's token-capture fields) override ``params``.
    """
    body: dict[str, Any] = dict(params)
    if extensions:
        body.update(extensions)
    body["messages"] = [wire_message(m) for m in request.messages]
    if request.tools:
        body["tools"] = [
            WireTool(WireFunctionSpec(t.name, t.description, t.parameters, t.strict)) for t in request.tools
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


def parse_response(body: bytes, *, capture: bool = False, logprobs: bool = True) -> Response:
    """Decode an upstream ``chat.completion`` body.

    Args:
        capture: record the token ids and log-probabilities the server sent (vLLM's and
            SGLang's shapes are both read, whichever was asked for).
        logprobs: keep ``logprobs.content`` for the harness (it asked for it).

    Raises:
        WireError: the body is not a chat completion of one choice.
    """
    try:
        wire = (_RESPONSE if logprobs else _RESPONSE_SLIM).decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise WireError(f"malformed completion from the model: {e}") from None
    if len(wire.choices) != 1:
        raise WireError(f"malformed completion from the model: {len(wire.choices)} choices, expected 1")
    choice = wire.choices[0]
    message = _to_message(msgspec.structs.replace(choice.message, role="assistant"), 0)
    response = Response(message, _finish(choice.finish_reason), _usage(wire.usage), wire.model)  # type: ignore[arg-type]
    content = choice.logprobs.content if choice.logprobs is not None else None
    if logprobs:
        response.logprobs = content  # type: ignore[assignment]  # TokenLogprob when logprobs
    if capture:
        captured(response, wire.prompt_token_ids or choice.prompt_token_ids, choice.token_ids, content)
        response.policy_version = _version(wire.metadata.weight_version if wire.metadata else None)
    return response


def captured(
    response: Response,
    prompt_ids: list[int] | None,
    token_ids: list[int] | None,
    content: list[TokenLogprob] | list[_Logprob] | None,
) -> None:
    """Set the token fields of ``response``; completion ids missing are read from ``token_id:N``
    logprob tokens (vLLM's ``return_tokens_as_token_ids``) when every token reads so."""
    response.prompt_token_ids = prompt_ids
    if content is not None:
        response.token_logprobs = [entry.logprob for entry in content]
        if token_ids is None:
            token_ids = _ids_of_tokens(content)
    response.token_ids = token_ids


def _ids_of_tokens(content: list[TokenLogprob] | list[_Logprob]) -> list[int] | None:
    ids = []
    for entry in content:
        if not entry.token.startswith("token_id:"):
            return None
        try:
            ids.append(int(entry.token[9:]))
        except ValueError:
            return None
    return ids


def _version(value: str | int | None) -> int | None:
    """A policy version as an integer; ``None`` when absent or not an integer."""
    if value is None or isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        return None


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
    choice: dict[str, Any] = {
        "index": 0,
        "message": wire_message(response.message),
        "finish_reason": response.finish_reason,
    }
    if response.logprobs is not None:
        choice["logprobs"] = {"content": response.logprobs}
    body = {
        "id": completion_id or f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": response.model,
        "choices": [choice],
    }
    if response.usage is not None:
        body["usage"] = _wire_usage(response.usage)
    return _ENCODER.encode(body)
