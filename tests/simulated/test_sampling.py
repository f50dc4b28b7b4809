"""n choices, temperature and seed, plausible log-probabilities, per-token latency."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_client import Client, ask, assemble, events, serve, user

from rollout_ray._simulated.completion import Draw, choose, error_probability
from rollout_ray._simulated.config import SimulatedModelConfig
from rollout_ray._simulated.dialects import sglang_events, vllm_events
from rollout_ray._simulated.logprobs import Scorer, score
from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.request import parse
from rollout_ray._simulated.tokenizer import encode

CAPTURE = {"return_token_ids": True, "logprobs": True, "top_logprobs": 2}


def strip(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("id", "created")}


def test_n_choices_each_have_their_own_draws() -> None:
    _, one = ask({"messages": user("What is 6 * 7?")}, error_rate=0.5)
    _, two = ask({"messages": user("What is 6 * 7?"), "n": 2}, error_rate=0.5)
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0] == one["choices"][0]  # choice 0 is the answer n=1 gets
    assert two["usage"]["completion_tokens"] == 2 * one["usage"]["completion_tokens"]
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    answers = set()
    for question in range(10):
        _, data = ask({"messages": user(f"What is {question} * 7?"), "n": 16}, error_rate=0.5)
        answers |= {(question, c["message"]["content"]) for c in data["choices"]}
    assert len(answers) == 20  # each question got both its right and its wrong answer


def test_n_choices_with_token_capture_are_distinct_and_deterministic() -> None:
    question = {"messages": user("What is 6 * 7?"), "n": 2, "temperature": 0.8, "seed": 1, **CAPTURE}
    _, data = ask(question)
    assert strip(ask(question)[1]) == strip(data)
    first, second = data["choices"]
    assert first["logprobs"] != second["logprobs"]
    total = len(first["token_ids"]) + len(second["token_ids"])
    assert data["usage"]["completion_tokens"] == total


def test_n_choices_stream_side_by_side() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        for capture in ({}, CAPTURE):
            question = {"messages": user("Hello"), "n": 2, "temperature": 1.0, "seed": 3, **capture}
            _, raw = await post(question)
            whole = json.loads(raw)
            _, raw = await post({**question, "stream": True})
            chunks = events(raw)
            for choice in whole["choices"]:
                message, finish, _ = assemble(chunks, choice["index"])
                assert (message["content"], finish) == (choice["message"]["content"], choice["finish_reason"])
                if capture:
                    ids = [
                        i
                        for c in chunks[:-1]
                        for ch in c["choices"]
                        if ch["index"] == choice["index"]
                        for i in ch.get("token_ids", ())
                    ]
                    assert ids == choice["token_ids"]

    serve(body)


def test_wrong_answers_grow_with_temperature() -> None:
    config = SimulatedModelConfig(error_rate=0.1, temperature_error=0.5)
    assert error_probability(config, 0.0) == pytest.approx(0.1)
    assert error_probability(config, 1.0) == pytest.approx(1 - 0.9 * math.exp(-0.5))
    questions = [f"What is {a} + {a + 3}?" for a in range(150)]

    async def body(server: SimulatedModelServer, post: Client) -> list[int]:
        async def wrong(q: str, temperature: float | None) -> bool:
            a = int(q.split()[2])
            extra = {} if temperature is None else {"temperature": temperature}
            _, raw = await post({"messages": user(q), **extra})
            return json.loads(raw)["choices"][0]["message"]["content"] != str(2 * a + 3)

        counts = []
        for temperature in (None, 0.0, 0.7, 2.0):
            counts.append(sum(await asyncio.gather(*(wrong(q, temperature) for q in questions))))
        return counts

    none, zero, warm, hot = serve(body, error_rate=0.0)
    assert none == zero == 0  # temperature 0 (or none) answers as before
    assert 0 < warm < hot
    assert abs(warm / 150 - error_probability(SimulatedModelConfig(), 0.7)) < 0.12


def test_a_tool_result_is_misreported_more_often_the_hotter_it_samples() -> None:
    """The answer after a calculator's result is wrong (one too high) with the same
    probability as a computed one: a tool-calling taskset shows a pass@k curve too, and is
    always right at temperature 0."""

    def conversation(a: int) -> list[dict[str, Any]]:
        call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": "{}"}}
        return [
            *user(f"What is {a} + 1000?"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": f" {a + 1000}\n"},
        ]

    async def body(server: SimulatedModelServer, post: Client) -> list[int]:
        async def wrong(a: int, temperature: float | None) -> bool:
            extra = {} if temperature is None else {"temperature": temperature}
            _, raw = await post({"messages": conversation(a), **extra})
            answer = json.loads(raw)["choices"][0]["message"]["content"]
            assert answer in (str(a + 1000), str(a + 1001))
            return answer != str(a + 1000)

        return [sum(await asyncio.gather(*(wrong(a, t) for a in range(150)))) for t in (None, 0.0, 0.7, 2.0)]

    none, zero, warm, hot = serve(body)
    assert none == zero == 0
    assert 0 < warm < hot
    assert abs(warm / 150 - error_probability(SimulatedModelConfig(), 0.7)) < 0.12
    for weather in (f"sunny, {n} C" for n in range(20)):  # only integer results are misread
        _, data = ask(
            {
                "messages": [*conversation(1)[:2], {"role": "tool", "tool_call_id": "call_0", "content": weather}],
                "temperature": 2.0,
            }
        )
        assert data["choices"][0]["message"]["content"] == weather


def test_a_seed_fixes_the_sample_and_without_one_a_retry_resamples() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        async def sample(**extra: Any) -> Any:
            _, raw = await post({"messages": user("What is 12 + 30?"), **CAPTURE, **extra})
            return json.loads(raw)["choices"][0]

        seeded = [await sample(temperature=0.9, seed=5) for _ in range(3)]
        assert seeded[0] == seeded[1] == seeded[2]
        assert (await sample(temperature=0.9, seed=6))["logprobs"] != seeded[0]["logprobs"]
        unseeded = [await sample(temperature=0.9) for _ in range(2)]
        assert unseeded[0]["logprobs"] != unseeded[1]["logprobs"]
        greedy = [await sample(temperature=0, seed=s) for s in (1, 2)] + [await sample()]
        assert greedy[0] == greedy[1] == greedy[2]  # temperature 0 ignores the seed

    serve(body)
    # The server's seed counts too.
    question = {"messages": user("What is 12 + 30?"), **CAPTURE, "temperature": 0.9, "seed": 5}
    assert ask(question, seed=1)[1]["choices"][0]["logprobs"] != ask(question, seed=2)[1]["choices"][0]["logprobs"]


def test_a_wrong_sample_ranks_the_right_token_first() -> None:
    for a in range(40):
        _, data = ask({"messages": user(f"What is {a} + 1?"), **CAPTURE, "temperature": 2.0, "seed": a})
        choice = data["choices"][0]
        first = choice["logprobs"]["content"][0]
        for entry in choice["logprobs"]["content"]:
            assert entry["logprob"] < 0 and entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        if choice["message"]["content"] != str(a + 1):  # sampled first, then the true best: the right answer
            assert first["top_logprobs"][1]["token"] == str(a + 1)
            assert first["top_logprobs"][1]["logprob"] > first["logprob"]
            break
    else:
        pytest.fail("no wrong answer at temperature 2 in 40 tries")


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_streamed_waits_add_up_to_ttft_plus_per_token_times_tokens(dialect: str) -> None:
    config = SimulatedModelConfig(ttft=0.25, per_token=0.125)
    body = {"messages": user("Hello"), "logprobs": True, "stream": True, "n": 2, "temperature": 0.5}
    call = parse(json.dumps(body).encode(), config)
    choices = [choose(call, config, Draw(bytes(16), bytes(28)), i) for i in range(2)]
    tokens = len(encode("I don't know.")) + 1
    assert [len(c.ids) for c in choices] == [tokens, tokens]
    head = {"id": "x", "created": 0, "model": "m"}
    if dialect == "vllm":
        sent = vllm_events(head, choices, [], None, call.capture, config.ttft, config.per_token)
        per_chunk = [len(e[1]["choices"][0]["logprobs"]["content"]) for e in sent[2:]]
        assert per_chunk == [1] * 2 * tokens  # one token a chunk, the two choices side by side
    else:
        sent = sglang_events(head, choices, None, call.capture, config.ttft, config.per_token)
    assert sum(wait for wait, _ in sent) == config.ttft + config.per_token * tokens


def test_token_capture_streams_in_real_time() -> None:
    async def main() -> tuple[float, int]:
        config = SimulatedModelConfig(ttft=0.02, per_token=0.01)
        async with SimulatedModelServer(config) as server, aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            start = loop.time()
            payload = {"messages": user("Hello"), "stream": True, "return_token_ids": True}  # 5 tokens
            async with session.post(f"{server.base_url}/chat/completions", json=payload) as resp:
                raw = await resp.read()
            return loop.time() - start, len(events(raw))

    elapsed, chunks = asyncio.run(main())
    assert chunks == 1 + 5 + 1  # role, one per token, [DONE]
    assert 0.07 <= elapsed < 30  # paced by the latency; the upper bound only guards a hang


@settings(max_examples=50, deadline=None)
@given(
    sampled=st.lists(st.integers(16, 400), max_size=12),
    greedy=st.lists(st.integers(16, 400), max_size=12),
    cut=st.integers(0, 12),
)
def test_scores_are_causal_so_a_scorer_can_take_over_a_completion_midway(
    sampled: list[int], greedy: list[int], cut: int
) -> None:
    whole = score(sampled, greedy, b"material")
    assert score(sampled[:cut], greedy, b"material") == whole[:cut]
    scorer = Scorer(greedy, b"material", sampled[:cut])
    assert [scorer.next(t) for t in sampled[cut:]] == whole[cut:]
