"""The OpenAI Chat Completions wire format, streamed: a Response as SSE events (the proxy's
side), and SSE events folded back into one Response (the model client's and the agents').
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, Generic

import msgspec

from .._errors import WireError
from .messages import (
    AssistantMessage,
    Response,
    TokenLogprob,
    ToolCall,
    Usage,
)
from .openai_codec import _ENCODER, L, WireLogprobs, WireUsage, _finish, _Logprob, _usage, _wire_usage, captured


def sse_events(response: Response, *, include_usage: bool, completion_id: str | None = None) -> Iterator[bytes]:
    """The SSE events of a streamed ``response``, ending with ``data: [DONE]``."""
    cid = completion_id or f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
        if logprobs is not None:
            choices[0]["logprobs"] = {"content": logprobs}
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": response.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + _ENCODER.encode(body) + b"\n\n"

    message = response.message
    # The log-probabilities ride on the text chunk, or on the finish chunk of a reply without text.
    logprobs = response.logprobs
    yield chunk({"role": "assistant", "content": ""})
    if isinstance(message.content, str) and message.content:
        yield chunk({"content": message.content}, logprobs=logprobs)
        logprobs = None
    for i, call in enumerate(message.tool_calls or ()):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ]
            }
        )
    yield chunk({}, response.finish_reason, logprobs=logprobs)
    if include_usage and response.usage is not None:
        yield chunk(None, usage=_wire_usage(response.usage))  # type: ignore[arg-type]
    yield b"data: [DONE]\n\n"


class StreamAssembler:
    """Folds ``chat.completion.chunk`` events into one Response.

    Args:
        capture: also collect the prompt and completion token ids and log-probabilities
            (vLLM's chunk shapes).
        logprobs: keep ``logprobs.content`` for the harness.
    """

    def __init__(self, *, capture: bool = False, logprobs: bool = False) -> None:
        self.capture, self.keep_logprobs = capture, logprobs
        self.tokens = capture or logprobs
        self._chunks = _CHUNK if logprobs else _CHUNK_SLIM
        self.prompt_ids: list[int] | None = None
        self.token_ids: list[int] = []
        self.logprobs: list[Any] = []
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
        if self.tokens:
            self._feed_typed(data)
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
            self._merge_calls(delta.get("tool_calls"))
            self.finish = choice.get("finish_reason") or self.finish

    def _merge_calls(self, calls: list[dict[str, Any]] | None) -> None:
        for call in calls or ():
            slot = self.calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
            function = call.get("function") or {}
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] += function.get("name") or ""
            slot["arguments"] += function.get("arguments") or ""

    def _feed_typed(self, data: bytes) -> None:
        """``feed`` with token details: one chunk per token, so decoded into structs (faster
        than dicts, and a logprob entry's unread fields are skipped)."""
        try:
            chunk = self._chunks.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise WireError(f"malformed stream chunk from the model: {e}") from None
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
        if chunk.prompt_token_ids:
            self.prompt_ids = chunk.prompt_token_ids
        for choice in chunk.choices or ():
            if choice.index:
                raise WireError("malformed stream from the model: more than one choice, expected 1")
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.content.append(delta.content)
                if delta.reasoning_content:
                    self.reasoning.append(delta.reasoning_content)
                if delta.tool_calls:
                    self._merge_calls(delta.tool_calls)
            if choice.token_ids:
                self.token_ids += choice.token_ids
            if choice.logprobs is not None and choice.logprobs.content:
                self.logprobs += choice.logprobs.content
            self.finish = choice.finish_reason or self.finish

    def response(self) -> Response:
        if not self.done:
            raise WireError("malformed stream from the model: no terminal [DONE] event")
        calls = [ToolCall(c["id"], c["name"], c["arguments"] or "{}") for _, c in sorted(self.calls.items())]
        message = AssistantMessage("".join(self.content) or None, "".join(self.reasoning) or None, calls or None)
        response = Response(message, _finish(self.finish), self.usage, self.model)
        if self.tokens:
            content = self.logprobs or None
            if self.keep_logprobs:
                response.logprobs = content
            if self.capture:
                captured(response, self.prompt_ids, self.token_ids or None, content)
        return response


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _ChunkChoice(msgspec.Struct, Generic[L]):
    delta: _Delta | None = None
    finish_reason: str | None = None
    index: int = 0
    token_ids: list[int] | None = None
    logprobs: WireLogprobs[L] | None = None


class _Chunk(msgspec.Struct, Generic[L]):
    choices: list[_ChunkChoice[L]] | None = None
    model: str | None = None
    usage: WireUsage | None = None
    prompt_token_ids: list[int] | None = None
    """vLLM: in the first chunk."""


_CHUNK = msgspec.json.Decoder(_Chunk[TokenLogprob])
_CHUNK_SLIM = msgspec.json.Decoder(_Chunk[_Logprob])
