"""What a run reports: ``Progress`` while it runs, ``RunResult`` at its end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa


@dataclass
class Progress:
    """Counters of a running driver, for progress displays."""

    total: int | None
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    retried: int = 0
    skipped: int = 0
    stale: int = 0
    """Rollouts dropped as too old for the policy version (``max_staleness``) and re-run."""
    masked: int = 0
    """Rollouts too old for the policy version kept with their tokens masked (``stale_samples="mask"``)."""
    held: int = 0
    """Groups whose admission waited for the trainer to take groups or update (``admission``)."""
    rejected: int = 0
    """Groups stored but not streamed (``keep_rule``: the keep rule, or a sample lost on every attempt)."""
    reward_sum: float = 0.0
    """Σ reward of the rollouts counted in ``done``: each one's kept (stored) outcome, a failed
    one as 0, as the summary counts it; a retried attempt's outcome is not in it."""
    started: float = field(default_factory=time.monotonic)

    @property
    def mean_reward(self) -> float | None:
        """The running mean reward of the rollouts counted done (None before the first)."""
        return self.reward_sum / self.done if self.done > 0 else None

    def count(self, ok: bool, reward: float, sign: int = 1) -> None:
        """Count a rollout's kept outcome as done (``sign=-1``: take back one counted before,
        a stale sample dropped to run again). A failure, or a NaN reward, counts as reward 0."""
        self.done += sign
        self.failed += sign * (not ok)
        if ok and reward == reward:
            self.reward_sum += sign * reward

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if self.total is None or not self.rate:
            return None
        return (self.total - self.skipped - self.done) / self.rate


@dataclass(frozen=True)
class RunResult:
    status: Literal["completed", "halted"]
    reason: str
    samples: pa.Table
    groups: pa.Table
    run_dir: str | None
    stale: int = 0
    """Rollouts dropped as stale and re-run."""
    masked: int = 0
    """Stale rollouts kept with their tokens masked."""
    held: int = 0
    """Groups whose admission waited for the trainer."""
    rejected: int = 0
    """Groups stored but not streamed (the summary's ``rejected`` says why)."""
