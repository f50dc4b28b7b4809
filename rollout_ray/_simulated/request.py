"""A chat completion request as the simulated model reads it: checked, with its dialect.

Every field this module reads is checked; a bad one raises :class:`Invalid` naming it (an
HTTP 400). Other fields are ignored. The token-capture extensions and the dialect they pick
are described in ``dialects.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .config import SimulatedModelConfig
from .logprobs import TOP_MAX

__all__ = ["MAX_N", "Capture", "ChatCall", "Invalid", "parse", "request_id"]

MAX_N = 64
"""Most choices one request may ask for."""
Dialect = Literal["vllm", "sglang"]
_SGLANG_ONLY = ("return_prompt_token_ids", "return_meta_info")
_VLLM_ONLY = ("return_tokens_as_token_ids",)
_FLAGS = ("return_token_ids", *_SGLANG_ONLY, *_VLLM_ONLY, "logprobs")
_decode = msgspec.json.Decoder().decode


class Invalid(Exception):
    """A request the server refuses with 400; ``sglang``: in SGLang's flat error shape."""

    def __init__(self, message: str, param: str | None, sglang: bool = False) -> None:
        super().__init__(message)
        self.param = param
        self.sglang = sglang


@dataclass(frozen=True, slots=True)
class Capture:
    """What the request asks to see of the tokens, and in which dialect's shapes."""

    dialect: Dialect
    token_ids: bool = False
    """``return_token_ids``: completion ids, and the prompt ids (both dialects)."""
    prompt_ids: bool = False
    """SGLang's ``return_prompt_token_ids``."""
    meta_info: bool = False
    """SGLang's ``return_meta_info``."""
    logprobs: bool = False
    top_logprobs: int = 0
    as_token_ids: bool = False
    """vLLM's ``--return-tokens-as-token-ids`` (the server's setting or the request's field)."""

    @property
    def on(self) -> bool:
        """Whether any token detail is asked for; then usage counts the tokenizer's ids."""
        return self.token_ids or self.prompt_ids or self.meta_info or self.logprobs


@dataclass(frozen=True, slots=True)
class ChatCall:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    cap: int
    stream: bool
    include_usage: bool
    n: int
    temperature: float
    """0 when the request has none: the answers of temperature 0."""
    seed: int | None
    capture: Capture
    request_id: str | None = None
    """The client's id for it (vLLM's ``request_id``, SGLang's ``rid``): what an abort names."""


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise Invalid(f"'{name}' must be a boolean.", name)
    return bool(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is not None and (type(value) is not int or value < low or (high is not None and value > high)):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise Invalid(f"'{name}' must be an integer {bounds}.", name)
    return value


def _dialect(body: dict[str, Any], config: SimulatedModelConfig) -> Dialect:
    """SGLang-only fields pick SGLang, vLLM-only fields pick vLLM; neither or both: the config."""
    sglang = any(body.get(k) is not None for k in _SGLANG_ONLY)
    vllm = any(body.get(k) is not None for k in _VLLM_ONLY)
    if sglang != vllm:
        return "sglang" if sglang else "vllm"
    return config.dialect


def _capture(body: dict[str, Any], stream: bool, config: SimulatedModelConfig) -> Capture:
    flags = {name: _flag(body, name) for name in _FLAGS}
    top = _integer(body, "top_logprobs", 0, TOP_MAX) or 0
    dialect = _dialect(body, config)
    if dialect == "vllm" and top and not flags["logprobs"]:
        raise Invalid("when using 'top_logprobs', 'logprobs' must be set to true.", "top_logprobs")
    if dialect == "sglang" and stream:
        for name in ("return_prompt_token_ids", "return_token_ids", "return_meta_info"):
            if flags[name]:
                raise Invalid(
                    f"{name} is not supported with streaming. Please set stream=false when using {name}=true.",
                    name,
                    sglang=True,
                )
    return Capture(
        dialect,
        token_ids=flags["return_token_ids"],
        prompt_ids=dialect == "sglang" and flags["return_prompt_token_ids"],
        meta_info=dialect == "sglang" and flags["return_meta_info"],
        logprobs=flags["logprobs"],
        top_logprobs=top if flags["logprobs"] else 0,
        as_token_ids=config.return_tokens_as_token_ids or flags["return_tokens_as_token_ids"],
    )


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; raises :class:`Invalid` (400) when it is not one.
    Every route of the simulated model reads its body through here, so all say the same."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError:
        raise Invalid("We could not parse the JSON body of your request.", None) from None
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.", None)
    return body


def _temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return 0.0
    if type(value) not in (int, float) or not 0 <= value < float("inf"):
        raise Invalid("'temperature' must be a number of at least 0.", "temperature")
    return float(value)


def parse(raw: bytes, config: SimulatedModelConfig) -> ChatCall:
    """The request's fields; raises :class:`Invalid` naming the offending one."""
    body = json_object(raw)
    messages = body.get("messages")
    if messages is None:
        raise Invalid("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise Invalid("'messages' must be an array of message objects.", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise Invalid("'tools' must be an array.", "tools")
    cap = config.max_completion_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        value = _integer(body, name, 1)
        cap = cap if value is None else min(cap, value)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    n = _integer(body, "n", 1, MAX_N) or 1
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise Invalid("'seed' must be an integer.", "seed")
    temperature = _temperature(body)
    capture = _capture(body, stream, config)
    return ChatCall(messages, tools, cap, stream, usage, n, temperature, seed, capture, request_id(body))


def request_id(body: dict[str, Any]) -> str | None:
    """The request's own id: vLLM's ``request_id`` or SGLang's ``rid``."""
    for name in ("request_id", "rid"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise Invalid(f"'{name}' must be a string.", name)
        if value:
            return value
    return None
