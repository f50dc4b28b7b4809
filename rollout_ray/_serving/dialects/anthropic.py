"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): what Claude Code
and the ``anthropic`` SDK speak (Claude Code posts to ``/v1/messages?beta=true``).

The key comes in ``x-api-key`` (or as a bearer, Claude Code's ``ANTHROPIC_AUTH_TOKEN``);
``anthropic-version`` and ``anthropic-beta`` are read by no one. ``system``, and a message
of role ``system`` (Claude Code's environment), are system messages; a user turn's ``tool_result`` blocks are tool messages (before the turn's other
blocks, a user message); an assistant turn's ``thinking``, ``text`` and ``tool_use`` blocks
are one assistant message, its reasoning, text and tool calls, so a turn sent back reads as
the turn the session committed and its token ids carry on (token in). Custom tools are Chat
Completions tools; server tools, ``thinking`` budgets, cache controls and the fields with no
Chat Completions counterpart are dropped and recorded. The answer is built by
``anthropic_output``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from ..._errors import WireError
from ..._record.messages import (
    AssistantMessage,
    Content,
    ImagePart,
    ImageURL,
    Message,
    Request,
    Response,
    SystemMessage,
    TextPart,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from . import anthropic_output
from .dialect import UNTRANSLATABLE, Dialect, History, Parsed, decode_object, typed

_RENAMED = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
}
_READ = frozenset({"messages", "system", "tools", "tool_choice", "model", "stream", "thinking"})
_CONVERSATION = frozenset({"messages", "system", "tools"})
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
CHARS_PER_TOKEN = 4
"""``count_tokens``' estimate: the proxy holds no tokenizer (the model server does)."""


class AnthropicMessages(Dialect):
    name = "anthropic"
    endpoint = "/messages"
    paths = ("/v1/messages",)
    id_prefix = "msg_"

    def secret(self, headers: Mapping[str, str]) -> str:
        return headers.get("x-api-key", "").strip() or super().secret(headers)

    def parse(self, body: bytes, history: History) -> Parsed:
        raw = decode_object(body, _CONVERSATION)
        dropped: dict[str, str] = {}
        messages: list[Message] = []
        if raw.get("system") is not None:
            messages.append(SystemMessage(_system(raw["system"], "system", dropped)))
        for i, message in enumerate(typed(raw.get("messages"), list, "messages", "an array")):
            messages += _message(message, f"messages[{i}]", dropped)
        params = _params(raw, dropped)
        stream = typed(raw.get("stream", False), bool, "stream", "a boolean")
        return Parsed(Request(messages, _tools(raw.get("tools"), dropped)), params, stream, dropped)

    def encode(self, response: Response, parsed: Parsed, answer_id: str) -> bytes:
        return anthropic_output.encode(response, answer_id)

    def events(self, response: Response, parsed: Parsed, answer_id: str) -> Iterator[bytes]:
        return anthropic_output.events(response, answer_id)

    def error(self, status: int, message: str, kind: str, param: str | None) -> bytes:
        kind = _ERROR_TYPES.get(status, "api_error")
        return _ENCODER.encode({"type": "error", "error": {"type": kind, "message": message}})

    def side_routes(self) -> dict[str, Callable[[bytes], bytes]]:
        return {"/v1/messages/count_tokens": self.count_tokens}

    def count_tokens(self, body: bytes) -> bytes:
        """``{"input_tokens": N}``, estimated at ``CHARS_PER_TOKEN`` characters a token of
        the request as it would go upstream (checked as a model call's request is)."""
        request = self.parse(body, lambda _: None).request
        size = len(_ENCODER.encode(request.messages)) + len(_ENCODER.encode(request.tools or []))
        return _ENCODER.encode({"input_tokens": math.ceil(size / CHARS_PER_TOKEN)})


_ENCODER = msgspec.json.Encoder()


def _params(raw: dict[str, Any], dropped: dict[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _RENAMED:
            params[_RENAMED[key]] = value
        elif key not in _READ:
            dropped[key] = UNTRANSLATABLE
    if "max_tokens" in params:
        typed(params["max_tokens"], int, "max_tokens", "an integer")
    if "top_k" in params:
        typed(params["top_k"], int, "top_k", "an integer")
    if "stop" in params:
        for i, stop in enumerate(typed(params["stop"], list, "stop_sequences", "an array of strings")):
            typed(stop, str, f"stop_sequences[{i}]", "a string")
    thinking = raw.get("thinking")
    if thinking is not None and typed(thinking, dict, "thinking", "an object").get("type") != "disabled":
        dropped["thinking"] = f"{UNTRANSLATABLE} (a thinking budget)"
    if raw.get("tool_choice") is not None:
        _tool_choice(typed(raw["tool_choice"], dict, "tool_choice", "an object"), params)
    return params


def _tool_choice(choice: dict[str, Any], params: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "tool":
        name = typed(choice.get("name"), str, "tool_choice.name", "a string")
        params["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in ("auto", "none", "any"):
        params["tool_choice"] = "required" if kind == "any" else kind
    else:
        raise WireError(
            f"invalid request: `tool_choice.type` must be auto, any, tool or none, got {kind!r}", "tool_choice.type"
        )
    if choice.get("disable_parallel_tool_use"):
        params["parallel_tool_calls"] = False


def _system(system: Any, where: str, dropped: dict[str, str]) -> str:
    if isinstance(system, str):
        return system
    blocks = typed(system, list, where, "a string or an array of text blocks")
    texts = []
    for i, block in enumerate(blocks):
        typed(block, dict, f"{where}[{i}]", "an object")
        if block.get("type") != "text":
            raise WireError(
                f"invalid request: `{where}[{i}].type` must be text, got {block.get('type')!r}", f"{where}[{i}].type"
            )
        texts.append(typed(block.get("text"), str, f"{where}[{i}].text", "a string"))
        _cache_control(block, dropped)
    # Blocks are one prompt to Anthropic's model; a Chat Completions template wants one string.
    return "\n\n".join(texts)


def _cache_control(block: dict[str, Any], dropped: dict[str, str]) -> None:
    if "cache_control" in block:
        dropped["cache_control"] = f"{UNTRANSLATABLE} (the server caches prefixes itself)"


def _tools(tools: Any, dropped: dict[str, str]) -> list[Tool] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(typed(tools, list, "tools", "an array")):
        where = f"tools[{i}]"
        typed(tool, dict, where, "an object")
        if tool.get("type", "custom") != "custom":
            dropped[where] = f"{UNTRANSLATABLE} (a server tool, {tool.get('type')!r})"
            continue
        _cache_control(tool, dropped)
        out.append(
            Tool(
                typed(tool.get("name"), str, f"{where}.name", "a string"),
                typed(tool.get("description") or "", str, f"{where}.description", "a string"),
                typed(tool.get("input_schema"), dict, f"{where}.input_schema", "an object"),
            )
        )
    return out or None


def _message(message: Any, where: str, dropped: dict[str, str]) -> list[Message]:
    typed(message, dict, where, "an object")
    role = message.get("role")
    content = message.get("content")
    if role == "system":  # Claude Code sends its environment so, after the first user turn
        return [SystemMessage(_system(content, f"{where}.content", dropped))]
    blocks = (
        [{"type": "text", "text": content}]
        if isinstance(content, str)
        else typed(content, list, f"{where}.content", "a string or an array of content blocks")
    )
    if role == "assistant":
        return [_assistant(blocks, where, dropped)]
    if role != "user":
        raise WireError(
            f"invalid request: `{where}.role` must be user, assistant or system, got {role!r}", f"{where}.role"
        )
    results: list[Message] = []
    parts: list[TextPart | ImagePart] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        typed(block, dict, at, "an object")
        _cache_control(block, dropped)
        if block.get("type") == "tool_result":
            call_id = typed(block.get("tool_use_id"), str, f"{at}.tool_use_id", "a string")
            results.append(ToolMessage(call_id, _result(block.get("content", ""), at, dropped)))
        else:
            parts += _part(block, at, dropped)
    if parts:  # a turn's results answer the calls before it; its text comes after them
        results.append(UserMessage(_content(parts)))
    return results


def _assistant(blocks: list[Any], where: str, dropped: dict[str, str]) -> AssistantMessage:
    text: list[str] | None = None
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        typed(block, dict, at, "an object")
        kind = block.get("type")
        if kind == "text":
            text = [*(text or []), typed(block.get("text"), str, f"{at}.text", "a string")]
        elif kind == "thinking":
            thinking.append(typed(block.get("thinking"), str, f"{at}.thinking", "a string"))
        elif kind == "tool_use":
            arguments = _ENCODER.encode(typed(block.get("input", {}), dict, f"{at}.input", "an object")).decode()
            calls.append(
                ToolCall(
                    typed(block.get("id"), str, f"{at}.id", "a string"),
                    typed(block.get("name"), str, f"{at}.name", "a string"),
                    arguments,
                )
            )
        else:
            dropped[at] = f"{UNTRANSLATABLE} (a {kind!r} block)"
    return AssistantMessage("".join(text) if text is not None else None, "".join(thinking) or None, calls or None)


def _part(block: dict[str, Any], at: str, dropped: dict[str, str]) -> list[TextPart | ImagePart]:
    kind = block.get("type")
    if kind == "text":
        return [TextPart(typed(block.get("text"), str, f"{at}.text", "a string"))]
    if kind == "image":
        source = typed(block.get("source"), dict, f"{at}.source", "an object")
        if source.get("type") == "base64":
            data = typed(source.get("data"), str, f"{at}.source.data", "a string")
            media = typed(source.get("media_type"), str, f"{at}.source.media_type", "a string")
            return [ImagePart(ImageURL(f"data:{media};base64,{data}"))]
        if source.get("type") == "url":
            return [ImagePart(ImageURL(typed(source.get("url"), str, f"{at}.source.url", "a string")))]
    dropped[at] = f"{UNTRANSLATABLE} (a {kind!r} block)"
    return []


def _result(content: Any, at: str, dropped: dict[str, str]) -> Content:
    if isinstance(content, str):
        return content
    parts: list[TextPart | ImagePart] = []
    for k, block in enumerate(typed(content, list, f"{at}.content", "a string or an array of blocks")):
        parts += _part(typed(block, dict, f"{at}.content[{k}]", "an object"), f"{at}.content[{k}]", dropped)
    return _content(parts)


def _content(parts: list[TextPart | ImagePart]) -> Content:
    """One text block reads as a string (as Chat Completions agents send it), more as parts."""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return parts
