"""Rollout.close() and abort(): order, scoring rules, spans, teardown (B20–B21, B41–B46)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

import pytest

from rollout_ray import (
    Harness,
    HarnessContext,
    HarnessSession,
    LocalInterception,
    ProgramResult,
    Reward,
    RolloutLimits,
    RolloutTimeouts,
    Trace,
    metric,
    reward,
)
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel

from conftest import EchoTask, make_rollout, run


class Scored(EchoTask):
    @reward(weight=2.0)
    def said_hello(self, trace: Trace) -> float:
        return float(trace.last_reply == "hello")

    @metric
    def turns(self, trace: Trace) -> float:
        return trace.num_turns


def test_completed_run_is_ok_scored_and_weighted() -> None:
    trace = run(make_rollout(Scored({"prompt": "hi"})).run())
    assert (trace.ok, trace.is_completed, trace.stop_condition) == (True, True, "agent_completed")
    assert trace.rewards == {"said_hello": Reward(1.0, 2.0)} and trace.metrics == {"turns": 1.0}
    assert trace.reward == 2.0


def test_b41_close_order() -> None:
    events: list[str] = []

    class Ordered(EchoTask):
        async def finalize(self) -> None:
            events.append("task.finalize")

        @metric
        async def m(self) -> float:
            events.append("task.score")
            return 1.0

    class Session(HarnessSession):
        async def _close(self) -> None:
            events.append("harness_session.close")

    class OrderedHarness(ScriptedHarness):
        def session(self, ctx: HarnessContext) -> HarnessSession:
            return Session(self, ctx)

        @metric
        async def h(self) -> float:
            events.append("harness.score")
            return 1.0

        async def cleanup(self, trace: Trace, runtime: Any) -> None:
            events.append("harness.cleanup")

    class OrderedRuntime(MemoryRuntime):
        async def _teardown(self) -> None:
            events.append("runtime.stop")

    @asynccontextmanager
    async def tools(toolsets: Any, runtime: Any, secret: str, **kw: Any) -> Any:
        yield {"t": "http://127.0.0.1:1"}
        events.append("tool_servers.close")

    class WithTools(Ordered):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return ["t"]

    interception = LocalInterception()
    r = make_rollout(
        WithTools({"prompt": "hi"}),
        harness=OrderedHarness(in_process=False),  # served by the interception and tools checked
        runtime_factory=OrderedRuntime,
        tool_server=tools,
        interception=interception,
    )
    run(r.open())
    run(r.step())
    original_release = r.session.release
    r.session.release = lambda: (events.append("interception.release"), original_release())  # type: ignore[method-assign]
    run(r.close())
    assert events[:4] == [
        "harness_session.close",
        "tool_servers.close",
        "interception.release",
        "task.finalize",
    ]
    assert sorted(events[4:6]) == ["harness.score", "task.score"]
    assert events[6:] == ["harness.cleanup", "runtime.stop"]


def test_b41_harness_session_close_failure_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    class Session(HarnessSession):
        async def _close(self) -> None:
            raise ConnectionResetError("transport gone")

    class Flaky(ScriptedHarness):
        def session(self, ctx: HarnessContext) -> HarnessSession:
            return Session(self, ctx)

    trace = run(make_rollout(Scored({"prompt": "hi"}), harness=Flaky()).run())
    assert trace.ok and trace.errors == [] and trace.reward == 2.0
    assert "harness session close failed" in caplog.text


def test_b42_failed_run_is_not_finalized_or_scored() -> None:
    finalized: list[bool] = []

    class Task(Scored):
        async def finalize(self) -> None:
            finalized.append(True)

    class Fails(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            return ProgramResult(1, stderr="segfault")

    trace = run(make_rollout(Task({"prompt": "hi"}), harness=Fails()).run())
    assert (trace.ok, trace.rewards, trace.metrics, finalized) == (False, {}, {}, [])
    assert trace.timing.finalize.start == 0 and trace.timing.scoring.start == 0


def test_b42_stopped_run_is_scored() -> None:
    model = ScriptedModel(default=Reply(tool_calls=[("noop", {})]))
    r = make_rollout(
        Scored({"prompt": "hi"}),
        model=model,
        harness=ScriptedHarness(tools={"noop": lambda: "ok"}),
        limits=RolloutLimits(max_turns=2),
    )
    trace = run(r.run())
    assert (trace.ok, trace.stop_condition, trace.num_turns) == (True, "max_turns", 2)
    assert trace.rewards == {"said_hello": Reward(0.0, 2.0)} and trace.metrics == {"turns": 2.0}


def test_b47_scorer_failure_keeps_seeded_placeholders_none() -> None:
    class Broken(EchoTask):
        @reward
        def good(self) -> float:
            return 1.0

        @reward
        def bad(self) -> float:
            raise ZeroDivisionError("division by zero")

    trace = run(make_rollout(Broken({"prompt": "hi"})).run())
    assert trace.ok is False and trace.stop_condition == "agent_completed"  # Q3
    assert trace.rewards == {"good": None, "bad": None}
    assert trace.errors[-1].message == ("task Broken scoring failed: ZeroDivisionError: division by zero")


@pytest.mark.parametrize(
    ("phase", "message"), [("finalize", "task finalize timed out"), ("scoring", "scoring timed out")]
)
def test_b43_finalize_and_scoring_timeouts(phase: str, message: str) -> None:
    class Slow(EchoTask):
        async def finalize(self) -> None:
            await asyncio.sleep(10 if phase == "finalize" else 0)

        @metric
        async def slow(self) -> float:
            await asyncio.sleep(10)
            return 1.0

    trace = run(make_rollout(Slow({"prompt": "hi"}), timeouts=RolloutTimeouts(finalize=5, scoring=5)).run())
    assert [(e.type, e.message) for e in trace.errors] == [("TaskError", message)]
    assert trace.ok is False


def test_b43_task_data_timeouts_apply_when_the_rollout_sets_none() -> None:
    class Slow(EchoTask):
        async def finalize(self) -> None:
            await asyncio.sleep(10)

    task = Slow({"prompt": "hi", "timeout": {"finalize": 1}})
    trace = run(make_rollout(task).run())
    assert trace.errors[0].message == "task finalize timed out"


def test_b41_owned_runtime_stopped_borrowed_never_stopped_but_cleaned() -> None:
    cleaned: list[str] = []

    class Cleans(ScriptedHarness):
        async def cleanup(self, trace: Trace, runtime: Any) -> None:
            cleaned.append(runtime.name)

    owned = make_rollout(harness=Cleans())
    run(owned.run())
    assert owned.runtime.stopped and owned.runtime.stop_calls == 1  # type: ignore[union-attr]

    borrowed_runtime = MemoryRuntime("pool")
    run(borrowed_runtime.start())
    borrowed = make_rollout(harness=Cleans(), runtime=borrowed_runtime)
    run(borrowed.run())
    assert borrowed_runtime.stopped is False and borrowed_runtime.stop_calls == 0
    assert cleaned == [owned.trace.id, "pool"]  # Q17: cleanup runs on borrowed runtimes too


def test_b41_close_is_idempotent() -> None:
    r = make_rollout(Scored({"prompt": "hi"}))
    first = run(r.run())
    snapshot = Trace.__struct_fields__, [getattr(first, f) for f in Trace.__struct_fields__]
    assert run(r.close()) is first
    assert [getattr(first, f) for f in Trace.__struct_fields__] == snapshot[1]
    assert r.runtime.stop_calls == 1  # type: ignore[union-attr]


def test_b44_ok_written_only_at_close() -> None:
    r = make_rollout()
    run(r.open())
    run(r.step())
    assert r.trace.ok is False
    assert run(r.close()).ok is True


def test_b45_spans_and_b46_agent_split() -> None:
    class Thinks(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            await asyncio.sleep(0)
            return await super().launch(ctx)

    trace = run(make_rollout(Scored({"prompt": "hi"}), harness=Thinks()).run())
    t = trace.timing
    for span in (t.boot, t.setup, t.agent, t.finalize, t.scoring):
        assert 0 < span.start <= span.end
    assert t.boot.end == t.setup.start and t.setup.end == t.agent.start
    assert t.agent.end <= t.finalize.start and t.finalize.end == t.scoring.start
    model_time = sum(c.time.duration for c in trace.calls)
    assert t.agent.model.duration == pytest.approx(min(model_time, t.agent.duration))
    assert t.agent.model.duration + t.agent.harness.duration == pytest.approx(t.agent.duration)


def test_b41_closing_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_ray")
    trace = run(make_rollout(Scored({"prompt": "hi", "idx": 3})).run())
    assert f"rollout done: id={trace.id} task=3 reward=2.000 turns=1 stop=agent_completed" in caplog.text
    failed = run(make_rollout(EchoTask({"prompt": None})).run())
    assert f"rollout done: id={failed.id} task=0 reward=0.000 turns=0 stop=TaskError" in caplog.text


def test_b21_abort_releases_without_finalize_or_scoring() -> None:
    interception = LocalInterception()
    r = make_rollout(Scored({"prompt": "hi"}), interception=interception)
    run(r.open())
    run(r.step())
    run(r.abort())
    assert interception.load == 0 and r.runtime.stopped  # type: ignore[union-attr]
    assert (r.trace.is_completed, r.trace.rewards, r.trace.timing.agent.end) == (False, {}, 0)
    assert run(r.close()) is r.trace and r.trace.rewards == {}


def test_q2_closing_a_never_opened_rollout_reports_ok() -> None:
    r = make_rollout(Scored({"prompt": "hi"}))
    trace = run(r.close())
    assert (trace.ok, trace.stop_condition, trace.rewards, r.runtime) == (True, None, {}, None)


def test_q15_service_teardown_failure_fails_the_run_and_skips_scoring() -> None:
    @asynccontextmanager
    async def tools(toolsets: Any, runtime: Any, secret: str, **kw: Any) -> Any:
        yield {}
        raise OSError("tool server did not exit")

    class WithTools(Scored):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return ["t"]

    trace = run(make_rollout(WithTools({"prompt": "hi"}), tool_server=tools).run())
    assert (trace.ok, trace.rewards) == (False, {})
    assert trace.errors[0].message == "tool server did not exit"


def test_b20_failure_with_a_borrowed_runtime_torn_down_mid_run_raises() -> None:
    runtime = MemoryRuntime("pool")
    run(runtime.start())

    class OwnerStopsIt(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            await runtime.stop()
            return ProgramResult(1)

    r = make_rollout(harness=OwnerStopsIt(), runtime=runtime)
    run(r.open())
    with pytest.raises(ValueError, match=r"^borrowed runtime 'pool' was torn down by its owner mid-run$"):
        run(r.step())
    assert r.trace.errors == []


def test_harness_base_class_without_launch_fails_clearly() -> None:
    trace = run(make_rollout(harness=Harness("bare")).run())
    assert trace.errors[0].message == ("harness 'bare' failed: NotImplementedError: Harness.launch is not implemented")
