"""The simulated model's chat template: messages and tools to prompt token ids.

The text is ChatML with Hermes tool calls, as the vLLM CPU recipe's tiny model renders it
(``CHAT_TEMPLATE`` in ``scripts/vllm_cpu/make_tiny_model.py``)::

    <|im_start|>system\\n{system}\\n\\n# Tools\\n...<tools>\\n{tool JSON}...\\n</tools>\\n...<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}\\n<tool_call>{"name": "f", "arguments": {args}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n                      (the generation prompt)

(the system turn exists when the first message is a system message or tools are offered).
A message is a header (``role + "\\n"``) and a body (:func:`body`). The ids are
``[<|im_start|>] + encode(header) + encode(body) + [<|im_end|>] + encode("\\n")`` per message:
header and body are encoded apart, so an assistant turn re-renders to exactly the ids it was
sampled as (``encode(body) + [<|im_end|>]``), and the prompt of turn k+1 begins with the
prompt of turn k plus its completion: the prefix property.

Template drift (``drift=True``): the header and the body of each message are encoded as one
text, as real templates do before tokenizing. The sampled completion still starts a fresh
chunk after the generation prompt, so re-rendering a previous assistant turn merges the
header's last chunk (``"t\\n"``) with the first characters of the body: the prefix property
breaks at the last token of the previous prompt, where the assistant turn begins. (No merge
happens when the body is empty or starts with a non-ASCII character or a special token.)

:func:`parse` reads a rendering back (drifted or not: it works on the text): the messages and
tools, and the completion so far (the ids after the last generation prompt), so the server can
continue a completion it is given as token ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .tokenizer import IM_END, IM_START, SPECIAL_TOKENS, decode, encode

__all__ = ["GENERATION_HEADER", "Parsed", "assistant", "body", "parse", "render", "text_of", "tool_call_text"]

GENERATION_HEADER = "assistant\n"
TOOLS_PREAMBLE = "# Tools\nYou may call one or more functions. Function signatures:\n<tools>"
TOOLS_EPILOGUE = '\n</tools>\nReturn each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


def text_of(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, a list of parts, or ``None``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


def tool_call_text(name: Any, arguments: Any) -> str:
    """One Hermes tool call, ``\\n<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
    string arguments are written as they are, others as JSON."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'\n<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def body(message: dict[str, Any]) -> str:
    """The text of a message after its header; for an assistant, its content then its calls."""
    text = text_of(message.get("content"))
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            text += tool_call_text(fn.get("name", ""), fn.get("arguments", ""))
    return text


def _system(messages: list[dict[str, Any]], tools: list[Any] | None) -> tuple[str | None, int]:
    """The system turn's body (``None``: no system turn) and how many messages it used."""
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    system = body(messages[0]) if first_is_system else None
    if tools:
        listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        prefix = system + "\n\n" if system is not None else ""
        system = prefix + TOOLS_PREAMBLE + listed + TOOLS_EPILOGUE
    return system, int(first_is_system)


def _turn(header: str, text: str, drift: bool) -> list[int]:
    inner = encode(header + text) if drift else encode(header) + encode(text)
    return [IM_START, *inner, IM_END, *encode("\n")]


def render(messages: list[dict[str, Any]], tools: list[Any] | None = None, *, drift: bool = False) -> list[int]:
    """The prompt ids of ``messages`` and ``tools``, ending with the generation prompt."""
    system, skip = _system(messages, tools)
    ids = [] if system is None else _turn("system\n", system, drift)
    for message in messages[skip:]:
        role = message.get("role")
        ids += _turn(f"{role if isinstance(role, str) else ''}\n", body(message), drift)
    return [*ids, IM_START, *encode(GENERATION_HEADER)]


@dataclass(frozen=True, slots=True)
class Parsed:
    """A prompt read back: its conversation and the completion begun after it."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    completion: list[int]
    """The ids after the last generation prompt (``[]`` when the prompt ends with it or has none)."""


_TURN = re.compile(
    re.escape(SPECIAL_TOKENS[IM_START]) + r"([^\n]*)\n(.*?)" + re.escape(SPECIAL_TOKENS[IM_END]) + r"\n", re.DOTALL
)
_CALL = re.compile(r'\n<tool_call>\{"name": "(.*?)", "arguments": (.*?)\}</tool_call>', re.DOTALL)


def _split(ids: list[int]) -> tuple[list[int], list[int]]:
    """``(conversation, completion)``: the ids before and after the last generation prompt
    (no generation prompt: all conversation)."""
    header = [IM_START, *encode(GENERATION_HEADER)]
    for i in range(len(ids) - len(header), -1, -1):
        if ids[i : i + len(header)] == header:
            return ids[:i], ids[i + len(header) :]
    return ids, []


def _tools(system: str) -> tuple[str | None, list[Any] | None]:
    """The system content and the tools listed in a system turn's body."""
    at = system.find(TOOLS_PREAMBLE)
    end = system.rfind(TOOLS_EPILOGUE)
    if at < 0 or end < at:
        return system, None
    tools = []
    for line in system[at + len(TOOLS_PREAMBLE) : end].split("\n")[1:]:
        try:
            tools.append(json.loads(line))
        except ValueError:
            continue  # not a rendering of ours: the prompt was written by hand
    return (system[: at - 2] if at else None), tools


def assistant(text: str, calls_before: int) -> dict[str, Any]:
    """An assistant message from its text: the content, then its Hermes tool calls, whose ids
    count on from ``calls_before`` (the calls of the conversation before it)."""
    cut = text.find("\n<tool_call>")
    if cut < 0:
        return {"role": "assistant", "content": text}
    calls = [
        {"id": f"call_{calls_before + i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(_CALL.findall(text[cut:]))
    ]
    return {"role": "assistant", "content": text[:cut] or None, "tool_calls": calls}


def parse(ids: list[int]) -> Parsed:
    """The conversation, tools and completion of prompt ids (the inverse of :func:`render`)."""
    conversation, completion = _split(ids)
    turns = _TURN.findall(decode(conversation))
    messages: list[dict[str, Any]] = []
    tools = None
    for i, (role, text) in enumerate(turns):
        if role == "system" and i == 0:
            content, tools = _tools(text)
            if content is not None:
                messages.append({"role": "system", "content": content})
        elif role == "assistant":
            messages.append(assistant(text, sum(len(m.get("tool_calls", ())) for m in messages)))
        else:
            messages.append({"role": role, "content": text})
    return Parsed(messages, tools, completion)
