"""Token in, token out on the simulated model (issue 22 §2): with the scale-out routes, a turn's
prompt is the previous turn's prompt and sampled ids plus the ids of only the new messages, so
a multi-turn tool rollout is one training sequence even where the template re-tokenizes a
reply (``template_drift``); the harness still speaks Chat Completions."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import msgspec
import pytest

from rollout_ray import Request, RolloutSession, SystemMessage, Tool, ToolMessage, Trace, TraceTask, UserMessage
from rollout_ray._core.model import CallContext
from rollout_ray._record.openai_codec import encode_request
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import IM_END, decode, encode

CALC = Tool("calc", "Evaluate arithmetic.", {"type": "object", "properties": {"expression": {"type": "string"}}})


async def tool_rollout(
    scale_out: bool, drift: bool = True, stream: bool = False, token_in: Any = "auto"
) -> tuple[Trace, list[Any], SimulatedModelServer]:
    """A calculator call, its result reported, then an answer to "Go on.": three turns."""
    config = SimulatedModelConfig(ttft=0, template_drift=drift, scale_out=scale_out, policy_version=2)
    async with SimulatedModelServer(config) as server:
        assert server.base_url is not None
        model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm", stream=stream, token_in=token_in)
        try:
            session = RolloutSession(Trace(task=TraceTask(type="T")), model)
            messages: list[Any] = [SystemMessage("Use the calculator."), UserMessage("What is 2 + 3?")]
            for _ in range(3):
                reply = (await asyncio.wait_for(session.chat(Request(list(messages), [CALC])), 30)).message
                messages.append(reply)
                for call in reply.tool_calls or ():
                    messages.append(ToolMessage(call.id, "5"))
                if not reply.tool_calls:
                    messages.append(UserMessage("Go on."))
            return session.trace, messages, server
        finally:
            await model.aclose()


def test_today_a_drifting_template_makes_a_sequence_per_tool_turn() -> None:
    trace, _, _ = asyncio.run(tool_rollout(scale_out=False))
    assert trace.token_drift == [1, 2] and len(token_sequences(trace)) == 3


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_token_in_keeps_a_multi_turn_tool_rollout_one_sequence(stream: bool) -> None:
    trace, messages, _ = asyncio.run(tool_rollout(scale_out=True, stream=stream))
    assert trace.token_drift == [] and trace.num_turns == 3
    [sequence] = token_sequences(trace)
    calls = trace.calls
    assert [trace.nodes[c.node].message for c in calls] == [messages[2], messages[4], messages[6]]
    assert messages[2].tool_calls and messages[4].content == "5"  # the harness got the same replies
    for before, after in zip(calls, calls[1:]):
        previous = full_prompt(trace, before) + trace.nodes[before.node].token_ids
        prompt = full_prompt(trace, after)
        assert prompt[: len(previous)] == previous  # the sampled ids, never re-tokenized
        assert trace.nodes[before.node].token_ids[-1] == IM_END
        assert prompt[len(previous)] == encode("\n")[0]  # the template's end of the turn
    assert sequence.input_ids == full_prompt(trace, calls[-1]) + trace.nodes[calls[-1].node].token_ids
    assert sum(sequence.loss_mask) == sum(len(trace.nodes[c.node].token_ids) for c in calls)


def test_the_new_messages_are_the_servers_rendering_of_them() -> None:
    trace, messages, _ = asyncio.run(tool_rollout(scale_out=True, drift=False))
    second = trace.calls[1]
    sent = msgspec.json.decode(encode_request(Request(messages[:4], [CALC]), {}, model=None, stream=False))
    # Without drift the template renders the sampled reply to its own ids: the whole prompt is
    # the server's rendering, built from ids all the same.
    assert full_prompt(trace, second) == render(sent["messages"], sent["tools"])
    assert trace.token_drift == []


def test_token_in_off_sends_text_as_before() -> None:
    trace, _, _ = asyncio.run(tool_rollout(scale_out=True, token_in=False))
    assert trace.token_drift == [1, 2]


def test_changed_tools_start_a_new_sequence_rather_than_keep_a_stale_system_prompt() -> None:
    async def main() -> Trace:
        config = SimulatedModelConfig(ttft=0, scale_out=True)
        async with SimulatedModelServer(config) as server:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                session = RolloutSession(Trace(task=TraceTask(type="T")), model)
                first = [UserMessage("What is 2 + 3?")]
                reply = (await session.chat(Request(first, [CALC]))).message
                more = Tool("more", "Another tool.", {"type": "object"})
                await session.chat(Request([*first, reply, ToolMessage(reply.tool_calls[0].id, "5")], [CALC, more]))
                return session.trace
            finally:
                await model.aclose()

    trace = asyncio.run(main())
    assert trace.token_drift == [1]  # the system prompt lists the new tool: the server's prompt
    assert '"more"' in decode(full_prompt(trace, trace.calls[1]) or [])


def test_kept_ids_longer_than_the_servers_rendering_leave_the_reply_the_length_asked() -> None:
    """A turn's kept ids (the previous prompt and sampled reply) may be longer than the server's
    rendering of that history (the tiny vLLM renders a sampled tool call of 38 ids, junk
    arguments parsed away, in fewer). The reply may still be as long as asked: only the context
    window may shorten it (there a third tool turn got 22 of its 64 tokens and stopped inside
    its tool call)."""
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "Go on."},
    ]
    kept = render(messages[:1]) + encode("5 and some more") + [IM_END]  # sampled longer than it renders

    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(ttft=0, scale_out=True)) as server:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                chat = {"model": "simulated", "messages": messages, "max_tokens": 20}
                return await model._tokens.start(model.pool.servers[0], chat, CallContext(kept, 2, None))
            finally:
                await model.aclose()

    partial = asyncio.run(main())
    assert partial.prompt[: len(kept)] == kept and len(partial.prompt) > len(render(messages))
    assert partial.params["max_tokens"] == 20


def test_a_cancelled_interruptible_generation_leaves_no_reader_behind() -> None:
    """The final cancel of a run cuts calls that wait for their generation or their interrupt:
    the reader task must end with the call, not run on and fail unseen once the client closes
    ("Task exception was never retrieved", issue 33)."""
    from rollout_ray._core.policy_gate import Interrupt, PolicyGate

    unretrieved: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))
        config = SimulatedModelConfig(ttft=3600, scale_out=True)  # the generation never ends by itself
        async with SimulatedModelServer(config) as server:
            assert server.base_url is not None
            model = OpenAIModel(server.base_url, name="simulated", token_capture="vllm")
            try:
                call = CallContext(interrupt=Interrupt(PolicyGate()))
                request = Request([UserMessage("Hi")])
                task = asyncio.ensure_future(model.generate(request, model=None, sampling={}, call=call))
                deadline = asyncio.get_running_loop().time() + 10
                while not server.engine.flights:  # bounded poll: the generation reached the server
                    assert asyncio.get_running_loop().time() < deadline, "the generation never reached the server"
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                others = asyncio.all_tasks() - {asyncio.current_task()}
                # Whatever the cancel left must already be ending (cancelled), not reading on.
                assert all(t.cancelling() or t.done() for t in others if "_read" in repr(t.get_coro())), others
            finally:
                await model.aclose()
        for _ in range(20):  # let what the close failed run its course, then collect it
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(main())
    assert not unretrieved, [c.get("message") for c in unretrieved]
