"""Staleness control: finished rollouts too old for the current policy are re-run (or masked).

In asynchronous RL the trainer updates the weights while rollouts run, so a rollout may have
been sampled, in part or in whole, by older versions of the policy. Each model call records
the version that produced it (``ModelCall.policy``). When a group is about to be finalized,
stored and streamed, a sample whose *oldest* call is more than ``max_staleness`` versions
behind the driver's current version is stale: it is dropped (never stored, never streamed)
and its ``(task, sample)`` is run again, in the manner of AReaL's staleness control. The
group is finalized when the trainer asks for the next group (not ahead, where it would wait
in the stream and grow older), so every group a trainer receives holds the bound at that
moment. ``max_staleness=0`` is synchronous on-policy RL: only rollouts sampled entirely by
the current version are kept. A rollout that made no versioned call is never stale.

This check is the fallback: with ``batch_groups`` the driver holds admission back so that
rollouts seldom end this stale (``admission``), and with ``stale_samples="mask"`` a stale
sample is kept in its group with its tokens masked instead of being re-run. Re-runs are
counted in ``Progress.stale``, masked samples in ``Progress.masked``.
"""

from __future__ import annotations

from .._record.arrow import RolloutRecord
from .._record.trace import Trace


def oldest_policy(trace: Trace) -> int | None:
    """The oldest policy version among the trace's model calls (``None``: none recorded)."""
    versions = [c.policy for c in trace.calls if c.policy is not None]
    return min(versions) if versions else None


def is_stale(trace: Trace, current: int, max_staleness: int) -> bool:
    """Whether ``trace``'s oldest turn is more than ``max_staleness`` versions behind ``current``."""
    oldest = oldest_policy(trace)
    return oldest is not None and current - oldest > max_staleness


def split_stale(
    members: list[RolloutRecord], current: int, max_staleness: int
) -> tuple[list[RolloutRecord], list[RolloutRecord]]:
    """``members`` as ``(fresh, stale)``, each in its order."""
    fresh: list[RolloutRecord] = []
    stale: list[RolloutRecord] = []
    for record in members:
        (stale if is_stale(record.trace, current, max_staleness) else fresh).append(record)
    return fresh, stale
