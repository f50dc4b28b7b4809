"""ChatHarness and ProgramHarness in full rollouts over real HTTP (proxy + tool server)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from calc_taskset import ArithWithDiv

from rollout_ray import (
    AssistantMessage,
    HarnessContext,
    LocalRuntime,
    ProviderError,
    Reward,
    Rollout,
    RolloutLimits,
    SystemMessage,
    Task,
    ToolCall,
    ToolMessage,
    ToolServer,
    Trace,
    TraceTask,
    UserMessage,
)
from rollout_ray._harnesses.chat import ChatHarness
from rollout_ray._harnesses.program import ProgramHarness
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray.testing import Reply, ScriptedModel

AGENT = [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "agent_program.py")]
ADD = Reply(tool_calls=[("add", {"a": 1, "b": 2})])


class Chat(Task):
    """No tools, no rewards."""


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


def rollout_run(task: Task, harness: Any, model: ScriptedModel, **kwargs: Any) -> Trace:
    async def main() -> Trace:
        async with HTTPInterception() as proxy, ToolServer() as tools:
            kwargs.setdefault("tool_server", tools.serve)
            kwargs.setdefault("runtime_factory", LocalRuntime)
            interception = None if harness.in_process else proxy  # an in-process harness takes none
            return await Rollout(task, harness, model=model, interception=interception, **kwargs).run()

    return run(main)


def interaction(harness: Any, model: ScriptedModel, turns: list[str]) -> tuple[list[bool], Trace]:
    """A prompt-less rollout driven by a user: one step per turn, in one event loop."""

    async def main() -> tuple[list[bool], Trace]:
        async with HTTPInterception() as proxy:
            rollout = Rollout(
                Chat({"system_prompt": "Be brief."}),
                harness,
                model=model,
                interception=None if harness.in_process else proxy,
                has_user=True,
                runtime_factory=LocalRuntime,
            )
            assert await rollout.open()
            progressed = [await rollout.step([UserMessage(text)]) for text in turns]
            return progressed, await rollout.close()

    return run(main)


def assert_tool_rollout(trace: Trace, model: ScriptedModel) -> None:
    call = ToolCall("call_2_0", "add", '{"a": 1, "b": 2}')
    assert trace.errors == []
    assert (trace.ok, trace.stop_condition, trace.num_turns) == (True, "agent_completed", 2)
    assert trace.messages == [
        SystemMessage("Add."),
        UserMessage("1+2?"),
        AssistantMessage(tool_calls=[call]),
        ToolMessage("call_2_0", "3", "add"),
        AssistantMessage("3"),
    ]
    assert [t.name for t in trace.tools] == ["add", "div"]
    assert [t.name for t in model.requests[0].tools or []] == ["add", "div"]
    assert trace.rewards == {"correct": Reward(1.0)}
    assert trace.reward == 1.0


# -- ChatHarness ----------------------------------------------------------------------------


TRANSPORTS = pytest.mark.parametrize("transport", ["inprocess", "http"])


@TRANSPORTS
def test_chat_harness_rollout_with_a_tool(transport: Any) -> None:
    model = ScriptedModel([ADD, "3"])

    async def main() -> Trace:
        async with HTTPInterception() as proxy, ToolServer() as tools:
            rollout = Rollout(
                ArithWithDiv({"prompt": "1+2?", "system_prompt": "Add."}),
                ChatHarness(transport=transport),
                model=model,
                interception=None if transport == "inprocess" else proxy,
                tool_server=tools.serve,
                runtime_factory=LocalRuntime,
            )
            trace = await rollout.run()
            assert tools._registrations == {}  # unregistered when the rollout closed (or never made)
            return trace

    trace = run(main)
    assert_tool_rollout(trace, model)
    # Every tool call is recorded on the trace.
    calls = [(r.server, r.name, r.arguments, r.ok) for r in trace.tool_calls]
    assert calls == [("calc", "add", '{"a":1,"b":2}', True)]


def test_chat_harness_streaming() -> None:
    model = ScriptedModel([ADD, "3"])
    trace = rollout_run(
        ArithWithDiv({"prompt": "1+2?", "system_prompt": "Add."}), ChatHarness(stream=True, transport="http"), model
    )
    assert_tool_rollout(trace, model)


@TRANSPORTS
def test_chat_harness_resume_with_user_turns(transport: Any) -> None:
    model = ScriptedModel(["hello", "bye"])
    progressed, trace = interaction(ChatHarness(transport=transport), model, ["hi", "more"])
    assert progressed == [True, True]
    assert trace.ok and trace.num_turns == 2 and trace.num_branches == 1
    conversation = [
        SystemMessage("Be brief."),
        UserMessage("hi"),
        AssistantMessage("hello"),
        UserMessage("more"),
        AssistantMessage("bye"),
    ]
    assert trace.messages == conversation
    assert [r.messages for r in model.requests] == [conversation[:2], conversation[:4]]


@TRANSPORTS
def test_chat_harness_limit_stops_cleanly_and_is_scored(transport: Any) -> None:
    model = ScriptedModel(default=ADD)
    trace = rollout_run(
        ArithWithDiv({"prompt": "1+2?"}), ChatHarness(transport=transport), model, limits=RolloutLimits(max_turns=1)
    )
    assert (trace.ok, trace.stop_condition, trace.num_turns, trace.errors) == (True, "max_turns", 1, [])
    assert len(model.requests) == 1  # the second call was refused before the model
    assert trace.rewards == {"correct": Reward(0.0)}


@TRANSPORTS
def test_chat_harness_retries_provider_errors(transport: Any) -> None:
    model = ScriptedModel([ProviderError("busy", 503), "hello"])
    trace = rollout_run(Chat({"prompt": "hi"}), ChatHarness(backoff=0.0, transport=transport), model)
    assert (trace.ok, trace.stop_condition, trace.num_turns, trace.errors) == (True, "agent_completed", 1, [])
    assert [(c.error.type, c.error.message, c.error.status_code) if c.error else None for c in trace.calls] == [
        ("ProviderError", "busy", 503),
        None,
    ]
    assert trace.last_reply == "hello"


@TRANSPORTS
def test_chat_harness_gives_up_after_retries(transport: Any) -> None:
    model = ScriptedModel([ProviderError("busy", 503)] * 3)
    trace = rollout_run(Chat({"prompt": "hi"}), ChatHarness(retries=2, backoff=0.0, transport=transport), model)
    assert not trace.ok and len(trace.calls) == 3
    # the stashed provider error beats the harness exit (B30)
    assert [(e.type, e.message) for e in trace.errors] == [("ProviderError", "busy")]


def test_chat_harness_wire_retry_headers_and_errors() -> None:
    """Against a bare endpoint: bearer, retry counter header, then a non-retryable error."""
    seen: list[tuple[str | None, str | None]] = []
    statuses = [503, 429, 200, 401]

    async def completions(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), request.headers.get("x-stainless-retry-count")))
        status = statuses.pop(0)
        if status != 200:
            return web.json_response({"error": {"message": f"nope {status}"}}, status=status)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    async def main() -> tuple[Any, Any]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ctx = HarnessContext(
            trace=Trace(task=TraceTask(type="T")),
            runtime=None,  # type: ignore[arg-type]
            endpoint=f"http://127.0.0.1:{port}/v1",
            secret="s3cret",
            data=Chat({"prompt": "hi"}).data,
        )
        try:
            harness = ChatHarness(retries=2, backoff=0.0, transport="http")
            return await harness.launch(ctx), await harness.launch(ctx)
        finally:
            await runner.cleanup()

    first, second = run(main)
    assert (first.exit_code, first.stdout) == (0, "ok")
    assert (second.exit_code, second.stderr) == (1, "model call failed with 401: nope 401")
    assert seen == [("Bearer s3cret", None), ("Bearer s3cret", "1"), ("Bearer s3cret", "2"), ("Bearer s3cret", None)]


@pytest.mark.parametrize(
    "harness",
    [ChatHarness(), ChatHarness(transport="http"), ProgramHarness(AGENT)],
    ids=["chat", "chat-http", "program"],
)
def test_tool_errors_are_shown_to_the_model(harness: Any) -> None:
    model = ScriptedModel(
        [Reply(tool_calls=[("add", {"a": "x", "b": 1}), ("div", {"a": 1, "b": 0}), ("nope", {})]), "sorry"]
    )
    trace = rollout_run(ArithWithDiv({"prompt": "1+2?"}), harness, model)
    assert (trace.ok, trace.num_turns, trace.errors) == (True, 2, [])
    assert [(m.name, m.content) for m in trace.tool_messages] == [
        (
            "add",
            "error: invalid arguments for tool 'add': a: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        ("div", "ZeroDivisionError: division by zero"),
        ("nope", "error: unknown tool 'nope'"),
    ]


# -- ProgramHarness -------------------------------------------------------------------------


def test_program_harness_runs_the_agent_program_with_tools() -> None:
    model = ScriptedModel([ADD, "3"])
    trace = rollout_run(ArithWithDiv({"prompt": "1+2?", "system_prompt": "Add."}), ProgramHarness(AGENT), model)
    assert_tool_rollout(trace, model)


def test_program_harness_nonzero_exit_is_a_harness_error() -> None:
    harness = ProgramHarness([sys.executable, "-c", "import sys; print('out'); sys.exit('boom')"])
    trace = rollout_run(Chat({"prompt": "hi"}), harness, ScriptedModel(default="x"))
    assert (trace.ok, trace.stop_condition) == (False, "error")
    assert [(e.type, e.message) for e in trace.errors] == [("HarnessError", "harness 'program' exited 1: boom\n")]


def test_program_harness_timeout() -> None:
    harness = ProgramHarness(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"], timeout=0.3
    )
    trace = rollout_run(Chat({"prompt": "hi"}), harness, ScriptedModel(default="x"))
    assert [(e.type, e.message) for e in trace.errors] == [
        ("HarnessError", "harness 'program' timed out after 0.3s: started\n")
    ]


def test_program_harness_limit_stops_cleanly() -> None:
    model = ScriptedModel(default=ADD)
    trace = rollout_run(
        ArithWithDiv({"prompt": "1+2?"}), ProgramHarness(AGENT), model, limits=RolloutLimits(max_turns=1)
    )
    assert (trace.ok, trace.stop_condition, trace.num_turns, trace.errors) == (True, "max_turns", 1, [])
    assert trace.rewards == {"correct": Reward(0.0)}


def test_program_harness_resume_with_user_turns() -> None:
    model = ScriptedModel(["hello", "bye"])
    progressed, trace = interaction(ProgramHarness(AGENT), model, ["hi", "more"])
    assert progressed == [True, True]
    assert trace.ok and trace.num_turns == 2 and trace.num_branches == 1
    conversation = [
        SystemMessage("Be brief."),
        UserMessage("hi"),
        AssistantMessage("hello"),
        UserMessage("more"),
        AssistantMessage("bye"),
    ]
    assert trace.messages == conversation
    assert [r.messages for r in model.requests] == [conversation[:2], conversation[:4]]


def test_program_harness_environment_and_input_file() -> None:
    script = (
        "import json, os\n"
        "print(json.dumps({k: os.environ[k] for k in ('OPENAI_BASE_URL', 'OPENAI_API_KEY', "
        "'ROLLOUT_RAY_TOOLS', 'ROLLOUT_RAY_INPUT', 'EXTRA')}))\n"
        "print(open(os.environ['ROLLOUT_RAY_INPUT']).read())\n"
    )
    seen: list[str] = []

    class Spy(ProgramHarness):
        async def launch(self, ctx: HarnessContext) -> Any:
            result = await super().launch(ctx)
            seen.extend([result.stdout, ctx.endpoint, ctx.secret, msgspec.json.encode(ctx.tool_urls).decode()])
            return result

    trace = rollout_run(
        ArithWithDiv({"prompt": "1+2?"}),
        Spy([sys.executable, "-c", script], env={"EXTRA": "1"}),
        ScriptedModel(default="x"),
    )
    assert trace.errors == []
    stdout, endpoint, secret, tools = seen
    env_line, input_line = stdout.splitlines()
    env = msgspec.json.decode(env_line)
    assert env["OPENAI_BASE_URL"] == endpoint and endpoint.endswith("/v1")
    assert env["OPENAI_API_KEY"] == secret and env["EXTRA"] == "1"
    assert msgspec.json.decode(env["ROLLOUT_RAY_TOOLS"]) == msgspec.json.decode(tools)
    assert list(msgspec.json.decode(env["ROLLOUT_RAY_TOOLS"])) == ["calc"]
    assert env["ROLLOUT_RAY_INPUT"].startswith(f".rollout_ray/{trace.id}/input-")
    assert msgspec.json.decode(input_line) == {"messages": [{"role": "user", "content": "1+2?"}]}
