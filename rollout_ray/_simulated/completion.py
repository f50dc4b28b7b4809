"""One choice of a chat completion: its answer, its token ids, its log-probabilities.

Draws (blake2b throughout; ``conversation`` and ``digest`` come from the server, ``model_server.py``):

- temperature 0 (or none): choice 0's error draw is ``digest[8:16]``, choice ``i > 0``
  draws ``blake2b(digest, i)``; log-probabilities are seeded by ``conversation`` alone (the
  prompt's text), so the same prompt and the same answer get the same numbers.
- temperature T > 0: the source is the request's ``seed`` field when it has one, else the
  attempt's ``digest`` (so a retry samples afresh); choice ``i`` draws its error and seeds
  its log-probabilities from ``blake2b(conversation, source, i)``.

The policy version tunes the model: the log-probabilities and the preamble of choice ``i``
are seeded by ``blake2b(its material, version)``, so two versions score the same tokens
differently and write different preambles, while the answer (right or wrong) is the same.

An integer answer (the model's own arithmetic, or a tool's result it reports) is wrong with
probability ``1 - (1 - error_rate) * exp(-temperature_error * T)``: ``error_rate`` at T = 0
(0 by default), growing towards 1 with T. So a tool-calling rollout, too, fails more often
the hotter it samples (a pass@k curve), and is always right at T = 0 by default.

Without token capture a choice costs what the policy's estimate says (``answers.py``). With
it, its ids are ``encode(body) + [<|im_end|>]`` (the body as the chat template renders an
assistant message, ``template.py``): a text answer longer than the request's cap is cut to
``cap`` ids (finish ``"length"``, no ``<|im_end|>``), tool calls are never cut.

``SimulatedModelConfig.preamble_tokens`` words (four characters each, so one token each, and
the words that follow keep their ids) open the content of every answer: long completions.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from .answers import cap_completion, respond
from .config import SimulatedModelConfig
from .logprobs import Scored, score
from .request import ChatCall
from .template import body, text_of, tool_call_text
from .tokenizer import IM_END, TOOL_CALL, decode, encode, token_text

__all__ = ["PREAMBLE_WORDS", "Choice", "Draw", "choose", "preamble_length", "deltas", "error_probability"]

PREAMBLE_WORDS = (
    "hmm ",
    "so, ",
    "ok, ",
    "let ",
    "me  ",
    "see ",
    "now ",
    "yes ",
    "and ",
    "the ",
    "sum ",
    "is  ",
    "one ",
    "two ",
    "as  ",
    "if  ",
)
"""What a preamble is made of: each one token of the simulated tokenizer."""


@dataclass(frozen=True, slots=True)
class Draw:
    """A request's randomness: ``conversation`` (the server's seed and the prompt's text: what
    the model sees), ``digest`` (that attempt)."""

    conversation: bytes
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
    greedy: tuple[int, ...] = ()
    """What the model would have said at temperature 0 (how ``scored`` was scored)."""
    material: bytes = b""
    """What seeded ``scored`` (with ``greedy``, all a ``Scorer`` needs to go on)."""
    preamble: int = 0
    """How many of ``ids`` are the preamble."""


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
        return u, draw.conversation
    source = b"seed" + str(call.seed).encode() if call.seed is not None else b"attempt" + draw.digest
    material = hashlib.blake2b(draw.conversation + source + b"\0choice" + tag, digest_size=16).digest()
    return _unit(material + b"error"), material


def _tuned(material: bytes, version: int) -> bytes:
    """The material of the model at policy ``version``."""
    return hashlib.blake2b(material + b"\0policy" + version.to_bytes(8, "big", signed=True), digest_size=16).digest()


def _preamble(material: bytes, n: int) -> str:
    words = []
    for block in range(-(-n // 64)):
        d = hashlib.blake2b(material + b"preamble" + block.to_bytes(4, "big"), digest_size=64).digest()
        words += [PREAMBLE_WORDS[b % len(PREAMBLE_WORDS)] for b in d]
    return "".join(words[:n])


def preamble_length(config: SimulatedModelConfig, draw: Draw, index: int) -> int:
    """Words of choice ``index``'s preamble: ``preamble_tokens``, or with the capacity model's
    ``gen_median``, drawn lognormal per request (the long tail of completion lengths)."""
    capacity = config.capacity
    if capacity is None or capacity.gen_median is None:
        return config.preamble_tokens
    u = _unit(draw.digest + b"length" + index.to_bytes(4, "big"))
    z = NormalDist().inv_cdf(min(max(u, 1e-12), 1 - 1e-12))
    return max(1, round(capacity.gen_median * math.exp(capacity.gen_sigma * z)))


def _with_preamble(message: dict[str, Any], preamble: str) -> dict[str, Any]:
    return {**message, "content": preamble + text_of(message.get("content"))} if preamble else message


def _tokens(message: dict[str, Any], cap: int) -> tuple[list[int], dict[str, Any], str]:
    ids = [*encode(body(message)), IM_END]
    if message.get("tool_calls"):
        return ids, message, "tool_calls"
    if len(ids) <= cap:
        return ids, message, "stop"
    return ids[:cap], {**message, "content": decode(ids[:cap])}, "length"


def choose(
    call: ChatCall, config: SimulatedModelConfig, draw: Draw, index: int, version: int = 0, *, scored: bool = True
) -> Choice:
    """Choice ``index`` of ``call``, as the model at policy ``version`` answers it. Not ``scored``:
    without ``scored`` (its ``greedy`` and ``material`` let a ``Scorer`` score it as it goes:
    a long completion cut short is never scored whole)."""
    u, material = _draws(call, draw, index)
    material = _tuned(material, version)
    words = preamble_length(config, draw, index)
    preamble = _preamble(material, words)
    rate = error_probability(config, call.temperature)
    message = _with_preamble(respond(call.messages, call.tools, config, u, error_rate=rate), preamble)
    if not call.capture.on:
        message, finish, tokens = cap_completion(message, call.cap)
        return Choice(index, message, finish, tokens)
    ids, message, finish = _tokens(message, call.cap)
    greedy: list[int] = []
    numbers: list[Scored] = []
    if call.capture.logprobs:
        best = _with_preamble(respond(call.messages, call.tools, config, 1.0, error_rate=0.0), preamble)
        greedy = [*encode(body(best)), IM_END]
        numbers = score(ids, greedy, material) if scored else []
    return Choice(
        index, message, finish, len(ids), tuple(ids), tuple(numbers), tuple(greedy), material, min(len(ids), words)
    )


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
