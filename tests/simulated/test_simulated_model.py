"""The simulated model: its pure policy, and its OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_client import Client, assemble, events, serve, user

from rollout_ray._simulated.answers import cap_completion, evaluate, prompt_tokens, respond
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.model_server import SimulatedModelServer

CFG = SimulatedModelConfig()
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "Calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def answer(text: str, config: SimulatedModelConfig = CFG, rng_value: float = 0.5) -> Any:
    return respond(user(text), None, config, rng_value)["content"]


# --- policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What is 17 + 25?", "42"),
        ("Compute (3+4)*5", "35"),
        ("What is -3 * 4?", "-12"),
        ("What is 10 - -3?", "13"),
        ("Evaluate 2 * (5 - (10 - 1)) please.", "-8"),
        ("(what is 6*7)", "42"),
        ("Problem 3: what is 100 - 1?", "99"),
    ],
)
def test_arithmetic_is_answered_with_its_value(question: str, expected: str) -> None:
    assert answer(question) == expected


def test_parts_content_is_read() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]
    assert respond(messages, None, CFG, 0.5) == {"role": "assistant", "content": "4"}


@pytest.mark.parametrize("question", ["Hello there", "Is 5 more than 3?", "What is 2**10?", "__import__('os')", ""])
def test_no_arithmetic_gets_i_dont_know(question: str) -> None:
    assert answer(question) == "I don't know."


def test_no_user_message_gets_i_dont_know() -> None:
    assert respond([{"role": "system", "content": "1+1"}], None, CFG, 0.5)["content"] == ("I don't know.")


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",
        "2**10",
        "(1).__class__",
        "[1+1]",
        "1 / 2",
        "x + 1",
        "1.5 + 1",
        "f(1)",
        "True + 1",
    ],
)
def test_unsafe_or_foreign_syntax_is_never_evaluated(source: str) -> None:
    with pytest.raises(ValueError):
        evaluate(source)


def test_huge_values_are_refused() -> None:
    with pytest.raises(ValueError, match="too large"):
        evaluate("*".join(["99999999"] * 20))


def test_calculator_tool_gets_an_expression_call() -> None:
    message = respond(user("Compute (3+4)*5"), [WEATHER_TOOL, CALC_TOOL], CFG, 0.5)
    assert message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "Calculator", "arguments": '{"expression": "(3+4)*5"}'},
            }
        ],
    }


def test_add_tool_with_a_and_b_gets_operands() -> None:
    call = respond(user("What is 17 + -25?"), [ADD_TOOL], CFG, 0.5)["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 17, "b": -25}'}
    # Not a single "+": the a/b tool still gets the whole expression.
    call = respond(user("What is 2 * 3?"), [ADD_TOOL], CFG, 0.5)["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 * 3"}


def test_non_calculator_tools_are_ignored() -> None:
    assert respond(user("What is 1+1?"), [WEATHER_TOOL], CFG, 0.5)["content"] == "2"


def test_tool_result_is_the_answer() -> None:
    messages = user("What is 17 + 25?")
    call = respond(messages, [ADD_TOOL], CFG, 0.5)
    messages += [call, {"role": "tool", "tool_call_id": "call_0", "content": " 42\n"}]
    assert respond(messages, [ADD_TOOL], CFG, 0.5) == {"role": "assistant", "content": "42"}
    # A second question in the same conversation numbers its call after the first.
    messages += [{"role": "assistant", "content": "42"}, *user("And 1 + 2?")]
    assert respond(messages, [ADD_TOOL], CFG, 0.5)["tool_calls"][0]["id"] == "call_1"


def test_error_rate_makes_answers_off_by_one() -> None:
    assert answer("What is 17 + 25?", SimulatedModelConfig(error_rate=1.0), 0.999) == "43"
    half = SimulatedModelConfig(error_rate=0.5)
    assert [answer("What is 6*7?", half, u) for u in (0.0, 0.49, 0.5, 0.9)] == [
        "43",
        "43",
        "42",
        "42",
    ]


def test_policy_is_deterministic() -> None:
    messages = [*user("What is 17 + 25?"), {"role": "assistant", "content": "42"}, *user("3*3")]
    outputs = [respond(messages, [CALC_TOOL], CFG, 0.3) for _ in range(3)]
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0]["tool_calls"][0]["function"]["arguments"] == '{"expression": "3*3"}'


def test_token_estimates_and_cap() -> None:
    call = respond(user("What is 17 + 25?"), [ADD_TOOL], CFG, 0.5)
    # 16 chars -> 4 + 4; "add" + '{"a": 17, "b": 25}' = 21 chars -> 5 + 4.
    assert prompt_tokens([*user("What is 17 + 25?"), call]) == 17
    assert cap_completion({"role": "assistant", "content": "42"}, 5)[1:] == ("stop", 1)
    text = {"role": "assistant", "content": "I don't know."}
    assert cap_completion(text, 1) == ({"role": "assistant", "content": "I do"}, "length", 1)
    assert cap_completion(call, 1) == (call, "tool_calls", 5)


def test_config_validates() -> None:
    with pytest.raises(pydantic.ValidationError):
        SimulatedModelConfig(rate_429=1.5)
    with pytest.raises(pydantic.ValidationError):
        SimulatedModelConfig(rate_429=0.6, rate_5xx=0.6)
    with pytest.raises(pydantic.ValidationError):
        SimulatedModelConfig(ttft=-1)
    with pytest.raises(pydantic.ValidationError):
        SimulatedModelConfig(max_completion_tokens=0)
    with pytest.raises(pydantic.ValidationError):
        CFG.seed = 3  # type: ignore[misc]
    fields = SimulatedModelConfig.model_fields
    assert fields["ttft"].description == "Seconds before the first token."


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", 3])},
    optional={"content": JSON | st.text(alphabet="0123456789+-*() ab", max_size=20), "tool_calls": JSON},
)


@settings(max_examples=100, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=4), tools=st.none() | st.lists(JSON, max_size=2))
def test_policy_never_raises_on_garbage(messages: list[Any], tools: Any) -> None:
    message = respond(messages, tools, CFG, 0.5)
    assert message["role"] == "assistant"
    reply, finish, tokens = cap_completion(message, 3)
    assert finish in {"stop", "length", "tool_calls"} and tokens >= 1
    assert prompt_tokens(messages) >= 4 * len(messages)


# --- server ---------------------------------------------------------------------------------


QUESTION = {"model": "simulated", "messages": user("What is 17 + 25?")}


def test_completion_json_shape_and_usage() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        status, raw = await post(QUESTION)
        assert status == 200
        data = json.loads(raw)
        assert data["id"].startswith("chatcmpl-") and isinstance(data["created"], int)
        del data["id"], data["created"]
        assert data == {
            "object": "chat.completion",
            "model": "simulated",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "42"},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
        }
        assert server.stats.requests == 1 and server.stats.by_status == {200: 1}

    serve(body)


def test_stream_assembles_to_the_completion() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        for question, cap in (("What is 1000 * 1000 + 1?", None), ("Tell me a story", 1)):
            payload = {"messages": user(question), "max_tokens": cap}
            _, raw = await post(payload)
            plain = json.loads(raw)
            streamed = {**payload, "stream": True, "stream_options": {"include_usage": True}}
            status, raw = await post(streamed)
            assert status == 200
            chunks = events(raw)
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert chunks[-2]["choices"] == []
            message, finish, usage = assemble(chunks)
            assert message == plain["choices"][0]["message"]
            assert finish == plain["choices"][0]["finish_reason"]
            assert usage == plain["usage"]
        assert message == {"role": "assistant", "content": "I do"} and finish == "length"
        # Without include_usage no chunk carries usage.
        _, raw = await post({**QUESTION, "stream": True})
        assert assemble(events(raw)) == ({"role": "assistant", "content": "42"}, "stop", None)

    serve(body)


def test_tool_call_stream_assembles_to_json_arguments() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        expectations = [(ADD_TOOL, {"a": 17, "b": 25}), (CALC_TOOL, {"expression": "17 + 25"})]
        for tool, expected in expectations:
            _, raw = await post({**QUESTION, "tools": [tool], "stream": True})
            message, finish, _ = assemble(events(raw))
            (call,) = message["tool_calls"]
            assert json.loads(call["function"]["arguments"]) == expected
            assert (call["id"], call["type"], finish) == ("call_0", "function", "tool_calls")
            assert call["function"]["name"] == tool["function"]["name"]
            _, raw = await post({**QUESTION, "tools": [tool]})
            assert json.loads(raw)["choices"][0]["message"]["tool_calls"] == [call]

    serve(body)


def test_models_route() -> None:
    async def main() -> Any:
        async with SimulatedModelServer(SimulatedModelConfig(model_name="m1")) as server:
            assert server.base_url is not None and server.base_url.startswith("http://127.0.0.1:")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{server.base_url}/models") as resp:
                    return resp.status, await resp.json()

    assert asyncio.run(main()) == (
        200,
        {"object": "list", "data": [{"id": "m1", "object": "model", "owned_by": "rollout_ray"}]},
    )


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "simulated"}', "messages"),
        (b'{"messages": "hi"}', "messages"),
        (b'{"messages": [1]}', "messages"),
        (b'{"messages": [], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [], "stream": "yes"}', "stream"),
    ],
)
def test_invalid_requests_get_400(raw: bytes, param: str | None) -> None:
    async def body(server: SimulatedModelServer, post: Client) -> tuple[int, Any]:
        status, data = await post(None, raw)
        return status, json.loads(data)

    status, data = serve(body)
    assert status == 400
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["param"] == param
    if param:
        assert param in data["error"]["message"]


def test_rate_429_and_5xx() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> list[int]:
        return [(await post(QUESTION))[0] for _ in range(3)]

    assert serve(body, rate_429=1.0) == [429, 429, 429]
    statuses = serve(body, rate_5xx=1.0)
    # Retries of one request rotate through the three server errors.
    assert sorted(statuses) == [500, 502, 503]


def test_malformed_bodies_do_not_parse() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        status, raw = await post(QUESTION)
        assert status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw)
        status, raw = await post({**QUESTION, "stream": True})
        assert status == 200 and b"[DONE]" not in raw
        with pytest.raises((json.JSONDecodeError, AssertionError)):
            events(raw)
        assert server.stats.by_fault == {"malformed": 2}

    serve(body, rate_malformed=1.0)


@pytest.mark.parametrize("hold", [0.2, 3600.0])
def test_timeout_fault_makes_the_client_time_out(hold: float) -> None:
    async def main() -> None:
        config = SimulatedModelConfig(rate_timeout=1.0, timeout_hold=hold)
        async with SimulatedModelServer(config) as server:
            timeout = aiohttp.ClientTimeout(total=0.05)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                with pytest.raises(TimeoutError):
                    await session.post(f"{server.base_url}/chat/completions", json=QUESTION)

    asyncio.run(main())


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_timeout_fault_holds_then_answers_504() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        held = asyncio.create_task(post(QUESTION))
        await until(lambda: server.stats.by_fault == {"timeout": 1})
        assert not held.done() and server.stats.by_status == {}
        status, raw = await held
        assert (status, json.loads(raw)["error"]["type"]) == (504, "timeout")

    serve(body, rate_timeout=1.0, timeout_hold=0.1)


def test_stop_releases_held_requests() -> None:
    async def main() -> None:
        server = SimulatedModelServer(SimulatedModelConfig(rate_timeout=1.0))  # holds 3600 s
        url = await server.start()
        async with aiohttp.ClientSession() as session:
            held = asyncio.create_task(session.post(f"{url}/chat/completions", json=QUESTION))
            await until(lambda: server.stats.by_fault == {"timeout": 1})
            await asyncio.wait_for(server.stop(), 5.0)  # far below the hold
            async with await held as resp:
                assert resp.status == 504

    asyncio.run(main())


def test_fault_sequence_is_deterministic_per_seed() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> list[tuple[int, str]]:
        out = []
        for i in [*range(12), 0, 0, 5]:  # the repeats are retries: each gets fresh draws
            status, raw = await post({"messages": user(f"What is {i} + 1?")})
            content = json.loads(raw)["choices"][0]["message"]["content"] if status == 200 else ""
            out.append((status, content))
        return out

    config = {"rate_429": 0.25, "rate_5xx": 0.25, "error_rate": 0.5, "seed": 7}
    first = serve(body, **config)
    assert first == serve(body, **config)
    assert first == [
        (200, "2"),
        (500, ""),
        (200, "3"),
        (429, ""),
        (429, ""),
        (502, ""),
        (200, "8"),
        (503, ""),
        (200, "10"),
        (502, ""),
        (200, "12"),
        (200, "12"),
        (429, ""),
        (200, "2"),
        (503, ""),
    ]
    assert serve(body, **{**config, "seed": 8}) != first


def test_stop_is_idempotent_and_restart_is_refused() -> None:
    async def main() -> None:
        server = SimulatedModelServer()
        await server.start()
        with pytest.raises(RuntimeError):
            await server.start()
        await server.stop()
        await server.stop()

    asyncio.run(main())


def test_concurrent_arrival_order_does_not_change_outcomes() -> None:
    questions = [f"What is {i} * 3?" for i in range(40)]

    async def outcome(post: Client, q: str) -> tuple[int, str]:
        status, raw = await post({"messages": user(q)})
        return status, json.loads(raw)["choices"][0]["message"]["content"] if status == 200 else ""

    async def sequential(server: SimulatedModelServer, post: Client) -> list[Any]:
        return [await outcome(post, q) for q in questions]

    async def concurrent(server: SimulatedModelServer, post: Client) -> list[Any]:
        return list(await asyncio.gather(*(outcome(post, q) for q in reversed(questions))))[::-1]

    config = {"rate_5xx": 0.3, "error_rate": 0.5, "seed": 1}
    assert serve(sequential, **config) == serve(concurrent, **config)


@pytest.mark.parametrize("stream", [False, True])
def test_latency_is_ttft_plus_per_token(stream: bool) -> None:
    async def main() -> float:
        config = SimulatedModelConfig(ttft=0.02, per_token=0.01)
        async with SimulatedModelServer(config) as server, aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            start = loop.time()
            payload = {"messages": user("Hello"), "stream": stream}  # "I don't know.": 3 tokens
            async with session.post(f"{server.base_url}/chat/completions", json=payload) as resp:
                await resp.read()
            return loop.time() - start

    assert 0.05 <= asyncio.run(main()) < 5.0
