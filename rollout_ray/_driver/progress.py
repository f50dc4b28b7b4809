"""What a run reports: ``Progress`` while it runs, ``RunResult`` at its end."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from .._record.store import read_groups, read_run


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
    target: int | None = None
    """``max_in_flight="auto"``: the in-flight target the servers' load sets (``auto_in_flight``)."""
    target_why: str = ""
    """What moved ``target`` last."""
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


@dataclass(frozen=True, eq=False)
class RunResult:
    """How a run ended, and what it produced: ``samples`` (every sample, finalized) and
    ``groups`` (one row per group).

    With a run directory, ``samples`` and ``groups`` are read from it the first time they are
    asked for (then kept), not when the run ends: a 100,000-rollout run's samples are ~60 MiB
    of Arrow, which a caller that streamed the groups, or wants a few columns
    (``read_run(result.run_dir, columns)``), does not need. Keep the directory until then.
    ``samples`` leaves out the two large conversation columns (``read_run`` has them)."""

    status: Literal["completed", "halted"]
    reason: str
    _samples: pa.Table | None = field(repr=False)
    """The samples; None: read from ``run_dir`` when asked for."""
    _groups: pa.Table | None = field(repr=False)
    run_dir: str | None
    stale: int = 0
    """Rollouts dropped as stale and re-run."""
    masked: int = 0
    """Stale rollouts kept with their tokens masked."""
    held: int = 0
    """Groups whose admission waited for the trainer."""
    rejected: int = 0
    """Groups stored but not streamed (the summary's ``rejected`` says why)."""

    @property
    def samples(self) -> pa.Table:
        """Every sample, finalized, with the group columns it was stored with."""
        if self._samples is None:
            object.__setattr__(self, "_samples", self._read(lambda run_dir: read_run(run_dir, conversation=False)))
        assert self._samples is not None
        return self._samples

    @property
    def groups(self) -> pa.Table:
        """One row per group."""
        if self._groups is None:
            object.__setattr__(self, "_groups", self._read(read_groups))
        assert self._groups is not None
        return self._groups

    def _read(self, read: Callable[[str], pa.Table]) -> pa.Table:
        if self.run_dir is None:  # not made by a driver: it gave both tables
            raise ValueError("RunResult without a run directory must be given its samples and groups")
        if not os.path.isdir(self.run_dir):
            raise FileNotFoundError(
                f"the run directory {self.run_dir} is gone: RunResult reads its samples and "
                "groups from it when first asked for; ask before removing it"
            )
        return read(self.run_dir)
