"""One choice of a chat completion: its answer, its token ids, its log-probabilities.

Draws (blake2b throughout; ``key`` and ``digest`` come from the server, ``server.py``):

- temperature 0 (or none): choice 0's error draw is ``digest[8:16]``, choice ``i > 0``
  draws ``blake2b(digest, i)``; log-probabilities are seeded by ``key`` alone, so the same
  prompt and the same answer get the same numbers.
- temperature T > 0: the source is the request's ``seed`` field when it has one, else the
  attempt's ``digest`` (so a retry samples afresh); choice ``i`` draws its error and seeds
  its log-probabilities from ``blake2b(key, source, i)``.

An integer answer (the model's own arithmetic, or a tool's result it reports) is wrong with
probability ``1 - (1 - error_rate) * exp(-temperature_error * T)``: ``error_rate`` at T = 0
(0 by default), growing towards 1 with T. So a tool-calling rollout, too, fails more often
the hotter it samples (a pass@k curve), and is always right at T = 0 by default.

Without token capture a choice costs what the policy's estimate says (``answers.py``). With
it, its ids are ``encode(body) + [<|im_end|>]`` (the body as the chat template renders an
assistant message, ``template.py``): a text answer longer than the request's cap is cut to
``cap`` ids (finish ``"length"``, no ``<|im_end|>``), tool calls are never cut.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from .answers import cap_completion, respond
from .config import SimulatedModelConfig
from .logprobs import Scored, score
from .request import ChatCall
from .template import body, text_of, tool_call_text
from .tokenizer import IM_END, TOOL_CALL, decode, encode, token_text

__all__ = ["Choice", "Draw", "choose", "deltas", "error_probability"]


@dataclass(frozen=True, slots=True)
class Draw:
    """A request's randomness: ``key`` (its seed and messages), ``digest`` (that attempt)."""

    key: bytes
    digest: bytes

    @property
    def u_error(self) -> float:
        return int.from_bytes(self.digest[8:16], "big") / 2**64


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    message: dict[str, Any]
    finish: str
    tokens: int
    """Completion tokens: ``len(ids)`` with token capture, the estimate without."""
    ids: tuple[int, ...] = ()
    scored: tuple[Scored, ...] = ()


def _unit(data: bytes) -> float:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") / 2**64


def error_probability(config: SimulatedModelConfig, temperature: float) -> float:
    """The chance of a wrong integer answer at ``temperature``."""
    return 1 - (1 - config.error_rate) * math.exp(-config.temperature_error * temperature)


def _draws(call: ChatCall, draw: Draw, index: int) -> tuple[float, bytes]:
    """``(error draw, log-probability material)`` of choice ``index``."""
    tag = index.to_bytes(4, "big")
    if not call.temperature:
        u = draw.u_error if index == 0 else _unit(draw.digest + b"choice" + tag)
        return u, draw.key
    source = b"seed" + str(call.seed).encode() if call.seed is not None else b"attempt" + draw.digest
    material = hashlib.blake2b(draw.key + source + b"\0choice" + tag, digest_size=16).digest()
    return _unit(material + b"error"), material


def _tokens(message: dict[str, Any], cap: int) -> tuple[list[int], dict[str, Any], str]:
    ids = [*encode(body(message)), IM_END]
    if message.get("tool_calls"):
        return ids, message, "tool_calls"
    if len(ids) <= cap:
        return ids, message, "stop"
    return ids[:cap], {**message, "content": decode(ids[:cap])}, "length"


def choose(call: ChatCall, config: SimulatedModelConfig, draw: Draw, index: int) -> Choice:
    """Choice ``index`` of ``call``."""
    u, material = _draws(call, draw, index)
    rate = error_probability(config, call.temperature)
    message = respond(call.messages, call.tools, config, u, error_rate=rate)
    if not call.capture.on:
        message, finish, tokens = cap_completion(message, call.cap)
        return Choice(index, message, finish, tokens)
    ids, message, finish = _tokens(message, call.cap)
    scored: list[Scored] = []
    if call.capture.logprobs:
        greedy = respond(call.messages, call.tools, config, 1.0, error_rate=0.0)
        scored = score(ids, [*encode(body(greedy)), IM_END], material)
    return Choice(index, message, finish, len(ids), tuple(ids), tuple(scored))


def _call_spans(message: dict[str, Any]) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Where each tool call opens (offset of its ``<tool_call>`` in the body) and the span of
    its arguments there."""
    opens, spans = {}, []
    offset = len(text_of(message.get("content")))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        text = tool_call_text(fn["name"], fn["arguments"])
        start = offset + text.index('"arguments": ') + len('"arguments": ')
        opens[offset + 1] = i
        spans.append((start, offset + len(text) - len("}</tool_call>")))
        offset += len(text)
    return opens, spans


def deltas(choice: Choice) -> list[dict[str, Any]]:
    """What each completion token adds to the message, as a streamed ``delta``: content, a
    tool call's opening (id, type, name) at its ``<tool_call>``, pieces of its arguments, or
    nothing (``{}``). ``<|im_end|>`` adds ``""`` to a text answer."""
    message = choice.message
    calls = message.get("tool_calls")
    if not calls:
        return [{"content": "" if t == IM_END else token_text(t)} for t in choice.ids]
    text, content = body(message), len(text_of(message.get("content")))
    opens, spans = _call_spans(message)
    out: list[dict[str, Any]] = []
    start = 0
    for token in choice.ids:
        end = start + (0 if token == IM_END else len(token_text(token)))
        parts: list[dict[str, Any]] = []
        if start < content:
            out.append({"content": text[start : min(end, content)]})
            start = end
            continue
        if token == TOOL_CALL and start in opens:
            fn = calls[opens[start]]["function"]
            opening = {"index": opens[start], "id": calls[opens[start]]["id"], "type": "function"}
            parts.append({**opening, "function": {"name": fn["name"]}})
        for i, (a, b) in enumerate(spans):
            if max(start, a) < min(end, b):
                parts.append({"index": i, "function": {"arguments": text[max(start, a) : min(end, b)]}})
        out.append({"tool_calls": parts} if parts else {})
        start = end
    return out
