"""RolloutHost: K rollouts at once, forwarded verbs, room released exactly once (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from rollout_ray import InfrastructureLost, LocalExecutor, LocalInterception
from rollout_ray._hosting.rollout_host import RolloutHost
from rollout_ray._hosting.spec import RolloutSpec
from rollout_ray.testing import MemoryRuntime, ScriptedHarness, ScriptedModel

from conftest import EchoTask, run


def host(capacity: int) -> RolloutHost:
    return RolloutHost(capacity, interception=LocalInterception(), runtime_factory=MemoryRuntime)


def spec() -> RolloutSpec:
    return RolloutSpec(EchoTask({"prompt": "hi"}), ScriptedHarness(), ScriptedModel(default="hello"))


def test_run_returns_the_closed_trace_and_frees_its_room() -> None:
    h = host(1)
    trace = run(h.run(spec()))
    assert trace.ok and trace.stop_condition == "agent_completed" and trace.num_turns == 1
    assert h.open_ids() == [] and h.completed == 1
    assert run(h.run(spec())).ok  # the room was freed


def test_a_rollout_whose_services_were_lost_comes_back_as_a_lost_trace() -> None:
    """The host hands back the trace, lost or not: the driver reads ``is_a``, nothing is raised."""

    async def lose_the_services(ctx: object) -> None:
        raise InfrastructureLost("the node's services were lost: ActorDiedError")

    lost = RolloutSpec(
        EchoTask({"prompt": "hi"}), ScriptedHarness(before_segment=lose_the_services), ScriptedModel(default="hello")
    )
    h = host(1)
    trace = run(h.run(lost))
    assert not trace.ok and [e.type for e in trace.errors] == ["InfrastructureLost"]
    assert trace.errors[0].is_a(InfrastructureLost) and h.open_ids() == [] and h.completed == 1


def test_open_waits_for_room_when_capacity_is_reached() -> None:
    h = host(1)

    async def main() -> list[str]:
        first, _ = await h.open(spec())
        second = asyncio.create_task(h.open(spec()))
        await asyncio.sleep(0)
        assert not second.done() and h.open_ids() == [first]
        await h.close(first)
        rollout_id, opened = await second
        assert opened
        await h.abort(rollout_id)
        await h.abort(rollout_id)  # twice is harmless
        return h.open_ids()

    assert run(main()) == []
    with pytest.raises(KeyError, match="no open rollout"):
        run(h.close("nope"))


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^capacity must be >= 1 \(or None: no bound\), got 0$"):
        host(0)


def test_the_local_executor_hosts_its_rollouts_as_an_actor_does_without_a_bound() -> None:
    """``LocalExecutor`` runs its rollouts on a ``RolloutHost`` of its own: each is live (with
    the driver's label) while it runs and gone once its trace is back, and the host adds no
    bound (three held at once, where the driver's ``max_in_flight`` is the only limit)."""
    let_go, all_held = asyncio.Event(), asyncio.Event()
    held: list[object] = []

    async def hold(ctx: object) -> None:
        held.append(ctx)
        if len(held) == 3:
            all_held.set()
        await let_go.wait()

    def labelled(n: int) -> RolloutSpec:
        harness = ScriptedHarness(before_segment=hold)
        return RolloutSpec(EchoTask({"prompt": "hi"}), harness, ScriptedModel(default="hello"), label=f"g#{n}")

    async def main() -> None:
        async with LocalExecutor(runtime="local") as executor:
            assert (await executor.live())["rollouts"] == []
            runs = [asyncio.create_task(executor.run(labelled(n))) for n in range(3)]
            async with asyncio.timeout(30):  # a bound, not a wait: all three are in their segment
                await all_held.wait()
            assert sorted(r["label"] for r in (await executor.live())["rollouts"]) == ["g#0", "g#1", "g#2"]
            let_go.set()
            traces = await asyncio.gather(*runs)
            assert all(t.ok for t in traces) and (await executor.live())["rollouts"] == []

    run(main())
