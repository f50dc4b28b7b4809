"""Turn and token limits (B33–B35, Q20) and phase timeouts (B2, B43)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rollout_ray import (
    AssistantMessage,
    MessageNode,
    ModelCall,
    Request,
    Reward,
    Rollout,
    RolloutLimits,
    RolloutTimeouts,
    Task,
    TaskData,
    Trace,
    TraceTask,
    Usage,
    UserMessage,
    metric,
    reward,
)
from rollout_ray._core.limits import LIMIT_FIELDS
from rollout_ray._record.trace import TraceCounts
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel, run_virtual

AGGREGATES = ("num_turns", "num_input_tokens", "num_output_tokens", "num_total_tokens")


def counted(**aggregates: int) -> SimpleNamespace:
    """A stand-in trace whose ``counts()`` are the given aggregates."""
    return SimpleNamespace(counts=lambda: TraceCounts(**aggregates))


@pytest.mark.parametrize("name", LIMIT_FIELDS)
@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (-1, ValueError, None),
        (1.5, TypeError, "1.5"),
        (True, TypeError, "True"),
        (False, TypeError, "False"),
        ("3", TypeError, "'3'"),
    ],
)
def test_b33_limit_validation(name, value, error, shown):
    expected = (
        f"{name} must be >= 0 or None, got -1" if error is ValueError else f"{name} must be an int or None, got {shown}"
    )
    with pytest.raises(error, match=rf"^{re.escape(expected)}$"):
        RolloutLimits(**{name: value})


def test_b33_zero_and_none_are_valid_caps():
    assert RolloutLimits(0, 0, 0, 0).reached(Trace(task=TraceTask(type="T"))) == "max_turns"
    assert RolloutLimits().reached(counted(**dict.fromkeys(AGGREGATES, 10**9))) is None


def test_b34_limit_names_are_the_field_names_in_check_order():
    assert LIMIT_FIELDS == ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        ((3, 10, 5, 15), "max_turns"),  # everything reached: turns first
        ((4, 10, 5, 15), "max_input_tokens"),
        ((4, 11, 5, 15), "max_output_tokens"),
        ((4, 11, 6, 15), "max_total_tokens"),
        ((4, 11, 6, 16), None),  # each check is value >= cap
        ((None, None, None, 15), "max_total_tokens"),
    ],
)
def test_b34_reached_checks_turns_input_output_total_in_order(caps, expected):
    aggregates = counted(num_turns=3, num_input_tokens=10, num_output_tokens=5, num_total_tokens=15)
    assert RolloutLimits(*caps).reached(aggregates) == expected


def test_b33_reached_reads_the_trace_aggregates():
    trace = Trace(task=TraceTask(type="T"))
    trace.nodes = [MessageNode(None, UserMessage("q")), MessageNode(0, AssistantMessage("a"), sampled=True)]
    trace.calls = [ModelCall(node=1, usage=Usage(prompt_tokens=6, completion_tokens=4, cached_input_tokens=2))]
    assert [getattr(trace, a) for a in AGGREGATES] == [1, 8, 4, 12]
    assert RolloutLimits(max_total_tokens=12).reached(trace) == "max_total_tokens"
    assert RolloutLimits(2, 9, 5, 13).reached(trace) is None


# -- through a full rollout ----------------------------------------------------------------


class ScoredTask(Task):
    @reward
    def done(self) -> float:
        return 1.0

    @metric
    def turns(self, trace: Trace) -> float:
        return trace.num_turns


def limited_run(limits: RolloutLimits, script=(), default=None):
    """A tool-calling loop: every reply asks for a tool, so the harness keeps calling.

    Usage: prompt = 10 per request message, completion = 5. After k calls on one branch:
    turns k, input 15k - 5, output 5k, total 20k - 5.
    """
    seen: list[tuple[int, ...]] = []
    holder: list[Rollout] = []

    def answer(request: Request) -> Reply:
        seen.append(tuple(getattr(holder[0].trace, a) for a in AGGREGATES))
        return Reply(
            "calling",
            tool_calls=[("echo", {"text": "x"})],
            usage=Usage(prompt_tokens=10 * len(request.messages), completion_tokens=5),
        )

    model = ScriptedModel(
        [s if s is not None else answer for s in script], default=answer if default is None else default
    )
    harness = ScriptedHarness(tools={"echo": lambda text: text})
    rollout = Rollout(ScoredTask({"prompt": "go"}), harness, model=model, runtime_factory=MemoryRuntime, limits=limits)
    holder.append(rollout)
    return run_virtual(rollout.run()), model, seen


@pytest.mark.parametrize(
    ("limits", "name", "turns", "crossed"),
    [
        (RolloutLimits(max_turns=3), "max_turns", 3, 3),
        (RolloutLimits(max_input_tokens=38), "max_input_tokens", 3, 40),
        (RolloutLimits(max_output_tokens=12), "max_output_tokens", 3, 15),
        (RolloutLimits(max_total_tokens=50), "max_total_tokens", 3, 55),
        (RolloutLimits(max_output_tokens=5), "max_output_tokens", 1, 5),
    ],
)
def test_b35_each_limit_stops_after_the_crossing_turn(limits, name, turns, crossed):
    trace, model, seen = limited_run(limits)
    assert trace.stop_condition == name
    assert trace.num_turns == turns
    assert getattr(trace, AGGREGATES[LIMIT_FIELDS.index(name)]) == crossed  # soft by one turn
    assert len(model.requests) == turns == len(trace.calls)  # the refused call never went upstream
    assert all(c.node is not None and c.error is None for c in trace.calls)
    assert [s[0] for s in seen] == list(range(turns))
    assert all(limits.reached(counted(**dict(zip(AGGREGATES, s)))) is None for s in seen)
    assert (trace.ok, trace.is_completed, trace.errors) == (True, True, [])
    assert trace.is_truncated
    # B42: a stopped run is finalized and scored
    assert trace.rewards == {"done": Reward(1.0, 1.0)}
    assert trace.metrics == {"turns": float(turns)}


def test_b35_max_turns_zero_refuses_the_first_call():
    trace, model, _ = limited_run(RolloutLimits(max_turns=0))
    assert (trace.stop_condition, trace.num_turns, len(model.requests), trace.nodes) == ("max_turns", 0, 0, [])
    assert trace.ok and trace.rewards == {"done": Reward(1.0, 1.0)}


def test_b34_first_limit_in_order_wins_when_several_are_reached():
    # after 2 calls: turns 2, input 25, output 10, total 35
    limits = RolloutLimits(max_turns=5, max_input_tokens=30, max_output_tokens=10, max_total_tokens=35)
    trace, model, _ = limited_run(limits)
    assert (trace.stop_condition, trace.num_turns, len(model.requests)) == ("max_output_tokens", 2, 2)


def test_q20_harness_finishing_exactly_at_max_turns_is_agent_completed():
    trace, model, _ = limited_run(RolloutLimits(max_turns=3), script=[None, None, "done"])
    assert (trace.stop_condition, trace.num_turns, len(model.requests)) == ("agent_completed", 3, 3)
    assert trace.ok and trace.last_reply == "done"
    assert not trace.is_truncated


def test_q20_single_turn_at_cap_is_agent_completed():
    trace, model, _ = limited_run(RolloutLimits(max_turns=1, max_output_tokens=1), default="hello")
    assert (trace.stop_condition, trace.num_turns, len(model.requests)) == ("agent_completed", 1, 1)


# -- timeouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["setup", "agent", "finalize", "scoring"])
@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (-1.5, "-1.5"), (float("nan"), "nan"), (0.0, "0.0")])
def test_b43_timeout_validation(name, value, shown):
    message = f"timeouts.{name} must be > 0 seconds or None, got {shown}"
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        RolloutTimeouts(**{name: value})


@pytest.mark.parametrize("name", ["setup", "agent", "finalize", "scoring"])
@pytest.mark.parametrize(("value", "shown"), [(True, "True"), ("5", "'5'")])
def test_b43_timeout_must_be_a_number(name, value, shown):
    message = f"timeouts.{name} must be a number of seconds or None, got {shown}"
    with pytest.raises(TypeError, match=rf"^{re.escape(message)}$"):
        RolloutTimeouts(**{name: value})


def test_b43_merged_takes_unset_values_from_the_fallback():
    mine = RolloutTimeouts(setup=1.0, scoring=4)
    assert mine.merged(None) is mine
    assert mine.merged(RolloutTimeouts(setup=9, agent=2.5, finalize=3)) == RolloutTimeouts(1.0, 2.5, 3, 4)
    assert RolloutTimeouts().merged(RolloutTimeouts()) == RolloutTimeouts(None, None, None, None)


def test_b43_b2_rollout_falls_back_to_task_data_timeouts():
    data = TaskData(prompt="p", timeout=RolloutTimeouts(setup=5, agent=30, finalize=7))
    rollout = Rollout(
        Task(data),
        ScriptedHarness(),
        model=ScriptedModel(default="x"),
        runtime_factory=MemoryRuntime,
        timeouts=RolloutTimeouts(agent=12, scoring=2),
    )
    assert rollout.timeouts == RolloutTimeouts(setup=5, agent=12, finalize=7, scoring=2)
    assert rollout.remaining_agent_budget == 12  # B2
    unbounded = Rollout(
        Task({"prompt": "p"}), ScriptedHarness(), model=ScriptedModel(default="x"), runtime_factory=MemoryRuntime
    )
    assert (unbounded.timeouts, unbounded.remaining_agent_budget) == (RolloutTimeouts(), None)
