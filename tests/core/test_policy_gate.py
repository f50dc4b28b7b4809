"""The policy gate and the agent clock: versions on model calls, pauses for weight updates
(issue 12 §4, §5). Virtual time: a pause of 1,000 s takes none."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from rollout_ray import Request, RolloutTimeouts, SessionConcluded, UserMessage
from rollout_ray._core.policy_gate import PolicyGate, SegmentClock, process_gate
from rollout_ray._core.session import RolloutSession
from rollout_ray._record.trace import Trace, TraceTask
from rollout_ray.testing import Reply, ScriptedHarness, ScriptedModel

from conftest import make_rollout, run


class Stamping(ScriptedModel):
    """A server that stamps its own policy version on every reply."""

    def __init__(self, version: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = version

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Any:
        response = await super().complete(request, model=model, sampling=sampling)
        return msgspec.structs.replace(response, policy_version=self.version)


def versioned(version: int, paused: bool = False) -> PolicyGate:
    policy = PolicyGate()
    policy.set(version, paused)
    return policy


def two_turns(*delays: float) -> tuple[ScriptedModel, ScriptedHarness]:
    """A model asking for one tool, then answering; each reply after its delay."""
    model = ScriptedModel([Reply(tool_calls=[("look", {})], delay=delays[0]), Reply("done", delay=delays[1])])
    return model, ScriptedHarness(tools={"look": lambda: "seen"})


def test_every_call_records_the_current_version_unless_the_server_stamps_one() -> None:
    r = make_rollout(policy=versioned(3))
    trace = run(r.run())
    assert [c.policy for c in trace.calls] == [3]
    stamped = make_rollout(model=Stamping(9, default="hello"), policy=versioned(3))
    assert [c.policy for c in run(stamped.run()).calls] == [9]


def test_the_process_policy_is_the_default_and_unset_records_none() -> None:
    r = make_rollout()
    assert r.policy is process_gate() and r.session.policy is process_gate()
    assert [c.policy for c in run(make_rollout(policy=PolicyGate()).run()).calls] == [None]


def test_not_paused_the_gate_costs_no_event() -> None:
    policy = versioned(0)

    async def main() -> None:
        await policy.wait()

    run(main())
    assert policy._gate is None and policy.paused_seconds() == 0


def test_a_pause_holds_new_calls_lets_calls_in_flight_finish_and_is_not_charged() -> None:
    policy = versioned(0)
    model, harness = two_turns(2, 1)
    r = make_rollout(model=model, harness=harness, timeouts=RolloutTimeouts(agent=5), policy=policy)

    async def main() -> tuple[Trace, float]:
        loop = asyncio.get_running_loop()
        running = asyncio.create_task(r.run())
        await asyncio.sleep(1)
        assert len(model.requests) == 1  # the first call is in flight
        policy.set(0, True)
        await asyncio.sleep(999)  # a long weight update: everything else waits
        assert len(model.requests) == 1, "a call went upstream while paused"
        assert [c.policy for c in r.trace.calls] == [0]  # the call in flight finished
        policy.set(1, False)
        return await running, loop.time()

    trace, ended = run(main())
    assert ended == pytest.approx(1001)  # the agent timeout (5 s) would have expired at 5
    assert trace.ok and trace.stop_condition == "agent_completed"
    assert [c.policy for c in trace.calls] == [0, 1]  # the rollout spans the update
    assert r.remaining_agent_budget == pytest.approx(5 - 2)  # charged 1001 s less 999 paused


def test_a_segment_started_while_paused_waits_and_carries_the_version_of_the_resume() -> None:
    policy = versioned(4, paused=True)
    model = ScriptedModel([Reply("hello", delay=1)])
    r = make_rollout(model=model, timeouts=RolloutTimeouts(agent=5), policy=policy)

    async def main() -> Trace:
        running = asyncio.create_task(r.run())
        await asyncio.sleep(50)
        assert model.requests == [] and r.deadline_at == pytest.approx(5 + 50)
        policy.set(5, False)
        return await running

    trace = run(main())
    assert trace.ok and [c.policy for c in trace.calls] == [5]
    assert r.remaining_agent_budget == pytest.approx(4)


def test_the_deadline_moves_out_by_the_pause_and_still_holds_after_it() -> None:
    policy = versioned(0)
    seen: list[float | None] = []
    r: Any = None

    async def hang(ctx: Any) -> None:
        seen.append(r.deadline_at)
        await asyncio.Event().wait()

    r = make_rollout(harness=ScriptedHarness(before_segment=hang), timeouts=RolloutTimeouts(agent=5), policy=policy)

    async def main() -> tuple[Trace, float]:
        loop = asyncio.get_running_loop()
        running = asyncio.create_task(r.run())
        await asyncio.sleep(2)
        policy.set(0, True)
        await asyncio.sleep(100)
        seen.append(r.deadline_at)
        policy.set(0, False)
        return await running, loop.time()

    trace, ended = run(main())
    assert seen == [pytest.approx(5), pytest.approx(105)]
    assert ended == pytest.approx(105)
    assert [(e.type, e.message) for e in trace.errors] == [
        ("HarnessError", "agent timeout: rollout exceeded its 5s budget")
    ]


def test_two_pauses_in_one_segment_are_both_credited() -> None:
    policy = versioned(0)

    async def main() -> tuple[float, float | None]:
        clock = SegmentClock(policy, 10)
        async with clock.timeout():
            await asyncio.sleep(1)
            policy.set(0, True)
            await asyncio.sleep(30)
            policy.set(1, False)
            await asyncio.sleep(1)
            policy.set(1, True)
            await asyncio.sleep(40)
            policy.set(2, False)
            await asyncio.sleep(1)
        clock.close()
        assert policy._clocks == set()
        return clock.spent(), clock.deadline

    spent, deadline = run(main())
    assert spent == pytest.approx(3) and deadline == pytest.approx(80)


def test_a_call_held_by_a_session_released_meanwhile_never_goes_upstream() -> None:
    policy = versioned(0, paused=True)
    model = ScriptedModel(default="hello")
    session = RolloutSession(Trace(task=TraceTask(type="T")), model, policy=policy)

    async def main() -> None:
        held = asyncio.create_task(session.chat(Request([UserMessage("hi")])))
        await asyncio.sleep(10)
        session.release()
        policy.set(0, False)
        with pytest.raises(SessionConcluded):
            await held

    run(main())
    assert model.requests == [] and session.trace.calls == []


def test_set_is_idempotent_and_a_repeated_pause_does_not_restart_the_count() -> None:
    policy = versioned(0)

    async def main() -> float:
        policy.set(0, True)
        await asyncio.sleep(3)
        policy.set(1, True)  # a version change while paused: still the same pause
        await asyncio.sleep(2)
        policy.set(1, False)
        policy.set(1, False)
        return policy.paused_seconds()

    assert run(main()) == pytest.approx(5)
    assert policy.state() == (1, False)
