"""Each request's randomness: its fault, its error draw, its id, its sampling material.

A request is keyed (``key``: a chat completion's ``messages`` re-encoded as compact JSON, key
order as sent, with the server's seed); the server counts how often it has seen each key, and
the n-th request with a key (n = 0, 1, ...) draws from ``blake2b(key, n)``. So the same config
and the same requests give the same answers and faults whatever order concurrent requests
arrive in, and a retry of a failed request gets fresh draws. Keys are kept for the server's
life (16 bytes plus a count each).

What the model samples from is its *conversation* (``completion.Draw``): the text of the prompt
as the chat template renders it (with the server's seed), whichever way the prompt came, as
messages or as token ids. So a completion continued from token ids is sampled from the same
material as the chat completion it continues.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .completion import Draw
from .config import SimulatedModelConfig
from .tokenizer import decode

__all__ = ["FAULTS", "SERVER_ERRORS", "Attempt", "Attempts"]

FAULTS = ("429", "5xx", "timeout", "malformed")
SERVER_ERRORS = (500, 502, 503)


@dataclass(frozen=True, slots=True)
class Attempt:
    fault: str | None
    status_5xx: int
    cid: str
    """The completion id, ``chatcmpl-`` and hex."""
    draw: Draw


class Attempts:
    """The draws of one server's requests."""

    def __init__(self, config: SimulatedModelConfig) -> None:
        self._config = config
        self._seed = f"{config.seed}\0".encode()
        self._seen: dict[bytes, int] = {}

    def conversation(self, prompt: list[int]) -> bytes:
        """What the model sees of prompt ids: their text, with the server's seed."""
        text = decode(prompt).encode("utf-8", "surrogatepass")
        return hashlib.blake2b(self._seed + b"\0prompt\0" + text, digest_size=16).digest()

    def next(self, key: bytes, conversation: bytes) -> Attempt:
        """The next attempt of the request keyed ``key`` (bytes the seed is added to)."""
        key = hashlib.blake2b(self._seed + key, digest_size=16).digest()
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        d = hashlib.blake2b(key + n.to_bytes(8, "big"), digest_size=28).digest()
        u_fault = int.from_bytes(d[:8], "big") / 2**64
        cfg, fault, edge = self._config, None, 0.0
        rates = (cfg.rate_429, cfg.rate_5xx, cfg.rate_timeout, cfg.rate_malformed)
        for name, rate in zip(FAULTS, rates):
            edge += rate
            if u_fault < edge:
                fault = name
                break
        return Attempt(fault, SERVER_ERRORS[(key[0] + n) % 3], "chatcmpl-" + d[16:].hex(), Draw(conversation, d))
