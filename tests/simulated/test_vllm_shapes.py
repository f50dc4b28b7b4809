"""Token capture in vLLM's shapes, field by field as a live vLLM 0.32.0 answers (``scripts/vllm_cpu/``)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from sim_client import Client, ask, assemble, events, serve, user

from rollout_ray._simulated.model_server import SimulatedModelServer
from rollout_ray._simulated.template import render
from rollout_ray._simulated.tokenizer import IM_END, decode, token_bytes, token_text

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
CAPTURE = {"return_token_ids": True, "logprobs": True, "top_logprobs": 3}
QUESTION = {"messages": user("What is 17 + 25?"), **CAPTURE}


def check_entry(entry: dict[str, Any], k: int) -> None:
    """One ``logprobs.content`` entry as vLLM writes it: the sampled token first in its
    ``top_logprobs``, then the true top-k without it, best first."""
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["bytes"] == list(entry["token"].encode())
    top = entry["top_logprobs"]
    assert len(top) == k and all(set(t) == {"token", "logprob", "bytes"} for t in top)
    assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])
    assert all(t["logprob"] <= 0 for t in top) and entry["logprob"] <= 0
    values = [entry["logprob"], *(t["logprob"] for t in top)]
    assert values == [struct.unpack("f", struct.pack("f", v))[0] for v in values]  # float32, as vLLM's
    rest = [t["logprob"] for t in top[1:]]
    assert rest == sorted(rest, reverse=True)
    assert entry["token"] not in [t["token"] for t in top[1:]]


def test_json_has_prompt_ids_at_the_top_and_completion_ids_logprobs_per_choice() -> None:
    status, data = ask(QUESTION)
    assert status == 200
    assert set(data) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prompt_token_ids",
        "prompt_logprobs",
        "prompt_text",
    }
    assert (data["object"], data["prompt_logprobs"], data["prompt_text"]) == ("chat.completion", None, None)
    assert data["prompt_token_ids"] == render(user("What is 17 + 25?"))
    (choice,) = data["choices"]
    assert set(choice) == {"index", "message", "token_ids", "logprobs", "finish_reason", "stop_reason"}
    assert choice["message"] == {"role": "assistant", "content": "42", "tool_calls": [], "reasoning": None}
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert ids[-1] == IM_END and decode(ids) == "42<|im_end|>"
    assert len(ids) == len(content) == data["usage"]["completion_tokens"]
    assert data["usage"] == {
        "prompt_tokens": len(data["prompt_token_ids"]),
        "completion_tokens": len(ids),
        "total_tokens": len(data["prompt_token_ids"]) + len(ids),
    }
    assert [e["token"] for e in content] == [token_text(i) for i in ids]
    for entry in content:
        check_entry(entry, 3)


def test_without_return_token_ids_the_ids_are_null_and_logprobs_stay() -> None:
    status, data = ask({"messages": user("What is 17 + 25?"), "logprobs": True})
    assert status == 200 and data["prompt_token_ids"] is None and data["choices"][0]["token_ids"] is None
    assert [e["top_logprobs"] for e in data["choices"][0]["logprobs"]["content"]] == [[], []]
    status, data = ask({"messages": user("What is 17 + 25?"), "return_token_ids": True})
    assert data["choices"][0]["logprobs"] is None and len(data["choices"][0]["token_ids"]) == 2


def test_tokens_as_token_ids_keep_the_real_bytes_in_the_main_entry_only() -> None:
    status, data = ask(QUESTION, return_tokens_as_token_ids=True)
    ids = data["choices"][0]["token_ids"]
    for token, entry in zip(ids, data["choices"][0]["logprobs"]["content"]):
        assert entry["token"] == f"token_id:{token}" and entry["bytes"] == token_bytes(token)
        assert entry["top_logprobs"][0]["token"] == f"token_id:{token}"
        for top in entry["top_logprobs"]:
            assert top["token"].startswith("token_id:") and top["bytes"] == list(top["token"].encode())
    # The per-request field does the same on a server without the flag.
    _, again = ask({**QUESTION, "return_tokens_as_token_ids": True})
    assert again["choices"][0]["logprobs"] == data["choices"][0]["logprobs"]


def test_sse_sends_prompt_ids_first_then_one_token_per_chunk() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        _, raw = await post(QUESTION)
        whole = json.loads(raw)
        stream = {**QUESTION, "stream": True, "stream_options": {"include_usage": True}}
        status, raw = await post(stream)
        assert status == 200
        chunks = events(raw)
        first, *tokens, usage, done = chunks
        assert done == "[DONE]"
        assert first["choices"] == [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]
        assert first["prompt_token_ids"] == whole["prompt_token_ids"] and first["prompt_text"] is None
        for chunk in tokens:
            assert "prompt_token_ids" not in chunk and chunk["object"] == "chat.completion.chunk"
            (choice,) = chunk["choices"]
            assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == 1
            check_entry(choice["logprobs"]["content"][0], 3)
        assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (len(tokens) - 1) + ["stop"]
        assert "stop_reason" not in tokens[0]["choices"][0] and tokens[-1]["choices"][0]["stop_reason"] is None
        assert [i for c in tokens for i in c["choices"][0]["token_ids"]] == whole["choices"][0]["token_ids"]
        streamed = [e for c in tokens for e in c["choices"][0]["logprobs"]["content"]]
        assert streamed == whole["choices"][0]["logprobs"]["content"]
        assert usage == {
            **{k: first[k] for k in ("id", "object", "created", "model")},
            "choices": [],
            "usage": whole["usage"],
        }
        assert assemble(chunks)[:2] == ({"role": "assistant", "content": "42"}, "stop")

    serve(body)


def test_sse_streams_a_tool_call_a_token_at_a_time() -> None:
    async def body(server: SimulatedModelServer, post: Client) -> None:
        _, raw = await post({**QUESTION, "tools": [ADD_TOOL]})
        whole = json.loads(raw)["choices"][0]
        assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
        _, raw = await post({**QUESTION, "tools": [ADD_TOOL], "stream": True})
        chunks = events(raw)
        message, finish, _ = assemble(chunks)
        assert message["tool_calls"] == whole["message"]["tool_calls"] and finish == "tool_calls"
        assert [c["choices"][0]["token_ids"] for c in chunks[1:-1]] == [[i] for i in whole["token_ids"]]
        opening = chunks[1 + whole["token_ids"].index(3)]["choices"][0]["delta"]  # at <tool_call>
        assert opening == {
            "tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "add"}}]
        }
        assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 17, "b": 25}

    serve(body)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"return_token_ids": 1}, "return_token_ids"),
        ({"n": 0}, "n"),
        ({"temperature": -1}, "temperature"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_capture_and_sampling_fields_get_400(extra: dict[str, Any], param: str) -> None:
    status, data = ask({"messages": user("hi"), **extra})
    assert status == 400 and data["error"]["param"] == param
