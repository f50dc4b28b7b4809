"""The proxy's dialects with the official clients: the ``openai`` SDK on Chat Completions and
Responses, the ``anthropic`` SDK on Messages, JSON and streamed, against the real proxy and
the simulated model (pytest turns any warning of theirs into a failure). A multi-turn tool
rollout in each dialect is recorded in the one Trace format and, with token in on a
template that re-tokenizes replies, stored as one training sequence."""

from __future__ import annotations

import io
from typing import Any

import aiohttp
import anthropic
import msgspec
import openai
import pytest
from aiohttp import web
from capture_rig import Rig, recording_server, rig, run

from rollout_ray import AssistantMessage, Request, Response, RolloutLimits, RolloutSession, Trace, TraceTask
from rollout_ray._core.hooks import Hook
from rollout_ray._core.interception import Slot
from rollout_ray._core.model import Model
from rollout_ray._record.graph import leaves, path_to
from rollout_ray._record.messages import ToolCall, text_of
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._serving.proxy import HTTPInterception
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig

QUESTION = "Use the calculator: what is 17*3?"
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}}
RESPONSES_TOOLS: Any = [{"type": "function", "name": "calculator", "description": "evaluate", "parameters": SCHEMA}]
ANTHROPIC_TOOLS: Any = [{"name": "calculator", "description": "evaluate", "input_schema": SCHEMA}]
# strict: the openai SDK's stream helper parses only strict function tools before its 3.x line.
CHAT_TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "calculator", "description": "evaluate", "parameters": SCHEMA, "strict": True},
    }
]
DRIFTING = SimulatedModelConfig(ttft=0, scale_out=True, template_drift=True)
"""A template that re-tokenizes replies: only token in keeps a rollout one sequence."""


def assert_one_sequence(trace: Trace, endpoint: str, turns: int) -> None:
    """The rollout's turns, in the one Trace format, are one sequence built from ids."""
    assert [c.endpoint for c in trace.calls] == [endpoint] * turns and trace.num_turns == turns
    assert trace.token_drift == []
    [sequence] = token_sequences(trace)
    calls = trace.calls
    for before, after in zip(calls, calls[1:]):
        previous = full_prompt(trace, before) + trace.nodes[before.node].token_ids  # type: ignore[index,operator]
        assert full_prompt(trace, after)[: len(previous)] == previous  # the sampled ids, never re-tokenized
    last = trace.nodes[calls[-1].node]  # type: ignore[index]
    assert sequence.input_ids == full_prompt(trace, calls[-1]) + last.token_ids  # type: ignore[operator]
    assert sum(sequence.loss_mask) == sum(len(trace.nodes[c.node].token_ids or ()) for c in calls)  # type: ignore[index]


def openai_client(slot: Slot) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=slot.base_url + "/v1", api_key=slot.model_secret, max_retries=0)


def anthropic_client(slot: Slot) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=slot.base_url, api_key=slot.model_secret, max_retries=0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_sdk_chat_completions_tool_rollout(stream: bool) -> None:
    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r:
            session, slot = await r.open_session()
            async with openai_client(slot) as client:
                messages: list[Any] = [{"role": "user", "content": QUESTION}]
                for _ in range(2):
                    if stream:
                        async with client.chat.completions.stream(model="x", messages=messages, tools=CHAT_TOOLS) as s:
                            reply = (await s.get_final_completion()).choices[0].message
                    else:
                        reply = (
                            (await client.chat.completions.create(model="x", messages=messages, tools=CHAT_TOOLS))
                            .choices[0]
                            .message
                        )
                    messages.append(reply.model_dump(exclude_none=True))
                    for call in reply.tool_calls or ():
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": "51"})
            assert reply.content == "51"
            return session.trace

    assert_one_sequence(run(main), "/chat/completions", 2)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_sdk_responses_tool_rollout_by_previous_response_id_and_by_whole_input(stream: bool) -> None:
    async def create(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
        if not stream:
            return await client.responses.create(model="x", instructions="Be brief.", tools=RESPONSES_TOOLS, **kwargs)
        async with client.responses.stream(model="x", instructions="Be brief.", tools=RESPONSES_TOOLS, **kwargs) as s:
            kinds = [event.type async for event in s]
            assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
            return await s.get_final_response()

    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r:
            session, slot = await r.open_session()
            async with openai_client(slot) as client:
                first = await create(client, input=QUESTION)
                [call] = first.output
                assert call.type == "function_call" and call.name == "calculator"
                result = {"type": "function_call_output", "call_id": call.call_id, "output": "51"}
                second = await create(client, previous_response_id=first.id, input=[result])
                assert second.output_text == "51" and second.usage.output_tokens > 0
                history = [
                    {"role": "user", "content": QUESTION},
                    *[i.model_dump(exclude_none=True) for i in first.output],
                    result,
                    *[i.model_dump(exclude_none=True) for i in second.output],
                    {"role": "user", "content": "What is 2+2?"},
                ]
                third = await create(client, input=history)  # the whole conversation again, as Codex sends it
                assert [i.arguments for i in third.output] == ['{"expression": "2+2"}']
            return session.trace

    trace = run(main)
    assert_one_sequence(trace, "/responses", 3)
    assert trace.nodes[trace.calls[0].node].message.tool_calls[0].name == "calculator"  # type: ignore[index,union-attr]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_anthropic_sdk_messages_tool_rollout(stream: bool) -> None:
    async def create(client: anthropic.AsyncAnthropic, messages: list[Any]) -> Any:
        kwargs: Any = {
            "model": "x",
            "max_tokens": 200,
            "system": "Be brief.",
            "tools": ANTHROPIC_TOOLS,
            "messages": messages,
        }
        if not stream:
            return await client.messages.create(**kwargs)
        async with client.messages.stream(**kwargs) as s:
            kinds = [event.type async for event in s]
            assert kinds[0] == "message_start" and "content_block_delta" in kinds
            return await s.get_final_message()

    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r:
            session, slot = await r.open_session()
            async with anthropic_client(slot) as client:
                messages: list[Any] = [{"role": "user", "content": QUESTION}]
                first = await create(client, messages)
                assert first.stop_reason == "tool_use" and first.content[0].input == {"expression": "17*3"}
                messages += [
                    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "51"}],
                    },
                ]
                second = await create(client, messages)
                assert second.stop_reason == "end_turn" and second.content[0].text == "51"
                counted = await client.messages.count_tokens(model="x", messages=messages, tools=ANTHROPIC_TOOLS)
                assert counted.input_tokens > 0
            return session.trace

    assert_one_sequence(run(main), "/messages", 2)


async def post(r: Rig, slot: Slot, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    auth = headers if headers is not None else {"Authorization": f"Bearer {slot.model_secret}"}
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    async with r.client.post(f"{slot.base_url}{path}", data=data, headers=auth) as resp:
        return resp.status, msgspec.json.decode(await resp.read())


MALFORMED: list[tuple[str, Any, str]] = [
    ("/v1/responses", {"input": 3}, "input"),
    ("/v1/responses", {}, "input"),
    ("/v1/responses", {"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ("/v1/responses", {"input": "hi", "tool_choice": []}, "tool_choice"),
    ("/v1/responses", {"input": "hi", "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": "9"}, "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ("/v1/responses", {"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ("/v1/responses", {"input": "hi", "temperature": 2**70}, "temperature"),  # the trace holds 64 bits
    ("/v1/messages", {"messages": "hi"}, "messages"),
    ("/v1/messages", {"messages": [], "max_tokens": 1, "top_k": "5"}, "top_k"),  # went upstream as a string
    (
        "/v1/messages",
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        "messages[0].content[0].tool_use_id",
    ),
    (
        "/v1/messages",
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": []}]}]},
        "messages[0].content[0].input",
    ),
    ("/v1/messages", {"messages": [], "tool_choice": {}}, "tool_choice.type"),
    ("/v1/messages", {"messages": [], "tool_choice": []}, "tool_choice"),
    ("/v1/messages", {"messages": [], "system": [{"type": "image"}]}, "system[0].type"),
    ("/v1/messages", {"messages": [], "stop_sequences": ["a", 1]}, "stop_sequences[1]"),
    ("/v1/messages", {"messages": [], "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ("/v1/messages", {"messages": [], "metadata": {"n": [-(2**64)]}}, "metadata.n[0]"),
]


def test_every_malformed_field_is_a_400_naming_it_in_the_dialects_error_shape() -> None:
    async def main() -> None:
        async with rig() as r:
            session, slot = await r.open_session()
            for path, body, param in MALFORMED:
                status, answer = await post(r, slot, path, {"model": "x", **body})
                assert status == 400, (path, body, answer)
                error = answer["error"]
                assert f"`{param}`" in error["message"], (param, error)
                if path == "/v1/responses":
                    assert error["param"] == param
                else:
                    assert answer["type"] == "error" and error["type"] == "invalid_request_error"
            status, answer = await post(r, slot, "/v1/messages", b"[1]")
            assert status == 400 and "JSON object" in answer["error"]["message"]
            assert session.trace.calls == []

    run(main)


def test_what_the_upstream_cannot_express_is_dropped_and_recorded_not_refused() -> None:
    async def main() -> Trace:
        async with rig() as r:
            session, slot = await r.open_session()
            hosted = {
                "model": "x",
                "input": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"type": "web_search_call", "id": "ws_1"},
                    {"type": "function_call", "call_id": "c1", "name": "f"},
                    {
                        "type": "function_call_output",
                        "call_id": "c1",
                        "output": [{"type": "input_text", "text": "seen"}, {"type": "input_file", "file_id": "f_1"}],
                    },
                ],
                "tools": [{"type": "web_search"}],
                "tool_choice": {"type": "function", "name": "f"},
                "store": False,
                "include": ["reasoning.encrypted_content"],
                "reasoning": {"effort": "low", "summary": "auto"},
            }
            status, answer = await post(r, slot, "/v1/responses", hosted)
            assert status == 200 and answer["output"][0]["content"][0]["text"] == "seen", answer  # the tool said
            thinking = {
                "model": "x",
                "max_tokens": 50,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "top_k": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "What is 2+2?", "cache_control": {"type": "ephemeral"}}],
                    },
                    {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                ],
            }
            status, answer = await post(
                r,
                slot,
                "/v1/messages?beta=true",
                thinking,
                {"x-api-key": slot.model_secret, "anthropic-version": "2023-06-01"},
            )
            assert status == 200 and answer["content"] == [{"type": "text", "text": "4"}], answer
            return session.trace

    trace = run(main)
    responses, messages = trace.calls
    assert set(responses.dropped or ()) == {
        "input[1]",
        "input[3].output[1]",
        "tools[0]",
        "tool_choice",
        "store",
        "include",
        "reasoning.summary",
    }
    assert set(messages.dropped or ()) == {"thinking", "tools[0]", "cache_control", "top_k"}
    path = [type(trace.nodes[i].message).__name__ for i in path_to(trace, messages.node)]  # type: ignore[arg-type]
    assert path == ["UserMessage", "SystemMessage", "AssistantMessage"]  # a system turn, as Claude Code sends
    assert responses.sampling == {"reasoning_effort": "low"} and messages.sampling == {"max_tokens": 50}


def test_anthropic_key_header_and_error_shape() -> None:
    async def main() -> None:
        async with rig() as r:
            _, slot = await r.open_session()
            body = {"model": "x", "max_tokens": 10, "messages": [{"role": "user", "content": "What is 2+2?"}]}
            status, answer = await post(r, slot, "/v1/messages", body, {"x-api-key": "wrong"})
            assert status == 401 and answer == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "unknown or missing rollout secret"},
            }
            async with anthropic_client(slot) as client:
                with pytest.raises(anthropic.BadRequestError, match="`messages\\[0\\].role`"):
                    await client.messages.create(
                        model="x",
                        max_tokens=10,
                        messages=[
                            {
                                "role": "robot",  # type: ignore[list-item,typeddict-item]
                                "content": "hi",
                            }
                        ],
                    )

    run(main)


async def reasoning(request: web.Request) -> web.Response:
    message = {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}
    return web.json_response({"choices": [{"message": message, "finish_reason": "stop"}], "model": "plain"})


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_reasoning_is_kept_across_a_turn(path: str) -> None:
    """A reply's reasoning comes back to the agent (a ``reasoning`` item, a ``thinking`` block)
    and, sent back, reads as the committed turn: the next turn continues its branch."""
    question = {"role": "user", "content": "What is 2+2?"}

    async def main() -> Trace:
        async with (
            recording_server(reasoning) as (url, _, bodies),
            HTTPInterception() as proxy,
            aiohttp.ClientSession() as client,
        ):
            model = OpenAIModel(url, name="plain")
            session = RolloutSession(Trace(task=TraceTask(type="T")), model)
            try:
                async with proxy.serve(session) as slot:
                    r = Rig(proxy, model, client, [])
                    first: dict[str, Any] = {"model": "x", "max_tokens": 100}
                    first.update({"input": [question]} if path == "/v1/responses" else {"messages": [question]})
                    status, answer = await post(r, slot, path, first)
                    assert status == 200, answer
                    if path == "/v1/responses":
                        assert answer["output"][0]["type"] == "reasoning"
                        again = {**first, "input": [question, *answer["output"], {"role": "user", "content": "Go on."}]}
                    else:
                        assert answer["content"][0] == {
                            "type": "thinking",
                            "thinking": "Two and two make four.",
                            "signature": "",
                        }
                        again = {
                            **first,
                            "messages": [
                                question,
                                {"role": "assistant", "content": answer["content"]},
                                {"role": "user", "content": "Go on."},
                            ],
                        }
                    status, answer = await post(r, slot, path, again)
                    assert status == 200, answer
                    sent = msgspec.json.decode(bodies[-1])["messages"]
                    assert sent[1]["reasoning_content"] == "Two and two make four."  # upstream, as the model said it
            finally:
                await model.aclose()
            return session.trace

    trace = run(main)
    first, second = (trace.nodes[c.node] for c in trace.calls)  # type: ignore[index]
    assert isinstance(first.message, AssistantMessage) and first.message.reasoning_content
    assert second.parent is not None and trace.nodes[second.parent].parent == trace.calls[0].node


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_sdk_retry_is_replayed_with_the_same_id_not_resampled(path: str) -> None:
    body: dict[str, Any] = {"model": "x", "max_tokens": 20}
    body.update(
        {"input": "What is 2+2?"}
        if path == "/v1/responses"
        else {"messages": [{"role": "user", "content": "What is 2+2?"}]}
    )

    async def main() -> Trace:
        async with rig() as r:
            session, slot = await r.open_session()
            auth = {"Authorization": f"Bearer {slot.model_secret}"}
            status, first = await post(r, slot, path, body, auth)
            status_again, again = await post(r, slot, path, body, {**auth, "x-stainless-retry-count": "1"})
            first.pop("created_at", None), again.pop("created_at", None)  # Responses' clock may tick between
            assert (status, status_again) == (200, 200) and again == first
            assert first["id"].startswith("resp_" if path == "/v1/responses" else "msg_")
            return session.trace

    assert len(run(main).calls) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_logprobs_asked_by_include_come_in_the_output_text(stream: bool) -> None:
    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0), token_capture="vllm") as r:
            session, slot = await r.open_session()
            async with openai_client(slot) as client:
                kwargs: Any = {
                    "model": "x",
                    "input": "What is 2+2?",
                    "top_logprobs": 2,
                    "include": ["message.output_text.logprobs"],
                }
                if stream:
                    async with client.responses.stream(**kwargs) as s:
                        deltas = [e.logprobs async for e in s if e.type == "response.output_text.delta"]
                        answer = await s.get_final_response()
                    assert [[e.token for e in d] for d in deltas] == [["4", "<|im_end|>"]]
                else:
                    answer = await client.responses.create(**kwargs)
            part = answer.output[0].content[0]
            assert part.text == "4" and [e.token for e in part.logprobs] == ["4", "<|im_end|>"]
            assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
            (call,) = session.trace.calls
            assert call.dropped is None and call.sampling == {"logprobs": True, "top_logprobs": 2}
            node = session.trace.nodes[call.node]  # type: ignore[index]
            assert node.logprobs == [e.logprob for e in part.logprobs]

    run(main)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_hooks_and_budgets_work_the_same_whatever_the_dialect(path: str) -> None:
    """A response ``@intercept`` rewrites what the agent reads, a request ``@stop`` sees the
    translated request, the token budget clamps the reply's length, and a refused turn is a
    400 in the dialect's own error shape."""

    def polite(response: Response) -> Response:
        return msgspec.structs.replace(response, message=AssistantMessage("Four."))

    def no_goodbyes(request: Request) -> bool:
        return text_of(request.messages[-1].content) == "Bye."

    def body(text: str) -> dict[str, Any]:
        if path == "/v1/responses":
            return {"model": "x", "input": text, "max_output_tokens": 500}
        return {"model": "x", "max_tokens": 500, "messages": [{"role": "user", "content": text}]}

    async def main() -> Trace:
        async with rig() as r:
            session = RolloutSession(
                Trace(task=TraceTask(type="T")),
                r.model,
                limits=RolloutLimits(max_output_tokens=64),
                response_interceptors=[Hook("polite", polite)],
                request_stops=[Hook("no_goodbyes", no_goodbyes)],
            )
            async with r.proxy.serve(session) as slot:
                status, answer = await post(r, slot, path, body("What is 2+2?"))
                assert status == 200
                text = (
                    answer["output"][0]["content"][0]["text"]
                    if path == "/v1/responses"
                    else answer["content"][0]["text"]
                )
                assert text == "Four."
                status, answer = await post(r, slot, path, body("Bye."))
                assert status == 400 and answer["error"]["message"] == "rollout stopped: no_goodbyes"
                assert ("type" in answer) == (path == "/v1/messages")  # Anthropic's error envelope
            return session.trace

    trace = run(main)
    assert trace.stop_condition == "no_goodbyes" and trace.last_reply == "Four."
    assert trace.calls[0].sampling == {"max_tokens": 64} and trace.response_rewrites[0].handler == "polite"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_namespace_tools_functions_go_upstream_and_come_back_namespaced(stream: bool) -> None:
    """Codex offers its MCP tools as a ``namespace`` tool (``mcp__calc`` holding ``add``) and
    routes a call only by ``name`` + ``namespace``: each function goes upstream as one tool
    (``mcp__calc__add``), its call comes back split, and the call sent back joins again (one
    training sequence)."""
    tools = [
        {
            "type": "namespace",
            "name": "mcp__calc",
            "description": "calc over MCP",
            "tools": [
                {
                    "type": "function",
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    },
                }
            ],
        }
    ]

    async def post(http: aiohttp.ClientSession, slot: Slot, items: list[Any]) -> list[dict[str, Any]]:
        body = {"model": "x", "input": items, "tools": tools, "stream": stream}
        async with http.post(
            f"{slot.base_url}/v1/responses", json=body, headers={"Authorization": f"Bearer {slot.model_secret}"}
        ) as resp:
            assert resp.status == 200, await resp.text()
            if not stream:
                return (await resp.json())["output"]
            events = [
                msgspec.json.decode(line[6:]) for line in (await resp.text()).splitlines() if line.startswith("data: ")
            ]
            return events[-1]["response"]["output"]

    async def main() -> Trace:
        async with rig(DRIFTING, token_capture="vllm") as r, aiohttp.ClientSession() as http:
            session, slot = await r.open_session()
            question = {"role": "user", "content": "What is 2+3?"}
            [call] = await post(http, slot, [question])
            assert (call["type"], call["namespace"], call["name"]) == ("function_call", "mcp__calc", "add")
            result = {"type": "function_call_output", "call_id": call["call_id"], "output": "5"}
            [answer] = await post(http, slot, [question, call, result])
            assert answer["content"][0]["text"] == "5"
            return session.trace

    trace = run(main)
    assert [t.name for t in trace.tools or ()] == ["mcp__calc__add"]
    assert trace.nodes[trace.calls[0].node].message.tool_calls[0].name == "mcp__calc__add"  # type: ignore[index,union-attr]
    assert_one_sequence(trace, "/responses", 2)


def test_an_array_of_too_many_items_is_a_400_naming_it_before_its_items_are_translated() -> None:
    """Security review F4: a 15 MiB body of empty messages (500,000) was translated item by item
    on the node's loop (seconds of stall), and ``count_tokens`` did it with no model call."""
    from rollout_ray._serving.dialects.dialect import MAX_ITEMS

    many = [{"role": "user", "content": ""}] * (MAX_ITEMS + 1)
    cases = [
        ("/v1/messages", {"max_tokens": 1, "messages": many}, "messages"),
        ("/v1/messages/count_tokens", {"messages": many}, "messages"),
        (
            "/v1/messages",
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * (MAX_ITEMS + 1)}],
            },
            "messages[0].content",
        ),
        ("/v1/responses", {"input": many}, "input"),
        ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}] * (MAX_ITEMS + 1)}, "tools"),
    ]

    async def post_large(r: Rig, slot: Slot, path: str, body: Any) -> tuple[int, Any]:
        data = io.BytesIO(msgspec.json.encode(body))  # aiohttp warns of large bytes sent as such
        auth = {"x-api-key": slot.model_secret, "Authorization": f"Bearer {slot.model_secret}"}
        async with r.client.post(f"{slot.base_url}{path}", data=data, headers=auth) as resp:
            return resp.status, msgspec.json.decode(await resp.read())

    async def main() -> None:
        async with rig() as r:
            session, slot = await r.open_session()
            for path, body, param in cases:
                status, answer = await post_large(r, slot, path, {"model": "x", **body})
                assert status == 400, (path, param, answer)
                assert f"`{param}` has {MAX_ITEMS + 1} items" in answer["error"]["message"], (param, answer)
            assert session.trace.calls == []
            status, _ = await post_large(
                r, slot, "/v1/messages/count_tokens", {"model": "x", "messages": many[:MAX_ITEMS]}
            )
            assert status == 200  # at the cap: still answered

    run(main)


class _NoObjectArguments(Model):
    """A tool call whose ``arguments`` are no JSON object, then text: what a random-weight
    model writes under vLLM's tool grammar (``false``; ``tests/real_server/test_vllm_dialects``)."""

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments

    async def complete(self, request: Request, *, model: str | None, sampling: dict[str, Any]) -> Response:
        if any(isinstance(m, AssistantMessage) for m in request.messages):
            return Response(AssistantMessage("done"))
        call = ToolCall("toolu_1", "calculator", self.arguments)
        return Response(AssistantMessage(None, tool_calls=[call]), "tool_calls")


@pytest.mark.parametrize("arguments", ["false", '"17*3"', '{"expression": "17*', "[1]"])
def test_a_call_whose_arguments_are_no_object_is_the_sampled_node_when_the_anthropic_sdk_sends_it_back(
    arguments: str,
) -> None:
    """The Messages answer gives such a call ``input: {}`` (Anthropic's ``input`` is an object);
    the agent sends ``{}`` back, which must still be the sampled reply, not a fork whose next
    turn re-renders the history (found on a real vLLM: every tool turn started a new prompt)."""

    async def main() -> Trace:
        session = RolloutSession(Trace(task=TraceTask(type="T")), _NoObjectArguments(arguments))
        async with HTTPInterception() as proxy, proxy.serve(session) as slot, anthropic_client(slot) as client:
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            reply = await client.messages.create(model="x", max_tokens=50, messages=messages, tools=ANTHROPIC_TOOLS)
            (use,) = [b for b in reply.content if b.type == "tool_use"]
            assert use.input == {}
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "bad input"}]},
            ]
            await client.messages.create(model="x", max_tokens=50, messages=messages, tools=ANTHROPIC_TOOLS)
        return session.trace

    trace = run(main)
    first, second = trace.calls
    assert len(leaves(trace)) == 1 and first.node in path_to(trace, second.node)  # type: ignore[arg-type]
    assert trace.nodes[first.node].message.tool_calls[0].arguments == arguments  # type: ignore[index]
