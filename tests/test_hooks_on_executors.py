"""Hooks see the same Trace whichever executor runs the rollout (``_hosting/trace_sync``).

An in-process agent is served in the rollout's own process; one that speaks HTTP, as a
program does, is served by a proxy (on Ray: the node's services, holding a copy of the
trace during a segment). These run one scenario on ``LocalExecutor`` and on ``RayExecutor``,
over both transports, and expect the same record: a trace ``@stop`` sees the tool calls
made so far, and a harness that asks (``ctx.sync()``) sees that the rollout stopped.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from rollout_ray import (
    ChatHarness,
    HarnessContext,
    LocalExecutor,
    ProgramResult,
    Request,
    RolloutLimits,
    RolloutSpec,
    Task,
    ToolMessage,
    Toolset,
    Trace,
    stop,
    tool,
)
from rollout_ray.testing import Reply, ScriptedModel


class Adder(Toolset):
    name = "adder"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class StopsAfterATool(Task):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Adder()]

    @stop
    def after_a_tool(self, trace: Trace) -> bool:
        return len(trace.tool_calls) >= 1


class WithTools(Task):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        return [Adder()]


class NotesWhetherStopped(ChatHarness):
    """ChatHarness that, after its segment, records what it sees of the trace's stop."""

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        result = await super().launch(ctx)
        await ctx.sync()
        ctx.trace.info["harness_saw"] = ctx.trace.stop_condition
        return result


def _add_then_answer(request: Request) -> Reply | str:
    # Stateless, so the copies Ray makes of the model all answer alike.
    if any(isinstance(m, ToolMessage) for m in request.messages):
        return "5"
    return Reply(tool_calls=[("add", {"a": 2, "b": 3})])


def _model() -> ScriptedModel:
    return ScriptedModel(default=_add_then_answer)


def _spec(task: Task, harness: ChatHarness, **kwargs: Any) -> RolloutSpec:
    return RolloutSpec(task, harness, _model(), **kwargs)


async def _run(kind: str, spec: RolloutSpec) -> Trace:
    if kind == "local":
        executor: Any = LocalExecutor()
    else:
        from rollout_ray._ray.ray_executor import RayExecutor

        executor = RayExecutor(actors=1, capacity=2)
    async with executor:
        return await executor.run(spec)


@pytest.fixture(params=["inprocess", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def executor_kind(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        ray = request.getfixturevalue("ray_cluster")
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return request.param


def test_a_trace_stop_sees_the_tool_calls_made_so_far(executor_kind: str, transport: Any) -> None:
    harness = ChatHarness(transport=transport)
    trace = asyncio.run(_run(executor_kind, _spec(StopsAfterATool({"prompt": "2 + 3?"}), harness)))
    assert trace.ok and trace.stop_condition == "after_a_tool"
    assert [(c.name, c.arguments, c.ok) for c in trace.tool_calls] == [("add", '{"a":2,"b":3}', True)]
    assert trace.num_turns == 1  # the second model call was refused by the stop


def test_a_harness_that_syncs_sees_the_stop_mid_rollout(executor_kind: str, transport: Any) -> None:
    spec = _spec(
        WithTools({"prompt": "2 + 3?"}), NotesWhetherStopped(transport=transport), limits=RolloutLimits(max_turns=1)
    )
    trace = asyncio.run(_run(executor_kind, spec))
    assert trace.ok and trace.stop_condition == "max_turns"
    assert trace.info["harness_saw"] == "max_turns"
    assert len(trace.tool_calls) == 1 and trace.num_turns == 1
