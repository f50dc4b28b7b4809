"""How many rollouts to keep in flight so the model servers stay at their saturation point
(issue 33 §3's ``max_in_flight="auto"``; ``auto_in_flight.py`` feeds it and applies it).

The signal is what the servers say on ``/metrics`` (summed over the fleet): requests running
and waiting, KV-cache usage, preemptions so far. Saturation is a small queue that is not
empty: every server has its batch full and a request ready when one finishes, while the KV
cache has room. So, at each sample:

* the cache preempted since the last sample, or is nearly full: lower the target by a
  quarter (a preempted sequence is recomputed: wasted GPU time);
* the queue is longer than ``queue_share`` of what runs: lower it by a tenth;
* nothing waits: raise it by ``step`` (agentic rollouts spend time in tools, so the target
  may exceed the servers' batch), but only if the bound was reached since the last sample:
  when something else holds rollouts back (the staleness window, ``max_groups``, an operator's
  lower number, a run running out of tasks), an idle fleet says nothing about the bound, and
  raising it on every sample would leave it far above the fleet's saturation point when that
  hold lifts (TCP's congestion-window validation, RFC 7661, for the same reason);
* else hold.

Additive increase, multiplicative decrease (as TCP): it settles near the point where the queue
starts to grow and backs off quickly from overload. ``why`` says which rule moved it, for the
progress line and ``ctl status``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FleetSample", "FleetTarget"]


@dataclass(frozen=True, slots=True)
class FleetSample:
    """The fleet's ``/metrics`` at one moment, summed over its servers."""

    running: int
    waiting: int
    kv_usage: float
    """The fullest server's KV-cache usage, 0 to 1."""
    preemptions: int
    """Preemptions since the servers started (a counter)."""


class FleetTarget:
    """The in-flight target, moved by each :meth:`update`, within ``[low, high]``."""

    def __init__(
        self,
        initial: int,
        *,
        low: int = 1,
        high: int = 1 << 16,
        step: int = 4,
        queue_share: float = 0.1,
        kv_full: float = 0.95,
    ) -> None:
        if not 1 <= low <= initial <= high:
            raise ValueError(f"the in-flight target needs 1 <= low <= initial <= high, got {low}, {initial}, {high}")
        if step < 1:
            raise ValueError(f"`step` must be >= 1, got {step}")
        self.target, self.low, self.high, self.step = initial, low, high, step
        self.queue_share, self.kv_full = queue_share, kv_full
        self.why = "starting"
        self._preemptions: int | None = None

    def update(self, sample: FleetSample, used: int | None = None) -> int:
        """The target after ``sample`` (also in ``target``; ``why`` says what moved it).

        Args:
            used: the most rollouts in flight at once since the last sample (``None``: not
                known, taken as the bound reached).
        """
        preempted = self._preemptions is not None and sample.preemptions > self._preemptions
        self._preemptions = sample.preemptions
        if preempted or sample.kv_usage >= self.kv_full:
            self._set(int(self.target * 0.75), "KV cache preempting" if preempted else "KV cache full")
        elif sample.waiting > max(1, self.queue_share * sample.running):
            self._set(int(self.target * 0.9), f"{sample.waiting} waiting at the servers")
        elif sample.waiting == 0 and used is not None and used < self.target:
            self.why = f"held: the servers have room but at most {used} of {self.target} were in flight"
        elif sample.waiting == 0:
            self._set(self.target + self.step, "servers have room")
        else:
            self.why = "at saturation"
        return self.target

    def _set(self, target: int, why: str) -> None:
        self.target, self.why = max(self.low, min(self.high, target)), why
