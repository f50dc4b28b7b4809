"""Continuing a completion from token ids: the prompt the server reported plus the ids sampled
so far, given back on the token-in route (vLLM's ``/inference/v1/generate``, SGLang's
``/generate``), continue it exactly; under another policy version, the new version writes the
rest."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from sim_client import call, events, run, user

from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.tokenizer import IM_END, decode

QUESTION = user("What is 17 + 25?")
CAPTURE = {"return_token_ids": True, "logprobs": True}
ROUTE = {"vllm": "/inference/v1/generate", "sglang": "/generate"}


async def chat(session: aiohttp.ClientSession, root: str, **extra: Any) -> tuple[list[int], list[int], list[float]]:
    """An uninterrupted chat completion: ``(prompt ids, completion ids, logprobs)``."""
    status, data = await call(
        session, "POST", f"{root}/v1/chat/completions", json={"messages": QUESTION, **CAPTURE, **extra}
    )
    assert status == 200, data
    choice = data["choices"][0]
    prompt = data.get("prompt_token_ids") or choice["prompt_token_ids"]
    return prompt, choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


async def rest(
    session: aiohttp.ClientSession,
    root: str,
    dialect: str,
    ids: list[int],
    sampling: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[list[int], list[float], Any]:
    """Continue ``ids`` on the token-in route: ``(new ids, their logprobs, versions)``."""
    sampling = sampling or {}
    if dialect == "vllm":
        body = {"token_ids": ids, "sampling_params": {**sampling, "logprobs": 0}, **extra}
    else:
        body = {
            "input_ids": ids,
            "sampling_params": {"sampling_seed": sampling.get("seed"), **sampling},
            "return_logprob": True,
            **extra,
        }
        body["sampling_params"].pop("seed", None)
    status, data = await call(session, "POST", f"{root}{ROUTE[dialect]}", json=body)
    assert status == 200, data
    if dialect == "vllm":
        (choice,) = data["choices"]
        return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]], choice["weight_versions"]
    meta = data["meta_info"]
    assert data["output_ids"] == [i for _, i, _ in meta["output_token_logprobs"]]
    return data["output_ids"], [lp for lp, _, _ in meta["output_token_logprobs"]], meta["weight_version"]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 4}], ids=["greedy", "seeded"])
@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_completion_continued_from_any_point_is_the_uninterrupted_one(dialect: str, sampling: dict[str, Any]) -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt, ids, logprobs = await chat(session, root, **sampling)
        assert len(ids) == 8 + 2 and ids[-1] == IM_END  # the preamble, "42", <|im_end|>
        for k in range(len(ids) + 1):
            tokens, numbers, _ = await rest(session, root, dialect, prompt + ids[:k], sampling)
            assert (tokens, numbers) == (ids[k:], logprobs[k:]), k

    run(body, dialect=dialect, preamble_tokens=8)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_under_another_version_the_new_version_writes_the_rest(dialect: str) -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt, old, old_logprobs = await chat(session, root)
        server.policy_version = 1
        _, new, new_logprobs = await chat(session, root)
        assert new[-2:] == old[-2:] and decode(new[-2:]) == "42<|im_end|>"  # the same answer
        assert new[:8] != old[:8] and new_logprobs[-2:] != old_logprobs[-2:]  # another preamble, other numbers
        tokens, numbers, versions = await rest(session, root, dialect, prompt + old[:3])
        assert tokens == new[3:]  # the new model's words, where its preamble stands
        assert versions == ([{"version": "1", "start": 0, "end": len(tokens)}] if dialect == "vllm" else "1")
        # The new version scores what is really there: continuing its own continuation changes nothing.
        again, renumbered, _ = await rest(session, root, dialect, prompt + old[:3] + tokens[:2])
        assert (again, renumbered) == (tokens[2:], numbers[2:])
        assert numbers[-2:] != old_logprobs[-2:]

    run(body, dialect=dialect, preamble_tokens=8)


def test_max_tokens_counts_the_new_tokens_and_the_config_caps_the_whole() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt, ids, _ = await chat(session, root)
        status, data = await call(
            session,
            "POST",
            f"{root}/inference/v1/generate",
            json={"token_ids": prompt + ids[:2], "sampling_params": {"max_tokens": 3}},
        )
        (choice,) = data["choices"]
        assert (choice["token_ids"], choice["finish_reason"], choice["logprobs"]) == (ids[2:5], "length", None)
        tokens, _, _ = await rest(session, root, "vllm", prompt + ids[:2], {"max_tokens": 100})
        assert len(ids[:2] + tokens) == 6  # max_completion_tokens
        assert tokens == ids[2:6]

    run(body, preamble_tokens=8, max_completion_tokens=6)


def test_vllm_answers_in_its_token_shapes() -> None:
    """Field by field as vLLM 0.32's ``/inference/v1/generate`` answers (the CPU build)."""

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt, ids, logprobs = await chat(session, root, top_logprobs=3)
        ask = {"token_ids": prompt, "sampling_params": {"logprobs": 2}, "return_token_ids": True}
        status, data = await call(
            session, "POST", f"{root}/inference/v1/generate", json=ask, headers={"X-Request-Id": "r7"}
        )
        assert status == 200 and data["request_id"] == "generate-tokens-r7" and data["output_mode"] == "tokens"
        assert data["prompt_token_ids"] == prompt and data["usage"]["completion_tokens"] == len(ids)
        (choice,) = data["choices"]
        assert set(choice) == {
            "index",
            "finish_reason",
            "stop_reason",
            "token_ids",
            "routed_experts",
            "sampling_mask",
            "weight_versions",
            "logprobs",
        }
        assert (choice["token_ids"], choice["finish_reason"]) == (ids, "stop")
        for entry, token, number in zip(choice["logprobs"]["content"], ids, logprobs, strict=True):
            assert (entry["token_id"], entry["logprob"]) == (token, number)
            top = entry["top_logprobs"]
            assert top[0] == {"token_id": token, "logprob": number, "rank": entry["rank"]}
            assert 2 <= len(top) <= 3 and [t["rank"] for t in top[1:]] == sorted(t["rank"] for t in top[1:])
        status, chunks = await call(
            session,
            "POST",
            f"{root}/inference/v1/generate",
            json={**ask, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == len(ids)
        tokens = chunks[:-2]
        assert [c["choices"][0]["token_ids"] for c in tokens] == [[i] for i in ids]  # one token a chunk
        assert "prompt_token_ids" in tokens[0] and all("prompt_token_ids" not in c for c in tokens[1:])
        assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (len(ids) - 1) + ["stop"]
        assert tokens[-1]["choices"][0]["weight_versions"] == [{"version": "0", "start": 0, "end": len(ids)}]

    run(body, preamble_tokens=4)


def test_sglang_answers_in_its_generate_shapes() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt, ids, logprobs = await chat(session, root)
        ask = {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 2, "rid": "job-1"}
        status, data = await call(session, "POST", f"{root}/generate", json=ask)
        assert status == 200 and data["output_ids"] == ids and data["text"] == decode(ids[:-1])
        meta = data["meta_info"]
        assert meta["id"] == "job-1" and meta["finish_reason"] == {"type": "stop", "matched": IM_END}
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (
            len(prompt),
            len(ids),
            "5",
        )
        assert meta["output_token_logprobs"] == [[lp, i, None] for lp, i in zip(logprobs, ids)]
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])
        status, raw = await call(session, "POST", f"{root}/generate", json={**ask, "stream": True})
        chunks = raw[:-1]
        assert raw[-1] == "[DONE]" and len(chunks) >= 2
        grown = [len(c["output_ids"]) for c in chunks]  # each chunk is the whole answer so far
        assert grown == sorted(set(grown)) and all(c["output_ids"] == ids[: len(c["output_ids"])] for c in chunks)
        assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
        last = chunks[-1]
        assert {**last, "meta_info": {**last["meta_info"], "e2e_latency": 0}} == {
            **data,
            "meta_info": {**meta, "e2e_latency": 0},
        }

    run(body, dialect="sglang", preamble_tokens=6, policy_version=5, per_token=0.01)


@pytest.mark.parametrize(
    "ask, param",
    [
        ({"token_ids": []}, "token_ids"),
        ({"token_ids": [1, -2]}, "token_ids"),
        ({"token_ids": [7]}, "token_ids"),  # reserved: no text encodes to it
        ({"token_ids": [20], "sampling_params": {"n": 2}}, "n"),
        ({"token_ids": [20], "sampling_params": {"max_tokens": 0}}, "max_tokens"),
        ({"token_ids": [20], "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"token_ids": [20], "sampling_params": []}, "sampling_params"),
    ],
)
def test_bad_token_requests_get_400_naming_the_field(ask: dict[str, Any], param: str) -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> Any:
        status, data = await call(session, "POST", f"{root}/inference/v1/generate", json=ask)
        return status, data["error"]["param"]

    assert run(body) == (400, param)


def test_an_aborted_stream_continued_from_its_ids_is_the_uninterrupted_answer() -> None:
    """The whole round trip a proxy makes: stream, abort mid-way (keeping the ids and logprobs
    sampled), continue from the prompt ids plus those: the joined answer is the one never
    interrupted."""

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        payload = {"messages": QUESTION, **CAPTURE, "stream": True}
        kept: list[int] = []
        numbers: list[float] = []
        prompt: list[int] = []
        async with session.post(f"{root}/v1/chat/completions", json=payload, headers={"X-Request-Id": "a"}) as resp:
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                (choice,) = (chunk := events(line)[0])["choices"]
                prompt = chunk.get("prompt_token_ids") or prompt
                kept += choice.get("token_ids") or []
                numbers += [e["logprob"] for e in (choice["logprobs"] or {}).get("content", [])]
                if len(kept) == 5:
                    await call(session, "POST", f"{root}/abort_requests", json={"request_ids": ["chatcmpl-a"]})
                finish = choice["finish_reason"]
        assert finish == "abort" and len(kept) >= 5
        tokens, rest_numbers, _ = await rest(session, root, "vllm", prompt + kept)
        _, ids, logprobs = await chat(session, root)
        assert len(kept) < len(ids) and (kept + tokens, numbers + rest_numbers) == (ids, logprobs)

    run(body, preamble_tokens=150, per_token=0.002, max_completion_tokens=1000)
