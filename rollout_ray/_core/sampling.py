"""The sampling parameters a model request may carry, in one place: what a model call records,
what a sweep's ``sampling`` axis accepts, and what tells eval's ``--sampling`` keys from typos.

The list is OpenAI Chat Completions' sampling and length fields plus the extra sampling fields
that both vLLM and SGLang accept in a Chat Completions body. A field missing here still goes
upstream; it is only not recognised as sampling (not recorded, and eval warns of it).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

OPENAI_SAMPLING_FIELDS = frozenset({
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "n",
    "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs",
    "reasoning_effort",
})  # fmt: skip
"""Chat Completions request fields that shape how the reply is sampled, or how long it is."""

SERVER_SAMPLING_FIELDS = frozenset({
    "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos",
    "skip_special_tokens",
})  # fmt: skip
"""vLLM's and SGLang's extra sampling fields (each server reads them from the request body)."""

SAMPLING_FIELDS = OPENAI_SAMPLING_FIELDS | SERVER_SAMPLING_FIELDS
"""Every known sampling field."""


def unknown_sampling(keys: Iterable[str]) -> list[tuple[str, str | None]]:
    """Each of ``keys`` that is not a known sampling field, with the known one it is likely a
    misspelling of (``None`` when it resembles none, e.g. a server's own extension)."""
    unknown = []
    for key in keys:
        if key not in SAMPLING_FIELDS:
            close = difflib.get_close_matches(key, sorted(SAMPLING_FIELDS), n=1, cutoff=0.75)
            unknown.append((key, close[0] if close else None))
    return unknown
