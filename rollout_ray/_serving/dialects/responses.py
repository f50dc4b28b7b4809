"""OpenAI Responses (``POST /v1/responses``): what Codex CLI and the Agents SDK speak.

The request's ``input`` items become our messages: ``message`` items by role (``developer``
and ``system`` are system messages), and the items of one assistant turn (``reasoning``, an
assistant ``message``, ``function_call``\\ s) one assistant message, so that a turn sent
back reads as the turn the session committed and its token ids carry on (token in).
``instructions`` is a system message first; ``previous_response_id`` continues from a turn
this rollout answered (its instructions not carried over, as OpenAI's). Function tools are
Chat Completions tools; hosted and custom tools, and the fields with no Chat Completions
counterpart (``store``, ``include``, ``text``...), are dropped and recorded. The answer is
built by ``responses_output``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..._errors import WireError
from ..._record.messages import (
    AssistantMessage,
    Content,
    ImagePart,
    ImageURL,
    Message,
    Response,
    SystemMessage,
    TextPart,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ..._record.messages import Request as ChatRequest
from . import responses_output
from .dialect import UNTRANSLATABLE, Dialect, History, Parsed, decode_object, typed
from .responses_output import qualified

_RENAMED = {
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "parallel_tool_calls": "parallel_tool_calls",
    "user": "user",
    "top_logprobs": "top_logprobs",
}
"""Responses fields that are Chat Completions fields under another (or the same) name."""

_READ = frozenset(
    {
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "tool_choice",
        "model",
        "stream",
        "reasoning",
        "text",
        "include",
    }
)
LOGPROBS = "message.output_text.logprobs"
"""The ``include`` entry that asks for the answer's log-probabilities (Chat Completions' ``logprobs``)."""
_PLAIN_TEXT = {"format": {"type": "text"}}
_CONVERSATION = frozenset({"input", "instructions", "tools"})


class Responses(Dialect):
    name = "responses"
    endpoint = "/responses"
    paths = ("/v1/responses",)
    id_prefix = "resp_"
    continued = True

    def parse(self, body: bytes, history: History) -> Parsed:
        raw = decode_object(body, _CONVERSATION)
        dropped: dict[str, str] = {}
        messages: list[Message] = []
        instructions = raw.get("instructions")
        if instructions is not None:
            messages.append(SystemMessage(typed(instructions, str, "instructions", "a string")))
        previous = raw.get("previous_response_id")
        if previous is not None:
            earlier = history(typed(previous, str, "previous_response_id", "a string"))
            if earlier is None:
                raise WireError(
                    f"invalid request: `previous_response_id` {previous!r} is not a response of this "
                    "rollout; send the whole conversation in `input`, or an id this rollout answered",
                    "previous_response_id",
                )
            messages += earlier
        items = raw.get("input")
        if isinstance(items, str):
            messages.append(UserMessage(items))
        elif items is not None or previous is None:
            messages += _messages(typed(items, list, "input", "a string or an array of items"), dropped)
        tools = _tools(raw.get("tools"), dropped)
        params = _params(raw, dropped)
        echo = {
            key: raw.get(key)
            for key in (
                "instructions",
                "previous_response_id",
                "temperature",
                "top_p",
                "max_output_tokens",
                "reasoning",
                "metadata",
            )
        }
        echo.update(
            tools=raw.get("tools") or [],
            tool_choice=raw.get("tool_choice", "auto"),
            parallel_tool_calls=raw.get("parallel_tool_calls", True),
        )
        stream = typed(raw.get("stream", False), bool, "stream", "a boolean")
        return Parsed(
            ChatRequest(messages, tools), params, stream, dropped, echo, uncarried=1 if instructions is not None else 0
        )

    def encode(self, response: Response, parsed: Parsed, answer_id: str) -> bytes:
        return responses_output.encode(response, parsed.echo, answer_id)

    def events(self, response: Response, parsed: Parsed, answer_id: str) -> Iterator[bytes]:
        return responses_output.events(response, parsed.echo, answer_id)


def _params(raw: dict[str, Any], dropped: dict[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _RENAMED:
            params[_RENAMED[key]] = value
        elif key not in _READ:
            dropped[key] = UNTRANSLATABLE
    if "max_tokens" in params:
        typed(params["max_tokens"], int, "max_output_tokens", "an integer")
    include = typed(raw.get("include") or [], list, "include", "an array of strings")
    if LOGPROBS in include or "top_logprobs" in params:
        params["logprobs"] = True
    if any(entry != LOGPROBS for entry in include):
        dropped["include"] = UNTRANSLATABLE
    if "tool_choice" in raw:
        choice = _tool_choice(raw["tool_choice"], dropped)
        if choice is not None:
            params["tool_choice"] = choice
    reasoning = raw.get("reasoning")
    if reasoning is not None:
        for key, value in typed(reasoning, dict, "reasoning", "an object").items():
            if key == "effort" and value is not None:
                params["reasoning_effort"] = typed(value, str, "reasoning.effort", "a string")
            elif value is not None:
                dropped[f"reasoning.{key}"] = UNTRANSLATABLE
    text = raw.get("text")
    if text is not None and typed(text, dict, "text", "an object") != _PLAIN_TEXT and text:
        dropped["text"] = UNTRANSLATABLE  # a JSON schema is constrained decoding; verbosity has no counterpart
    return params


def _tool_choice(choice: Any, dropped: dict[str, str]) -> Any:
    """Chat Completions' ``tool_choice`` for a Responses one (``None``: dropped here)."""
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        if choice["type"] == "function":
            name = typed(choice.get("name"), str, "tool_choice.name", "a string")
            return {"type": "function", "function": {"name": name}}
        dropped["tool_choice"] = UNTRANSLATABLE  # allowed_tools, a hosted tool, a custom tool
        return None
    raise WireError(
        'invalid request: `tool_choice` must be "none", "auto", "required" or '
        f'{{"type": "function", "name": ...}}, got {choice!r}',
        "tool_choice",
    )


def _tools(tools: Any, dropped: dict[str, str]) -> list[Tool] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(typed(tools, list, "tools", "an array")):
        where = f"tools[{i}]"
        typed(tool, dict, where, "an object")
        if tool.get("type") == "namespace":  # Codex's MCP tools: each function one tool upstream
            space = typed(tool.get("name"), str, f"{where}.name", "a string")
            inner = typed(tool.get("tools") or [], list, f"{where}.tools", "an array")
            for j, fn in enumerate(inner):
                typed(fn, dict, f"{where}.tools[{j}]", "an object")
                if fn.get("type") == "function":
                    name = typed(fn.get("name"), str, f"{where}.tools[{j}].name", "a string")
                    out.append(_function_tool({**fn, "name": qualified(space, name)}, f"{where}.tools[{j}]"))
                else:
                    dropped[f"{where}.tools[{j}]"] = f"{UNTRANSLATABLE} (only function tools are)"
            continue
        if tool.get("type") != "function":
            dropped[where] = f"{UNTRANSLATABLE} (a {tool.get('type')!r} tool: only function tools are)"
            continue
        out.append(_function_tool(tool, where))
    return out or None


def _function_tool(tool: dict[str, Any], where: str) -> Tool:
    return Tool(
        typed(tool.get("name"), str, f"{where}.name", "a string"),
        typed(tool.get("description") or "", str, f"{where}.description", "a string"),
        typed(tool.get("parameters") or {}, dict, f"{where}.parameters", "an object"),
        typed(tool.get("strict"), (bool, type(None)), f"{where}.strict", "a boolean"),
    )


class _Turn:
    """The assistant message being gathered from consecutive items of one turn."""

    def __init__(self) -> None:
        self.text: list[str] | None = None
        self.reasoning: str | None = None
        self.calls: list[ToolCall] = []

    def empty(self) -> bool:
        return self.text is None and self.reasoning is None and not self.calls

    def message(self) -> AssistantMessage:
        return AssistantMessage(
            "".join(self.text) if self.text is not None else None, self.reasoning, self.calls or None
        )


def _messages(items: list[Any], dropped: dict[str, str]) -> list[Message]:
    messages: list[Message] = []
    turn = _Turn()

    def close() -> _Turn:
        if not turn.empty():
            messages.append(turn.message())
            return _Turn()
        return turn

    for i, item in enumerate(items):
        where = f"input[{i}]"
        typed(item, dict, where, "an object")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            if turn.text is not None or turn.calls:
                turn = close()
            turn.text = [_text(part, f"{where}.content[{j}]") for j, part in enumerate(_parts(item, where))]
        elif kind == "function_call":
            name = typed(item.get("name"), str, f"{where}.name", "a string")
            space = typed(item.get("namespace"), (str, type(None)), f"{where}.namespace", "a string")
            turn.calls.append(
                ToolCall(
                    typed(item.get("call_id"), str, f"{where}.call_id", "a string"),
                    name if space is None else qualified(space, name),
                    typed(item.get("arguments", "{}"), str, f"{where}.arguments", "a string"),
                )
            )
        elif kind == "reasoning":
            turn = close()
            turn.reasoning = _reasoning(item, where)
        else:
            turn = close()
            message = _other(item, kind, where, dropped)
            if message is not None:
                messages.append(message)
    close()
    return messages


def _other(item: dict[str, Any], kind: Any, where: str, dropped: dict[str, str]) -> Message | None:
    if kind == "function_call_output":
        call_id = typed(item.get("call_id"), str, f"{where}.call_id", "a string")
        output = item.get("output")
        if isinstance(output, list):  # text and image parts, as a message's content
            return ToolMessage(call_id, _content(output, f"{where}.output", dropped))
        return ToolMessage(call_id, typed(output, str, f"{where}.output", "a string or an array of parts"))
    if kind != "message":
        dropped[where] = f"{UNTRANSLATABLE} (a {kind!r} item)"
        return None
    role = item.get("role")
    content = _content(_parts(item, where), f"{where}.content", dropped)
    if role in ("system", "developer"):
        return SystemMessage(content)
    if role == "user":
        return UserMessage(content)
    raise WireError(
        f"invalid request: `{where}.role` must be user, system, developer or assistant, got {role!r}", f"{where}.role"
    )


def _parts(item: dict[str, Any], where: str) -> list[Any]:
    content = item.get("content")
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    return typed(content, list, f"{where}.content", "a string or an array of parts")  # type: ignore[no-any-return]


def _content(parts: list[Any], where: str, dropped: dict[str, str]) -> Content:
    """One text part reads as a string (as Chat Completions agents send it), more as parts."""
    out: list[TextPart | ImagePart] = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        typed(part, dict, at, "an object")
        if part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
            out.append(ImagePart(ImageURL(part["image_url"])))
        elif part.get("type") in ("input_text", "output_text", "text"):
            out.append(TextPart(_text(part, at)))
        else:
            dropped[at] = f"{UNTRANSLATABLE} (a {part.get('type')!r} part)"
    if len(out) == 1 and isinstance(out[0], TextPart):
        return out[0].text
    return out


def _text(part: Any, where: str) -> str:
    typed(part, dict, where, "an object")
    return typed(part.get("text", part.get("refusal")), str, f"{where}.text", "a string")  # type: ignore[no-any-return]


def _reasoning(item: dict[str, Any], where: str) -> str | None:
    """The reasoning text kept on the assistant message: its ``content`` (what this proxy
    answers), else its summary; ``None`` when it has neither (an encrypted item)."""
    for key in ("content", "summary"):
        parts = item.get(key) or []
        texts = [
            _text(part, f"{where}.{key}[{j}]")
            for j, part in enumerate(typed(parts, list, f"{where}.{key}", "an array"))
        ]
        if texts:
            return "".join(texts)
    return None
