"""The driver's GC settings for a run: rarer young collections, what lives for the whole run
frozen out of them, and all of it undone when the run ends (``_hosting/gc_tuning.py``)."""

from __future__ import annotations

import gc
import weakref

from rollout_ray._hosting.gc_tuning import THRESHOLDS, tuned_for_rollouts


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_a_run_tunes_the_collector_and_leaves_it_as_it_found_it() -> None:
    before = gc.get_threshold()
    old = Node()
    gone = weakref.ref(old)
    gc.collect()  # `old` is now in the oldest generation
    del old  # ... and garbage there: the run's young collection before the freeze keeps it
    with tuned_for_rollouts():
        assert gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert gone() is not None  # frozen, not walked by the run's collections
        gc.collect()
        assert gone() is not None
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.collect()  # collectable again once the run is over
    assert gone() is None
