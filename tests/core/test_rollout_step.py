"""Rollout.step(): segments, the agent budget, and how a segment ends (B22–B32)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollout_ray import (
    HarnessContext,
    HarnessSession,
    ProgramResult,
    ProviderError,
    Request,
    RolloutLimits,
    RolloutTimeouts,
    UserMessage,
    intercept,
)
from rollout_ray.testing import MemoryRuntime, Reply, ScriptedHarness, ScriptedModel

from conftest import EchoTask, make_rollout, run

PROMPTLESS = {"prompt": None}


def interactive(**kwargs: Any) -> Any:
    return make_rollout(EchoTask(PROMPTLESS), has_user=True, **kwargs)


def test_b22_step_is_a_no_op_before_open_after_close_and_after_failure() -> None:
    r = make_rollout()
    assert run(r.step()) is False
    run(r.open())
    run(r.close())
    assert run(r.step()) is False
    failed = make_rollout(EchoTask(PROMPTLESS))
    run(failed.open())
    assert run(failed.step()) is False and len(failed.trace.errors) == 1


def test_b23_deadline_exposed_only_while_a_segment_runs() -> None:
    seen: list[Any] = []
    r: Any = None

    async def observe(ctx: HarnessContext) -> None:
        seen.append((r.deadline_at, asyncio.get_running_loop().time()))

    r = make_rollout(harness=ScriptedHarness(before_segment=observe), timeouts=RolloutTimeouts(agent=10))
    run(r.open())
    run(r.step())
    ((deadline, now),) = seen
    assert deadline == pytest.approx(now + 10)
    assert r.deadline_at is None


def test_b24_budget_charged_only_while_segments_run() -> None:
    async def work(ctx: HarnessContext) -> None:
        await asyncio.sleep(3)

    r = interactive(harness=ScriptedHarness(before_segment=work), timeouts=RolloutTimeouts(agent=10))

    async def main() -> None:
        await r.open()
        assert await r.step([UserMessage("one")]) is True
        await asyncio.sleep(1000)  # the user thinks; not charged
        assert await r.step([UserMessage("two")]) is True

    run(main())
    assert r.remaining_agent_budget == pytest.approx(4)
    assert r.ok and r.trace.num_turns == 2


def test_b27_agent_deadline_is_a_harness_failure_never_a_stop() -> None:
    async def hang(ctx: HarnessContext) -> None:
        await asyncio.Event().wait()

    r = make_rollout(harness=ScriptedHarness(before_segment=hang), timeouts=RolloutTimeouts(agent=5))
    run(r.open())
    assert run(r.step()) is False
    trace = run(r.close())
    assert [(e.type, e.message) for e in trace.errors] == [
        ("HarnessError", "agent timeout: rollout exceeded its 5s budget")
    ]
    assert (trace.ok, trace.stop_condition, trace.rewards) == (False, "error", {})
    assert r.remaining_agent_budget == 0


def test_b27_budget_left_over_from_earlier_segments_is_the_deadline() -> None:
    async def work(ctx: HarnessContext) -> None:
        await asyncio.sleep(4)

    r = interactive(harness=ScriptedHarness(before_segment=work), timeouts=RolloutTimeouts(agent=6))
    run(r.open())
    assert run(r.step([UserMessage("one")])) is True
    assert run(r.step([UserMessage("two")])) is False  # 2 s left, needs 4
    assert r.trace.errors[0].message == "agent timeout: rollout exceeded its 6s budget"


class RawTimeoutSession(HarnessSession):
    async def turn(self, messages: Any = None) -> None:
        raise TimeoutError("socket read timed out")


class RawTimeoutHarness(ScriptedHarness):
    def session(self, ctx: HarnessContext) -> HarnessSession:
        return RawTimeoutSession(self, ctx)


def test_b28_timeout_error_without_expired_deadline_stays_raw() -> None:
    r = make_rollout(harness=RawTimeoutHarness(), timeouts=RolloutTimeouts(agent=100))
    run(r.open())
    assert run(r.step()) is False
    assert [(e.type, e.message) for e in r.trace.errors] == [("TimeoutError", "socket read timed out")]


def test_b28_harness_io_timeout_inside_the_session_is_a_harness_error() -> None:
    async def io_timeout(ctx: HarnessContext) -> None:
        raise TimeoutError

    r = make_rollout(harness=ScriptedHarness(before_segment=io_timeout))
    run(r.open())
    run(r.step())
    assert [(e.type, e.message) for e in r.trace.errors] == [("HarnessError", "harness 'scripted' timed out")]


class ExitCode(ScriptedHarness):
    def __init__(self, code: int, stderr: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code, self.stderr = code, stderr

    async def launch(self, ctx: HarnessContext) -> ProgramResult:
        await super().launch(ctx)
        return ProgramResult(self.code, stdout="out", stderr=self.stderr)


def test_b26_non_zero_exit_is_a_harness_error_with_the_output_tail() -> None:
    r = make_rollout(harness=ExitCode(2, stderr="x" * 3000 + "Traceback: boom"))
    run(r.open())
    assert run(r.step()) is False
    (error,) = r.trace.errors
    assert error.type == "HarnessError"
    assert error.message.startswith("harness 'scripted' exited 2: ")
    assert error.message.endswith("Traceback: boom") and len(error.message) == 2000 + 29


def test_b26_dead_runtime_under_the_harness_is_a_sandbox_error() -> None:
    r = make_rollout(harness=ExitCode(137))
    run(r.open())
    r.runtime.alive_result = False  # type: ignore[union-attr]
    run(r.step())
    assert r.trace.errors[0].type == "SandboxError"
    assert r.trace.errors[0].message == "runtime died under harness 'scripted' (exit 137): out"


def test_b26_b29_exit_code_ignored_and_exceptions_clean_after_a_stop() -> None:
    model = ScriptedModel(default=Reply(tool_calls=[("noop", {})]))
    # The harness keeps asking; the 2nd call is refused; ScriptedHarness then exits 1.
    harness = ScriptedHarness(tools={"noop": lambda: "ok"})
    r = make_rollout(model=model, harness=harness, limits=RolloutLimits(max_turns=1))
    run(r.open())
    assert run(r.step()) is False
    assert r.trace.errors == [] and r.trace.stop_condition == "max_turns"

    class Crashes(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            ctx.trace.stop("done_early")
            raise RuntimeError("crash after the stop")  # Q9: swallowed

    r = make_rollout(harness=Crashes())
    run(r.open())
    assert run(r.step()) is False
    trace = run(r.close())
    assert (trace.errors, trace.ok, trace.stop_condition) == ([], True, "done_early")


def test_b30_intercepted_model_error_beats_the_harness_exit() -> None:
    r = make_rollout(model=ScriptedModel([ProviderError("upstream 503", 503)]))
    run(r.open())
    assert run(r.step()) is False
    (error,) = r.trace.errors
    assert (error.type, error.message, error.status_code) == ("ProviderError", "upstream 503", 503)
    assert error.traceback is None
    assert "harness 'scripted' exited 1" in repr(r.failure.__cause__)  # type: ignore[union-attr]


def test_b31_model_error_swallowed_by_the_harness_still_fails_the_run() -> None:
    harness = ScriptedHarness(on_provider_error="swallow")
    r = make_rollout(model=ScriptedModel([ProviderError("rate limited", 429)]), harness=harness)
    run(r.open())
    assert run(r.step()) is False
    assert [(e.type, e.status_code) for e in r.trace.errors] == [("ProviderError", 429)]


def test_b31_model_error_recovered_by_a_retry_does_not_fail_the_run() -> None:
    class Retrying(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            try:
                await ctx.client.chat(Request([UserMessage("hi")]))  # type: ignore[union-attr]
            except ProviderError:
                await ctx.client.chat(Request([UserMessage("hi")]))  # type: ignore[union-attr]
            return ProgramResult(0)

    r = make_rollout(model=ScriptedModel([ProviderError("blip", 502), "hello"]), harness=Retrying())
    run(r.open())
    assert run(r.step()) is True
    trace = run(r.close())
    assert trace.ok and trace.errors == [] and len(trace.calls) == 2


def test_b32_segment_without_a_turn_ends_the_exchange_without_stop_or_failure() -> None:
    class Idle(ScriptedHarness):
        async def launch(self, ctx: HarnessContext) -> ProgramResult:
            return ProgramResult(0)

    r = make_rollout(harness=Idle())
    run(r.open())
    assert run(r.step()) is False
    assert r.ok and r.trace.stop_condition is None and r.trace.errors == []


def test_b25_user_turns_intercepted_inside_the_segment() -> None:
    class Redacts(EchoTask):
        @intercept
        def redact(self, request: Request) -> Request:
            last = request.messages[-1]
            if isinstance(last, UserMessage) and "password" in str(last.content):
                return Request([*request.messages[:-1], UserMessage("[redacted]")], request.tools)
            return request

    model = ScriptedModel(default="noted")
    r = make_rollout(Redacts(PROMPTLESS), model=model, has_user=True)
    run(r.open())
    assert run(r.step([UserMessage("my password is hunter2")])) is True
    assert model.requests[0].messages == [UserMessage("[redacted]")]
    assert [x.handler for x in r.trace.request_rewrites] == ["redact"]


def test_b26_second_segment_resumes_with_the_users_messages() -> None:
    model = ScriptedModel(["first", "second"])
    r = interactive(model=model)
    run(r.open())
    assert run(r.step([UserMessage("a")])) is True
    assert run(r.step([UserMessage("b")])) is True
    assert [m.content for m in model.requests[1].messages] == ["a", "first", "b"]
    assert r.trace.num_branches == 1 and r.trace.num_turns == 2


def test_b24_cancelled_segment_is_still_charged() -> None:
    entered = asyncio.Event()

    async def work(ctx: HarnessContext) -> None:
        entered.set()
        await asyncio.sleep(50)

    r = make_rollout(harness=ScriptedHarness(before_segment=work), timeouts=RolloutTimeouts(agent=100))

    async def main() -> None:
        await r.open()
        task = asyncio.create_task(r.step())
        await entered.wait()
        await asyncio.sleep(7)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert r.remaining_agent_budget == pytest.approx(93)
    assert isinstance(r.runtime, MemoryRuntime)


def test_a_session_that_cannot_be_synced_fails_the_run() -> None:
    from rollout_ray import LocalInterception

    class Lost(LocalInterception):
        async def sync(self, session: Any) -> None:
            raise ConnectionError("interception actor died")

    r = make_rollout(interception=Lost())
    run(r.open())
    assert run(r.step()) is False
    assert [(e.type, e.message) for e in r.trace.errors] == [("ConnectionError", "interception actor died")]
