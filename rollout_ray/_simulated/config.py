"""How the simulated model answers: latency, wrong answers, faults, seed, dialect, drift."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CapacityConfig(BaseModel):
    """A loaded vLLM engine's capacity, opt-in (``SimulatedModelConfig.capacity``): one decode
    step at a time for the whole batch, a waiting queue beyond ``max_batch``, a KV cache of
    ``kv_blocks`` blocks with prefix caching (LRU) and preemption when it is full
    (``scheduler.py``, ``kv_cache.py``). Times are seconds of the engine's clock."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_batch: int = Field(64, ge=1)
    """Most sequences decoded together (vLLM's ``--max-num-seqs``); more wait in a queue."""
    kv_blocks: int = Field(4096, ge=1)
    """Size of the KV cache in blocks (vLLM's ``num_gpu_blocks``)."""
    block_size: int = Field(16, ge=1)
    """Tokens per KV block; prefix caching matches whole blocks."""
    step_base: float = Field(0.01, ge=0)
    """Seconds of one decode step, whatever the batch (the weights are read once per step)."""
    step_per_seq: float = Field(0.0002, ge=0)
    """Seconds one decode step grows by per sequence in the batch."""
    prefill_per_token: float = Field(0.00002, ge=0)
    """Seconds of prefill per prompt token not found in the prefix cache (added to the step
    that admits the sequence)."""
    gen_median: int | None = Field(None, ge=1)
    """Median completion length in tokens: each choice opens with a preamble whose length is
    drawn lognormal (``gen_sigma``) per request, in place of ``preamble_tokens``. ``None``:
    completions are as long as without the capacity model. Capped by the request's
    ``max_tokens`` and ``max_completion_tokens``."""
    gen_sigma: float = Field(1.0, ge=0)
    """Sigma of the lognormal completion length (its long tail): 0 makes every one
    ``gen_median`` long."""


class SimulatedModelConfig(BaseModel):
    """How the simulated model answers. Fault rates are bands of one uniform draw, in the
    order 429, 5xx, timeout, malformed, so together they may not exceed 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    ttft: float = Field(0.05, ge=0)
    """Seconds before the first token."""
    per_token: float = Field(0.0, ge=0)
    """Seconds per completion token: token ``j`` is produced ``ttft + (j + 1) * per_token``
    after the request arrives (not counting a pause), and a stream sends it then."""
    error_rate: float = Field(0.0, ge=0, le=1)
    """Probability that an integer answer (computed, or a tool's result reported) is wrong
    (one too high) at temperature 0."""
    rate_429: float = Field(0.0, ge=0, le=1)
    """Probability of a 429 rate-limit error."""
    rate_5xx: float = Field(0.0, ge=0, le=1)
    """Probability of a server error (500, 502, 503, rotating over retries)."""
    rate_timeout: float = Field(0.0, ge=0, le=1)
    """Probability that the request is held ``timeout_hold`` seconds, then answered 504."""
    timeout_hold: float = Field(3600.0, ge=0)
    """Seconds a timed-out request is held (long enough for any client to give up)."""
    rate_malformed: float = Field(0.0, ge=0, le=1)
    """Probability of a 200 whose body is truncated: invalid JSON, or an SSE stream cut short."""
    seed: int = 0
    """Seed of every fault and error decision."""
    model_name: str = "simulated"
    """The model id served and echoed in responses."""
    max_completion_tokens: int = Field(256, ge=1)
    """Cap on completion tokens; a capped text answer finishes with ``"length"``."""
    temperature_error: float = Field(0.5, ge=0)
    """How fast wrong answers grow with the request's temperature T: an integer answer is
    wrong with probability ``1 - (1 - error_rate) * exp(-temperature_error * T)``."""
    dialect: Literal["vllm", "sglang"] = "vllm"
    """Token-capture response shapes for requests whose fields do not decide (see
    ``dialects.py``), and the server's info route: vLLM ``GET /version``, SGLang
    ``GET /model_info``."""
    return_tokens_as_token_ids: bool = False
    """vLLM's ``--return-tokens-as-token-ids``: logprob tokens read ``token_id:N``."""
    template_drift: bool = False
    """Re-render previous assistant turns to other ids than were sampled (``template.py``)."""
    policy_version: int = Field(0, ge=0)
    """The policy version the server starts at (the ``X-Policy-Version`` header). The version
    is the model's weights: it tunes the log-probabilities and the preamble (``completion.py``)."""
    scale_out: bool = False
    """vLLM's ``--enable-scale-out``: the render, derender and token-route abort routes answer
    (``rendering.py``); without it they answer 403, as vLLM's do. The token-in route itself
    (``/inference/v1/generate``) always answers."""
    preamble_tokens: int = Field(0, ge=0)
    """Words (a token each, drawn per policy version) that open every answer's content: long
    completions, to interrupt and continue. 0: answers are just the answer."""

    capacity: CapacityConfig | None = None
    """A loaded engine's capacity model (``CapacityConfig``). When set, it decides when every
    generation's tokens are produced, and ``ttft`` and ``per_token`` are not used. ``None``
    (default): each request is timed alone by ``ttft`` and ``per_token``."""

    @model_validator(mode="after")
    def _rates_fit(self) -> SimulatedModelConfig:
        total = self.rate_429 + self.rate_5xx + self.rate_timeout + self.rate_malformed
        if total > 1 + 1e-9:
            raise ValueError(f"fault rates sum to {total}, more than 1")
        return self
