"""OpenAI Chat Completions (``POST /v1/chat/completions``): the upstream's own format, so
the request goes through as sent (``_record/openai_codec``) and only ``tool_choice`` is checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from ..._errors import WireError
from ..._record.messages import Response
from ..._record.openai_codec import encode_response, parse_request
from ..._record.openai_stream import sse_events
from .dialect import Dialect, History, Parsed

TOOL_CHOICE_STRINGS = ("none", "auto", "required")


class ChatCompletions(Dialect):
    name = "chat"
    endpoint = "/chat/completions"
    paths = ("/v1/chat/completions",)
    id_prefix = "chatcmpl-"

    def parse(self, body: bytes, history: History) -> Parsed:
        try:
            request, params, stream = parse_request(body)
        except RecursionError:  # msgspec's answer to JSON nested past the recursion limit
            raise WireError("invalid request: JSON nested too deeply") from None
        if "tool_choice" in params:
            check_tool_choice(params["tool_choice"])
        options = _OPTIONS.decode(body).stream_options if stream else None
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return Parsed(request, params, stream, echo={"include_usage": include_usage})

    def encode(self, response: Response, parsed: Parsed, answer_id: str) -> bytes:
        return encode_response(response, completion_id=answer_id)

    def events(self, response: Response, parsed: Parsed, answer_id: str) -> Iterator[bytes]:
        return sse_events(response, include_usage=parsed.echo["include_usage"], completion_id=answer_id)


class _StreamOptions(msgspec.Struct):
    stream_options: Any = None


_OPTIONS = msgspec.json.Decoder(_StreamOptions)


def check_tool_choice(choice: Any) -> None:
    """A 400 naming ``tool_choice`` unless it is one of OpenAI's shapes: a string of
    ``TOOL_CHOICE_STRINGS`` or an object typed ``function`` (naming one), ``allowed_tools``
    or ``custom``. A valid forced choice is dropped later, not refused (``upstream_fields``)."""
    if isinstance(choice, str) and choice in TOOL_CHOICE_STRINGS:
        return
    if isinstance(choice, dict):
        kind = choice.get("type")
        function = choice.get("function")
        if kind == "function" and isinstance(function, dict) and isinstance(function.get("name"), str):
            return
        if kind in ("allowed_tools", "custom"):
            return
    raise WireError(
        'invalid request: `tool_choice` must be "none", "auto", "required" or '
        f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}',
        "tool_choice",
    )
