"""Chat messages, tools, and the Request / Response seen at the model boundary.

Messages are ``msgspec`` structs tagged on ``role`` so that an OpenAI-style JSON list decodes
into the right classes with one typed decoder. ``Request`` and ``Response`` are also the
annotations that route ``@stop`` / ``@intercept`` hooks (B5).
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Literal

import msgspec


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    """A text content part."""

    text: str


class ImageURL(msgspec.Struct):
    """An image reference (``data:`` or remote URL)."""

    url: str


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    """An image content part."""

    image_url: ImageURL


Content = str | list[TextPart | ImagePart]


class ToolCall(msgspec.Struct):
    """One function call requested by the model; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"


class SystemMessage(msgspec.Struct, tag_field="role", tag="system"):
    """A system prompt."""

    role: ClassVar[str] = "system"

    content: Content


class UserMessage(msgspec.Struct, tag_field="role", tag="user"):
    """A user turn (the task prompt, or a caller's turn in an interaction)."""

    role: ClassVar[str] = "user"

    content: Content


class AssistantMessage(msgspec.Struct, tag_field="role", tag="assistant"):
    """A model reply, possibly with tool calls."""

    role: ClassVar[str] = "assistant"

    content: Content | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(msgspec.Struct, tag_field="role", tag="tool"):
    """A tool result answering ``tool_call_id``."""

    role: ClassVar[str] = "tool"

    tool_call_id: str
    content: Content
    name: str | None = None


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class Tool(msgspec.Struct):
    """A tool advertised to the model (OpenAI function schema)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    strict: bool | None = None


class Usage(msgspec.Struct):
    """Token usage of one model call.

    ``prompt_tokens`` excludes cache reads; ``input_tokens`` adds them back.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens + (self.cached_input_tokens or 0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.completion_tokens


FinishReason = Literal["stop", "length", "tool_calls"]


class TopLogprob(msgspec.Struct):
    """One of the most likely tokens at a position (OpenAI's ``top_logprobs[]``)."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(msgspec.Struct):
    """A sampled token and its log-probability (OpenAI's ``logprobs.content[]``)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class Request(msgspec.Struct):
    """What a harness asks the model: the whole conversation so far, and the tools."""

    messages: list[Message]
    tools: list[Tool] | None = None


class Response(msgspec.Struct):
    """One sampled reply, and what the server said about its tokens.

    The token fields are filled by a model client that captures tokens (``OpenAIModel``'s
    ``token_capture``); a client that does not leaves them ``None``.
    """

    message: AssistantMessage
    finish_reason: FinishReason | None = "stop"
    usage: Usage | None = None
    model: str | None = None
    logprobs: list[TokenLogprob] | None = None
    """OpenAI's ``logprobs.content`` as the harness asked for it (``logprobs: true``); ``None``
    when it did not ask, even if the client captured log-probabilities for itself."""
    prompt_token_ids: list[int] | None = None
    """The prompt as the server tokenized it (its chat template applied)."""
    token_ids: list[int] | None = None
    """The completion's token ids, as sampled (a stop token the server kept included)."""
    token_logprobs: list[float] | None = None
    """The sampling log-probability of each of ``token_ids``."""
    policy_version: int | None = None
    """The policy version the server said produced this reply (``X-Policy-Version``, or
    SGLang's ``weight_version``), if it said one; for a reply continued after an interrupt,
    the version it was begun under."""
    token_versions: list[int | None] | None = None
    """The policy version of each of ``token_ids``, where the server said it (vLLM's
    ``weight_versions`` spans); ``None`` entries, or ``None``: it did not say."""


def message_hash(message: Message) -> bytes:
    """Identity of a message for prefix matching in the conversation graph.

    ``None`` and ``""`` content hash alike, and tool-call arguments ignore key order, so a
    harness that re-serialises the conversation still matches its earlier turns. Arguments
    that are no JSON object (a random model's ``false``, a call cut off mid-JSON) hash as
    ``{}``: the Anthropic Messages answer can only give such a call ``input: {}``, and the
    agent's echo of it must still be the sampled reply, not a fork of the conversation.
    """
    if isinstance(message, AssistantMessage):
        calls = [msgspec.structs.replace(c, arguments=_canonical_json(c.arguments)) for c in message.tool_calls or ()]
        message = msgspec.structs.replace(message, content=message.content or "", tool_calls=calls or None)
    raw = msgspec.json.encode(message)
    return hashlib.blake2b(raw, digest_size=16).digest()


def _canonical_json(text: str) -> str:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return "{}"
    return msgspec.json.encode(value, order="sorted").decode() if isinstance(value, dict) else "{}"


def text_of(content: Content | None) -> str:
    """The plain text of a message's content (image parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content if isinstance(p, TextPart))
