"""Budgets of a rollout: turn and token limits, phase timeouts, and its runtime's resources."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from .._record.trace import Trace

# The order limits are checked in, and each one's name as a stop condition (B33, B34).
LIMIT_FIELDS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
_AGGREGATE = {
    "max_turns": "num_turns",
    "max_input_tokens": "num_input_tokens",
    "max_output_tokens": "num_output_tokens",
    "max_total_tokens": "num_total_tokens",
}


@dataclass(frozen=True)
class RolloutLimits:
    """Turn and token caps, checked before every model call (``None`` = no cap).

    Each cap reads the trace aggregate of the same name and is reached when
    ``value >= cap``. Because the check happens *before* a call, the turn that crosses a
    token cap still completes: caps are soft by one turn. The first cap reached, in field
    order, refuses the call and becomes the trace's ``stop_condition``.
    """

    # Read by pydantic when a config (EvalConfig, TaskData.timeout) is filled from a dict: a
    # misspelt key ("max_turn") is an error there, never a cap silently not set.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    max_turns: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{f.name} must be an int or None, got {value!r}")
            if value is not None and value < 0:
                raise ValueError(f"{f.name} must be >= 0 or None, got {value}")

    def reached(self, trace: Trace) -> str | None:
        """The name of the first limit ``trace`` has reached, or ``None``."""
        if all(getattr(self, name) is None for name in LIMIT_FIELDS):
            return None
        counts = trace.counts()
        for name in LIMIT_FIELDS:
            cap = getattr(self, name)
            if cap is not None and getattr(counts, _AGGREGATE[name]) >= cap:
                return name
        return None


@dataclass(frozen=True)
class RolloutTimeouts:
    """Seconds allowed per phase (``None`` = unbounded).

    Attributes:
        setup: one deadline shared by task setup and harness setup.
        agent: one cumulative budget over every segment; time between segments (waiting for
            a user) is not charged. Running out is a harness failure, never a stop.
        finalize: task finalize.
        scoring: task and harness scoring together.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}  # as RolloutLimits

    setup: float | None = None
    agent: float | None = None
    finalize: float | None = None
    scoring: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"timeouts.{f.name} must be a number of seconds or None, got {value!r}")
            if not value > 0:  # written this way round so that NaN is rejected too
                raise ValueError(f"timeouts.{f.name} must be > 0 seconds or None, got {value!r}")

    def merged(self, fallback: RolloutTimeouts | None) -> RolloutTimeouts:
        """These timeouts, with each unset one taken from ``fallback`` (B43)."""
        if fallback is None:
            return self
        return RolloutTimeouts(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(fallback, f.name)
                for f in fields(self)
            }
        )


class TaskResources(BaseModel):
    """What one rollout's runtime may use (upstream's ``TaskResources``: cores, memory in GB).

    A runtime whose ``enforces`` holds ``"memory"`` (``"cpu"``) holds its programs to it;
    ``None``: the runtime's own default. GPUs and disk are not taken (a row naming them is
    refused, not silently run without them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: float | None = Field(None, gt=0)
    """CPU cores all the runtime's programs may use together (a fraction is a share of one)."""
    memory: float | None = Field(None, gt=0)
    """Memory, in GB (10**9 bytes, upstream's unit), all the runtime's programs may use together."""

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else int(self.memory * 1e9)
