"""Garbage collection for a process that runs many rollouts at once.

CPython's cyclic collector, at its default thresholds, runs a young collection every 700 net
allocations and a full one every hundred of those; each full collection walks every live
object: the driver's tasks, modules, Arrow buffers, an actor's hundreds of open rollouts. At a
few thousand rollouts a second that was 0.4-0.6 CPU-ms per rollout (a third of the driver's
cost). Rollouts make no cyclic garbage of their own (``Rollout`` and ``RolloutSession`` break
their cycles), so collections can be rarer, and what lives for the whole run — everything
that exists when it starts — is frozen out of them (``gc.freeze``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (50_000, 10, 10)
"""Young collections every 50,000 net allocations (default 700). A rollout lives ~0.1-0.4 s,
so the objects of every rollout in flight are young, and each young collection walks all of
them: at 7,000, a LocalExecutor run of 256 in flight made ~15 young collections a second of
~8 ms each, 0.21 CPU-ms per rollout in GC; at 50,000, 0.05-0.06
(benchmarks/profile_rollout_cost.py --local, GC by generation). Cyclic garbage waits longer
to be found; rollouts make next to none."""


def tune_for_rollouts() -> None:
    """For a process that exists to host rollouts (a rollout actor): for its whole life."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


@contextmanager
def tuned_for_rollouts() -> Iterator[None]:
    """For the length of a run in a process that is someone else's (the driver's): the
    previous thresholds are restored after it, and what was frozen is collectable again.

    Only the young generations are collected before the freeze: a full collection walks the
    whole heap, ~130 ms in a driver that imported Ray and Arrow (profile_rollout_cost.py
    --local: ~0.13 ms per rollout of a 1,000-rollout run). Garbage already old stays frozen until the run ends, and is
    collectable again from then on."""
    before = gc.get_threshold()
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
