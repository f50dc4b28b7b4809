"""Properties of the agent budget (B23, B24, B27) and of limits (B33–B35), on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rollout_ray import (
    HarnessError,
    Request,
    Reward,
    Rollout,
    RolloutLimits,
    RolloutTimeouts,
    Task,
    Trace,
    Usage,
    UserMessage,
    reward,
)
from rollout_ray._core.limits import LIMIT_FIELDS
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel, run_virtual

AGGREGATES = ("num_turns", "num_input_tokens", "num_output_tokens", "num_total_tokens")


class Scored(Task):
    @reward
    def one(self) -> float:
        return 1.0


# Durations are multiples of 0.5 s and budgets sit at an odd multiple of 0.25 s, so a running
# total never lands exactly on the deadline (a tie between two timers has no defined order),
# and every sum is exact in binary floating point.
halves = st.sampled_from([n / 2 for n in range(13)])
segments = st.lists(st.tuples(halves, halves), min_size=1, max_size=5)  # (duration, wait before)
budgets = st.sampled_from([n / 2 + 0.25 for n in range(41)])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(plan=segments, budget=budgets)
def test_b24_b27_budget_is_charged_only_while_segments_run(plan, budget):
    durations = iter(d for d, _ in plan)
    ran: list[float] = []
    deadlines: list[tuple[float, float | None, float | None]] = []
    holder: list[Rollout] = []

    async def before_segment(ctx) -> None:
        rollout = holder[0]
        loop = asyncio.get_running_loop()
        deadlines.append((loop.time(), rollout.deadline_at, rollout.remaining_agent_budget))
        d = next(durations)
        ran.append(d)
        await asyncio.sleep(d)

    async def main() -> tuple[Trace, list[bool], list[float | None], float, BaseException | None]:
        rollout = Rollout(
            Scored({"prompt": None}),
            ScriptedHarness(before_segment=before_segment),
            model=ScriptedModel(default="ok"),
            runtime_factory=MemoryRuntime,
            timeouts=RolloutTimeouts(agent=budget),
            has_user=True,
        )
        holder.append(rollout)
        loop = asyncio.get_running_loop()
        assert await rollout.open()
        t0 = loop.time()
        results, remaining = [], []
        for i, (_, wait) in enumerate(plan):
            await asyncio.sleep(wait)  # the caller thinks: never charged
            results.append(await rollout.step([UserMessage(f"u{i}")]))
            remaining.append(rollout.remaining_agent_budget)
            assert rollout.deadline_at is None
        elapsed = loop.time() - t0
        if rollout.ok:
            rollout.trace.stop("user_closed")
        return await rollout.close(), results, remaining, elapsed, rollout.failure

    trace, results, remaining, elapsed, failure = run_virtual(main())

    spent, expected_results, expected_remaining, exceeded_at = 0.0, [], [], None
    for i, (d, _) in enumerate(plan):
        if exceeded_at is None:
            spent += d
            if spent > budget:
                exceeded_at = i
        expected_results.append(exceeded_at is None)
        expected_remaining.append(max(0.0, budget - spent))

    event("budget exceeded" if exceeded_at is not None else "within budget")
    assert results == expected_results
    assert remaining == pytest.approx(expected_remaining)
    segments_run = len(plan) if exceeded_at is None else exceeded_at + 1
    assert ran == [d for d, _ in plan[:segments_run]]  # no segment runs after the failure
    # B23: each segment's deadline is its start plus what remained of the budget
    before = [budget, *expected_remaining][:segments_run]
    assert [x for _, dl, rem in deadlines for x in (dl, rem)] == pytest.approx(
        [x for (t, _, _), b in zip(deadlines, before, strict=True) for x in (t + b, b)]
    )
    # the loop clock did run through every wait; the budget just never saw them
    charged = sum(ran[:-1]) + (budget - sum(ran[:-1]) if exceeded_at is not None else ran[-1])
    assert elapsed == pytest.approx(sum(w for _, w in plan) + charged)
    if exceeded_at is None:
        assert (trace.ok, trace.stop_condition, trace.errors) == (True, "user_closed", [])
        assert trace.num_turns == len(plan) and failure is None
        assert trace.rewards == {"one": Reward(1.0)}
    else:  # B27: an agent timeout is a HarnessError failure, never a stop
        assert (trace.ok, trace.stop_condition, trace.num_turns) == (False, "error", exceeded_at)
        assert isinstance(failure, HarnessError) and isinstance(failure.__cause__, TimeoutError)
        assert [(e.type, e.message) for e in trace.errors] == [
            ("HarnessError", f"agent timeout: rollout exceeded its {budget:g}s budget")
        ]
        assert trace.rewards == {} and trace.metrics == {}  # failed runs are not scored


caps = st.one_of(st.none(), st.integers(min_value=0, max_value=120))
usages = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.one_of(st.none(), st.integers(0, 10))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(turn_cap=st.one_of(st.none(), st.integers(0, 8)), input_cap=caps, output_cap=caps, total_cap=caps, plan=usages)
def test_b33_b35_no_model_request_after_a_limit_was_reached(turn_cap, input_cap, output_cap, total_cap, plan):
    limits = RolloutLimits(turn_cap, input_cap, output_cap, total_cap)
    cap_of = dict(zip(AGGREGATES, (turn_cap, input_cap, output_cap, total_cap)))
    snapshots: list[dict[str, int]] = []
    holder: list[Rollout] = []

    def answer(request: Request) -> Reply:
        trace = holder[0].trace
        snapshots.append({a: getattr(trace, a) for a in AGGREGATES})
        prompt, completion, cached = plan[len(snapshots) - 1]
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_input_tokens=cached)
        last = len(snapshots) == len(plan)
        return Reply("done" if last else "more", tool_calls=[] if last else [("t", {})], usage=usage)

    model = ScriptedModel(default=answer)
    rollout = Rollout(
        Scored({"prompt": "go"}),
        ScriptedHarness(tools={"t": lambda: "r"}, max_calls=64),
        model=model,
        runtime_factory=MemoryRuntime,
        limits=limits,
    )
    holder.append(rollout)
    trace = run_virtual(rollout.run())

    def first_reached(values: dict[str, int]) -> str | None:
        for name, aggregate in zip(LIMIT_FIELDS, AGGREGATES):
            if cap_of[aggregate] is not None and values[aggregate] >= cap_of[aggregate]:
                return name
        return None

    # every request that reached the model arrived while no cap was reached
    assert [first_reached(s) for s in snapshots] == [None] * len(snapshots)
    assert [s["num_turns"] for s in snapshots] == list(range(len(snapshots)))
    assert len(model.requests) == len(snapshots) == trace.num_turns == len(trace.calls)
    final = {a: getattr(trace, a) for a in AGGREGATES}
    event(f"stop: {trace.stop_condition}")
    if trace.stop_condition == "agent_completed":
        assert len(model.requests) == len(plan)  # the harness finished on its own (Q20)
    else:  # refused: the stop names the first limit, in order, that the final trace reached
        assert len(model.requests) < len(plan)
        assert trace.stop_condition == first_reached(final) is not None
    assert (trace.ok, trace.errors, trace.rewards) == (True, [], {"one": Reward(1.0)})
