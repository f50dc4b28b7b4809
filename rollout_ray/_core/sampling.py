"""The request fields of a model call, in one place: what a model call records, what a sweep's
``sampling`` axis accepts, what tells eval's ``--sampling`` keys from typos, and which of a
harness's fields go upstream (``upstream_fields``).

``SAMPLING_FIELDS`` is OpenAI Chat Completions' sampling and length fields plus the extra
sampling fields that both vLLM and SGLang accept in a Chat Completions body.

``FORWARDED_FIELDS`` is what a harness (the agent, the program in the sandbox) may send the
model server beside its messages and tools. The operator's settings (``sampling`` in the
rollout's config) always go, and override every alias of the same setting; a harness's field
goes only if it is listed here or the operator's model adds it (``Model.forward_fields``). The
list is the Chat Completions parameters that shape the length, the stop and the format of the
reply, or bookkeeping, without changing the token distribution beyond the temperature and
nucleus the operator may fix: a logit bias, a grammar, a penalty, a minimum length, a server's
own extensions (``logits_processors``, ``guided_*``, ``ignore_eos``, ``chat_template``,
``lora_path``, ``priority``, ``request_id``, ``kv_transfer_params``...) would make the recorded
samples someone else's policy or cost the shared fleet, and are dropped, each recorded on the
call (``ModelCall.dropped``) with why.
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

FORWARDED_FIELDS = frozenset({
    "temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop", "n",
    "logprobs", "top_logprobs", "reasoning_effort", "tool_choice", "parallel_tool_calls", "user",
})  # fmt: skip
"""The fields of a harness's request that go upstream by default (see the module docstring)."""

FORWARDED_TOOL_CHOICES = frozenset({"auto", "none"})
"""``tool_choice`` values forwarded: a forced call (``"required"``, a named function) is
constrained decoding, which the policy did not choose."""

ALIASES = (("max_completion_tokens", "max_tokens"),)
"""Names of one setting, the one the servers prefer first (vLLM and SGLang take
``max_completion_tokens or max_tokens``)."""


def unknown_sampling(keys: Iterable[str]) -> list[tuple[str, str | None]]:
    """Each of ``keys`` that is not a known sampling field, with the known one it is likely a
    misspelling of (``None`` when it resembles none, e.g. a server's own extension)."""
    unknown = []
    for key in keys:
        if key not in SAMPLING_FIELDS:
            close = difflib.get_close_matches(key, sorted(SAMPLING_FIELDS), n=1, cutoff=0.75)
            unknown.append((key, close[0] if close else None))
    return unknown
