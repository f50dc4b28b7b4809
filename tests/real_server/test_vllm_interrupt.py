"""Interrupting generation on a real vLLM 0.32 (its CPU build, the tiny model of
``scripts/vllm_cpu/``), at the HTTP level: what a proxy can rely on to abort a model call,
keep what it sampled, load new weights into the running server, and continue the call.

The server (``vllm_dev``, below) runs with ``VLLM_SERVER_DEV_MODE=1`` (the ``/pause``,
``/resume``, ``/abort_requests``, ``/collective_rpc``, ``/update_weight_version`` routes) and
``--enable-scale-out`` (the token-in route ``/inference/v1/generate``). Teacher-forced logprobs
are ``/v1/completions`` with ``prompt_logprobs`` over the whole sequence (``Server.score``).
Checkpoint A is served; checkpoint B (another seed: other weights, the same tokenizer) is
loaded by ``/collective_rpc`` ``reload_weights`` and labelled by ``/update_weight_version``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from calc_taskset import Arith
from vllm_server import NAME, DevServer, get, post, serve_dev

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    LocalRuntime,
    OpenAIModel,
    Rollout,
    Task,
    Trace,
    reload_weights,
    table_to_traces,
)
from rollout_ray._record.tokens import full_prompt, token_sequences


@pytest.fixture(scope="module")
def vllm_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One vLLM server per module with the dev routes (abort, pause, reload, versions) and the
    token-in route, serving checkpoint A of the tiny model; ``.b`` is checkpoint B. Here, not
    in a conftest.py: the suite's tests import helpers ``from conftest``, and a second
    conftest module would shadow the first."""
    with serve_dev(tmp_path_factory.mktemp("vllm-dev")) as server:
        yield server


pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

LONG = 1500
"""``max_tokens`` of a generation that lasts seconds on 2 cores (with ``ignore_eos``): long
enough to stop midway."""
SAMPLED = {"temperature": 1.0, "seed": 5, "ignore_eos": True}
CHAT = {
    "model": NAME,
    "messages": [{"role": "user", "content": "Count to a thousand."}],
    "max_tokens": LONG,
    "logprobs": True,
    "return_token_ids": True,
    "stream": True,
    **SAMPLED,
}
TOLERANCE = 1e-4
"""Sampled and teacher-forced logprobs agree to float32 noise (0.0 to 1e-6 measured)."""


@pytest.fixture(autouse=True)
def at_a(vllm_dev: DevServer) -> Iterator[None]:
    """Every test starts on checkpoint A, labelled "0", not paused."""
    vllm_dev.load(vllm_dev.a, "0")
    yield


def metric(server: DevServer, name: str) -> float:
    """A counter or gauge of ``/metrics`` (``name`` with its labels as vLLM prints them)."""
    text = get(server.root + "/metrics")[1].decode()
    match = re.search(rf"^{re.escape(name)}\S* ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def finished(server: DevServer, reason: str) -> float:
    """How many requests finished for ``reason`` (an abort by ``/pause?mode=abort`` counts, one by
    ``/abort_requests`` or by a closed connection does not)."""
    return metric(server, f'vllm:request_success_total{{engine="0",finished_reason="{reason}"')


async def until(condition: Any, seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.05)


class Stream:
    """One SSE answer, read chunk by chunk: what it has sampled so far."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.chunks: list[dict[str, Any]] = []
        self.prompt: list[int] = []
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.done = False

    async def read(self, tokens: int | None = None) -> Stream:
        """Read until ``tokens`` tokens came (``None``: to the end)."""
        while not self.done and (tokens is None or len(self.ids) < tokens):
            line = await self.resp.content.readline()
            if not line:
                raise AssertionError(f"the stream ended without [DONE] after {self.chunks[-1:]}")
            if line.strip() == b"data: [DONE]":
                self.done = True
            elif line.startswith(b"data: "):
                chunk = json.loads(line[6:])
                self.chunks.append(chunk)
                self.prompt = chunk.get("prompt_token_ids") or self.prompt
                for choice in chunk["choices"]:
                    self.ids += choice.get("token_ids") or []
                    content = (choice.get("logprobs") or {}).get("content") or []
                    self.logprobs += [e["logprob"] for e in content]
        return self

    @property
    def last(self) -> dict[str, Any]:
        return self.chunks[-1]["choices"][0]


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], tokens: int, request_id: str | None = None
) -> Stream:
    headers = {"X-Request-Id": request_id} if request_id else {}
    resp = await session.post(url, json=body, headers=headers)
    assert resp.status == 200, await resp.text()
    return await Stream(resp).read(tokens)


def close(got: list[float], expected: list[float]) -> bool:
    return len(got) == len(expected) and all(abs(a - b) <= TOLERANCE for a, b in zip(got, expected))


def test_closing_the_stream_aborts_the_request_at_the_server(vllm_dev: DevServer) -> None:
    async def main() -> None:
        tokens, done = metric(vllm_dev, "vllm:generation_tokens_total"), finished(vllm_dev, "length")
        async with aiohttp.ClientSession() as session:
            answer = await stream(session, vllm_dev.base_url + "/chat/completions", CHAT, 5)
            answer.resp.close()
        await until(lambda: metric(vllm_dev, "vllm:num_requests_running") == 0)
        assert metric(vllm_dev, "vllm:generation_tokens_total") - tokens < LONG  # it stopped, unfinished
        assert finished(vllm_dev, "length") == done

    asyncio.run(main())


def test_abort_requests_ends_the_answer_with_abort_and_keeps_what_was_sampled(vllm_dev: DevServer) -> None:
    """``POST /abort_requests {"request_ids": ["chatcmpl-<X-Request-Id>"]}``: a stream ends with
    a chunk of no token and ``finish_reason: "abort"``; a JSON answer comes back whole, with
    the ids and logprobs sampled so far. Those are the model's own (teacher-forced)."""

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            answer = await stream(session, vllm_dev.base_url + "/chat/completions", CHAT, 5, "t-sse")
            assert post(vllm_dev.root + "/abort_requests", {"request_ids": ["chatcmpl-t-sse"]}) == {
                "status": "aborted",
                "aborted": 1,
            }
            await answer.read()
            assert answer.chunks[0]["id"] == "chatcmpl-t-sse"
            # The abort chunk: {"delta": {}, "logprobs": {"content": []}, "finish_reason": "abort",
            # "stop_reason": null, "token_ids": []}. Tokens sampled before the abort and not yet sent
            # ride on it (one on a quiet machine; more when the server's output loop lags under
            # load), each with its logprob: how many depends on timing, so only that they pair up.
            last = answer.last
            assert (last["finish_reason"], last["stop_reason"]) == ("abort", None), answer.chunks[-2:]
            assert len(last["token_ids"]) == len(last["logprobs"]["content"])
            assert 5 <= len(answer.ids) == len(answer.logprobs) < LONG
            assert close(answer.logprobs, vllm_dev.score(answer.prompt, answer.ids))

            json_answer = asyncio.create_task(
                session.post(
                    vllm_dev.base_url + "/chat/completions", json={**CHAT, "stream": False, "request_id": "t-json"}
                )
            )
            await until(lambda: metric(vllm_dev, "vllm:num_requests_running") == 1)
            post(vllm_dev.root + "/abort_requests", {"request_ids": ["chatcmpl-t-json"]})
            async with await json_answer as resp:
                data = await resp.json()
        (choice,) = data["choices"]
        assert (data["id"], choice["finish_reason"]) == ("chatcmpl-t-json", "abort")
        ids, logprobs = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
        assert 0 < len(ids) == len(logprobs) == data["usage"]["completion_tokens"] < LONG
        assert close(logprobs, vllm_dev.score(data["prompt_token_ids"], ids))

    asyncio.run(main())


def test_pause_abort_aborts_what_runs_and_holds_what_comes_until_resume(vllm_dev: DevServer) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            answer = await stream(session, vllm_dev.base_url + "/chat/completions", CHAT, 5)
            assert post(vllm_dev.root + "/pause?mode=abort") == {"status": "paused"}
            await answer.read()
            assert answer.last["finish_reason"] == "abort" and len(answer.ids) < LONG
            assert json.loads(get(vllm_dev.root + "/is_paused")[1]) == {"is_paused": True}
            later = asyncio.create_task(
                session.post(vllm_dev.base_url + "/chat/completions", json={**CHAT, "stream": False, "max_tokens": 3})
            )
            await asyncio.sleep(1.0)  # nothing to wait for: it must not happen
            assert not later.done()
            assert post(vllm_dev.root + "/resume") == {"status": "resumed"}
            async with await later as resp:
                data = await resp.json()
        assert data["choices"][0]["finish_reason"] == "length" and len(data["choices"][0]["token_ids"]) == 3
        assert json.loads(get(vllm_dev.root + "/is_paused")[1]) == {"is_paused": False}

    asyncio.run(main())


def test_prompt_ids_plus_the_ids_sampled_so_far_continue_the_completion(vllm_dev: DevServer) -> None:
    """The token-in route continues a completion given as one prompt (the chat completion's
    ``prompt_token_ids`` + its ``token_ids`` so far): greedy, exactly the uninterrupted
    completion; sampled, tokens the model scores as it samples them. ``/v1/completions`` with
    a list of ids does it too, without the versions."""
    chat = {**CHAT, "stream": False, "max_tokens": 40, "temperature": 0.0}
    data = post(vllm_dev.base_url + "/chat/completions", chat)
    prompt, ids = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    logprobs = [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
    for k in (1, 17, 39):
        rest = post(
            vllm_dev.root + "/inference/v1/generate",
            {
                "token_ids": prompt + ids[:k],
                "return_token_ids": True,
                "sampling_params": {"max_tokens": 40 - k, "temperature": 0.0, "logprobs": 0, "ignore_eos": True},
            },
        )
        (choice,) = rest["choices"]
        assert rest["prompt_token_ids"] == prompt + ids[:k] and rest["request_id"].startswith("generate-tokens-")
        assert choice["token_ids"] == ids[k:] and choice["finish_reason"] == "length"
        assert close([e["logprob"] for e in choice["logprobs"]["content"]], logprobs[k:])
        assert choice["weight_versions"] == [{"version": "0", "start": 0, "end": 40 - k}]
        text = post(
            vllm_dev.base_url + "/completions",
            {
                "model": NAME,
                "prompt": prompt + ids[:k],
                "max_tokens": 40 - k,
                "temperature": 0.0,
                "logprobs": 0,
                "return_token_ids": True,
                "ignore_eos": True,
            },
        )
        assert text["choices"][0]["token_ids"] == ids[k:]
        assert close(text["choices"][0]["logprobs"]["token_logprobs"], logprobs[k:])
    sampled = post(
        vllm_dev.root + "/inference/v1/generate",
        {"token_ids": prompt + ids[:5], "sampling_params": {"max_tokens": 30, "logprobs": 0, **SAMPLED}},
    )
    (choice,) = sampled["choices"]
    assert close(
        [e["logprob"] for e in choice["logprobs"]["content"]], vllm_dev.score(prompt + ids[:5], choice["token_ids"])
    )


def test_a_second_checkpoint_loads_midway_and_the_call_continues_under_it(vllm_dev: DevServer) -> None:
    """Issue 22's switch: a call samples under A; ``/pause?mode=abort`` stops it (its tokens
    kept); B is loaded into the running server (``reload_weights``, no restart) and labelled
    "1"; after ``/resume`` the call continues from its prompt and tokens. The tokens before
    the switch are A's (A's teacher-forced logprobs), those after are B's."""

    async def main() -> Stream:
        async with aiohttp.ClientSession() as session:
            answer = await stream(session, vllm_dev.base_url + "/chat/completions", CHAT, 5)
            post(vllm_dev.root + "/pause?mode=abort")
            return await answer.read()

    before = asyncio.run(main())
    assert before.last["finish_reason"] == "abort"
    vllm_dev.reload(vllm_dev.b)
    post(vllm_dev.root + "/update_weight_version", {"new_version": "1"})
    assert post(vllm_dev.root + "/resume") == {"status": "resumed"}
    assert json.loads(get(vllm_dev.root + "/weight_info")[1]) == {"weight_version": "1"}
    rest = post(
        vllm_dev.root + "/inference/v1/generate",
        {"token_ids": before.prompt + before.ids, "sampling_params": {"max_tokens": 50, "logprobs": 0, **SAMPLED}},
    )
    (choice,) = rest["choices"]
    after, after_logprobs = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
    assert choice["weight_versions"] == [{"version": "1", "start": 0, "end": 50}]
    assert close(after_logprobs, vllm_dev.score(before.prompt + before.ids, after))  # B's
    assert not close(before.logprobs, vllm_dev.score(before.prompt, before.ids))  # not B's
    vllm_dev.load(vllm_dev.a, "0")
    assert close(before.logprobs, vllm_dev.score(before.prompt, before.ids))  # A's
    assert not close(after_logprobs, vllm_dev.score(before.prompt + before.ids, after))  # not A's


def test_pause_keep_then_a_reload_continues_the_calls_in_flight_under_the_new_weights(vllm_dev: DevServer) -> None:
    """``/pause?mode=keep`` freezes the calls in flight; reload B; ``/resume``: they go on
    without being sent again, and the token-in route's ``weight_versions`` says which tokens
    each version sampled. On this CPU build the tokens after the switch score as B's, before
    as A's (the frozen requests' cache is recomputed: measured, not a documented promise)."""

    async def main() -> Stream:
        async with aiohttp.ClientSession() as session:
            body = {
                "token_ids": [1, 2942, 624, 813, 201],
                "stream": True,
                "sampling_params": {"max_tokens": LONG, "logprobs": 0, **SAMPLED},
            }
            answer = await stream(session, vllm_dev.root + "/inference/v1/generate", body, 5)
            assert post(vllm_dev.root + "/pause?mode=keep") == {"status": "paused"}
            vllm_dev.reload(vllm_dev.b)
            post(vllm_dev.root + "/update_weight_version", {"new_version": "1"})
            post(vllm_dev.root + "/resume")
            return await answer.read()

    answer = asyncio.run(main())
    assert answer.last["finish_reason"] == "length" and len(answer.ids) == LONG
    spans = answer.last["weight_versions"]
    cut = spans[0]["end"]
    assert spans == [{"version": "0", "start": 0, "end": cut}, {"version": "1", "start": cut, "end": LONG}]
    prompt = [1, 2942, 624, 813, 201]
    post(vllm_dev.root + "/reset_prefix_cache")  # score B from B's own cache, not the frozen A blocks
    assert close(answer.logprobs[cut:], vllm_dev.score(prompt + answer.ids[:cut], answer.ids[cut:]))
    vllm_dev.load(vllm_dev.a, "0")
    assert close(answer.logprobs[:cut], vllm_dev.score(prompt, answer.ids[:cut]))


# -- the package on the real server: Driver.paused(interrupt=True), token in / token out ------


class Long(Task):
    """One long reply per rollout, scored by nothing."""


def split(trace: Trace) -> tuple[list[int], list[int], list[float], int]:
    """A one-call rollout's prompt ids, sampled ids, their logprobs, and how many tokens the
    old version sampled (its ``token_policy``: version 0, then version 1)."""
    (call,) = trace.calls
    assert call.error is None and call.interrupts == 1, call
    (old, kept), (new, rest) = call.token_policy  # type: ignore[misc]
    (sequence,) = token_sequences(trace)
    prompt = [i for i, m in zip(sequence.input_ids, sequence.loss_mask) if not m]
    ids = [i for i, m in zip(sequence.input_ids, sequence.loss_mask) if m]
    logprobs = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask) if m]
    assert (old, new) == (0, 1) and kept > 0 and rest > 0 and kept + rest == len(ids) == LONG, call.token_policy
    assert sequence.input_ids == prompt + ids  # one turn: the prompt, then every sampled id
    assert [v for v, m in zip(sequence.policy, sequence.loss_mask) if m] == [0] * kept + [1] * rest
    return prompt, ids, logprobs, kept


def test_driver_paused_with_interrupt_loads_b_and_the_rollouts_continue_under_it(vllm_dev: DevServer) -> None:
    """Issue 22 §1 through the package: rollouts generate under checkpoint A (version 0);
    ``Driver.paused(version=1, interrupt=True)`` stops them at the server, ``reload_weights``
    loads B into the running server; after the block each call continues from what it sampled
    (token in). Each rollout is one reply whose tokens before the switch are A's (A's
    teacher-forced logprobs, not B's) and after it B's (not A's)."""
    n = 2
    tasks = [Long({"idx": i, "prompt": f"Count to {1000 + i}."}) for i in range(n)]
    config = EvalConfig(max_in_flight=n, sampling={"max_tokens": LONG, **SAMPLED})

    async def main() -> Any:
        model = OpenAIModel(vllm_dev.base_url, name=NAME, token_capture="vllm")
        try:
            async with LocalExecutor(runtime="local") as executor:
                driver = Driver(
                    tasks, ChatHarness(retries=0), model, executor=executor, config=config, policy_version=0
                )
                tokens = metric(vllm_dev, "vllm:generation_tokens_total")
                running = asyncio.ensure_future(driver.arun())
                # Both generating, and some tokens sampled by A: then the pause interrupts them midway.
                await until(
                    lambda: (
                        metric(vllm_dev, "vllm:num_requests_running") == n
                        and metric(vllm_dev, "vllm:generation_tokens_total") - tokens >= 20 * n
                    ),
                    300,
                )
                async with driver.paused(version=1, interrupt=True):
                    await reload_weights(model, str(vllm_dev.b), 1)
                return await asyncio.wait_for(running, 600)
        finally:
            await model.aclose()

    result = asyncio.run(main())
    samples = result.samples
    assert samples["ok"].to_pylist() == [True] * n
    assert (samples["policy_min"].to_pylist(), samples["policy_max"].to_pylist()) == ([0] * n, [1] * n)
    assert json.loads(get(vllm_dev.root + "/weight_info")[1]) == {"weight_version": "1"}
    rollouts = [split(trace) for trace in table_to_traces(samples)]  # the ids are in the token columns
    post(vllm_dev.root + "/reset_prefix_cache")
    for prompt, ids, logprobs, kept in rollouts:  # B is loaded
        assert close(logprobs[kept:], vllm_dev.score(prompt + ids[:kept], ids[kept:]))  # B's
        assert not close(logprobs[:kept], vllm_dev.score(prompt, ids[:kept]))  # not B's
    vllm_dev.load(vllm_dev.a, "0")
    for prompt, ids, logprobs, kept in rollouts:
        assert close(logprobs[:kept], vllm_dev.score(prompt, ids[:kept]))  # A's
        assert not close(logprobs[kept:], vllm_dev.score(prompt + ids[:kept], ids[kept:]))  # not A's
    print(f"\ntokens under A / under B per rollout: {[(k, LONG - k) for *_, k in rollouts]}")


def test_a_multi_turn_tool_rollout_is_one_training_sequence(vllm_dev: DevServer) -> None:
    """Issue 22 §2 on the tiny model, whose template re-tokenizes a past tool call (on the
    text route every tool turn drifts: ``test_vllm_cpu``). Token in: turn k+1's prompt is turn
    k's prompt and sampled ids, then the new messages' ids; the rollout is one sequence, no
    drift, every sampled id once with its logprob, and the tool calls were read back from the
    ids (the agent called ``add``)."""
    model = OpenAIModel(vllm_dev.base_url, name=NAME, token_capture="vllm")
    asked = {"max_tokens": 64, "seed": 3, "tool_choice": "required"}
    rollout = Rollout(
        Arith({"prompt": "What is 2 + 3? Use add.", "system_prompt": "Use the tools."}),
        ChatHarness(retries=0, max_calls=3),
        model=model,
        runtime_factory=LocalRuntime,
        sampling=asked,
    )

    async def main() -> Trace:
        try:
            return await rollout.run()
        finally:
            await model.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.errors == [], trace.errors
    assert len(trace.calls) == 3 and len(trace.tool_messages) >= 2
    nodes = [trace.nodes[c.node] for c in trace.calls]  # type: ignore[index]
    assert all(node.message.tool_calls for node in nodes)
    assert trace.token_drift == []
    (sequence,) = token_sequences(trace)
    sampled = [(i, lp) for i, m, lp in zip(sequence.input_ids, sequence.loss_mask, sequence.logprobs) if m]
    assert sampled == [(i, lp) for n in nodes for i, lp in zip(n.token_ids, n.logprobs)]  # type: ignore[arg-type]
    prompts = [full_prompt(trace, call) for call in trace.calls]
    for k in range(1, len(prompts)):  # turn k+1 grows turn k's ids, never re-tokenizes them
        assert (
            prompts[k][: len(prompts[k - 1]) + len(nodes[k - 1].token_ids)] == prompts[k - 1] + nodes[k - 1].token_ids
        )  # type: ignore[operator]
    assert sequence.input_ids[: len(prompts[0])] == prompts[0] and prompts[0][0] == 1  # <|im_start|>
    for prompt, node in zip(prompts, nodes):  # the model's ids after that very prompt: under the
        # tool grammar a logprob is the masked distribution's, never below the model's own
        scored = vllm_dev.score(prompt, node.token_ids)  # type: ignore[arg-type]
        assert all(lp >= raw - 1e-3 for lp, raw in zip(node.logprobs, scored, strict=True)), (node.logprobs, scored)
    print(f"\n{len(trace.calls)} turns, one sequence of {len(sequence.input_ids)} ids ({len(sampled)} sampled)")
