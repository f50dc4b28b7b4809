"""Plausible, deterministic log-probabilities for a sampled completion.

At each position the simulated model has a small distribution: the most likely token (the
greedy answer's token at the first position where the sampled answer departs from it, else
the sampled token) at logit 0; the sampled token, when it is not the most likely, at
``-(0.2 + 2u)``; ``TOP_MAX`` alternatives (printable one- or two-character tokens) at
decreasing logits, the first ``-(1 + 4u)``, each next ``0.25 + 2.5u`` lower; and one logit
``-(1.5 + 3u)`` standing for the rest of the vocabulary. Each ``u`` is a byte of
``blake2b(material, position, sampled id, top id) / 255``. Log-probabilities are the
log-softmax over all of these, so each is below 0, the most likely token ranks first, and a
token's log-probability does not depend on how many alternatives a request asks to see. Each
is a float32 number, as vLLM's and SGLang's are (their logprobs are float32 tensors).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

from .tokenizer import ASCII_BASE

__all__ = ["TOP_MAX", "Scored", "Scorer", "score"]

TOP_MAX = 20
"""Most alternatives a request may ask for (OpenAI's and vLLM's default limit)."""


@dataclass(frozen=True, slots=True)
class Scored:
    """One completion position: the sampled token's log-probability and the ranked tokens."""

    token: int
    logprob: float
    ranked: tuple[tuple[int, float], ...]
    """``(id, logprob)`` best first: the most likely token, the sampled one, the alternatives."""


def _alternative(c1: int, c2: int, taken: dict[int, float]) -> int:
    """A printable one- or two-character token not in ``taken`` (its id as ``encode`` gives it)."""
    first = 32 + c1 % 95
    while True:
        token = ASCII_BASE[1] + first * 128 + 32 + c2 % 95 if c2 & 1 else ASCII_BASE[0] + first
        if token not in taken:
            return token  # type: ignore[no-any-return]
        c2 = (c2 + 1) % 256


def _position(material: bytes, j: int, sampled: int, top: int) -> Scored:
    d = hashlib.blake2b(
        material + j.to_bytes(4, "big") + sampled.to_bytes(8, "big") + top.to_bytes(8, "big"),
        digest_size=64,
    ).digest()
    logits = {top: 0.0}
    if sampled != top:
        logits[sampled] = -(0.2 + 2.0 * d[0] / 255)
    z = -(1.0 + 4.0 * d[2] / 255)
    for m in range(TOP_MAX):
        c1, c2, g = d[3 + 3 * m : 6 + 3 * m]
        if m:
            z -= 0.25 + 2.5 * g / 255
        logits[_alternative(c1, c2, logits)] = z
    rest = -(1.5 + 3.0 * d[1] / 255)
    norm = math.log(sum(map(math.exp, logits.values())) + math.exp(rest))
    numbers = array("f", [v - norm for v in logits.values()]).tolist()  # float32, as the engines' are
    ranked = tuple(sorted(zip(logits, numbers), key=itemgetter(1), reverse=True))  # stable: ties keep order
    return Scored(sampled, numbers[1] if sampled != top else numbers[0], ranked)


class Scorer:
    """Scores a completion a token at a time, exactly as :func:`score` does at once: what a
    token's numbers are depends only on the tokens before it (causal, like a model's).

    ``greedy`` is what the model would say at temperature 0; ``prefix``: tokens already in
    the completion (e.g. sampled under another policy), scored by nobody here.
    """

    def __init__(self, greedy: Sequence[int], material: bytes, prefix: Sequence[int] = ()) -> None:
        self._greedy, self._material = greedy, material
        self.position, self._departed = 0, False
        for token in prefix:
            self._top(token)

    def _top(self, token: int) -> int:
        """The most likely token at this position, given that ``token`` is sampled here."""
        j = self.position
        self.position += 1
        if self._departed or j >= len(self._greedy) or self._greedy[j] == token:
            return token
        self._departed = True  # the first departure from the greedy answer
        return self._greedy[j]

    def next(self, token: int) -> Scored:
        """The numbers of ``token`` at the next position."""
        j = self.position
        return _position(self._material, j, token, self._top(token))


def score(sampled: list[int], greedy: list[int], material: bytes) -> list[Scored]:
    """One :class:`Scored` per sampled token. ``greedy`` is what the model would have said at
    temperature 0: at the first position where ``sampled`` departs from it, the greedy token
    is the most likely one; ``material`` seeds the rest (same material, same numbers)."""
    scorer = Scorer(greedy, material)
    return [scorer.next(token) for token in sampled]
