"""A finished rollout is freed by reference counting, not left to the cyclic collector.

Every rollout's object graph (Rollout, its session, trace, harness session) in a reference
cycle survives until a full collection: at thousands of rollouts a second that was a third
of the driver's CPU (``_hosting/gc_tuning.py``). These tests keep it from coming back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rollout_ray import ChatHarness, LocalRuntime, Rollout, Task
from rollout_ray.testing import ScriptedModel

from conftest import run


@pytest.fixture
def garbage() -> Iterator[list[object]]:
    """What the cyclic collector finds after the test body (and only what it made)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[object] = []
    try:
        yield found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def _collect(found: list[object]) -> set[str]:
    gc.collect()
    found.extend(gc.garbage)
    return {type(o).__name__ for o in found}


def test_a_chat_rollout_leaves_no_cyclic_garbage(garbage: list[object]) -> None:
    for i in range(3):
        rollout = Rollout(
            Task({"prompt": f"{i}+1?"}), ChatHarness(), model=ScriptedModel(default="ok"), runtime_factory=LocalRuntime
        )
        trace = run(rollout.run())
        assert trace.ok
        del rollout, trace
    kinds = _collect(garbage)
    assert not kinds & {"Rollout", "RolloutSession", "Trace", "HarnessSession", "LimitReservations"}, kinds
