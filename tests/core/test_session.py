"""The model boundary: RolloutSession's pipeline, hooks and refusals (B35–B40, §5.2)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from rollout_ray import (
    AssistantMessage,
    LocalInterception,
    OverlongPromptError,
    ProviderError,
    Request,
    Response,
    RolloutLimits,
    RolloutSession,
    SessionConcluded,
    SystemMessage,
    TaskError,
    Tool,
    ToolCall,
    ToolMessage,
    Trace,
    TraceTask,
    TurnRefused,
    Unauthorized,
    Usage,
    UserMessage,
)
from rollout_ray._core.hooks import Hook
from rollout_ray.testing import Reply, ScriptedModel, run_virtual

USER = UserMessage("2+2?")


def session(model: ScriptedModel | None = None, **kwargs: Any) -> RolloutSession:
    trace = Trace(task=TraceTask(type="T"))
    return RolloutSession(trace, model or ScriptedModel(default="4"), **kwargs)


def hook(fn: Any) -> Hook:
    return Hook(fn.__name__, fn)


def chat(s: RolloutSession, *messages: Any, tools: list[Tool] | None = None) -> Response:
    return run_virtual(s.chat(Request(list(messages or [USER]), tools)))


def test_turn_commits_prompt_and_sampled_reply_with_usage() -> None:
    s = session(ScriptedModel([Reply("4", usage=Usage(5, 1))]))
    response = chat(s, SystemMessage("be brief"), USER)
    assert response.message.content == "4"
    assert [n.sampled for n in s.trace.nodes] == [False, False, True]
    assert [n.parent for n in s.trace.nodes] == [None, 0, 1]
    (call,) = s.trace.calls
    assert (call.node, call.usage, call.finish_reason, call.error) == (2, Usage(5, 1), "stop", None)
    assert call.model == "scripted" and call.time.duration >= 0


def test_second_turn_reuses_the_known_prefix() -> None:
    s = session()
    first = chat(s)
    chat(s, USER, first.message, UserMessage("and 3+3?"))
    assert len(s.trace.nodes) == 4 and s.trace.num_branches == 1 and s.trace.num_turns == 2


def test_released_session_answers_409_and_commits_nothing() -> None:
    s = session()
    s.release()
    with pytest.raises(SessionConcluded) as info:
        chat(s)
    assert (info.value.status_code, info.value.body) == (409, "rollout concluded")
    assert s.trace.nodes == [] and s.trace.calls == []


def test_release_during_sampling_never_commits_a_late_turn() -> None:
    s = session(ScriptedModel([Reply("4", delay=1.0)]))

    async def main() -> None:
        task = asyncio.create_task(s.chat(Request([USER])))
        await asyncio.sleep(0.5)
        s.release()
        with pytest.raises(SessionConcluded):
            await task

    run_virtual(main())
    assert s.trace.nodes == [] and s.trace.calls == []


def test_unknown_secret_is_401() -> None:
    with pytest.raises(Unauthorized) as info:
        run_virtual(LocalInterception().chat("nope", Request([USER])))
    assert info.value.status_code == 401


def test_b35_limit_refuses_with_400_and_its_name() -> None:
    s = session(limits=RolloutLimits(max_turns=1))
    chat(s)
    with pytest.raises(TurnRefused) as info:
        chat(s)
    assert (info.value.status_code, info.value.body) == (400, "rollout stopped: max_turns")
    assert s.trace.stop_condition == "max_turns" and len(s.trace.calls) == 1


def test_b36_trace_stop_after_limits_and_by_name() -> None:
    def long_enough(trace: Trace) -> bool:
        return trace.num_turns >= 1

    s = session(trace_stops=[hook(long_enough)], limits=RolloutLimits(max_turns=1))
    chat(s)
    with pytest.raises(TurnRefused, match=r"^rollout stopped: max_turns$"):
        chat(s)
    s = session(trace_stops=[hook(long_enough)])
    chat(s)
    with pytest.raises(TurnRefused, match=r"^rollout stopped: long_enough$"):
        chat(s)
    assert s.trace.stop_condition == "long_enough"


def test_b36_non_bool_trace_stop_is_a_stashed_task_error() -> None:
    def sloppy(trace: Trace) -> Any:
        return "yes"

    s = session(trace_stops=[hook(sloppy)])
    with pytest.raises(TaskError, match=r"^@stop must return bool, got str$"):
        chat(s)
    assert isinstance(s.error, TaskError) and s.trace.calls == []


def upper(request: Request) -> Request:
    last = request.messages[-1]
    request.messages[-1] = msgspec.structs.replace(last, content=str(last.content).upper())
    return request


def test_b37_interceptor_rewrites_new_user_message_and_is_recorded() -> None:
    model = ScriptedModel(default="ok")
    s = session(model, request_interceptors=[hook(upper)])
    chat(s, UserMessage("shout"))
    assert model.requests[0].messages == [UserMessage("SHOUT")]
    assert [r.handler for r in s.trace.request_rewrites] == ["upper"]
    assert s.trace.nodes[0].message == UserMessage("SHOUT")


def test_b37_interceptor_gets_a_copy_and_none_means_unchanged() -> None:
    def meddle(request: Request) -> None:
        request.messages.clear()

    model = ScriptedModel(default="ok")
    s = session(model, request_interceptors=[hook(meddle)])
    chat(s)
    assert model.requests[0].messages == [USER] and s.trace.request_rewrites == []


def _add(r: Request) -> Request:
    return Request([*r.messages, UserMessage("x")], r.tools)


def _tools(r: Request) -> Request:
    return Request(r.messages, [Tool("evil")])


def _old(r: Request) -> Request:
    return Request([UserMessage("changed"), *r.messages[1:]], r.tools)


def _assistant(r: Request) -> Request:
    return Request([*r.messages[:-1], AssistantMessage("hi")], r.tools)


def _tool_id(r: Request) -> Request:
    return Request([*r.messages[:-1], ToolMessage("other", "4")], r.tools)


def _not_request(r: Request) -> Any:
    return "text"


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_add, "ValueError: cannot add or remove messages"),
        (_tools, "ValueError: cannot rewrite tools"),
        (_old, "ValueError: can only rewrite new user or tool messages"),
        (_assistant, "TypeError: cannot change a message's type"),
        (_tool_id, "ValueError: cannot change a tool message's tool_call_id"),
        (_not_request, "TypeError: interceptor must return a Request or None, got str"),
    ],
)
def test_b37_what_an_interceptor_may_not_rewrite(fn: Any, message: str) -> None:
    model = ScriptedModel(default="ok")
    s = session(model)
    first = chat(s)
    s.request_interceptors = [hook(fn)]
    call = ToolCall("c1", "add", "{}")
    answered = AssistantMessage(None, tool_calls=[call])
    with pytest.raises(TaskError) as info:
        chat(s, USER, first.message, answered, ToolMessage("c1", "4"))
    assert str(info.value) == f"request interception failed: {message}"
    assert s.error is info.value and len(model.requests) == 1


def test_b37_interceptor_exception_becomes_task_error() -> None:
    def broken(request: Request) -> Request:
        raise KeyError("k")

    s = session(request_interceptors=[hook(broken)])
    with pytest.raises(TaskError, match=r"^request interception failed: KeyError: 'k'$"):
        chat(s)
    assert s.trace.calls == []


def test_b38_request_stop_commits_the_prompt_then_refuses() -> None:
    def forbidden(request: Request) -> bool:
        return "secret" in str(request.messages[-1].content)

    model = ScriptedModel(default="ok")
    s = session(model, request_interceptors=[hook(upper)], request_stops=[hook(forbidden)])
    chat(s, UserMessage("a secret"), tools=[Tool("calc")])
    # The stop saw the rewritten request: "A SECRET" has no lowercase "secret".
    assert s.trace.stop_condition is None and len(model.requests) == 1

    s = session(model, request_stops=[hook(forbidden)])
    with pytest.raises(TurnRefused):
        chat(s, UserMessage("a secret"), tools=[Tool("calc")])
    assert [n.sampled for n in s.trace.nodes] == [False]
    assert s.trace.tools == [Tool("calc")] and s.trace.calls == []
    assert s.trace.stop_condition == "forbidden"


def test_b38_non_bool_request_stop_is_task_error() -> None:
    def sloppy(request: Request) -> Any:
        return 1

    s = session(request_stops=[hook(sloppy)])
    with pytest.raises(TaskError, match=r"^request interception failed: TypeError: @stop must return bool, got int$"):
        chat(s)


def polite(response: Response) -> Response:
    return Response(AssistantMessage("please"), "length", response.usage, response.model)


def test_b39_response_rewrite_forces_stop_and_is_recorded() -> None:
    s = session(ScriptedModel([Reply("rude", finish_reason="length")]), response_interceptors=[hook(polite)])
    response = chat(s)
    assert (response.message.content, response.finish_reason) == ("please", "stop")
    assert s.trace.nodes[-1].message == AssistantMessage("please")
    assert [r.handler for r in s.trace.response_rewrites] == ["polite"]


def _tool_reply(r: Response) -> Response:
    return Response(AssistantMessage("x", tool_calls=[ToolCall("1", "f")]), r.finish_reason, r.usage, r.model)


def _usage(r: Response) -> Response:
    return Response(AssistantMessage("x"), r.finish_reason, Usage(99, 99), r.model)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_tool_reply, "ValueError: must return an inert text-only message"),
        (_usage, "ValueError: can only replace the assistant message"),
    ],
)
def test_b39_invalid_response_rewrite_fails_the_call_without_commit(fn: Any, message: str) -> None:
    s = session(response_interceptors=[hook(fn)])
    with pytest.raises(TaskError) as info:
        chat(s)
    assert str(info.value) == f"response interception failed: {message}"
    (call,) = s.trace.calls
    assert call.node is None and call.error is not None and call.error.type == "TaskError"
    assert s.trace.nodes == [] and s.error is info.value


def test_b40_response_stop_commits_the_turn_then_refuses() -> None:
    def answered(response: Response) -> bool:
        return response.message.content == "please"

    s = session(response_interceptors=[hook(polite)], response_stops=[hook(answered)])
    with pytest.raises(TurnRefused, match=r"^rollout stopped: answered$"):
        chat(s)
    assert s.trace.num_turns == 1 and s.trace.calls[0].node == 1
    assert [r.handler for r in s.trace.response_rewrites] == ["polite"]
    assert s.trace.stop_condition == "answered"


def test_provider_error_is_stashed_with_status_and_recorded_on_the_call() -> None:
    s = session(ScriptedModel([ProviderError("overloaded", 429), "4"]))
    with pytest.raises(ProviderError):
        chat(s)
    assert isinstance(s.error, ProviderError) and s.error.status_code == 429
    assert s.trace.calls[0].error is not None and s.trace.calls[0].error.status_code == 429
    chat(s)  # a retry that reaches the model clears the stash (B31)
    assert s.error is None and s.trace.num_turns == 1 and len(s.trace.calls) == 2


def test_overlong_prompt_is_a_clean_context_length_stop() -> None:
    s = session(ScriptedModel([OverlongPromptError("prompt too long", 400)]))
    with pytest.raises(TurnRefused, match=r"^rollout stopped: context_length$"):
        chat(s)
    assert s.trace.stop_condition == "context_length" and s.error is None
    assert s.trace.errors == [] and s.trace.calls[0].node is None


def test_model_and_sampling_are_forced_on_every_request() -> None:
    seen: list[Any] = []

    class Spy(ScriptedModel):
        async def complete(self, request: Request, *, model: Any, sampling: Any) -> Response:
            seen.append((model, sampling))
            return await super().complete(request, model=model, sampling=sampling)

    s = session(Spy(default="4"), model_name="m1", sampling={"temperature": 0.5})
    chat(s)
    assert seen == [("m1", {"temperature": 0.5})]
    assert (s.trace.calls[0].model, s.trace.calls[0].sampling) == ("m1", {"temperature": 0.5})


def test_a_model_client_bug_is_recorded_on_the_call_but_not_stashed() -> None:
    from rollout_ray import UpstreamError

    s = session(ScriptedModel([RuntimeError("socket closed")]))
    with pytest.raises(UpstreamError, match=r"^model client failed: RuntimeError: socket closed$"):
        chat(s)
    (call,) = s.trace.calls
    assert call.error is not None and call.error.type == "UpstreamError" and s.error is None


def test_only_sampling_fields_are_recorded_on_the_call() -> None:
    s = session()
    run_virtual(s.chat(Request([USER]), {"temperature": 0.5, "tool_choice": "none", "user": "u"}))
    assert s.trace.calls[0].sampling == {"temperature": 0.5}


def test_hooks_are_named_after_their_function() -> None:
    from rollout_ray import Task, stop

    def turn_cap(n: int) -> Any:
        def cap(trace: Trace) -> bool:
            return trace.num_turns >= n

        return cap

    class Capped(Task):
        one_turn = stop(turn_cap(1))

    from rollout_ray._core.hooks import classify

    (hook,) = classify(Capped({"prompt": "x"}))["trace_stops"]
    assert hook.name == "cap"
