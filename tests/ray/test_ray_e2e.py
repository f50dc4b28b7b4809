"""End to end on a real local Ray instance: rollout actors, the per-node proxy and tool
server, runtime actors, real harnesses, and the built-in simulated model over HTTP."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from rollout_ray import (
    ChatHarness,
    OpenAIModel,
    ProgramHarness,
    Request,
    RolloutLimits,
    RolloutSpec,
    SimulatedModelConfig,
    SimulatedModelServer,
    Task,
    Trace,
    UserMessage,
    intercept,
    reward,
)

ray = pytest.importorskip("ray")

import calc_taskset  # noqa: E402
from calc_taskset import ShellArith  # noqa: E402

from rollout_ray._ray.rollout_client import RolloutActor  # noqa: E402
from rollout_ray._ray.runtime_actor import RuntimeActor  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(calc_taskset)
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

AGENT = (pathlib.Path(__file__).parents[2] / "examples" / "agent_program.py").read_text()


class NoTools(Task):
    @reward
    def correct(self, trace: Trace) -> float:
        return float(trace.last_reply == "42")


class Rewrites(NoTools):
    @intercept
    def smaller(self, request: Request) -> Request:
        messages = [UserMessage("What is 2 + 2?") if isinstance(m, UserMessage) else m for m in request.messages]
        return Request(messages, request.tools)


PROMPT = {"prompt": "What is 17 + 25?"}


@pytest.fixture(scope="module")
def actor() -> Any:
    handle = RolloutActor.create(capacity=4)
    yield handle
    asyncio.run(handle.aclose())


def with_model(body: Callable[[OpenAIModel], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0.0)) as server:
            return await body(OpenAIModel(server.base_url, name="simulated"))  # type: ignore[arg-type]

    return asyncio.run(main())


def test_owned_runtime_chat_rollout_with_tools_is_scored(actor: Any) -> None:
    trace = with_model(lambda model: actor.run(RolloutSpec(ShellArith(PROMPT), ChatHarness(), model)))
    assert trace.errors == [] and trace.ok and trace.stop_condition == "agent_completed"
    assert trace.num_turns == 2 and trace.last_reply == "42"
    assert [(c.server, c.name, c.ok) for c in trace.tool_calls] == [("calc", "add", True)]
    assert trace.tool_messages[0].content == "42"  # computed in the runtime
    assert trace.rewards["correct"].score == 1.0 and trace.metrics == {"tool_calls": 1.0}  # type: ignore[union-attr]
    assert trace.agent.runtime is not None and not trace.agent.runtime.borrowed
    assert trace.num_total_tokens > 0 and all(c.usage for c in trace.calls)


def test_borrowed_runtime_survives_the_rollout(actor: Any) -> None:
    async def body(model: OpenAIModel) -> tuple[Trace, bool]:
        pool = RuntimeActor.create()
        runtime = await pool.runtime()
        trace = await actor.run(RolloutSpec(ShellArith(PROMPT), ChatHarness(), model, runtime=runtime))
        alive = await runtime.alive()
        await pool.aclose()
        return trace, alive

    trace, alive = with_model(body)
    assert trace.ok and trace.reward == 1.0 and trace.agent.runtime.borrowed  # type: ignore[union-attr]
    assert alive


def test_program_harness_runs_a_script_in_the_runtime(actor: Any) -> None:
    # Shipped as a file: a sandboxed runtime sees none of the host's checkout.
    harness = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
    trace = with_model(lambda model: actor.run(RolloutSpec(ShellArith(PROMPT), harness, model)))
    assert trace.errors == [] and trace.ok
    assert trace.num_turns == 2 and trace.reward == 1.0 and len(trace.tool_calls) == 1


def _started_services(actor: Any) -> dict[str, bool]:
    """Run in the rollout actor: whether it started its runtime actor, and used its node's
    services, yet."""
    return {"runtime_actor": actor._runtimes is not None, "node_services": actor._services.used}


def test_runtime_actor_and_node_services_start_when_a_rollout_first_needs_them() -> None:
    """A cold start pays only for what its rollouts use: in-process chat needs neither, a tool
    that runs in the box needs the runtime actor, a program also the node's proxy."""
    from rollout_ray._ray.calls import call

    async def body(model: OpenAIModel) -> list[Any]:
        fresh = RolloutActor.create(capacity=4)
        seen = []
        try:
            program = ProgramHarness([sys.executable, "agent_program.py"], files={"agent_program.py": AGENT})
            for spec in (
                None,
                RolloutSpec(NoTools(PROMPT), ChatHarness(), model),
                RolloutSpec(ShellArith(PROMPT), ChatHarness(), model),
                RolloutSpec(ShellArith(PROMPT), program, model),
            ):
                trace = None if spec is None else await fresh.run(spec)
                seen.append(
                    (
                        trace is None or (trace.ok and trace.reward == 1.0),
                        await call(fresh.actor.__ray_call__.remote(_started_services)),
                    )
                )
        finally:
            await fresh.aclose()
        return seen

    assert with_model(body) == [
        (True, {"runtime_actor": False, "node_services": False}),  # created: nothing yet
        (True, {"runtime_actor": False, "node_services": False}),  # in-process chat
        (True, {"runtime_actor": True, "node_services": False}),  # its tool ran in the box
        (True, {"runtime_actor": True, "node_services": True}),  # a program: the node's proxy
    ]


def test_limit_reached_over_http_stops_with_its_name(actor: Any) -> None:
    limits = RolloutLimits(max_turns=1)
    spec = lambda model: RolloutSpec(ShellArith(PROMPT), ChatHarness(), model, limits=limits)  # noqa: E731
    trace = with_model(lambda model: actor.run(spec(model)))
    assert (trace.stop_condition, trace.num_turns, trace.ok) == ("max_turns", 1, True)
    assert trace.rewards["correct"].score == 0.0  # type: ignore[union-attr]  # stopped runs are scored


def test_request_interceptor_rewrites_what_the_model_receives(actor: Any) -> None:
    trace = with_model(lambda model: actor.run(RolloutSpec(Rewrites(PROMPT), ChatHarness(), model)))
    assert trace.ok and trace.last_reply == "4"  # the model answered the rewritten question
    assert [r.handler for r in trace.request_rewrites] == ["smaller"]
    assert trace.task.data["prompt"] == "What is 17 + 25?"


def test_trace_reflects_every_committed_turn_after_each_segment(actor: Any) -> None:
    async def body(model: OpenAIModel) -> list[int]:
        spec = RolloutSpec(NoTools({"prompt": None}), ChatHarness(), model, has_user=True)
        rollout_id, opened = await actor.open(spec)
        assert opened
        turns = []
        for question in ("What is 1 + 1?", "What is 40 + 2?"):
            assert await actor.step(rollout_id, [UserMessage(question)])
            turns.append((await actor.trace(rollout_id)).num_turns)
        trace = await actor.close(rollout_id)
        turns.append(trace.num_turns)
        assert trace.last_reply == "42" and trace.ok
        return turns

    assert with_model(body) == [1, 2, 2]


def test_traces_cross_the_wire_as_msgpack(actor: Any) -> None:
    trace = with_model(lambda model: actor.run(RolloutSpec(NoTools(PROMPT), ChatHarness(), model)))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(trace), type=Trace) == trace


def test_owned_runtimes_are_provisioned_on_first_use_and_always_stopped(actor: Any) -> None:
    async def body(model: OpenAIModel) -> tuple[Trace, Trace, list[str]]:
        untouched = await actor.run(RolloutSpec(NoTools(PROMPT), ChatHarness(), model))
        used = await actor.run(RolloutSpec(ShellArith(PROMPT), ChatHarness(), model))  # a tool execs in it
        runtimes = await actor.actor.runtime_actor.remote()
        return untouched, used, await runtimes.names.remote()

    untouched, used, live = with_model(body)
    assert untouched.ok and untouched.agent.runtime.id == untouched.id  # type: ignore[union-attr]  # never provisioned
    assert used.ok, used.errors[0].traceback
    assert used.tool_messages[0].content == "42"  # provisioned by the tool actor's copy
    assert live == []  # both stopped (or never made)
