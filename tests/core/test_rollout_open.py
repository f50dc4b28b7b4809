"""Rollout construction and open() (B1–B19)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from rollout_ray import (
    HarnessError,
    LocalInterception,
    Request,
    Rollout,
    RolloutTimeouts,
    TaskError,
    ToolsetError,
    Trace,
    intercept,
    reward,
)
from rollout_ray.testing import MemoryRuntime, ScriptedHarness, ScriptedModel

from conftest import EchoTask, make_rollout, run


def test_b1_trace_minted_at_construction_and_shown_to_on_trace() -> None:
    seen: list[Trace] = []
    task = EchoTask({"prompt": "hi", "idx": 7})
    r = make_rollout(task, on_trace=seen.append)
    assert seen == [r.trace]
    t = r.trace
    assert len(t.id) == 32 and int(t.id, 16) >= 0
    assert (t.task.type, t.task.key, t.task.hash, t.task.idx) == ("EchoTask", task.key, task.hash, 7)
    assert t.task.data["prompt"] == "hi"
    assert (t.ok, t.is_completed, t.timing.start > 0) == (False, False, True)


def test_b2_b3_budget_and_ownership_decided_at_construction() -> None:
    owned = make_rollout(timeouts=RolloutTimeouts(agent=30))
    assert (owned.owns_runtime, owned.remaining_agent_budget) == (True, 30)
    borrowed = make_rollout(runtime=MemoryRuntime())
    assert (borrowed.owns_runtime, borrowed.remaining_agent_budget) == (False, None)


def test_b3_a_rollout_with_no_runtime_and_no_factory_is_refused_before_minting() -> None:
    minted: list[Any] = []
    with pytest.raises(TypeError, match=r"^Rollout needs runtime= .* or runtime_factory= .*LocalRuntime\)$"):
        Rollout(EchoTask({"prompt": "hi"}), ScriptedHarness(), model=ScriptedModel(default="x"), on_trace=minted.append)
    assert minted == []  # no orphaned trace (Q1)


def test_b8_owned_runtime_is_named_after_the_trace_and_started() -> None:
    r = make_rollout()
    assert run(r.open()) is True
    assert isinstance(r.runtime, MemoryRuntime) and r.runtime.name == r.trace.id
    assert r.runtime.start_calls == 1
    assert r.trace.agent.runtime is not None and r.trace.agent.runtime.borrowed is False
    run(r.close())


def test_b8_borrowed_runtime_already_stopped_raises_to_the_caller() -> None:
    runtime = MemoryRuntime("pool-1")
    run(runtime.start())
    run(runtime.stop())
    r = make_rollout(runtime=runtime)
    with pytest.raises(ValueError, match=r"^borrowed runtime 'pool-1' was already torn down"):
        run(r.open())
    assert r.trace.errors == [] and r.trace.ok is False


def test_b10_borrowed_runtime_is_not_started_again() -> None:
    runtime = MemoryRuntime("pool-1")
    run(runtime.start())
    r = make_rollout(runtime=runtime)
    assert run(r.open()) is True
    assert runtime.start_calls == 1 and r.trace.agent.runtime.borrowed is True  # type: ignore[union-attr]
    run(r.close())


def test_b9_no_prompt_and_no_user_fails_before_the_runtime_starts() -> None:
    r = make_rollout(EchoTask({"prompt": None}))
    assert run(r.open()) is False
    assert r.runtime.start_calls == 0  # type: ignore[union-attr]
    (error,) = r.trace.errors
    assert (error.type, error.message) == (
        "TaskError",
        "task 0 has no prompt and no user to open the conversation",
    )
    assert make_rollout(EchoTask({"prompt": None}), has_user=True) is not None
    assert run(make_rollout(EchoTask({"prompt": None}), has_user=True).open()) is True


class SlowSetup(EchoTask):
    setup_seconds = 0.0

    async def setup(self, trace: Trace, runtime: Any) -> None:
        await asyncio.sleep(self.setup_seconds)


def _setup_rollout(task_s: float, harness_s: float, limit: float) -> Any:
    task = SlowSetup({"prompt": "hi"})
    task.setup_seconds = task_s
    harness = ScriptedHarness(setup=lambda runtime: asyncio.sleep(harness_s))
    return make_rollout(task, harness=harness, timeouts=RolloutTimeouts(setup=limit))


@pytest.mark.parametrize(
    ("task_s", "harness_s", "error"),
    [
        (2, 2, ("HarnessError", "harness setup timed out")),  # 2 + 2 > 3: the harness is late
        (4, 0, ("TaskError", "task setup timed out")),
        (1, 1, None),
    ],
)
def test_b11_task_and_harness_setup_share_one_deadline(task_s: float, harness_s: float, error: Any) -> None:
    r = _setup_rollout(task_s, harness_s, limit=3)
    assert run(r.open()) is (error is None)
    assert [(e.type, e.message) for e in r.trace.errors] == ([error] if error else [])


def test_b11_setup_exception_is_attributed_to_its_side() -> None:
    class Broken(EchoTask):
        def setup(self, runtime: Any) -> None:
            raise OSError("disk full")

    r = make_rollout(Broken({"prompt": "hi"}))
    assert run(r.open()) is False
    assert r.trace.errors[0].message == "task setup failed: OSError: disk full"


def test_b12_toolset_construction_failure_is_a_toolset_error() -> None:
    class Tools(EchoTask):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            raise ImportError("no module named calc")

    r = make_rollout(Tools({"prompt": "hi"}))
    assert run(r.open()) is False
    assert r.trace.errors[0].type == "ToolsetError"
    assert r.trace.errors[0].message == "building tool servers failed: ImportError: no module named calc"


def test_b13_tools_declared_without_a_tool_server_fail_loudly() -> None:
    class Tools(EchoTask):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return ["calc"]

    r = make_rollout(Tools({"prompt": "hi"}))
    assert run(r.open()) is False
    assert r.trace.errors[0].type == ToolsetError.__name__


class RecordingRuntime(MemoryRuntime):
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.calls: list[Any] = []

    async def prepare_setup(self) -> None:
        self.calls.append("prepare_setup")

    async def prepare_execution(self, routes: Sequence[str] | None) -> None:
        self.calls.append(("prepare_execution", list(routes or [])))


def test_b13_b14_services_then_execution_policy_keeps_framework_routes() -> None:
    @asynccontextmanager
    async def tool_server(toolsets: list[Any], runtime: Any, state_secret: str, **kw: Any) -> Any:
        assert state_secret
        yield {"calc": "http://127.0.0.1:9/calc"}

    class Tools(EchoTask):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return ["calc"]

    r = make_rollout(Tools({"prompt": "hi"}), runtime_factory=RecordingRuntime, tool_server=tool_server)
    assert run(r.open()) is True
    endpoint = LocalInterception.base_url + "/v1"
    assert r.runtime.calls == [  # type: ignore[union-attr]
        "prepare_setup",
        ("prepare_execution", [endpoint, "http://127.0.0.1:9/calc"]),
    ]
    assert r.harness_session is not None
    assert r.harness_session.ctx.endpoint == endpoint
    assert r.harness_session.ctx.tool_urls == {"calc": "http://127.0.0.1:9/calc"}
    run(r.close())


class Shouting(EchoTask):
    @intercept
    def shout(self, request: Request) -> Request:
        messages = [
            msgspec.structs.replace(m, content=str(m.content).upper()) if m.role == "user" else m  # type: ignore[union-attr]
            for m in request.messages
        ]
        return Request(messages, request.tools)


def test_b15_initial_prompt_rewritten_once_and_task_data_kept() -> None:
    model = ScriptedModel(default="ok")
    r = make_rollout(Shouting({"prompt": "hi", "system_prompt": "be kind"}), model=model)
    assert run(r.open()) is True
    assert [x.handler for x in r.trace.request_rewrites] == ["shout"]
    assert r.harness_session.ctx.data.prompt == "HI"  # type: ignore[union-attr]
    assert r.harness_session.ctx.data.system_prompt == "be kind"  # type: ignore[union-attr]
    assert r.trace.task.data["prompt"] == "hi"
    assert run(r.step()) is True
    # The harness sent the rewritten prompt; it was not intercepted a second time.
    assert [m.content for m in model.requests[0].messages] == ["be kind", "HI"]
    assert len(r.trace.request_rewrites) == 1
    run(r.close())


def test_b15_system_prompt_folded_when_the_harness_cannot_append_it() -> None:
    class NoSystem(ScriptedHarness):
        appends_system_prompt = False

    r = make_rollout(EchoTask({"prompt": "hi", "system_prompt": "be kind"}), harness=NoSystem())
    run(r.open())
    data = r.harness_session.ctx.data  # type: ignore[union-attr]
    assert (data.system_prompt, data.prompt) == (None, "be kind\n\nhi")
    run(r.close())


class StopsInSetup(EchoTask):
    async def setup(self, trace: Trace) -> None:
        trace.stop("nothing_to_do")

    @reward
    def scored(self) -> float:
        return 1.0


def test_b16_b19_stop_during_setup_returns_false_without_failure_and_is_scored() -> None:
    r = make_rollout(StopsInSetup({"prompt": "hi"}))
    assert run(r.open()) is False
    assert r.harness_session is None and r.trace.errors == []
    trace = run(r.close())
    assert (trace.ok, trace.stop_condition, trace.reward) == (True, "nothing_to_do", 1.0)


def test_b17_failed_open_keeps_services_until_close() -> None:
    interception = LocalInterception()

    class FailingRuntime(MemoryRuntime):
        async def prepare_execution(self, routes: Any) -> None:
            raise RuntimeError("policy daemon down")

    r = make_rollout(runtime_factory=FailingRuntime, interception=interception)
    assert run(r.open()) is False
    assert interception.load == 1  # Q14: the caller must still close
    assert r.trace.errors[0].message == "policy daemon down"
    run(r.close())
    assert interception.load == 0


def test_b18_cancellation_mid_setup_aborts_releases_and_reraises() -> None:
    interception = LocalInterception()
    entered = asyncio.Event()

    class Hangs(EchoTask):
        async def setup(self) -> None:
            entered.set()
            await asyncio.Event().wait()

    r = make_rollout(Hangs({"prompt": "hi"}), interception=interception)

    async def main() -> None:
        task = asyncio.create_task(r.open())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert r.runtime.stop_calls == 1 and r.runtime.stopped  # type: ignore[union-attr]
    assert r.trace.is_completed is False and r.trace.errors == []
    assert run(r.close()) is r.trace and r.trace.is_completed is False


def test_b7_b19_spans_of_a_successful_open() -> None:
    r = make_rollout()
    run(r.open())
    timing = r.trace.timing
    assert 0 < timing.boot.start <= timing.boot.end == timing.setup.start <= timing.setup.end
    assert timing.agent.start == timing.setup.end and timing.agent.end == 0
    run(r.close())


def test_b7_boot_span_started_even_when_open_fails() -> None:
    r = make_rollout(EchoTask({"prompt": None}))
    run(r.open())
    assert r.trace.timing.boot.start > 0 and r.trace.timing.boot.end == 0
    trace = run(r.close())
    assert trace.timing.boot.end >= trace.timing.boot.start  # B45: closed at close time
    assert trace.timing.setup.start == 0 and trace.timing.setup.end == 0


def test_b16_harness_session_open_failure_is_a_harness_error() -> None:
    class Broken(ScriptedHarness):
        def session(self, ctx: Any) -> Any:
            raise ConnectionError("acp socket refused")

    r = make_rollout(harness=Broken())
    assert run(r.open()) is False
    assert r.trace.errors[0].message == ("opening harness session failed: ConnectionError: acp socket refused")
    assert HarnessError.__name__ == r.trace.errors[0].type
    assert TaskError is not HarnessError


def test_b16_tool_interception_url_only_when_the_harness_supports_it_and_hooks_exist() -> None:
    class Intercepting(ScriptedHarness):
        supports_tool_interception = True

    def url_of(task: EchoTask, harness: ScriptedHarness) -> Any:
        r = make_rollout(task, harness=harness)
        run(r.open())
        url = r.harness_session.ctx.tool_interception_url  # type: ignore[union-attr]
        run(r.close())
        return url

    hooked = Shouting({"prompt": "hi"})
    assert url_of(hooked, Intercepting()) == LocalInterception.base_url + "/tool"
    assert url_of(hooked, ScriptedHarness()) is None
    assert url_of(EchoTask({"prompt": "hi"}), Intercepting()) is None


def test_b15_the_prompts_own_system_message_survives_interception() -> None:
    class Noop(EchoTask):
        @intercept
        def look(self, request: Request) -> None:
            return None

    model = ScriptedModel(default="ok")
    prompt = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]
    r = make_rollout(Noop({"prompt": prompt}), model=model)
    run(r.run())
    assert [m.role for m in model.requests[0].messages] == ["system", "user"]


@pytest.mark.parametrize("policy", [{"network_allow": []}, {"network_block": ["example.com"]}])
def test_b6_a_network_policy_on_a_runtime_that_cannot_enforce_it_warns(
    policy: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    rollout = make_rollout(EchoTask({"prompt": "hi", **policy}))
    trace = run(rollout.run())
    assert trace.ok  # a warning, not a failure: the runtime still runs the agent
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "asks for a network policy" in warning.getMessage() and "'memory'" in warning.getMessage()


def test_b6_no_policy_asked_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    rollout = make_rollout(EchoTask({"prompt": "hi", "network_allow": ["*"]}))
    assert run(rollout.run()).ok
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_b6_a_runtime_that_enforces_the_network_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    class Enforcing(MemoryRuntime):
        enforces = frozenset({"network"})

    rollout = make_rollout(EchoTask({"prompt": "hi", "network_allow": []}), runtime_factory=Enforcing)
    assert run(rollout.run()).ok
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
