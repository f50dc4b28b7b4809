"""Token capture end to end against a real vLLM server (its CPU build) on a tiny local model.

The server and where its environment is found: ``vllm_server.py`` (every test here is skipped
with the reason when it is absent). The replies are gibberish; what is checked is the token
record: the ids and logprobs the server sampled reach the trace unchanged, the prompt ids are
the server's own template, and the trainer's sequences line up. One server serves the module.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from calc_taskset import Arith
from vllm_server import NAME, REPO, Server, model_dir, serve, vllm_python

from rollout_ray import (
    ChatHarness,
    Driver,
    EvalConfig,
    LocalExecutor,
    LocalRuntime,
    ModelCall,
    OpenAIModel,
    Request,
    Rollout,
    RolloutSession,
    Task,
    Trace,
    TraceTask,
    UserMessage,
    reward,
    table_to_traces,
)
from rollout_ray._record.graph import path_to
from rollout_ray._record.openai_codec import encode_request
from rollout_ray._record.tokens import full_prompt, token_sequences
from rollout_ray._serving.proxy import HTTPInterception

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(900)]

EOS = {0, 2}  # the tiny model stops on <|im_end|> (2) or <|endoftext|> (0): its generation_config
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = vllm_python()
    tmp = tmp_path_factory.mktemp("vllm")
    with serve(python, model_dir(python, tmp), tmp) as server:
        yield server


class Ask(Task):
    """A trivial question; the reward only says that a reply came back."""

    @reward
    def replied(self, trace: Trace) -> float:
        return float(bool(trace.last_reply))


TASK = {"prompt": "What is 2 + 2?", "system_prompt": "Answer with a number."}


def upstream(trace: Trace, call: ModelCall) -> dict[str, Any]:
    """The body rollout_ray sent upstream for ``call`` (its messages and tools), rebuilt from
    the trace: the conversation on the path to the node the call sampled."""
    path = path_to(trace, call.node)[:-1]  # type: ignore[arg-type]
    request = Request([trace.nodes[i].message for i in path], trace.tools or None)
    return msgspec.json.decode(encode_request(request, {}, model=NAME, stream=False))


def check_turn(
    trace: Trace, call: ModelCall, server: Server, max_tokens: int = MAX_TOKENS, *, constrained: bool = False
) -> list[int]:
    """The call's prompt ids are the server's template of what was sent; its node holds the
    completion ids and one finite logprob per id; the agent saw their text. Returns the prompt."""
    assert call.error is None and call.node is not None, call
    node = trace.nodes[call.node]
    assert node.sampled
    ids, logprobs = node.token_ids, node.logprobs
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids), ids
    assert 1 <= len(ids) <= max_tokens
    assert logprobs is not None and len(logprobs) == len(ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs), logprobs
    assert call.usage is not None and call.usage.completion_tokens == len(ids), (call.usage, len(ids))
    assert (call.finish_reason == "length") == (len(ids) == max_tokens and ids[-1] not in EOS), (call, ids)
    prompt = full_prompt(trace, call)
    assert prompt == server.tokenize(upstream(trace, call))
    assert call.usage.prompt_tokens == len(prompt)
    scored = server.score(prompt, ids)
    if constrained:
        # Under a grammar (tool_choice "required" or named) vLLM's logprobs are those of the
        # *masked* distribution (a forced id has logprob 0.0): never below the model's own, and
        # not what a trainer's forward pass computes.
        assert all(lp >= raw - 1e-3 for lp, raw in zip(logprobs, scored)), (logprobs, scored)
    else:
        # Each logprob is the model's for that very id at that very position (teacher-forced).
        assert logprobs == pytest.approx(scored, abs=1e-3)
    text = server.detokenize([i for i in ids if i not in EOS])
    if node.message.tool_calls:  # the server parsed the sampled text into calls
        assert "<tool_call>" in text and call.finish_reason in ("tool_calls", "stop"), (text, call)
        assert all(c.name in text for c in node.message.tool_calls)
    else:  # what the agent saw is the text of the sampled ids (vLLM drops a trailing U+FFFD
        # when it stopped inside a UTF-8 sequence)
        assert node.message.content in (text, text.rstrip("\ufffd")), (node.message.content, text)
    return prompt


def check_turns(trace: Trace, server: Server, max_tokens: int = MAX_TOKENS, *, constrained: bool = False) -> list[int]:
    """Every call's turn (``check_turn``); the drift that ``token_drift`` reports is exactly
    where turn k's prompt does not begin with turn k-1's prompt + completion; the trainer's
    sequences hold every sampled id once, with its logprob, and each begins with a prompt the
    server saw. Returns the drifted turns."""
    prompts = [check_turn(trace, call, server, max_tokens, constrained=constrained) for call in trace.calls]
    nodes = [trace.nodes[call.node] for call in trace.calls]  # type: ignore[index]
    drift = [
        k
        for k in range(1, len(prompts))
        if prompts[k][: len(prompts[k - 1]) + len(nodes[k - 1].token_ids)]  # type: ignore[arg-type]
        != prompts[k - 1] + nodes[k - 1].token_ids
    ]  # type: ignore[operator]
    assert trace.token_drift == drift
    sequences = token_sequences(trace)
    assert len(sequences) == 1 + len(drift)
    sampled = [(i, lp) for s in sequences for i, m, lp in zip(s.input_ids, s.loss_mask, s.logprobs) if m]
    assert sampled == [(i, lp) for n in nodes for i, lp in zip(n.token_ids, n.logprobs)]  # type: ignore[arg-type]
    starts = [0, *drift]
    for sequence, k in zip(sequences, starts):
        assert sequence.input_ids[: len(prompts[k])] == prompts[k]
        assert len(sequence.input_ids) == len(sequence.loss_mask) == len(sequence.logprobs)
    assert sequences[-1].input_ids[-len(nodes[-1].token_ids) :] == nodes[-1].token_ids  # type: ignore[arg-type]
    print(
        f"\n{len(prompts)} turns: prompt lengths {[len(p) for p in prompts]}, completion lengths "
        f"{[len(n.token_ids) for n in nodes]}, drift {drift}",
        file=sys.stderr,
    )  # type: ignore[arg-type]
    return drift


def run_rollout(rollout: Rollout) -> Trace:
    async def main() -> Trace:
        try:
            return await rollout.run()
        finally:
            await rollout.session.model.aclose()

    return asyncio.run(main())


def sampling(logprobs: bool) -> dict[str, Any]:
    asked: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7}
    return {**asked, "logprobs": True, "top_logprobs": 2} if logprobs else asked


@pytest.mark.parametrize("logprobs", [False, True], ids=["agent-no-logprobs", "agent-logprobs"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("capture", ["vllm", "auto"])
def test_a_rollout_records_the_servers_ids_and_logprobs(
    vllm: Server, capture: str, stream: bool, logprobs: bool
) -> None:
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture=capture, stream=stream)  # type: ignore[arg-type]
    rollout = Rollout(
        Ask(TASK), ChatHarness(retries=0), model=model, runtime_factory=LocalRuntime, sampling=sampling(logprobs)
    )
    trace = run_rollout(rollout)
    assert trace.ok and trace.errors == [], trace.errors
    assert trace.rewards["replied"].score == float(bool(trace.last_reply))
    if capture == "auto":
        assert model.pool.servers[0].dialect == "vllm"
    (call,) = trace.calls
    assert upstream(trace, call)["messages"] == [
        {"role": "system", "content": TASK["system_prompt"]},
        {"role": "user", "content": TASK["prompt"]},
    ]
    prompt = check_turn(trace, call, vllm)
    node = trace.nodes[call.node]  # type: ignore[index]
    (sequence,) = token_sequences(trace)
    assert sequence.input_ids == prompt + node.token_ids
    assert sequence.loss_mask == [0] * len(prompt) + [1] * len(node.token_ids)  # type: ignore[arg-type]
    assert sequence.logprobs == [0.0] * len(prompt) + node.logprobs  # type: ignore[operator]
    assert trace.token_drift == []


def test_a_multi_turn_rollout_keeps_every_turns_ids_and_the_trainers_sequences(vllm: Server) -> None:
    """Three user turns: each prompt is the server's template of the conversation so far; the
    sequences cover every sampled id once, with its logprob, whether or not the template's
    re-tokenization of a reply drifted from the sampled ids (``token_drift`` says which)."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm")

    async def main() -> Trace:
        rollout = Rollout(
            Ask({"system_prompt": TASK["system_prompt"]}),
            ChatHarness(retries=0),
            model=model,
            runtime_factory=LocalRuntime,
            has_user=True,
            sampling=sampling(False),
        )
        try:
            assert await rollout.open()
            for text in ("What is 2 + 2?", "And 3 + 3?", "Thanks."):
                assert await rollout.step([UserMessage(text)])
            return await rollout.close()
        finally:
            await model.aclose()

    trace = asyncio.run(main())
    assert trace.ok and trace.errors == [] and len(trace.calls) == 3
    check_turns(trace, vllm)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_tool_calling_rollout_records_each_turn_and_its_drift(vllm: Server, stream: bool) -> None:
    """``tool_choice: required`` makes the random model emit real (parsed) tool calls: three
    turns with tool results between them. The tiny model's template renders a past call as
    ``\\n<tool_call>...</tool_call><|im_end|>``, the model sampled ``<tool_call>...`` and may have
    stopped on ``<|endoftext|>``: turn k+1's prompt re-tokenizes turn k, which is the drift
    every RL stack meets; it must be detected and the sequences must restart there."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm", stream=stream)
    asked = {"max_tokens": 64, "seed": 3, "tool_choice": "required"}
    rollout = Rollout(
        Arith({"prompt": "What is 2 + 3? Use add.", "system_prompt": "Use the tools."}),
        ChatHarness(retries=0, max_calls=3),
        model=model,
        runtime_factory=LocalRuntime,
        sampling=asked,
    )
    trace = run_rollout(rollout)
    assert trace.ok and trace.errors == [], trace.errors
    assert [t.name for t in trace.tools] == ["add"] and len(trace.calls) == 3
    assert all(trace.nodes[c.node].message.tool_calls for c in trace.calls)  # type: ignore[index]
    assert len(trace.tool_messages) >= 2  # the results (errors: the random arguments are junk)
    check_turns(trace, vllm, max_tokens=64, constrained=True)


CAPTURE_ONLY = {"token_ids", "prompt_token_ids", "prompt_logprobs", "prompt_text", "stop_reason"}


@pytest.mark.parametrize("agent_stream", [False, True], ids=["agent-json", "agent-sse"])
@pytest.mark.parametrize("upstream_stream", [False, True], ids=["upstream-json", "upstream-sse"])
def test_an_agent_through_the_proxy_gets_the_logprobs_it_asked_for_and_nothing_else(
    vllm: Server, upstream_stream: bool, agent_stream: bool
) -> None:
    """The issue's own report: an OpenAI client through the proxy asking ``logprobs: true,
    top_logprobs: 2`` gets them (real token strings, two alternatives each, the logprobs the
    trace keeps); the capture's fields never reach it; ``n: 2`` is a 400, not one choice."""
    model = OpenAIModel(vllm.base_url, name=NAME, token_capture="vllm", stream=upstream_stream)

    async def main() -> tuple[list[dict[str, Any]], set[str], Trace, tuple[int, Any]]:
        session = RolloutSession(Trace(task=TraceTask(type="T")), model)
        try:
            async with HTTPInterception() as proxy, proxy.serve(session) as slot, aiohttp.ClientSession() as client:
                url, auth = f"{slot.base_url}/v1/chat/completions", {"Authorization": f"Bearer {slot.model_secret}"}
                ask = {
                    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                    "max_tokens": MAX_TOKENS,
                    "seed": 11,
                    "logprobs": True,
                    "top_logprobs": 2,
                    "stream": agent_stream,
                }
                async with client.post(url, json=ask, headers=auth) as resp:
                    assert resp.status == 200, await resp.text()
                    raw = await resp.read()
                async with client.post(url, json={**ask, "n": 2, "stream": False}, headers=auth) as resp:
                    refused = resp.status, await resp.json()
        finally:
            await model.aclose()
        parts = (
            [
                msgspec.json.decode(b[5:])
                for b in raw.split(b"\n\n")
                if b.startswith(b"data:") and b[5:].strip() != b"[DONE]"
            ]
            if agent_stream
            else [msgspec.json.decode(raw)]
        )
        keys = {k for part in parts for k in part} | {k for part in parts for c in part["choices"] for k in c}
        entries = [
            e for part in parts for c in part["choices"] for e in ((c.get("logprobs") or {}).get("content") or ())
        ]
        return entries, keys, session.trace, refused

    entries, keys, trace, refused = asyncio.run(main())
    assert not keys & CAPTURE_ONLY, keys & CAPTURE_ONLY
    (node,) = [n for n in trace.nodes if n.sampled]
    assert node.token_ids and len(entries) == len(node.token_ids)
    assert [e["logprob"] for e in entries] == node.logprobs
    assert all(len(e["top_logprobs"]) == 2 and not e["token"].startswith("token_id:") for e in entries), entries
    text = vllm.detokenize([i for i in node.token_ids if i not in EOS])
    # The entries spell the sampled text, in order. (vLLM reports a token that is part of a
    # UTF-8 sequence as "" with empty bytes, so their join may lack a character of the text.)
    at, fragments = 0, False
    for e, i in zip(entries, node.token_ids):
        if i in EOS:
            continue
        if not e["token"]:
            fragments = True
            continue
        found = text.find(e["token"], at)
        assert found == at or (found > at and fragments), (e, text, at)
        at, fragments = found + len(e["token"]), False
    assert at == len(text) or fragments, (entries, text)
    assert refused[0] == 400 and refused[1]["error"]["param"] == "n", refused


def test_the_driver_streams_groups_that_batch_the_servers_ids(vllm: Server) -> None:
    tasks = [Ask({"idx": i, "prompt": f"What is {i} + {i}?", "system_prompt": "Answer."}) for i in range(2)]
    config = EvalConfig(samples_per_task=2, max_in_flight=2, sampling=sampling(False))

    async def main() -> list[tuple[dict[str, Any], list[Trace]]]:
        model = OpenAIModel(vllm.base_url, name=NAME, token_capture="auto")
        try:
            async with LocalExecutor() as executor:
                driver = Driver(tasks, ChatHarness(retries=0), model, executor=executor, config=config)
                return [(group.batch(pad_to=128), table_to_traces(group.samples)) async for group in driver.groups()]
        finally:
            await model.aclose()

    groups = asyncio.run(main())
    assert len(groups) == 2
    for batch, traces in groups:
        assert batch["input_ids"].shape == (2, 128)
        assert len(traces) == 2 and all(t.ok for t in traces)
        assert sorted(batch["sample_idx"].tolist()) == [0, 1]
        for row, idx in enumerate(batch["sample_idx"].tolist()):  # the row is the sample's sequence
            (sequence,) = token_sequences(traces[idx])
            n = len(sequence.input_ids)
            assert batch["input_ids"][row, :n].tolist() == sequence.input_ids
            assert batch["loss_mask"][row, :n].tolist() == sequence.loss_mask
            assert batch["old_logprobs"][row, :n].tolist() == pytest.approx(sequence.logprobs, abs=1e-6)
            assert batch["attention_mask"][row].sum() == n
        for trace in traces:  # two rollouts were in flight at once: each kept its own ids
            (call,) = trace.calls
            prompt = check_turn(trace, call, vllm)
            (sequence,) = token_sequences(trace)
            assert sequence.input_ids[: len(prompt)] == prompt and prompt[0] == 1  # <|im_start|>


def test_rollout_ray_eval_stores_the_servers_ids_once_by_default(vllm: Server, tmp_path: Path) -> None:
    """The command line, as a user runs it against vLLM: no flag asks for token data, the
    summary says it was stored (vLLM found by its GET /version), the run directory's token
    columns are the server's ids, and the trace blobs hold them no more (read back whole)."""
    from rollout_ray import read_run
    from rollout_ray._record.trace import decode_trace

    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            str(REPO / "examples" / "arith.py"),
            "--executor",
            "local",
            "--model-url",
            vllm.base_url,
            "--limit",
            "2",
            "--samples",
            "2",
            "--max-tokens",
            str(MAX_TOKENS),
            "--temperature",
            "1.0",
            "--seed",
            "7",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "token data: stored for 4 of 4 rollouts (vllm)" in result.stdout, result.stdout
    table = read_run(out)
    assert table.column("input_ids").null_count == 0
    for blob in table.column("trace").to_pylist():  # float32 logprobs, as vLLM's are: out of the blob too
        assert all(n.token_ids is None and n.logprobs is None for n in decode_trace(blob).nodes)
    for trace, ids in zip(table_to_traces(table), table.column("input_ids").to_pylist()):
        (call,) = trace.calls
        prompt = check_turn(trace, call, vllm)
        assert ids == [prompt + trace.nodes[call.node].token_ids]  # type: ignore[index, operator]
