"""The in-flight target that follows the fleet (``_driver/fleet_target.py``): each rule, and a
closed loop on the simulated fleet's capacity model (engines stepping in lockstep, agentic
rollouts with tool waits; deterministic, counted in steps)."""

from __future__ import annotations

import statistics

import pytest

from rollout_ray._driver.fleet_target import FleetSample, FleetTarget
from rollout_ray._simulated.config import CapacityConfig
from rollout_ray._simulated.kv_cache import Seq
from rollout_ray._simulated.scheduler import Scheduler


def test_each_rule_moves_the_target_and_says_why() -> None:
    t = FleetTarget(40, low=4, high=64, step=4)
    assert t.update(FleetSample(running=16, waiting=0, kv_usage=0.5, preemptions=0)) == 44
    assert t.why == "servers have room"
    assert t.update(FleetSample(running=16, waiting=1, kv_usage=0.5, preemptions=0)) == 44
    assert t.why == "at saturation"
    assert t.update(FleetSample(running=16, waiting=6, kv_usage=0.5, preemptions=0)) == 39
    assert t.why == "6 waiting at the servers"
    assert t.update(FleetSample(running=16, waiting=1, kv_usage=0.5, preemptions=3)) == 29
    assert t.why == "KV cache preempting"
    assert t.update(FleetSample(running=16, waiting=1, kv_usage=0.99, preemptions=3)) == 21
    assert t.why == "KV cache full"
    for _ in range(20):
        t.update(FleetSample(running=16, waiting=9, kv_usage=0.5, preemptions=3))
    assert t.target == 4  # never below `low`


def test_room_raises_the_target_only_when_the_bound_was_reached() -> None:
    """Something else holding rollouts back (the staleness window, an operator) leaves the fleet
    idle: that says nothing about the bound, which holds rather than climbs."""
    t = FleetTarget(40, step=4)
    room = FleetSample(running=10, waiting=0, kv_usage=0.2, preemptions=0)
    assert t.update(room, used=39) == 40
    assert t.why == "held: the servers have room but at most 39 of 40 were in flight"
    assert t.update(room, used=40) == 44 and t.why == "servers have room"
    assert t.update(FleetSample(running=10, waiting=9, kv_usage=0.2, preemptions=0), used=3) == 39  # down whatever


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match=r"1 <= low <= initial <= high, got 8, 4, 64"):
        FleetTarget(4, low=8, high=64)


def closed_loop(kv_blocks: int, ticks: int = 6000) -> tuple[list[int], list[int], list[int], int]:
    """Two engines of batch 8; rollouts of 3 turns (answers of 40 tokens, tool waits of 60
    steps), as many in flight as the target says, sampled every 50 steps. Returns the target,
    the running and the waiting sequences at each sample, and the preemptions."""
    engines = [Scheduler(CapacityConfig(max_batch=8, kv_blocks=kv_blocks)) for _ in range(2)]
    target = FleetTarget(2, step=2)
    rollouts: dict[int, list[int]] = {}  # id -> [turns left, tick its tool is done (or -1: generating)]
    history: dict[int, list[int]] = {}
    calls: dict[Seq, int] = {}
    targets, running, waiting = [], [], []
    next_id = 0
    for tick in range(ticks):
        while len(rollouts) < target.target:
            rollouts[next_id], history[next_id] = [3, tick], [next_id * 10_000 + i for i in range(200)]
            next_id += 1
        for r, state in list(rollouts.items()):
            if state[1] == tick:  # its tool is done (or it just started): call the model
                engine = min(engines, key=lambda e: len(e.running) + len(e.waiting))
                seq = engine.seq(
                    history[r] + [r * 10_000 + 5_000 + state[0] * 100 + j for j in range(40)], len(history[r])
                )
                engine.add(seq)
                calls[seq], state[1] = r, -1
        for engine in engines:
            for seq in engine.step()[1]:
                r = calls.pop(seq)
                rollouts[r][0] -= 1
                history[r] = list(seq.ids)
                if rollouts[r][0] == 0:
                    del rollouts[r]
                else:
                    rollouts[r][1] = tick + 60
        if tick % 50 == 49:
            target.update(
                FleetSample(
                    sum(len(e.running) for e in engines),
                    sum(len(e.waiting) for e in engines),
                    max(e.usage for e in engines),
                    sum(e.counters.preemptions for e in engines),
                )
            )
            targets.append(target.target)
            running.append(sum(len(e.running) for e in engines))
            waiting.append(sum(len(e.waiting) for e in engines))
    return targets, running, waiting, sum(e.counters.preemptions for e in engines)


def test_the_target_climbs_to_the_fleets_saturation_and_holds_it_there() -> None:
    targets, running, waiting, _ = closed_loop(kv_blocks=4096)
    late = slice(len(targets) // 2, None)
    assert statistics.mean(running[late]) >= 0.85 * 16  # the batches stay nearly full
    assert statistics.mean(waiting[late]) <= 4  # with a short queue, not a long one
    assert min(targets[late]) > 16  # rollouts in their tools: more in flight than the batches
    assert max(targets[late]) < 3 * 16  # and it does not run away


def test_a_kv_cache_that_preempts_holds_the_target_lower() -> None:
    roomy, *_ = closed_loop(kv_blocks=4096)
    tight, _, _, preemptions = closed_loop(kv_blocks=120)
    assert preemptions > 0
    late = slice(len(roomy) // 2, None)
    assert statistics.mean(tight[late]) < statistics.mean(roomy[late])
