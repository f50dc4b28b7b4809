"""Text a record keeps, cut at a cap: a message of the conversation, a tool call's arguments.

A record that lives as long as its rollout (the trace a node's proxy holds for a session, the
rollout's own, the driver's until it is written) must not grow with what a program sends:
12 turns of an 8 MiB tool output would otherwise hold ~100 MiB per rollout. Text over the cap
keeps its first ``cap`` characters and a marker saying how many there were; the record says
the original length in a field of its own (``MessageNode.original_chars``,
``ToolCallRecord.arguments_chars``).

What is cut is text only: token ids (``MessageNode.token_ids``, ``ModelCall.prompt_ids``) are
recorded apart and whole, so the training sequences are exact; a trainer that re-tokenizes a
message's text instead loses what was cut (the marker shows where), and so does a reward that
reads a cut message. Images (``ImagePart``) are kept whole.
"""

from __future__ import annotations

import msgspec

from .messages import AssistantMessage, Content, Message, TextPart

MAX_MESSAGE_CHARS = 1 << 20
"""Characters a recorded message keeps of each of its texts (content, a text part, reasoning)
by default: a message over it (~250k tokens) is more than any turn a model samples on."""

MAX_TOOL_CALL_CHARS = 64 << 10
"""Characters a recorded tool call keeps of its arguments and of its error."""


def marker(total: int) -> str:
    """What ends a text cut from ``total`` characters. ASCII: a non-ASCII character would make
    Python store the whole kept text at 2 or 4 bytes a character."""
    return f"\n...[cut by rollout_ray: {total} characters in all]"


def capped(text: str, cap: int) -> str:
    """``text``, or its first ``cap`` characters and the ``marker`` if it is longer."""
    return text if len(text) <= cap else text[:cap] + marker(len(text))


def text_chars(message: Message) -> int:
    """The characters of ``message``'s texts (what ``cap_message`` cuts)."""
    chars = _content_chars(message.content)
    if isinstance(message, AssistantMessage):
        chars += len(message.reasoning_content or "")
    return chars


def cap_message(message: Message, cap: int) -> Message:
    """``message`` with each of its texts cut at ``cap`` characters (itself if none is over)."""
    if not _over(message, cap):
        return message
    changes: dict[str, object] = {"content": _capped_content(message.content, cap)}
    if isinstance(message, AssistantMessage) and message.reasoning_content is not None:
        changes["reasoning_content"] = capped(message.reasoning_content, cap)
    return msgspec.structs.replace(message, **changes)


def _over(message: Message, cap: int) -> bool:
    texts = _texts(message.content)
    if isinstance(message, AssistantMessage) and message.reasoning_content is not None:
        texts.append(message.reasoning_content)
    return any(len(t) > cap for t in texts)


def _texts(content: Content | None) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [p.text for p in content if isinstance(p, TextPart)]


def _content_chars(content: Content | None) -> int:
    return sum(len(t) for t in _texts(content))


def _capped_content(content: Content | None, cap: int) -> Content | None:
    if content is None or isinstance(content, str):
        return None if content is None else capped(content, cap)
    return [TextPart(capped(p.text, cap)) if isinstance(p, TextPart) else p for p in content]
