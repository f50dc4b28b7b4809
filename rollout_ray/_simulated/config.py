"""How the simulated model answers: latency, wrong answers, faults, seed, dialect, drift."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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

    @model_validator(mode="after")
    def _rates_fit(self) -> SimulatedModelConfig:
        total = self.rate_429 + self.rate_5xx + self.rate_timeout + self.rate_malformed
        if total > 1 + 1e-9:
            raise ValueError(f"fault rates sum to {total}, more than 1")
        return self
