"""Stopping generations: a closed connection, an abort, a pause (vLLM's ``/abort_requests``,
``/pause``, ``/resume``, ``/is_paused``; SGLang's ``/abort_request``, ``/pause_generation``,
``/continue_generation``), in the shapes a live vLLM 0.32 answers with."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from sim_client import call, events, run, until, user

from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import decode

CAPTURE = {"return_token_ids": True, "logprobs": True}
LONG = {"preamble_tokens": 1000, "per_token": 0.01, "max_completion_tokens": 2000}
"""A generation of ten seconds: whatever stops it, it did not finish."""
CHAT = {"messages": user("What is 17 + 25?"), **CAPTURE}


async def open_stream(
    session: aiohttp.ClientSession, root: str, path: str, payload: dict[str, Any], tokens: int, **headers: str
) -> tuple[aiohttp.ClientResponse, list[Any]]:
    """Start a stream and read it until ``tokens`` tokens came; the response stays open."""
    resp = await session.post(f"{root}{path}", json=payload, headers=headers)
    got: list[Any] = []
    while sum(len(c["choices"][0].get("token_ids") or []) for c in got if c["choices"]) < tokens:
        line = await resp.content.readline()
        if line.startswith(b"data: {"):
            got += events(line)
    return resp, got


async def read_rest(resp: aiohttp.ClientResponse) -> list[Any]:
    async with resp:
        return events(await resp.read())


def test_closing_a_stream_stops_its_generation_at_once() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        for path, payload in [
            ("/v1/chat/completions", {**CHAT, "stream": True}),
            ("/inference/v1/generate", {"token_ids": [20], "stream": True}),
        ]:
            resp, _ = await open_stream(session, root, path, payload, 3)
            resp.close()
            await until(lambda: not server.engine.flights)
        assert server.stats.aborted == 2 and server.stats.tokens < 100

    run(body, **LONG)


def test_a_client_that_gives_up_on_a_json_answer_stops_it_too() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        with pytest.raises(TimeoutError):
            await call(
                session, "POST", f"{root}/v1/chat/completions", json=CHAT, timeout=aiohttp.ClientTimeout(total=0.2)
            )
        await until(lambda: not server.engine.flights)
        assert server.stats.aborted == 1

    run(body, **LONG)


def test_abort_requests_ends_a_stream_with_an_abort_chunk_after_the_tokens_sampled() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        resp, got = await open_stream(
            session, root, "/v1/chat/completions", {**CHAT, "stream": True}, 3, **{"X-Request-Id": "r1"}
        )
        answer = await call(session, "POST", f"{root}/abort_requests", json={"request_ids": ["chatcmpl-r1"]})
        assert answer == (200, {"status": "aborted", "aborted": 1})
        got += await read_rest(resp)
        assert got[-1] == "[DONE]" and got[0]["id"] == "chatcmpl-r1"
        *tokens, end = [c["choices"][0] for c in got[1:-1]]
        assert end == {
            "index": 0,
            "delta": {},
            "logprobs": {"content": []},
            "finish_reason": "abort",
            "stop_reason": None,
            "token_ids": [],
        }  # as vLLM 0.32 ends an aborted stream
        assert all(len(c["token_ids"]) == len(c["logprobs"]["content"]) == 1 for c in tokens)
        assert len(tokens) >= 3 and server.stats.tokens == len(tokens)

    run(body, **LONG)


def test_abort_requests_ends_a_json_answer_with_the_completion_so_far() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        held = asyncio.create_task(
            call(session, "POST", f"{root}/v1/chat/completions", json={**CHAT, "request_id": "j1"})
        )
        await until(lambda: "chatcmpl-j1" in server.engine.flights)
        flight = server.engine.flights["chatcmpl-j1"]
        await until(lambda: flight.elapsed() > 0.05)  # some tokens are produced: how many does not matter
        await call(session, "POST", f"{root}/abort_requests", json={"request_ids": ["chatcmpl-j1"]})
        status, data = await held
        (choice,) = data["choices"]
        assert status == 200 and choice["finish_reason"] == "abort"
        ids = choice["token_ids"]
        assert 0 < len(ids) == len(choice["logprobs"]["content"]) == data["usage"]["completion_tokens"] < 1000
        assert choice["message"]["content"] == decode(ids) and choice["message"]["tool_calls"] == []

    run(body, **LONG)


def test_abort_requests_without_ids_aborts_everything_in_flight() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        streams = [
            await open_stream(session, root, "/v1/chat/completions", {**CHAT, "stream": True}, 1) for _ in range(2)
        ]
        assert await call(session, "POST", f"{root}/abort_requests", json={}) == (
            200,
            {"status": "aborted", "aborted": 2},
        )
        for resp, _ in streams:
            assert (await read_rest(resp))[-2]["choices"][0]["finish_reason"] == "abort"

    run(body, **LONG)


def test_pause_abort_aborts_and_holds_new_requests_until_resume() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        resp, _ = await open_stream(session, root, "/v1/chat/completions", {**CHAT, "stream": True}, 2)
        assert await call(session, "POST", f"{root}/pause?mode=abort") == (200, {"status": "paused"})
        assert (await read_rest(resp))[-2]["choices"][0]["finish_reason"] == "abort"
        assert await call(session, "GET", f"{root}/is_paused") == (200, {"is_paused": True})
        held = asyncio.create_task(
            call(
                session,
                "POST",
                f"{root}/v1/chat/completions",
                json={"messages": user("What is 1 + 1?"), "max_tokens": 2},
            )
        )
        await until(lambda: server.stats.requests == 2)
        await asyncio.sleep(0.05)
        assert not held.done() and not server.engine.flights  # arrived, not admitted
        assert await call(session, "POST", f"{root}/resume") == (200, {"status": "resumed"})
        status, data = await held
        assert status == 200 and data["choices"][0]["finish_reason"] == "length"
        assert await call(session, "GET", f"{root}/is_paused") == (200, {"is_paused": False})

    run(body, **LONG)


def test_pause_keep_freezes_generations_and_resume_goes_on_under_the_version_loaded_meanwhile() -> None:
    """vLLM's ``pause?mode=keep``, a weight load, ``resume``: the tokens after the resume are
    the new version's, as if the tokens before had been given back to it to continue."""

    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        prompt = render(user("Count to 60."))
        ask = {"token_ids": prompt, "stream": True, "sampling_params": {"max_tokens": 60, "logprobs": 0}}
        resp, got = await open_stream(session, root, "/inference/v1/generate", ask, 3)
        await call(session, "POST", f"{root}/pause?mode=keep")
        frozen = server.stats.tokens
        await asyncio.sleep(0.05)
        assert server.engine.flights and server.stats.tokens == frozen  # nothing is produced while paused
        assert await call(session, "POST", f"{root}/update_weight_version", json={"new_version": "1"}) == (
            200,
            {"success": True, "new_version": "1"},
        )
        assert await call(session, "GET", f"{root}/weight_info") == (200, {"weight_version": "1"})
        await call(session, "POST", f"{root}/resume")
        got += await read_rest(resp)
        choices = [c["choices"][0] for c in got[:-1]]
        ids = [i for c in choices for i in c["token_ids"]]
        numbers = [e["logprob"] for c in choices for e in c["logprobs"]["content"]]
        spans = choices[-1]["weight_versions"]
        assert len(ids) == 60 and [s["version"] for s in spans] == ["0", "1"]
        cut = spans[0]["end"]
        assert spans == [{"version": "0", "start": 0, "end": cut}, {"version": "1", "start": cut, "end": 60}]
        status, data = await call(
            session,
            "POST",
            f"{root}/inference/v1/generate",
            json={"token_ids": prompt + ids[:cut], "sampling_params": {"max_tokens": 60 - cut, "logprobs": 0}},
        )
        (rest,) = data["choices"]
        assert rest["token_ids"] == ids[cut:] and [e["logprob"] for e in rest["logprobs"]["content"]] == numbers[cut:]

    run(body, **LONG)


def test_pause_wait_returns_once_the_generations_in_flight_are_done() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        answer = asyncio.create_task(call(session, "POST", f"{root}/v1/chat/completions", json=CHAT))
        await until(lambda: bool(server.engine.flights))
        assert await call(session, "POST", f"{root}/pause?mode=wait") == (200, {"status": "paused"})
        assert answer.done() and (await answer)[1]["choices"][0]["finish_reason"] == "stop"
        await call(session, "POST", f"{root}/resume")

    run(body, preamble_tokens=20, per_token=0.01)


def test_a_plain_stream_is_aborted_too() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        resp = await session.post(
            f"{root}/v1/chat/completions", json={"messages": user("What is 1 + 1?"), "stream": True}
        )
        assert (await resp.content.readline()).startswith(b"data: ")  # the role chunk
        await call(session, "POST", f"{root}/abort_requests", json={})
        got = await read_rest(resp)
        assert got[-2]["choices"] == [
            {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort", "stop_reason": None}
        ]

    run(body, **LONG)


def test_sglang_aborts_by_rid_prefix_or_all_and_pauses_in_its_shapes() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        async def generate(rid: str) -> Any:
            return await call(session, "POST", f"{root}/generate", json={"input_ids": [20], "rid": rid})

        jobs = [asyncio.create_task(generate(rid)) for rid in ("job-1-a", "job-1-b", "job-2")]
        await until(lambda: len(server.engine.flights) == 3)
        assert (await call(session, "POST", f"{root}/abort_request", json={"rid": "job-1"}))[0] == 200
        for job in jobs[:2]:
            assert (await job)[1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert await call(session, "POST", f"{root}/pause_generation", json={"mode": "in_place"}) == (
            200,
            {"message": "Generation paused successfully.", "status": "ok"},
        )
        assert server.engine.frozen and not jobs[2].done()
        assert (await call(session, "POST", f"{root}/continue_generation", json={}))[0] == 200
        await call(session, "POST", f"{root}/abort_request", json={"abort_all": True})
        assert (await jobs[2])[1]["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "Aborted by AbortReq.",
            "status_code": None,
            "err_type": None,
        }

    run(body, dialect="sglang", **LONG)


def test_sglang_update_weights_from_disk_waits_for_the_generations_in_flight_then_loads() -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        job = asyncio.create_task(call(session, "POST", f"{root}/generate", json={"input_ids": [20]}))
        await until(lambda: bool(server.engine.flights))
        answer = await call(
            session, "POST", f"{root}/update_weights_from_disk", json={"model_path": "/ckpt/2", "weight_version": "2"}
        )
        assert answer == (
            200,
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0},
        )
        assert job.done() and (await job)[1]["meta_info"]["weight_version"] == "0"
        assert server.policy_version == 2 and server.engine.paused is None
        status, info = await call(session, "GET", f"{root}/model_info")
        assert info["weight_version"] == "2"

    run(body, dialect="sglang", preamble_tokens=20, per_token=0.01)


@pytest.mark.parametrize(
    "dialect, method, path, payload",
    [
        ("vllm", "POST", "/pause?mode=later", None),
        ("vllm", "POST", "/abort_requests", {"request_ids": "r1"}),
        ("vllm", "POST", "/update_weight_version", {"new_version": "v2"}),
        ("vllm", "POST", "/update_weight_version", {}),
        ("sglang", "POST", "/pause_generation", {"mode": "later"}),
        ("sglang", "POST", "/update_weights_from_disk", {"model_path": "/ckpt"}),
    ],
)
def test_bad_control_requests_get_400_and_change_nothing(dialect: str, method: str, path: str, payload: Any) -> None:
    async def body(server: SimulatedModelServer, session: aiohttp.ClientSession, root: str) -> None:
        status, data = await call(session, method, f"{root}{path}", json=payload)
        assert status == 400 and data["error"]["message"], data
        assert server.engine.paused is None and server.policy_version == 0

    run(body, dialect=dialect)
