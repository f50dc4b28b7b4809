"""Token capture through the real proxy and OpenAIModel, against the simulated vLLM and SGLang.

What is checked: the Response carries the prompt ids (the server's template), the completion
ids (the EOS it stopped on included), one log-probability per completion id, the finish
reason and the policy version; the trace's sampled node keeps ids and log-probabilities;
the harness sees only what it asked for (OpenAI-shaped logprobs if it asked, no capture
fields ever), in JSON and in SSE; ``n > 1`` is refused with a 400 naming ``n``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from aiohttp import web
from capture_rig import QUESTION, recording_server, rig, run, sse

from rollout_ray._errors import ProviderError
from rollout_ray._record.messages import Request, UserMessage
from rollout_ray._record.openai_codec import parse_response
from rollout_ray._serving.upstream import OpenAIModel
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import IM_END, encode

CAPTURE_ONLY = {
    "token_ids",
    "prompt_token_ids",
    "prompt_logprobs",
    "prompt_text",
    "metadata",
    "meta_info",
    "matched_stop",
    "stop_reason",
}
ANSWER_IDS = [*encode("4"), IM_END]


def fields(body: dict[str, Any]) -> set[str]:
    """Every key of the body, its choices and its chunks (an SSE answer's included)."""
    parts = body.get("chunks", [body])
    keys: set[str] = set()
    for part in parts:
        keys |= set(part)
        for choice in part.get("choices", ()):
            keys |= set(choice)
    return keys


def content(status: int, body: dict[str, Any]) -> str:
    assert status == 200, body
    return body["content"] if "chunks" in body else body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("agent_stream", [False, True], ids=["agent-json", "agent-sse"])
@pytest.mark.parametrize("upstream_stream", [False, True], ids=["upstream-json", "upstream-sse"])
@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_capture_records_ids_logprobs_finish_and_version(
    dialect: str, upstream_stream: bool, agent_stream: bool
) -> None:
    async def main() -> None:
        config = SimulatedModelConfig(ttft=0, dialect=dialect, policy_version=3)  # type: ignore[arg-type]
        async with rig(config, token_capture=dialect, stream=upstream_stream) as r:
            session, slot = await r.open_session()
            status, body = await r.post(slot, {"messages": QUESTION, "stream": agent_stream})
            assert content(status, body) == "4"
            assert not fields(body) & CAPTURE_ONLY and body.get("logprobs") is None
            assert all(c.get("logprobs") is None for c in body.get("chunks", [body])[0]["choices"])
            response = r.last_response(slot)
            assert response.prompt_token_ids == render(QUESTION)
            assert response.token_ids == ANSWER_IDS
            assert response.token_logprobs is not None and len(response.token_logprobs) == len(ANSWER_IDS)
            assert all(lp < 0 for lp in response.token_logprobs)
            assert response.finish_reason == "stop" and response.policy_version == 3
            assert response.logprobs is None  # the harness did not ask
            (node,) = [n for n in session.trace.nodes if n.sampled]
            assert node.token_ids == ANSWER_IDS and node.logprobs == response.token_logprobs

    run(main)


@pytest.mark.parametrize("agent_stream", [False, True], ids=["agent-json", "agent-sse"])
@pytest.mark.parametrize("capture", ["vllm", "sglang", None])
def test_harness_asking_logprobs_gets_them_in_openai_shape(capture: str | None, agent_stream: bool) -> None:
    async def main() -> None:
        config = SimulatedModelConfig(ttft=0, dialect=capture or "vllm")  # type: ignore[arg-type]
        async with rig(config, token_capture=capture) as r:
            session, slot = await r.open_session()
            for top in (2, 0):
                ask = {"messages": QUESTION, "logprobs": True, "top_logprobs": top, "stream": agent_stream}
                status, body = await r.post(slot, ask)
                assert content(status, body) == "4"
                got = body["logprobs"] if agent_stream else body["choices"][0]["logprobs"]["content"]
                assert [e["token"] for e in got] == ["4", "<|im_end|>"]
                assert all(len(e["top_logprobs"]) == top and e["bytes"] for e in got)
                assert not fields(body) & CAPTURE_ONLY
                if capture is not None:
                    node = [n for n in session.trace.nodes if n.sampled][-1]
                    assert node.logprobs == [e["logprob"] for e in got]

    run(main)


def test_multi_turn_tool_rollout_records_every_turn() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "evaluate",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]

    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0), token_capture="vllm", stream=True) as r:
            session, slot = await r.open_session()
            messages: list[Any] = [{"role": "user", "content": "Use the calculator: what is 17*3?"}]
            status, body = await r.post(slot, {"messages": messages, "tools": tools})
            assert status == 200 and body["choices"][0]["finish_reason"] == "tool_calls", body
            first = r.last_response(slot)
            call = body["choices"][0]["message"]["tool_calls"][0]
            messages += [body["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "51"}]
            status, body = await r.post(slot, {"messages": messages, "tools": tools})
            assert status == 200, body
            second = r.last_response(slot)
            assert first.prompt_token_ids and first.token_ids and second.prompt_token_ids
            # The simulated template has the prefix property: turn 2's prompt extends turn 1's.
            assert (
                second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)]
                == first.prompt_token_ids + first.token_ids
            )
            sampled = [n for n in session.trace.nodes if n.sampled]
            assert [n.token_ids for n in sampled] == [first.token_ids, second.token_ids]

    run(main)


def test_n_over_one_is_refused_with_400_before_anything_is_sampled() -> None:
    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0), token_capture="vllm") as r:
            session, slot = await r.open_session()
            status, body = await r.post(slot, {"messages": QUESTION, "logprobs": True, "top_logprobs": 1, "n": 2})
            assert status == 400 and body["error"]["param"] == "n"
            assert body["error"]["message"] == (
                "invalid request: `n` must be 1, got 2: each model call of a rollout records one reply; "
                "send n requests to sample n replies"
            )
            assert r.servers[0].stats.requests == 0 and session.trace.nodes == []
            status, body = await r.post(slot, {"messages": QUESTION, "n": 1})
            assert status == 200

    run(main)


def test_n_over_one_in_the_rollout_sampling_is_refused_by_the_model() -> None:
    async def main() -> None:
        async with recording_server() as (url, seen, _):
            model = OpenAIModel(url)
            with pytest.raises(ProviderError, match=r"^`n` must be 1, got 3: ") as info:
                await model.complete(Request([UserMessage("hi")]), model=None, sampling={"n": 3})
            await model.aclose()
            assert info.value.status_code == 400 and seen == []

    run(main)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_auto_detects_the_dialect_once_per_server(dialect: str) -> None:
    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0, dialect=dialect), token_capture="auto") as r:  # type: ignore[arg-type]
            for _ in range(2):
                _, slot = await r.open_session()
                assert content(*await r.post(slot, {"messages": QUESTION})) == "4"
                assert r.last_response(slot).token_ids == ANSWER_IDS
            assert r.model.pool.servers[0].dialect == dialect

    run(main)


def test_auto_on_a_plain_server_captures_nothing_and_sends_no_extensions() -> None:
    async def main() -> None:
        async with recording_server() as (url, _, bodies):
            model = OpenAIModel(url, token_capture="auto")
            response = await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
            await model.aclose()
            assert response.message.content == "4" and response.token_ids is None
            assert model.pool.servers[0].dialect is None
            assert set(msgspec.json.decode(bodies[0])) == {"messages"}

    run(main)


@pytest.mark.parametrize(
    ("capture", "extensions"),
    [
        (None, set()),
        ("vllm", {"return_token_ids", "logprobs", "return_tokens_as_token_ids"}),
        ("sglang", {"return_token_ids", "return_prompt_token_ids", "logprobs"}),
    ],
)
def test_request_extensions_per_dialect(capture: str | None, extensions: set[str]) -> None:
    async def main() -> None:
        async with recording_server() as (url, _, bodies):
            model = OpenAIModel(url, token_capture=capture, stream=capture == "sglang")  # type: ignore[arg-type]
            await model.complete(Request([UserMessage("hi")]), model=None, sampling={"temperature": 0})
            await model.aclose()
            assert set(msgspec.json.decode(bodies[0])) == {"messages", "temperature", *extensions}

    run(main)


def test_token_id_tokens_stand_in_for_missing_completion_ids() -> None:
    body = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "4"},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [{"token": "token_id:68", "logprob": -0.5}, {"token": "token_id:2", "logprob": -0.25}]
                },
            }
        ],
        "prompt_token_ids": [1, 2, 3],
    }
    response = parse_response(msgspec.json.encode(body), capture=True, logprobs=False)
    assert response.token_ids == [68, 2] and response.token_logprobs == [-0.5, -0.25]
    assert response.prompt_token_ids == [1, 2, 3] and response.logprobs is None


def test_a_changed_policy_version_is_recorded_per_call() -> None:
    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0), token_capture="vllm", stream=True) as r:
            _, slot = await r.open_session()
            versions = []
            for version in (0, 5):
                r.servers[0].policy_version = version
                await r.post(slot, {"messages": [{"role": "user", "content": f"v{version}: 1+1?"}]})
                versions.append(r.last_response(slot).policy_version)
            assert versions == [0, 5]

    run(main)


def test_sse_helper_round_trips() -> None:
    raw = b'data: {"choices":[{"index":0,"delta":{"content":"4"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    assert sse(raw)["content"] == "4"


def test_sglang_weight_version_stands_for_the_policy_version_without_a_header() -> None:
    body = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "4"},
                "finish_reason": "stop",
                "prompt_token_ids": [1, 2],
                "token_ids": [68, 2],
                "logprobs": {
                    "content": [
                        {"token": "4", "logprob": -0.5, "bytes": [52], "top_logprobs": []},
                        {"token": "<|im_end|>", "logprob": -0.1, "top_logprobs": []},
                    ]
                },
            }
        ],
        "metadata": {"weight_version": "7"},
    }
    response = parse_response(msgspec.json.encode(body), capture=True, logprobs=False)
    assert (response.prompt_token_ids, response.token_ids) == ([1, 2], [68, 2])
    assert response.token_logprobs == [-0.5, -0.1] and response.policy_version == 7


def test_capture_asked_of_a_server_that_ignores_it_records_no_ids() -> None:
    async def main() -> None:
        async with recording_server() as (url, _, _):
            model = OpenAIModel(url, token_capture="vllm")
            response = await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
            await model.aclose()
        assert response.message.content == "4"
        assert (response.prompt_token_ids, response.token_ids, response.token_logprobs) == (None, None, None)

    run(main)


def test_auto_over_servers_of_both_dialects_asks_each_in_its_own() -> None:
    async def main() -> None:
        configs = [SimulatedModelConfig(ttft=0, dialect=d) for d in ("vllm", "sglang")]  # type: ignore[arg-type]
        async with rig(*configs, token_capture="auto", stream=True) as r:
            for _ in range(2):  # the first call of each session goes to the idler server: one each
                _, slot = await r.open_session()
                assert content(*await r.post(slot, {"messages": QUESTION})) == "4"
                assert r.last_response(slot).token_ids == ANSWER_IDS
            assert [s.dialect for s in r.model.pool.servers] == ["vllm", "sglang"]
            assert [s.stats.requests for s in r.servers] == [1, 1]

    run(main)


def test_auto_takes_no_web_page_for_an_info_route_and_asks_each_server_once() -> None:
    """A server answering 200 to every GET (a catch-all web page) offers no token ids: auto
    sends its calls no extension, and asks it twice (one GET per info route), not per call."""
    gets: list[str] = []

    async def page(request: web.Request) -> web.Response:
        gets.append(request.path)
        return web.Response(text="<html>welcome</html>", content_type="text/html")

    async def main() -> None:
        async with recording_server(extra_routes=[web.get("/{tail:.*}", page)]) as (url, _, bodies):
            model = OpenAIModel(url, token_capture="auto")
            try:
                for _ in range(3):
                    response = await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
                    assert response.token_ids is None
                assert await model.capture_dialect() is None
            finally:
                await model.aclose()
        assert gets == ["/get_model_info", "/version"]
        assert [set(msgspec.json.decode(b)) for b in bodies] == [{"messages"}] * 3

    run(main)


@pytest.mark.parametrize(("capture", "dialect"), [("auto", "vllm"), ("sglang", "sglang"), (None, None)])
def test_capture_dialect_names_what_the_calls_ask_in(capture: str | None, dialect: str | None) -> None:
    async def main() -> None:
        async with rig(SimulatedModelConfig(ttft=0), token_capture=capture) as r:
            assert await r.model.capture_dialect() == dialect

    run(main)


def test_capture_dialect_of_an_unreachable_server_is_a_provider_error() -> None:
    async def main() -> None:
        async with recording_server() as (url, _, _):
            pass  # closed: nothing listens there any more
        model = OpenAIModel(url, token_capture="auto")
        with pytest.raises(ProviderError, match=r"^cannot reach the model at ") as info:
            await model.capture_dialect()
        await model.aclose()
        assert info.value.status_code == 503

    run(main)


def test_auto_misled_by_an_info_route_drops_the_fields_the_server_refuses_after_one_call() -> None:
    """A gateway answering ``/version`` itself, in front of a provider that refuses unknown
    fields (OpenAI's 400): one call is sent again without the capture fields, the later ones
    carry none; every call succeeds."""

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "1.2.3"})

    async def refuse_extensions(request: web.Request) -> web.StreamResponse:
        body = msgspec.json.decode(await request.read())
        if "return_token_ids" in body:
            return web.json_response(
                {
                    "error": {
                        "message": "Unrecognized request argument supplied: return_token_ids",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]}
        )

    async def main() -> None:
        async with recording_server(refuse_extensions, [web.get("/version", version)]) as (url, _, bodies):
            model = OpenAIModel(url, token_capture="auto")
            try:
                for _ in range(3):
                    response = await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
                    assert response.message.content == "4" and response.token_ids is None
                assert await model.capture_dialect() is None
            finally:
                await model.aclose()
        assert ["return_token_ids" in msgspec.json.decode(b) for b in bodies] == [True, False, False, False]

    run(main)


def test_a_400_naming_a_capture_field_is_final_when_the_capture_was_asked_for() -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}}, status=400
        )

    async def main() -> None:
        async with recording_server(refuse) as (url, _, bodies):
            model = OpenAIModel(url, token_capture="vllm")
            try:
                with pytest.raises(ProviderError, match=r"^provider answered 400: .*return_token_ids"):
                    await model.complete(Request([UserMessage("hi")]), model=None, sampling={})
            finally:
                await model.aclose()
        assert len(bodies) == 1  # "vllm" was the user's word: the refusal is theirs to see

    run(main)
